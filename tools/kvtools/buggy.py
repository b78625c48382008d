"""The bug zoo: deliberately wrong adapters the kit must catch.

Each factory wraps the spec with one realistic porting mistake. They exist
to prove that ``kvref check`` finds and shrinks real bugs, e.g.::

    kvref check --target kvtools.buggy:forward_free --against spec
"""

from __future__ import annotations

from kvspec.block_pool import BlockId
from kvspec.config import KVCacheConfig
from kvspec.kv_cache_manager import KVCacheManager


class ForwardFree(KVCacheManager):
    """Frees a finished request's blocks first-to-last instead of last-to-first,
    so the shared prefix is evicted before the private tail."""

    name = "forward_free"

    def free(self, request_id: str) -> None:
        """Free every group's table in allocation order (the bug)."""
        for m in self.coordinator.managers:
            blocks = m.pop_blocks_for_free(request_id)
            self.block_pool.free_blocks(blocks)


class AppendAllOnFree(KVCacheManager):
    """vLLM 0.16.0's queue rule: freed blocks all go to the tail, unhashed ones
    included (0.25.1 puts unhashed blocks at the front)."""

    name = "append_all_on_free"

    def __init__(self, config: KVCacheConfig) -> None:
        """Patch this instance's pool."""
        super().__init__(config)
        pool = self.block_pool

        def free_blocks(ordered: object, skipped: bool = False) -> None:  # every block to the tail, whatever kind
            blocks = list(ordered)  # type: ignore[call-overload]  # any iterable of ids
            for b in blocks:
                if b != 0:
                    pool.ref_cnt[b] -= 1
            pool.free_queue += [BlockId(b) for b in blocks if b != 0 and pool.ref_cnt[b] == 0]

        pool.free_blocks = free_blocks  # type: ignore[method-assign, assignment]  # deliberate mutant


def forward_free(config: KVCacheConfig) -> ForwardFree:
    """Factory for the forward-order free mutant."""
    return ForwardFree(config)


def append_all_on_free(config: KVCacheConfig) -> AppendAllOnFree:
    """Factory for the 0.16.0 free-queue mutant."""
    return AppendAllOnFree(config)
