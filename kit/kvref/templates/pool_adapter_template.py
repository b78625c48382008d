"""Template: your block pool alone, checked from its first day.

Replace ``Pool`` (a stand-in: kvspec's block pool) with your port and run::

    kvref check --layer pool --target my_pool_adapter:make --against spec

The operations are vLLM ``BlockPool``'s over integer block ids
(:class:`kvref.BlockPoolAdapter`); block 0 is the null block.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvref import declare
from kvspec.block_pool import BlockId
from kvspec.block_pool import BlockPool as Pool
from kvspec.config import KVCacheConfig
from kvspec.events import KVCacheEvent
from kvspec.hashing import BlockHash
from kvspec.request import Request
from kvspec.view import KVView


@declare(unsupported={"events"})
def make(config: KVCacheConfig) -> MyPoolAdapter:
    """The factory: one full-attention group; its block size is the hash block size."""
    return MyPoolAdapter(config)


class MyPoolAdapter:
    name = "my-pool"

    def __init__(self, config: KVCacheConfig) -> None:
        self.pool = Pool(config.num_blocks, config.enable_caching, config.groups[0].block_size)

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        return list(self.pool.get_new_blocks(num_blocks))

    def free_blocks(self, block_ids: Sequence[int]) -> None:
        self.pool.free_blocks(BlockId(b) for b in block_ids)

    def touch(self, block_ids: Sequence[int]) -> None:
        self.pool.touch([BlockId(b) for b in block_ids])

    def cache_full_blocks(self, request: Request, block_ids: Sequence[int], num_cached_blocks: int,
                          num_full_blocks: int, block_size: int, group_id: int) -> None:  # fmt: skip
        ids = [BlockId(b) for b in block_ids]
        self.pool.cache_full_blocks(request, ids, num_cached_blocks, num_full_blocks, block_size, group_id)

    def get_cached_block(self, block_hash: bytes, group_ids: Sequence[int]) -> list[int] | None:
        found = self.pool.get_cached_block(BlockHash(block_hash), group_ids)
        return None if found is None else list(found)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        self.pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    def get_num_free_blocks(self) -> int:
        return self.pool.get_num_free_blocks()

    def get_usage(self) -> float:
        return self.pool.get_usage()

    def take_events(self) -> list[KVCacheEvent]:
        return self.pool.take_events()

    def to_view(self) -> KVView:
        p = self.pool
        return KVView(
            free_queue=tuple(p.free_queue),
            ref_cnt=tuple((b, n) for b, n in enumerate(p.ref_cnt) if b != 0 and n > 0),
            cached=tuple(sorted((k, tuple(ids)) for k, ids in p.cached.items())),
            tables=(),
            usage=p.get_usage(),
        )
