"""nanokv: a small paged KV-cache block manager (one full-attention group).

Written from scratch for the kvref check, nano-vllm style: its own block ids
0 .. N-1 (no null block), one table per sequence, a hash -> blocks map for the
prefix cache, LRU reuse of freed blocks. The adapter below the engine puts it
behind kvref's facade.
"""

from __future__ import annotations


class BlockManager:
    """Blocks of one attention group: reference counts, free list, prefix cache."""

    def __init__(self, num_blocks: int, block_size: int, caching: bool) -> None:
        self.block_size = block_size
        self.caching = caching
        self.free_ids = list(range(num_blocks))  # reuse order: head first
        self.ref = [0] * num_blocks
        self.hash_of: list[bytes | None] = [None] * num_blocks
        self.cache: dict[bytes, list[int]] = {}  # hash -> blocks, oldest first
        self.tables: dict[str, list[int]] = {}
        self.num_cached: dict[str, int] = {}

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    def lookup(self, hashes: list[bytes]) -> list[int]:
        """The cached blocks of the longest cached prefix of ``hashes``."""
        hit = []
        for h in hashes:
            ids = self.cache.get(h)
            if not ids:
                break
            hit.append(ids[0])
        return hit

    def blocks_needed(self, seq: str, num_slots: int, hits: list[int]) -> int:
        """Free blocks an allocation of ``num_slots`` slots would take."""
        have = len(self.tables.get(seq, ())) + len(hits)
        required = -(-num_slots // self.block_size)
        return max(required - have, 0) + sum(1 for b in hits if self.ref[b] == 0)

    def allocate(self, seq: str, num_slots: int, hits: list[int]) -> list[int]:
        """Grow ``seq``'s table to cover ``num_slots`` slots; return the new blocks."""
        table = self.tables.setdefault(seq, [])
        if hits:
            for b in hits:
                if self.caching:
                    if self.ref[b] == 0:
                        self.free_ids.remove(b)
                    self.ref[b] += 1
            table += hits
            self.num_cached[seq] = len(table)
        n = -(-num_slots // self.block_size) - len(table)
        new, self.free_ids = self.free_ids[: max(n, 0)], self.free_ids[max(n, 0) :]
        for b in new:
            if self.caching:
                self._forget_hash(b)
            self.ref[b] = 1
        table += new
        return new

    def cache_full(self, seq: str, hashes: list[bytes], num_tokens: int) -> None:
        """Put the full blocks of ``seq`` up to ``num_tokens`` into the prefix cache."""
        table = self.tables.setdefault(seq, [])
        start, end = self.num_cached.get(seq, 0), num_tokens // self.block_size
        for i in range(start, end):
            self.hash_of[table[i]] = hashes[i]
            self.cache.setdefault(hashes[i], []).append(table[i])
        self.num_cached[seq] = max(start, end)

    def release(self, seq: str) -> None:
        """Drop the sequence; its blocks lose a reference, last block first."""
        self.num_cached.pop(seq, None)
        unhashed: list[int] = []
        hashed: list[int] = []
        for b in reversed(self.tables.pop(seq, [])):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (hashed if self.hash_of[b] is not None else unhashed).append(b)
        # never-hit blocks are reused first; cached ones last (LRU)
        self.free_ids = unhashed + self.free_ids + hashed

    def evict(self, ids: list[int]) -> None:
        """Drop blocks from the prefix cache (ascending ids)."""
        for b in sorted(set(ids)):
            self._forget_hash(b)

    def reset(self) -> bool:
        """Clear the prefix cache if no block is in use."""
        if len(self.free_ids) != len(self.ref):
            return False
        self.cache.clear()
        self.hash_of = [None] * len(self.ref)
        return True

    def _forget_hash(self, b: int) -> None:
        h = self.hash_of[b]
        if h is None:
            return
        self.hash_of[b] = None
        self.cache[h].remove(b)
        if not self.cache[h]:
            del self.cache[h]
