"""The adapters around kvimpl, the optimized implementation: its manager and its block pool."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvimpl.block_pool import BlockPool
from kvimpl.kv_cache_manager import KVCacheManager
from kvref.layers.pool import pool_view
from kvspec.block_pool import BlockId
from kvspec.config import KVCacheConfig
from kvspec.errors import UnsupportedByProfileError
from kvspec.events import KVCacheEvent
from kvspec.hashing import BlockHash
from kvspec.profiles import VLLM_0_25_1
from kvspec.request import Request
from kvspec.view import KVView

IMPL_PROFILES = frozenset({VLLM_0_25_1.name})
"""The semantics profiles kvimpl follows today."""


class ImplAdapter(KVCacheManager):
    """kvimpl's ``KVCacheManager``; it already speaks the adapter protocol."""

    name = "impl"


def make_impl_adapter(config: KVCacheConfig) -> ImplAdapter:
    """Factory for ``--target impl``.

    Raises:
        UnsupportedByProfileError: For a profile kvimpl does not follow yet.
    """
    if config.profile.name not in IMPL_PROFILES:
        raise UnsupportedByProfileError(
            f"kvimpl does not follow {config.profile.name} yet (it follows {', '.join(sorted(IMPL_PROFILES))})"
        )
    return ImplAdapter(config)


class ImplPoolAdapter:
    """kvimpl's ``BlockPool`` for the pool layer (:mod:`kvref.layers.pool`)."""

    name = "impl"

    def __init__(self, config: KVCacheConfig) -> None:
        """A pool of ``config.num_blocks`` hashing at its one group's block size."""
        self.pool = BlockPool(
            config.num_blocks, config.enable_caching, config.groups[0].block_size,
            config.enable_kv_cache_events, config.int_block_hashes,
        )  # fmt: skip

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        return list(self.pool.get_new_blocks(num_blocks))

    def free_blocks(self, block_ids: Sequence[int]) -> None:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        self.pool.free_blocks(BlockId(b) for b in block_ids)

    def touch(self, block_ids: Sequence[int]) -> None:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        self.pool.touch([BlockId(b) for b in block_ids])

    def cache_full_blocks(
        self,
        request: Request,
        block_ids: Sequence[int],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int,
    ) -> None:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        ids = [BlockId(b) for b in block_ids]
        self.pool.cache_full_blocks(request, ids, num_cached_blocks, num_full_blocks, block_size, group_id)

    def get_cached_block(self, block_hash: bytes, group_ids: Sequence[int]) -> list[int] | None:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        found = self.pool.get_cached_block(BlockHash(block_hash), group_ids)
        return None if found is None else list(found)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        self.pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        return self.pool.reset_prefix_cache()

    def get_num_free_blocks(self) -> int:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        return self.pool.get_num_free_blocks()

    def get_usage(self) -> float:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        return self.pool.get_usage()

    def take_events(self) -> list[KVCacheEvent]:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        return self.pool.take_events()

    def check_invariants(self) -> None:
        """kvimpl's pool invariants."""
        self.pool.check_invariants()

    def to_view(self) -> KVView:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        p = self.pool
        return pool_view(p.free_order(), p.ref_cnt, p.cached, p.get_usage())


def make_impl_pool(config: KVCacheConfig) -> ImplPoolAdapter:
    """Factory for ``--layer pool --target impl``.

    Raises:
        UnsupportedByProfileError: For a profile kvimpl does not follow yet.
    """
    if config.profile.name not in IMPL_PROFILES:
        raise UnsupportedByProfileError(f"kvimpl does not follow {config.profile.name} yet")
    return ImplPoolAdapter(config)
