"""Real vLLM 0.25.1, re-broken: one method of the installed vLLM's block pool
patched at run time inside an adapter factory.

Each factory wraps :func:`kvref.adapters.vllm.make_vllm_adapter` and
replaces ONE method on that adapter's own ``BlockPool`` or ``KVCacheManager``
instance (the classes and every other object stay intact), so the kit can show
it catches faults in the real code, not only in kvimpl::

    kvref check --target kvtools.zoo.vllm:vllm_free_all_to_tail --against spec

Needs vLLM 0.25.1 installed (``bash ci/setup.sh --with-vllm``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kvref.adapters.vllm import VllmAdapter, make_vllm_adapter
from kvspec.config import KVCacheConfig


@dataclass(frozen=True)
class VllmZooEntry:
    """One fault planted into the installed vLLM."""

    name: str
    method: str
    description: str
    factory: Callable[[KVCacheConfig], VllmAdapter]


def _broken(
    config: KVCacheConfig, name: str, method: str, make: Callable[[Any], object], on: str = "pool"
) -> VllmAdapter:
    """The vLLM adapter with ``method`` of its block pool (``on="pool"``) or
    of its ``KVCacheManager`` (``on="manager"``) replaced by ``make(obj)``."""
    adapter = make_vllm_adapter(config)
    # The adapter keeps its declared semantics (upstream vLLM 0.25.1): the kit explains vLLM's documented
    # divergences from the spec (kit/kvref/divergences.toml) only for such a side; otherwise they would pass
    # for kills.
    del name
    obj = adapter.manager.block_pool if on == "pool" else adapter.manager
    setattr(obj, method, make(obj))
    return adapter


def _touch_before_capacity(mgr: Any) -> Callable[..., Any]:
    orig = mgr.allocate_slots

    def allocate_slots(request: Any, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
        out = orig(request, num_new_tokens, *args, **kwargs)
        hits = kwargs.get("new_computed_blocks")
        if out is None and hits is not None and mgr.enable_caching:
            for group in hits.blocks:
                mgr.block_pool.touch(group)  # hits stay referenced after the failed allocation
        return out

    return allocate_slots


def _cross_attn_batch_budget(mgr: Any) -> Callable[..., Any]:
    orig = mgr.allocate_slots

    def allocate_slots(request: Any, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("num_encoder_tokens", 0) > 0:
            kwargs["num_encoder_tokens"] = mgr.max_num_batched_tokens_for_zoo  # the step budget, not the encoder
        return orig(request, num_new_tokens, *args, **kwargs)

    return allocate_slots


def _full_hit_keeps_last(mgr: Any) -> Callable[[Any], Any]:
    orig = mgr.get_computed_blocks

    def get_computed_blocks(request: Any) -> Any:
        out = orig(request)
        if not mgr.enable_caching or request.skip_reading_prefix_cache:
            return out
        blocks, n = mgr.coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens)
        if n == request.num_tokens:
            return mgr.create_kv_cache_blocks(blocks), n - 1  # every block kept, one token recomputed
        return out

    return get_computed_blocks


def _preempted_in_hit_rate(mgr: Any) -> Callable[[Any], Any]:
    orig = mgr.get_computed_blocks

    def get_computed_blocks(request: Any) -> Any:
        saved, request.num_preemptions = request.num_preemptions, 0  # recorded as a first admission
        try:
            return orig(request)
        finally:
            request.num_preemptions = saved

    return get_computed_blocks


def _free_all_to_tail(pool: Any) -> Callable[[Iterable[Any]], None]:
    def free_blocks(ordered_blocks: Iterable[Any]) -> None:
        freed = []
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0 and not block.is_null:
                freed.append(block)
        pool.free_block_queue.append_n(freed)  # unhashed blocks no longer go to the front

    return free_blocks


def _touch_keeps_free(pool: Any) -> Callable[[Sequence[Any]], None]:
    def touch(blocks: Sequence[Any]) -> None:
        for block in blocks:
            block.ref_cnt += 1  # a free hit block stays in the free queue

    return touch


def _newest_duplicate(pool: Any) -> Callable[[Any, list[int]], list[Any] | None]:
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id  # noqa: PLC0415 - vLLM is optional

    def get_cached_block(block_hash: Any, kv_cache_group_ids: list[int]) -> list[Any] | None:
        found = []
        for gid in kv_cache_group_ids:
            blocks = pool.cached_block_hash_to_block._cache.get(make_block_hash_with_group_id(block_hash, gid))
            if blocks is None:
                return None
            found.append(blocks if not isinstance(blocks, dict) else list(blocks.values())[-1])
        return found

    return get_cached_block


def vllm_free_all_to_tail(config: KVCacheConfig) -> VllmAdapter:
    """BlockPool.free_blocks appends every freed block to the tail."""
    return _broken(config, "vllm_free_all_to_tail", "free_blocks", _free_all_to_tail)


def vllm_touch_keeps_free(config: KVCacheConfig) -> VllmAdapter:
    """BlockPool.touch skips removing a free hit block from the free queue."""
    return _broken(config, "vllm_touch_keeps_free", "touch", _touch_keeps_free)


def vllm_newest_duplicate(config: KVCacheConfig) -> VllmAdapter:
    """BlockPool.get_cached_block returns the newest of several duplicate blocks."""
    return _broken(config, "vllm_newest_duplicate", "get_cached_block", _newest_duplicate)


def vllm_touch_before_capacity(config: KVCacheConfig) -> VllmAdapter:
    """KVCacheManager.allocate_slots leaves the hits touched when it returns None (vllm#11565)."""
    return _broken(config, "vllm_touch_before_capacity", "allocate_slots", _touch_before_capacity, on="manager")


def vllm_cross_attn_batch_budget(config: KVCacheConfig) -> VllmAdapter:
    """KVCacheManager.allocate_slots sizes cross-attention by the step budget (vllm#30772)."""
    adapter = _broken(config, "vllm_cross_attn_batch_budget", "allocate_slots", _cross_attn_batch_budget, "manager")
    adapter.manager.max_num_batched_tokens_for_zoo = config.batched_tokens()
    return adapter


def vllm_full_hit_keeps_last(config: KVCacheConfig) -> VllmAdapter:
    """KVCacheManager.get_computed_blocks keeps every block of a fully cached prompt (vllm#11186)."""
    return _broken(config, "vllm_full_hit_keeps_last", "get_computed_blocks", _full_hit_keeps_last, on="manager")


def vllm_preempted_in_hit_rate(config: KVCacheConfig) -> VllmAdapter:
    """KVCacheManager.get_computed_blocks counts a preempted request's lookup as a first one (vllm#25787)."""
    return _broken(config, "vllm_preempted_in_hit_rate", "get_computed_blocks", _preempted_in_hit_rate, "manager")


VLLM_ZOO: dict[str, VllmZooEntry] = {
    e.name: e
    for e in (
        VllmZooEntry(
            "vllm_free_all_to_tail",
            "BlockPool.free_blocks",
            "every freed block is appended to the free-queue tail, unhashed ones included",
            vllm_free_all_to_tail,
        ),
        VllmZooEntry(
            "vllm_touch_keeps_free",
            "BlockPool.touch",
            "a prefix hit on a free cached block raises its ref_cnt but leaves it in the free queue",
            vllm_touch_keeps_free,
        ),
        VllmZooEntry(
            "vllm_newest_duplicate",
            "BlockPool.get_cached_block",
            "with several blocks cached under one hash, the newest is returned instead of the first",
            vllm_newest_duplicate,
        ),
        VllmZooEntry(
            "vllm_touch_before_capacity",
            "KVCacheManager.allocate_slots",
            "vllm#11565: a request that does not fit returns None but keeps its prefix hits touched",
            vllm_touch_before_capacity,
        ),
        VllmZooEntry(
            "vllm_cross_attn_batch_budget",
            "KVCacheManager.allocate_slots",
            "vllm#30772: cross-attention blocks sized by the step token budget, not the encoder length",
            vllm_cross_attn_batch_budget,
        ),
        VllmZooEntry(
            "vllm_full_hit_keeps_last",
            "KVCacheManager.get_computed_blocks",
            "vllm#11186: a fully cached prompt keeps all its blocks and recomputes only the last token",
            vllm_full_hit_keeps_last,
        ),
        VllmZooEntry(
            "vllm_preempted_in_hit_rate",
            "KVCacheManager.get_computed_blocks",
            "vllm#25787: a preempted request's re-admission lookup counts in the prefix-cache hit rate",
            vllm_preempted_in_hit_rate,
        ),
    )
}
