"""nanoblocks: a block manager in the style of nano-vllm's, written for kvref's examples.

The shape of nano-vllm's ``BlockManager`` (no line of it): a scheduler that
admits whole prompts and decodes one token per step calls

* ``can_allocate(seq)`` / ``allocate(seq)`` when a sequence is admitted: its
  prompt's full blocks are looked up in a hash -> block map, the longest
  cached prefix is reused and every other block taken from the head of the
  free list; every full block is entered in the map;
* ``can_append(seq)`` / ``may_append(seq)`` before each decode step: a new
  block when the token to compute starts one, and the block's hash when the
  token fills it;
* ``deallocate(seq)`` when the sequence finishes or is preempted: its blocks
  lose a reference, last block first, and go to the tail of the free list
  (they keep their hash until they are reused).

It validates nothing: its scheduler never makes an invalid call. The block
hashes come from the caller (``Sequence.block_hashes``), as a port reuses the
hash it must match. Four policies differ from vLLM's 0.25.1 (as nano-vllm's
do; they are what ``kvref check`` finds, docs/writing-an-adapter.md walks
through them):

* a prompt whose every block is cached is a hit of all its tokens (vLLM
  stops one token short, so that the last token is computed);
* the map holds one block per hash, the latest cached (vLLM keeps every
  block cached under a hash);
* ``can_allocate`` asks for a free block per block of the prompt, cache hits
  included (vLLM counts only the blocks the admission takes from the free
  list);
* every freed block goes to the tail of the free list (vLLM puts a freed
  block that holds no full block's hash at the head: it is reused first).

It also has nano-vllm's defect, which is no policy: a block reused for
another prefix keeps its old entry in the map, and a lookup that finds the
entry checks the block's tokens, not its hash, so a prompt whose tokens match
gets the KV of another prefix (one with other extra keys: a LoRA, a cache
salt, prompt embeddings). ``BlockManager(check_hash=True)`` is the fix.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class Block:
    """One KV-cache block: its reference count and, once full, its hash and tokens."""

    block_id: int
    ref_count: int = 0
    hash: bytes | None = None
    token_ids: list[int] = field(default_factory=list)

    def update(self, h: bytes, token_ids: list[int]) -> None:
        self.hash, self.token_ids = h, list(token_ids)

    def reset(self) -> None:
        self.ref_count, self.hash, self.token_ids = 1, None, []


@dataclass
class Sequence:
    """What the scheduler passes: the tokens so far and the hash of each full block."""

    seq_id: str
    token_ids: list[int]
    block_hashes: list[bytes]
    block_size: int
    block_table: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_blocks(self) -> int:
        return -(-len(self.token_ids) // self.block_size)

    def block(self, i: int) -> list[int]:
        return self.token_ids[i * self.block_size : (i + 1) * self.block_size]


class BlockManager:
    """Blocks, the free list (head first) and the hash -> block map."""

    def __init__(self, num_blocks: int, block_size: int, check_hash: bool = False) -> None:
        self.block_size = block_size
        self.check_hash = check_hash
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[bytes, int] = {}
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.used_block_ids: set[int] = set()

    def _allocate_block(self, block_id: int) -> Block:
        block = self.blocks[block_id]
        block.reset()
        self.free_block_ids.remove(block_id)
        self.used_block_ids.add(block_id)
        return block

    def _deallocate_block(self, block_id: int) -> None:
        self.used_block_ids.remove(block_id)
        self.free_block_ids.append(block_id)

    def cached_prefix(self, seq: Sequence) -> list[int]:
        """The blocks ``allocate`` would reuse for ``seq`` (its lookup, without allocating)."""
        hits = []
        for i in range(seq.num_blocks):
            token_ids = seq.block(i)
            if len(token_ids) < self.block_size:
                break
            block_id = self.hash_to_block_id.get(seq.block_hashes[i], -1)
            if not self._holds(block_id, seq.block_hashes[i], token_ids):
                break
            hits.append(block_id)
        return hits

    def can_allocate(self, seq: Sequence) -> bool:
        return len(self.free_block_ids) >= seq.num_blocks

    def allocate(self, seq: Sequence) -> None:
        assert not seq.block_table
        cache_miss = False
        for i in range(seq.num_blocks):
            token_ids = seq.block(i)
            h = seq.block_hashes[i] if len(token_ids) == self.block_size else None
            block_id = self.hash_to_block_id.get(h, -1) if h is not None else -1
            if h is None or not self._holds(block_id, h, token_ids):
                cache_miss = True
            if cache_miss:
                block_id = self.free_block_ids[0]
                block = self._allocate_block(block_id)
            else:
                seq.num_cached_tokens += self.block_size
                if block_id in self.used_block_ids:
                    block = self.blocks[block_id]
                    block.ref_count += 1
                else:
                    block = self._allocate_block(block_id)
            if h is not None:
                block.update(h, token_ids)
                self.hash_to_block_id[h] = block_id
            seq.block_table.append(block_id)

    def _holds(self, block_id: int, h: bytes, token_ids: list[int]) -> bool:
        """Whether the map's ``block_id`` for ``h`` still holds these tokens (and, with ``check_hash``, that hash)."""
        if block_id == -1 or self.blocks[block_id].token_ids != token_ids:
            return False
        return not self.check_hash or self.blocks[block_id].hash == h

    def deallocate(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._deallocate_block(block_id)
        seq.num_cached_tokens = 0
        seq.block_table.clear()

    def can_append(self, seq: Sequence) -> bool:
        return len(self.free_block_ids) >= (len(seq) % self.block_size == 1)

    def may_append(self, seq: Sequence) -> None:
        block_table = seq.block_table
        if len(seq) % self.block_size == 1:
            block_id = self.free_block_ids[0]
            self._allocate_block(block_id)
            block_table.append(block_id)
        elif len(seq) % self.block_size == 0:
            last = self.blocks[block_table[-1]]
            h = seq.block_hashes[seq.num_blocks - 1]
            last.update(h, seq.block(seq.num_blocks - 1))
            self.hash_to_block_id[h] = last.block_id
