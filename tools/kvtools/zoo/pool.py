"""Zoo entries in the block pool: allocation, free-queue order and eviction events."""

from __future__ import annotations

from typing import Any

from kvimpl.block_pool import NULL_BLOCK, BlockId
from kvref.adapters.impl import ImplAdapter
from kvspec.config import KVCacheConfig
from kvspec.events import MEDIUM_GPU, BlockRemoved
from kvspec.hashing import (
    external_block_hash,
    split_key,
)
from kvtools.zoo.base import entry, mutant, patch


@entry(
    "vllm#24228 (unconfirmed)",
    "the free-block count is decremented before the 'enough free blocks' assert, so an allocation that "
    "runs out half-way leaves blocks that are neither free nor owned",
    "equivalent/unreachable through the public API: kvimpl calls get_new_blocks only inside allocate_slots, after "
    "the capacity check has counted exactly the blocks it then takes (all or nothing), so "
    "the mutant's branch (more blocks asked than free) never runs; were it reachable, unmutated kvimpl would raise "
    "PoolExhaustedError there, which no impl-vs-spec run has shown. The same fault is reachable in vLLM 0.25.1, "
    "whose Mamba align + connector-token estimate misses a block (docs/divergences.md, "
    "mamba-align-external-estimate), but not in an implementation with exact estimates",
    unreachable=True,
)
def free_count_before_assert(config: KVCacheConfig) -> ImplAdapter:
    """get_new_blocks takes what is there before failing its check."""
    m = mutant(config, "free_count_before_assert")
    pool = m.block_pool
    orig = pool.get_new_blocks

    def get_new_blocks(num_blocks: int) -> list[BlockId]:
        if num_blocks > len(pool.free_queue):
            pool.free_queue.popleft_n(len(pool.free_queue))
        return orig(num_blocks)

    patch(pool, "get_new_blocks", get_new_blocks)
    return m


@entry(
    "vllm#42656",
    "freed blocks all go to the tail of the free queue, unhashed partial blocks included, so they are "
    "LRU-ordered with real cache entries and evict them early (the behaviour before #42656)",
    "view diff (free-queue order) after a free with unhashed blocks",
)
def unhashed_freed_to_tail(config: KVCacheConfig) -> ImplAdapter:
    """Every freed block is appended, none prepended."""
    m = mutant(config, "unhashed_freed_to_tail")
    pool = m.block_pool
    orig = pool.free_blocks

    def free_blocks(ordered_blocks: Any, skipped: bool = False) -> None:
        blocks = [BlockId(b) for b in ordered_blocks]
        was_hashed = {b: pool.block_hash[b] for b in blocks}
        orig(blocks, skipped)  # validation, ref counts and the correct queue
        freed = [b for b in blocks if b != NULL_BLOCK and pool.ref_cnt[b] == 0 and was_hashed[b] is None]
        for b in dict.fromkeys(freed):
            pool.free_queue.remove(b)
            pool.free_queue.append(b)

    patch(pool, "free_blocks", free_blocks)
    return m


@entry(
    "vllm#55092 (unconfirmed)",
    "evicting one block whose hash has several physical copies cached emits one BlockRemoved per copy, so a "
    "consumer's index forgets copies that are still cached",
    "event-log consistency after two cached copies of one hash (a fully cached prompt recomputes its last block),"
    " an eviction and a take_events",
)
def removed_event_per_copy(config: KVCacheConfig) -> ImplAdapter:
    """BlockRemoved repeated for every cached copy of the evicted hash."""
    m = mutant(config, "removed_event_per_copy")
    pool = m.block_pool
    orig = pool._evict

    def _evict(b: BlockId) -> None:
        key = pool.block_hash[b]
        copies = len(pool.cached.get(key, [])) if key is not None else 0
        orig(b)
        if key is not None and pool.enable_kv_cache_events and copies > 1:
            digest, gid = split_key(key)
            ext = external_block_hash(digest, pool.int_block_hashes)
            pool.events += [BlockRemoved((ext,), MEDIUM_GPU, gid) for _ in range(copies - 1)]

    patch(pool, "_evict", _evict)
    return m
