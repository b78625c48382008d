"""A fresh fault set: faults planted into kvimpl that the generator was not built against.

The bug zoo (:data:`kvtools.zoo.ZOO`) re-plants upstream faults, and the
machine's rules were tuned while they were hunted, so its kill rate flatters
the generator. These faults were written after the batch target, the coverage
merge and the fuzz entry point were done, and were never used to tune a rule:
mutation operators at kvimpl's decision points and at the arguments vLLM's
scheduler passes (an argument dropped, a bound off by one, a drain that does
not clear, a unit confused, an order reversed), each one a kind of fault vLLM's
KV-cache manager has had fixed. ``python -m kvtools zoo --fresh`` hunts them
(not ci/mutation.sh) and writes docs/reports/zoo-fresh.json and
docs/reports/bug-zoo-fresh.md.

Each factory replaces one method on one kvimpl adapter instance, as the zoo's do
(:func:`kvtools.zoo.base.patch`); impl/ is never edited.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvimpl.block_pool import NULL_BLOCK, BlockId
from kvref.adapters.impl import ImplAdapter
from kvspec.config import KVCacheConfig
from kvtools.zoo.base import ZooEntry, bound_args, mutant, patch

FRESH: dict[str, ZooEntry] = {}
"""The fresh set by name, in the order written."""


def fresh(operator: str, description: str) -> Callable[[Callable[[KVCacheConfig], ImplAdapter]], Any]:
    """Register the decorated factory in :data:`FRESH` (``operator``: the mutation's kind)."""

    def register(factory: Callable[[KVCacheConfig], ImplAdapter]) -> Callable[[KVCacheConfig], ImplAdapter]:
        FRESH[factory.__name__] = ZooEntry(factory.__name__, operator, description, factory, "")
        return factory

    return register


def _argument(name: str, attr: str, arg: str, value: Callable[[Any], Any]) -> Callable[[KVCacheConfig], ImplAdapter]:
    """A factory whose adapter's method ``attr`` gets ``value(old)`` for argument ``arg``."""

    def factory(config: KVCacheConfig) -> ImplAdapter:
        m = mutant(config, name)
        orig = getattr(m, attr)

        def call(*args: Any, **kwargs: Any) -> Any:
            bound = bound_args(orig, args, kwargs)
            bound[arg] = value(bound[arg])
            return orig(**bound)

        patch(m, attr, call)
        return m

    factory.__name__ = name
    return factory


def _wrap(name: str, attr: str, on_pool: bool, make: Callable[[Any, Any, ImplAdapter], Any]) -> Any:
    """A factory whose adapter (or its pool) gets ``make(orig, owner, adapter)`` as ``attr``."""

    def factory(config: KVCacheConfig) -> ImplAdapter:
        m = mutant(config, name)
        owner: Any = m.block_pool if on_pool else m
        patch(owner, attr, make(getattr(owner, attr), owner, m))
        return m

    factory.__name__ = name
    return factory


# -- allocate_slots: an argument the scheduler passes is dropped ----------------------------------

lookahead_dropped = fresh("argument dropped", "allocate_slots ignores num_lookahead_tokens (EAGLE's draft slots)")(
    _argument("lookahead_dropped", "allocate_slots", "num_lookahead_tokens", lambda v: 0)
)
watermark_skipped = fresh(
    "argument replaced", "allocate_slots treats every call as has_scheduled_reqs=False, so no watermark applies"
)(_argument("watermark_skipped", "allocate_slots", "has_scheduled_reqs", lambda v: False))
delay_cache_ignored = fresh(
    "argument dropped", "allocate_slots caches the new full blocks even with delay_cache_blocks (connector loads)"
)(_argument("delay_cache_ignored", "allocate_slots", "delay_cache_blocks", lambda v: False))
encoder_tokens_dropped = fresh(
    "argument dropped", "allocate_slots ignores num_encoder_tokens, so cross attention gets no blocks"
)(_argument("encoder_tokens_dropped", "allocate_slots", "num_encoder_tokens", lambda v: 0))
reserve_ignored = fresh("argument dropped", "allocate_slots ignores reserved_blocks in its capacity check")(
    _argument("reserve_ignored", "allocate_slots", "reserved_blocks", lambda v: 0)
)
full_sequence_gate_ignored = fresh(
    "argument dropped",
    "allocate_slots ignores full_sequence_must_fit (admits a sequence that won't fit whole)",
)(_argument("full_sequence_gate_ignored", "allocate_slots", "full_sequence_must_fit", lambda v: False))

# -- bounds off by one ----------------------------------------------------------------------------

cache_blocks_one_short = fresh(
    "off by one", "cache_blocks hashes up to num_computed_tokens - 1, so a block completed exactly is not cached"
)(_argument("cache_blocks_one_short", "cache_blocks", "num_computed_tokens", lambda v: v - 1 if v > 0 else v))
skipped_blocks_one_early = fresh(
    "off by one", "remove_skipped_blocks frees as if one more token were computed (window boundary off by one)"
)(_argument("skipped_blocks_one_early", "remove_skipped_blocks", "total_computed_tokens", lambda v: v + 1))
common_prefix_one_short = fresh("off by one", "get_num_common_prefix_blocks reports one block fewer per group")(
    _wrap(
        "common_prefix_one_short",
        "get_num_common_prefix_blocks",
        False,
        lambda orig, _o, _m: lambda rid: tuple(max(0, n - 1) for n in orig(rid)),
    )
)
evict_skips_last_id = fresh("loop bound", "evict_blocks drops every asked block but the last one")(
    _wrap("evict_skips_last_id", "evict_blocks", True, lambda orig, _o, _m: lambda ids: orig(list(ids)[:-1]))
)
usage_counts_null_block = fresh(
    "off by one", "usage divides by every block, the null block included, instead of the usable ones"
)(
    _wrap(
        "usage_counts_null_block",
        "get_usage",
        True,
        lambda orig, pool, _m: lambda: 1.0 - len(pool.free_queue) / pool.num_gpu_blocks,
    )
)

# -- drains that do not clear, or drop ------------------------------------------------------------


def _sticky(orig: Any, _owner: Any, _m: ImplAdapter) -> Any:
    """A drain whose first result comes back again with the next one."""
    kept: list[Any] = []

    def take() -> Any:
        out = [*kept, *orig()]
        if not kept:
            kept.extend(out)
        else:
            kept.clear()
        return out

    return take


new_block_ids_kept = fresh("drain not cleared", "take_new_block_ids returns its ids a second time on the next call")(
    _wrap("new_block_ids_kept", "take_new_block_ids", False, _sticky)
)
events_repeated = fresh("drain not cleared", "take_events returns the drained events again with the next drain")(
    _wrap("events_repeated", "take_events", False, _sticky)
)
events_lose_last = fresh("drain drops", "take_events drops the last event of each drain")(
    _wrap("events_lose_last", "take_events", False, lambda orig, _o, _m: lambda: orig()[:-1])
)


def _cumulative(orig: Any, _owner: Any, m: ImplAdapter) -> Any:
    def make() -> Any:
        stats = orig()
        m.prefix_cache_stats = stats  # the taken object keeps counting
        return stats

    return make


stats_not_reset = fresh(
    "drain not cleared", "make_prefix_cache_stats hands out its counters without starting new ones (cumulative)"
)(_wrap("stats_not_reset", "make_prefix_cache_stats", False, _cumulative))

# -- units, orders, return values and strictness --------------------------------------------------


def _hits_in_blocks(config: KVCacheConfig) -> ImplAdapter:
    m = mutant(config, "hits_recorded_in_blocks")
    bs = config.groups[0].block_size
    orig = m.record_prefix_cache_stats
    patch(m, "record_prefix_cache_stats", lambda request, num_hits: orig(request, num_hits // bs))
    return m


_hits_in_blocks.__name__ = "hits_recorded_in_blocks"
hits_recorded_in_blocks = fresh("unit confused", "record_prefix_cache_stats records the hit in blocks, not tokens")(
    _hits_in_blocks
)
popped_in_free_order = fresh(
    "order reversed", "pop_blocks_for_free returns the blocks reversed (the order the caller should free them in)"
)(_wrap("popped_in_free_order", "pop_blocks_for_free", False, lambda orig, _o, _m: lambda rid: orig(rid)[::-1]))
deferred_free_sorted = fresh(
    "order lost", "free_blocks (the deferred free) frees the popped blocks in ascending id order"
)(_wrap("deferred_free_sorted", "free_blocks", False, lambda orig, _o, _m: lambda ids: orig(sorted(ids))))
reset_always_succeeds = fresh(
    "return value", "reset_prefix_cache reports success even when it refused (blocks still in use)"
)(_wrap("reset_always_succeeds", "reset_prefix_cache", True, lambda orig, _o, _m: lambda: orig() or True))
block_ids_without_nulls = fresh(
    "filter added", "get_block_ids leaves out the null blocks of skipped (sliding-window) positions"
)(
    _wrap(
        "block_ids_without_nulls",
        "get_block_ids",
        False,
        lambda orig, _o, _m: lambda rid: tuple(tuple(b for b in g if b != NULL_BLOCK) for g in orig(rid)),
    )
)
new_step_ignored = fresh("call dropped", "new_step_starts does nothing (Mamba states cached this step stay unusable)")(
    _wrap("new_step_ignored", "new_step_starts", False, lambda _orig, _o, _m: lambda: None)
)


def _touch_reversed(orig: Any, _owner: Any, _m: ImplAdapter) -> Any:
    return lambda blocks: orig([BlockId(b) for b in reversed(list(blocks))])


touch_reversed = fresh("order reversed", "touch takes the hit blocks off the free queue in reverse order")(
    _wrap("touch_reversed", "touch", True, _touch_reversed)
)
