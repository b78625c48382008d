"""tinypool: a Python port of vLLM's BlockPool (free list, ref counts, prefix-cache map).

Block objects in a doubly linked free list, as vLLM's ``FreeKVCacheBlockQueue``;
block 0 is the null block. Ported first, before any manager exists.
"""

from __future__ import annotations


class Block:
    __slots__ = ("block_hash", "block_id", "next", "prev", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None
        self.prev: Block | None = None
        self.next: Block | None = None


class FreeQueue:
    """Free blocks, eviction order; O(1) removal from the middle."""

    def __init__(self, blocks: list[Block]) -> None:
        self.head, self.tail = Block(-1), Block(-1)
        self.head.next, self.tail.prev = self.tail, self.head
        self.size = 0
        for b in blocks:
            self.append(b)

    def append(self, b: Block) -> None:
        last = self.tail.prev
        assert last is not None
        last.next, b.prev, b.next, self.tail.prev = b, last, self.tail, b
        self.size += 1

    def prepend(self, b: Block) -> None:
        first = self.head.next
        assert first is not None
        self.head.next, b.prev, b.next, first.prev = b, self.head, first, b
        self.size += 1

    def remove(self, b: Block) -> None:
        assert b.prev is not None and b.next is not None
        b.prev.next, b.next.prev = b.next, b.prev
        b.prev = b.next = None
        self.size -= 1

    def popleft(self) -> Block:
        b = self.head.next
        assert b is not None and b is not self.tail
        self.remove(b)
        return b

    def blocks(self) -> list[Block]:
        out, b = [], self.head.next
        while b is not None and b is not self.tail:
            out.append(b)
            b = b.next
        return out


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.enable_caching = enable_caching
        self.free = FreeQueue(self.blocks[1:])  # block 0 is the null block
        self.cached: dict[bytes, dict[int, Block]] = {}  # key -> blocks, oldest first

    def get_new_blocks(self, n: int) -> list[Block]:
        if n > self.free.size:
            raise ValueError(f"Cannot get {n} free blocks from the pool")
        out = [self.free.popleft() for _ in range(n)]
        for b in out:
            if self.enable_caching:
                self.evict(b)
            b.ref_cnt += 1
        return out

    def touch(self, blocks: list[Block]) -> None:
        for b in blocks:
            if b.ref_cnt == 0 and b.block_id != 0:
                self.free.remove(b)
            b.ref_cnt += 1

    def free_blocks(self, blocks: list[Block]) -> None:
        unhashed: list[Block] = []
        hashed: list[Block] = []
        for b in blocks:
            b.ref_cnt -= 1
            if b.ref_cnt == 0 and b.block_id != 0:
                (unhashed if b.block_hash is None else hashed).append(b)
        for b in reversed(unhashed):
            self.free.prepend(b)
        for b in hashed:
            self.free.append(b)

    def cache_full_blocks(self, hashes: list[bytes], blocks: list[Block], start: int, end: int, group: int) -> None:
        for i in range(start, end):
            b = blocks[i]
            if b.block_id == 0:
                continue
            b.block_hash = hashes[i] + group.to_bytes(4, "big")
            self.cached.setdefault(b.block_hash, {})[b.block_id] = b

    def get_cached_block(self, block_hash: bytes, groups: list[int]) -> list[Block] | None:
        out = []
        for g in groups:
            found = self.cached.get(block_hash + g.to_bytes(4, "big"))
            if not found:
                return None
            out.append(next(iter(found.values())))
        return out

    def evict(self, b: Block) -> None:
        if b.block_hash is None:
            return
        entry = self.cached[b.block_hash]
        del entry[b.block_id]
        if not entry:
            del self.cached[b.block_hash]
        b.block_hash = None

    def reset_prefix_cache(self) -> bool:
        if self.free.size != len(self.blocks) - 1:
            return False
        for b in self.blocks:
            b.block_hash = None
        self.cached.clear()
        return True

    def usage(self) -> float:
        return 1.0 - self.free.size / (len(self.blocks) - 1) if len(self.blocks) > 1 else 0.0
