"""Real vLLM 0.25.1, re-broken: one method of the installed vLLM's block pool
patched at run time inside an adapter factory.

Each factory wraps :func:`kvref.adapters.vllm_adapter.make_vllm_adapter` and
replaces ONE method on that adapter's own ``BlockPool`` instance (the class
and every other manager stay intact), so the kit can show it catches faults in
the real code, not only in kvimpl::

    kvref check --target kvref.zoo_vllm:vllm_free_all_to_tail --against spec

Needs vLLM 0.25.1 installed (``ci/install-vllm.sh``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kvref.adapters.vllm_adapter import VllmAdapter, make_vllm_adapter
from kvspec.config import KVCacheConfig


@dataclass(frozen=True)
class VllmZooEntry:
    """One fault planted into the installed vLLM."""

    name: str
    method: str
    description: str
    factory: Callable[[KVCacheConfig], VllmAdapter]


def _broken(config: KVCacheConfig, name: str, method: str, make: Callable[[Any], object]) -> VllmAdapter:
    adapter = make_vllm_adapter(config)
    # The name stays "vllm": the kit explains vLLM 0.25.1's documented divergences from the spec
    # (kvref/divergences.toml) only for an adapter of that name; renamed, they would pass for kills.
    del name
    pool = adapter.manager.block_pool
    setattr(pool, method, make(pool))
    return adapter


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
    )
}
