"""Zoo entries in the facade: allocate_slots arguments, the prefix lookup's result and its statistics.

Each entry replaces one method of the ``KVCacheManager`` adapter itself.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvimpl.block_pool import BlockId
from kvref.adapters.impl import ImplAdapter
from kvspec.config import KVCacheConfig
from kvspec.request import Request
from kvtools.zoo.base import bound_args, entry, mutant, patch


@entry(
    "vllm#11565",
    "allocate_slots touches the prefix-hit blocks before checking capacity, so a request that does not fit "
    "returns None but keeps its hits referenced (leaked, out of the free queue)",
    "view diff (ref counts / free queue) after a failed allocate_slots with hits",
)
def touch_before_capacity_check(config: KVCacheConfig) -> ImplAdapter:
    """Hits are touched before the capacity check and never released on failure."""
    m = mutant(config, "touch_before_capacity_check")
    orig = m.allocate_slots

    def allocate_slots(*args: Any, **kwargs: Any) -> Any:
        out = orig(*args, **kwargs)
        hits = bound_args(orig, args, kwargs)["new_computed_blocks"]
        if out is None and hits and m.enable_caching:
            # Touching first then failing == failing then touching: the check
            # sees the same free-minus-needed balance either way.
            m.block_pool.touch([BlockId(b) for group in hits for b in group])
        return out

    patch(m, "allocate_slots", allocate_slots)
    return m


@entry(
    "vllm#30772",
    "cross-attention blocks are sized by the step's token budget (max_num_batched_tokens) instead of the "
    "request's own encoder length",
    "allocate_slots output on the cross shape (encoder length differs from the step budget)",
)
def cross_attn_batch_budget(config: KVCacheConfig) -> ImplAdapter:
    """Encoder tokens replaced by the batch budget."""
    m = mutant(config, "cross_attn_batch_budget")
    orig = m.allocate_slots

    def allocate_slots(*args: Any, **kwargs: Any) -> Any:
        a = bound_args(orig, args, kwargs)
        if a["num_encoder_tokens"] > 0:
            a["num_encoder_tokens"] = config.batched_tokens()
        return orig(**a)

    patch(m, "allocate_slots", allocate_slots)
    return m


@entry(
    "vllm#11186",
    "a prompt whose blocks are all cached keeps every hit block and recomputes only its last token, so the "
    "computed count is not block aligned (the last block is then cached wrongly and the hash chain breaks)",
    "get_computed_blocks output for a fully cached, block-aligned prompt",
)
def full_hit_keeps_last_block(config: KVCacheConfig) -> ImplAdapter:
    """A full hit is reported as num_tokens - 1 tokens over all num_tokens / block_size blocks."""
    m = mutant(config, "full_hit_keeps_last_block")
    orig = m.get_computed_blocks

    def get_computed_blocks(request: Request) -> Any:
        out = orig(request)
        if not m.enable_caching or request.skip_reading_prefix_cache:
            return out
        blocks, n = m.coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens)
        if n == request.num_tokens:
            return m._ids(blocks), n - 1
        return out

    patch(m, "get_computed_blocks", get_computed_blocks)
    return m


@entry(
    "vllm#25787 (issue #25780)",
    "a preempted request's lookup on re-admission is counted in the prefix-cache hit rate, so recomputation "
    "after preemption shows up as cache hits",
    "make_prefix_cache_stats output (requests / queries / hits vs the preempted_* counters) after a preemption",
)
def preempted_counted_in_hit_rate(config: KVCacheConfig) -> ImplAdapter:
    """Lookups record statistics as if the request had never been preempted."""
    m = mutant(config, "preempted_counted_in_hit_rate")
    orig = m.get_computed_blocks

    def get_computed_blocks(request: Request) -> Any:
        return orig(replace(request, num_preemptions=0))

    patch(m, "get_computed_blocks", get_computed_blocks)
    return m
