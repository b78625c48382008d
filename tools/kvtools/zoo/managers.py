"""Zoo entries in the single-type managers: cached-block counts, the common prefix and Mamba's state blocks."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvimpl.block_pool import NULL_BLOCK, BlockId, BlockPool, _stored_event
from kvimpl.single_type_kv_cache_manager import (
    MambaManager,
    SingleTypeKVCacheManager,
    cdiv,
)
from kvref.adapters.impl import ImplAdapter
from kvspec.config import KVCacheConfig
from kvspec.hashing import (
    make_key,
)
from kvspec.request import Request
from kvtools.zoo.base import entry, mutant, patch


@entry(
    "vllm#42615 (unconfirmed)",
    "Mamba align-mode remove_skipped_blocks frees the previous state block after the base class already "
    "freed it in the same call (one block freed twice)",
    "crash (DoubleFreeError) or ref-count/free-queue view diff on a Mamba align shape",
)
def double_free_in_call(config: KVCacheConfig) -> ImplAdapter:
    """The align-mode state block is freed without re-checking the table."""
    m = mutant(config, "double_free_in_call")
    for mgr in m.coordinator.managers:
        if isinstance(mgr, MambaManager) and mgr.mamba.mode == "align":
            patch(mgr, "remove_skipped_blocks", _double_free_remove(mgr))
    return m


def _double_free_remove(mgr: MambaManager) -> Callable[[str, int], None]:
    def remove_skipped_blocks(request_id: str, total_computed_tokens: int) -> None:
        total = max(0, total_computed_tokens - mgr.mamba.num_speculative_blocks)
        idx = mgr.last_state_block_idx.get(request_id)
        table = mgr.req_to_blocks.get(request_id, [])
        stale = None
        if idx is not None and idx < cdiv(total, mgr.block_size) - 1 and table[idx] != NULL_BLOCK:
            stale = table[idx]  # read before the base call, not re-checked after it (the bug)
        SingleTypeKVCacheManager.remove_skipped_blocks(mgr, request_id, total)
        if stale is not None and idx is not None:
            mgr.pool.free_blocks([stale])
            table[idx] = NULL_BLOCK

    return remove_skipped_blocks


@entry(
    "vllm#14073",
    "a new request's num_cached_blocks starts at 0 instead of its prefix-hit count, so cache_full_blocks "
    "re-walks the hit blocks (skipping those already hashed) and emits events from the wrong parent",
    "view diff (num_cached) / kvimpl invariant 'hashed block past num_cached_block' / event comparison",
)
def wrong_num_cached_blocks(config: KVCacheConfig) -> ImplAdapter:
    """num_cached_block is reset to 0 after the hits are added; hashing skips hashed blocks."""
    m = mutant(config, "wrong_num_cached_blocks")
    for mgr in m.coordinator.managers:
        patch(mgr, "add_local_computed_blocks", _zero_cached(mgr))
    patch(m.block_pool, "cache_full_blocks", _cache_skipping_hashed(m.block_pool))
    return m


def _zero_cached(mgr: SingleTypeKVCacheManager) -> Callable[[str, Sequence[BlockId], int, int], None]:
    orig = mgr.add_local_computed_blocks

    def add_local_computed_blocks(
        request_id: str, new_computed_blocks: Sequence[BlockId], num_local: int, num_external: int
    ) -> None:
        orig(request_id, new_computed_blocks, num_local, num_external)
        if request_id in mgr.num_cached_block:
            mgr.num_cached_block[request_id] = 0

    return add_local_computed_blocks


def _cache_skipping_hashed(pool: BlockPool) -> Callable[..., None]:
    def cache_full_blocks(
        request: Request,
        blocks: Sequence[BlockId],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int,
        block_mask: Sequence[bool] | None = None,
    ) -> None:
        if num_cached_blocks >= num_full_blocks:
            return
        k = block_size // pool.hash_block_size
        stored: list[int] = []
        for i in range(num_cached_blocks, num_full_blocks):
            b = blocks[i]
            if b == NULL_BLOCK or (block_mask is not None and not block_mask[i - num_cached_blocks]):
                continue
            if pool.block_hash[b] is not None:  # the "additional check" #14073 removed
                continue
            key = make_key(request.block_hashes[(i + 1) * k - 1], group_id)
            pool.block_hash[b] = key
            pool.cached.setdefault(key, []).append(b)
            stored.append(i)
        if pool.enable_kv_cache_events:
            pool.events.append(
                _stored_event(pool, request, k, stored, num_cached_blocks, num_full_blocks, block_size, group_id)
            )

    return cache_full_blocks


@entry(
    "vllm#23485",
    "get_num_common_prefix_blocks counts a block as common when its ref_cnt equals the number of requests with "
    "tables, so popped blocks awaiting a deferred free (ref_cnt too high) end the prefix early",
    "get_num_common_prefix_blocks output once a block popped by pop_blocks_for_free and shared with a running "
    "request awaits its deferred free",
)
def common_prefix_by_ref_cnt(config: KVCacheConfig) -> ImplAdapter:
    """Common prefix compared through ref_cnt instead of table membership."""
    m = mutant(config, "common_prefix_by_ref_cnt")
    for mgr in m.coordinator.managers:
        patch(mgr, "get_num_common_prefix_blocks", _prefix_by_ref(mgr))
    return m


def _prefix_by_ref(mgr: SingleTypeKVCacheManager) -> Callable[[str], int]:
    def get_num_common_prefix_blocks(request_id: str) -> int:
        if not mgr.track_holders:
            return 0
        tables = mgr.req_to_blocks
        n = 0
        for b in tables.get(request_id, []):
            if b == NULL_BLOCK:
                if not all(NULL_BLOCK in t for t in tables.values()):
                    break
            elif mgr.pool.ref_cnt[b] != len(tables):
                break
            n += 1
        return n

    return get_num_common_prefix_blocks


@entry(
    "vllm#55601 (unconfirmed)",
    "the Mamba align-mode 'state block of two steps ago' index is computed in hash-block units instead of the "
    "Mamba group's own block size",
    "view diff (free queue) on full@2x+mamba-align@2x+swa with EAGLE (one speculative block): after a one-token step"
    " the looser bound frees the block that still holds the running state",
)
def mamba_state_wrong_unit(config: KVCacheConfig) -> ImplAdapter:
    """cdiv(total, hash_block_size) where cdiv(total, mamba block size) is meant."""
    m = mutant(config, "mamba_state_wrong_unit")
    unit = m.coordinator.hash_block_size
    for mgr in m.coordinator.managers:
        if isinstance(mgr, MambaManager) and mgr.mamba.mode == "align":
            patch(mgr, "remove_skipped_blocks", _wrong_unit_remove(mgr, unit))
    return m


def _wrong_unit_remove(mgr: MambaManager, unit: int) -> Callable[[str, int], None]:
    def remove_skipped_blocks(request_id: str, total_computed_tokens: int) -> None:
        total = max(0, total_computed_tokens - mgr.mamba.num_speculative_blocks)
        SingleTypeKVCacheManager.remove_skipped_blocks(mgr, request_id, total)
        idx = mgr.last_state_block_idx.get(request_id)
        if idx is not None and idx < cdiv(total, unit) - 1:
            table = mgr.req_to_blocks[request_id]
            if idx < len(table) and table[idx] != NULL_BLOCK:
                mgr.pool.free_blocks([table[idx]])
                table[idx] = NULL_BLOCK

    return remove_skipped_blocks
