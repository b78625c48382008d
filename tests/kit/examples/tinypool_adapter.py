"""kvref pool-layer adapter for tinypool (public kvref API only).

``kvref check --layer pool --target tinypool_adapter:make --against spec``
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from tinypool import Block, BlockPool  # type: ignore[import-not-found]  # the engine sits beside this file

from kvref import declare
from kvspec.config import KVCacheConfig
from kvspec.errors import DoubleFreeError, InvalidBlockIdError, PoolExhaustedError
from kvspec.events import KVCacheEvent
from kvspec.request import Request
from kvspec.view import KVView


@declare(supports=lambda c: "tinypool emits no events" if c.enable_kv_cache_events else None, unsupported={"events"})
def make(config: KVCacheConfig) -> TinyPoolAdapter:
    """Factory for the pool layer."""
    return TinyPoolAdapter(config)


class TinyPoolAdapter:
    name = "tinypool"

    def __init__(self, config: KVCacheConfig) -> None:
        self.pool = BlockPool(config.num_blocks, config.enable_caching)

    def _blocks(self, ids: Iterable[int]) -> list[Block]:
        out = []
        for b in ids:
            if not 0 <= b < len(self.pool.blocks):
                raise InvalidBlockIdError(f"block id {b} is outside the pool")
            out.append(self.pool.blocks[b])
        return out

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        if num_blocks > self.pool.free.size:
            raise PoolExhaustedError(f"cannot get {num_blocks} free blocks")
        return [b.block_id for b in self.pool.get_new_blocks(num_blocks)]

    def free_blocks(self, block_ids: Sequence[int]) -> None:
        blocks = self._blocks(block_ids)
        for bid, n in Counter(b for b in block_ids if b != 0).items():
            if self.pool.blocks[bid].ref_cnt < n:
                raise DoubleFreeError(f"block {bid} freed more often than allocated")
        self.pool.free_blocks(blocks)

    def touch(self, block_ids: Sequence[int]) -> None:
        self.pool.touch(self._blocks(block_ids))

    def cache_full_blocks(self, request: Request, block_ids: Sequence[int], num_cached_blocks: int,
                          num_full_blocks: int, block_size: int, group_id: int) -> None:
        self.pool.cache_full_blocks(list(request.block_hashes), self._blocks(block_ids), num_cached_blocks,
                                    num_full_blocks, group_id)

    def get_cached_block(self, block_hash: bytes, group_ids: Sequence[int]) -> list[int] | None:
        found = self.pool.get_cached_block(block_hash, list(group_ids))
        return None if found is None else [b.block_id for b in found]

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        for b in sorted(set(self._blocks(block_ids)), key=lambda b: b.block_id):
            self.pool.evict(b)

    def reset_prefix_cache(self) -> bool:
        return bool(self.pool.reset_prefix_cache())

    def get_num_free_blocks(self) -> int:
        return int(self.pool.free.size)

    def get_usage(self) -> float:
        return float(self.pool.usage())

    def take_events(self) -> list[KVCacheEvent]:
        return []

    def to_view(self) -> KVView:
        p = self.pool
        return KVView(
            free_queue=tuple(b.block_id for b in p.free.blocks()),
            ref_cnt=tuple((b.block_id, b.ref_cnt) for b in p.blocks[1:] if b.ref_cnt > 0),
            cached=tuple(sorted((k, tuple(v)) for k, v in p.cached.items())),
            tables=(),
            usage=p.usage(),
        )
