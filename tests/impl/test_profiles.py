"""kvimpl follows each switch of the semantics profiles exactly as kvspec does.

One case per switch: a release's profile and the same profile with only that
switch flipped (``dataclasses.replace``), a minimal scenario whose outcome
(results, errors, view, events, new-block ids) depends on the switch, and
the check that kvimpl's outcome equals kvspec's under both profiles while the
two outcomes differ. So each case fails if kvimpl ignored its switch (it
would then answer both profiles alike), or if the scenario stopped showing
the switch. Then the impl adapter: it follows every profile kvspec models
and refuses one it does not know, and a configuration that uses a feature
kvspec models and kvimpl does not yet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Any

import pytest

from kvimpl import PROFILE_SWITCHES
from kvimpl.config_rules import unmodelled_features
from kvimpl.kv_cache_manager import KVCacheManager as ImplManager
from kvimpl.native import create_manager, native_module, native_unsupported
from kvref.adapters.impl import (
    IMPL_FEATURES,
    IMPL_PROFILES,
    REFUSED_FEATURE_SWITCHES,
    make_impl_adapter,
    unread_switches,
)
from kvspec import profiles
from kvspec.config import (
    MLA,
    AttentionKind,
    CircularBuffer,
    CrossAttention,
    FullAttention,
    KpoolTail,
    KVCacheConfig,
    Mamba,
    SinkFullAttention,
    SlidingWindow,
)
from kvspec.errors import ConfigError, KVCacheError, UnsupportedByProfileError, UnsupportedOperationError
from kvspec.hashing import ExtraKeySource, LoRA, MultiModalFeature
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.profiles import (
    MODELLED_FEATURES,
    NEWEST,
    PROFILES,
    VLLM_0_17_0,
    VLLM_0_19_1,
    VLLM_0_20_0,
    VLLM_0_21_0,
    VLLM_0_23_0,
    VLLM_0_24_0,
    VLLM_0_25_1,
    VLLM_0_26_0,
    VLLM_0_27_0,
    VLLM_0_28_0,
    VLLM_0_29_0,
    VLLM_0_30_0,
    VLLM_0_31_0,
    VLLM_0_32_0,
    VLLM_0_33_0,
    VLLM_0_34_0,
    SemanticsProfile,
    features_used,
)
from kvspec.request import Request, RequestBlockHasher, RequestStatus

Scenario = Callable[[Any, RequestBlockHasher], object]
"""Runs on a manager (kvspec's or kvimpl's) and returns what it observed."""


@dataclass(frozen=True)
class Case:
    """One switch: ``base`` has the release's value, the flipped profile ``value``."""

    switch: str
    base: SemanticsProfile
    value: Any
    scenario: Scenario
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def flipped(self) -> SemanticsProfile:
        changes: dict[str, Any] = {"name": f"{self.base.name}-{self.switch}-{self.value}", self.switch: self.value}
        return replace(self.base, **changes)


def outcome(make: Callable[[KVCacheConfig], Any], case: Case, profile: SemanticsProfile) -> object:
    """Everything observable of ``case.scenario`` on a manager built by ``make``."""
    kw: dict[str, Any] = {"num_blocks": 32, "max_model_len": 64, **case.config}
    try:
        config = KVCacheConfig(profile=profile, **kw)
    except ConfigError as exc:
        return ("config refused", type(exc).__name__)
    mgr = make(config)
    try:
        got = case.scenario(mgr, RequestBlockHasher.for_config(config))
    except KVCacheError as exc:
        got = ("error", type(exc).__name__)
    mgr.check_invariants()
    new_ids = mgr.take_new_block_ids() if profile.new_block_ids_list else "no take_new_block_ids"
    return got, mgr.to_view(), mgr.take_events(), new_ids


def admit(mgr: Any, req: Request) -> Request:
    """Look up, allocate the whole prompt (with its hits) and return the running request."""
    hits, n = mgr.get_computed_blocks(req)
    got = mgr.allocate_slots(req, req.num_tokens - n, n, hits if n else None)
    assert got is not None, f"admitting {req.request_id} failed"
    return replace(req, num_computed_tokens=req.num_tokens, status=RequestStatus.RUNNING)


# -- scenarios, one per switch ---------------------------------------------------------


def free_order(mgr: Any, h: RequestBlockHasher) -> object:
    """A request with one full and one partial block is freed: where does each go?"""
    admit(mgr, h.new_request("a", [1, 2, 3, 4, 5, 6]))
    mgr.free("a")
    return mgr.to_view().free_queue


def sink_blocks(mgr: Any, h: RequestBlockHasher) -> object:
    """Which blocks the first allocation gets (sink blocks are taken at construction)."""
    return mgr.allocate_slots(h.new_request("a", [1] * 6), 6)


def new_ids_with_cross(mgr: Any, h: RequestBlockHasher) -> object:
    """Fresh blocks of every kind, then which of them take_new_block_ids reports."""
    req = h.new_request("a", [1] * 9)
    return mgr.allocate_slots(req, 9, num_encoder_tokens=8), mgr.take_new_block_ids()


def new_ids(mgr: Any, h: RequestBlockHasher) -> object:
    """One allocation, then which fresh blocks take_new_block_ids reports."""
    return mgr.allocate_slots(h.new_request("a", [1] * 9), 9), mgr.take_new_block_ids()


def mamba_slack(mgr: Any, h: RequestBlockHasher) -> object:
    """remove_skipped_blocks at 9 tokens: does Mamba first subtract its speculative block count?"""
    admit(mgr, h.new_request("a", [1] * 10))
    mgr.remove_skipped_blocks("a", 9)
    return mgr.get_blocks("a")


def in_flight_basis(mgr: Any, h: RequestBlockHasher) -> object:
    """A 12-token sliding-window request steps on with 8 of its tokens still in flight:
    are the window's skipped blocks freed below 12 or below 4 computed tokens?"""
    a = admit(mgr, h.new_request("a", [1] * 13))
    a = replace(a, num_computed_tokens=12, num_in_flight_tokens=8)
    return mgr.allocate_slots(a, 1), mgr.get_blocks("a")


def mamba_retired(mgr: Any, h: RequestBlockHasher) -> object:
    """A Mamba align table [hit state, null, state, state] whose state moved on while its
    tokens were in flight: does removal below 12 tokens step over the null and free the
    hit state too?"""
    a = h.new_request("a", [1] * 8)
    mgr.allocate_slots(a, 4)
    mgr.allocate_slots(replace(a, num_computed_tokens=4), 4)
    mgr.free("a")
    mgr.new_step_starts()
    b = h.new_request("b", [1] * 4 + [3] * 12)
    hits, n = mgr.get_computed_blocks(b)
    assert n == 4, n
    mgr.allocate_slots(b, 8, n, hits)
    # 8 tokens in flight: nothing is skipped yet, and the state moves on past the hit's
    mgr.allocate_slots(replace(b, num_computed_tokens=12, num_in_flight_tokens=8), 2)
    mgr.remove_skipped_blocks("b", 12)
    return mgr.get_blocks("b")


def mamba_align_estimate(mgr: Any, h: RequestBlockHasher) -> object:
    """A request adopts a cached Mamba state without new tokens in a pool with two free blocks:
    the capped estimate (2) fits, the uncapped one (3) does not."""
    admit(mgr, h.new_request("a", [1] * 8))
    mgr.free("a")
    mgr.new_step_starts()
    b = h.new_request("b", [1] * 9)
    hits, n = mgr.get_computed_blocks(b)
    return (hits, n), mgr.allocate_slots(b, 0, n, hits)


def pop_nulls(mgr: Any, h: RequestBlockHasher) -> object:
    """A sliding-window table with three leading nulls is popped and freed later."""
    admit(mgr, h.new_request("a", [1] * 16))
    mgr.remove_skipped_blocks("a", 16)
    popped = mgr.pop_blocks_for_free("a")
    mgr.free_blocks(list(reversed(popped)))
    return popped


def eagle_mamba(mgr: Any, h: RequestBlockHasher) -> object:
    """Hybrid EAGLE search where the Mamba group shrinks the hit: without the switch the
    sliding-window group drops its EAGLE block again on the next pass (hit 4), with it its
    drop stays verified (hit 8). Holes: sliding-window block 10, Mamba blocks 17-19."""
    admit(mgr, h.new_request("a", list(range(25))))
    mgr.evict_blocks([10, 17, 18, 19])
    return mgr.get_computed_blocks(h.new_request("b", list(range(25))))


def eagle_hashed_cap(mgr: Any, h: RequestBlockHasher) -> object:
    """An 8-token request whose two blocks are cached: the EAGLE look-ahead capped by the
    hashed tokens (8) finds both and drops one; capped by num_tokens - 1 it finds one."""
    admit(mgr, h.new_request("a", [2, 2, 1, 1, 1, 1, 2, 1, 2, 2, 2, 2, 1]))
    return mgr.get_computed_blocks(h.new_request("b", [2, 2, 1, 1, 1, 1, 2, 1]))


def eagle_flags(mgr: Any, h: RequestBlockHasher) -> object:
    """A group flagged for EAGLE without use_eagle: does its hit drop a block?"""
    admit(mgr, h.new_request("a", [3] * 12))
    return mgr.get_computed_blocks(h.new_request("b", [3] * 12))


def stats(mgr: Any, h: RequestBlockHasher) -> object:
    """A lookup, then recording it at admission: which one counts?"""
    admit(mgr, h.new_request("a", [1] * 9))
    b = h.new_request("b", [1] * 9)
    _, n = mgr.get_computed_blocks(b)
    try:
        mgr.record_prefix_cache_stats(b, n)
        recorded: object = "recorded"
    except KVCacheError as exc:
        recorded = type(exc).__name__
    return recorded, mgr.make_prefix_cache_stats()


def adopt_hit(mgr: Any, h: RequestBlockHasher) -> object:
    """allocate_slots with 0 new tokens that adopts 8 hit tokens."""
    admit(mgr, h.new_request("a", [1] * 9))
    b = h.new_request("b", [1] * 9)
    hits, n = mgr.get_computed_blocks(b)
    return mgr.allocate_slots(b, 0, n, hits)


def common_prefix(mgr: Any, h: RequestBlockHasher) -> object:
    """Two requests share two blocks."""
    admit(mgr, h.new_request("a", [1] * 9))
    admit(mgr, h.new_request("b", [1] * 10))
    return mgr.get_num_common_prefix_blocks("a"), mgr.get_num_common_prefix_blocks("b")


def must_fit(mgr: Any, h: RequestBlockHasher) -> object:
    """An allocation that asks the whole request to fit first."""
    return mgr.allocate_slots(h.new_request("a", [1] * 9), 9, full_sequence_must_fit=True)


def reserved(mgr: Any, h: RequestBlockHasher) -> object:
    """An allocation that must leave one block free (``reserved_blocks``)."""
    return mgr.allocate_slots(h.new_request("a", [1] * 9), 9, reserved_blocks=1)


def num_cached(mgr: Any, h: RequestBlockHasher) -> object:
    """A read-only probe of ``b``'s cached tokens (vLLM 0.34.0's ``get_num_cached_tokens``)."""
    admit(mgr, h.new_request("a", [1] * 9))
    return mgr.get_num_cached_tokens(h.new_request("b", [1] * 9))


def late_skip(mgr: Any, h: RequestBlockHasher) -> object:
    """``b`` is made reading the cache, then its skip flag is set: which one counts?"""
    admit(mgr, h.new_request("a", [1] * 9))
    return mgr.get_computed_blocks(replace(h.new_request("b", [1] * 9), skip_reading_prefix_cache=True))


def logprob_cap(mgr: Any, h: RequestBlockHasher) -> object:
    """A prompt-logprob request that reads the cache, first scored row 5."""
    admit(mgr, h.new_request("a", [1] * 13))
    b = h.new_request("b", [1] * 13, skip_reading_prefix_cache=False, prompt_logprobs=True, prompt_logprob_start=5)
    return mgr.get_computed_blocks(b)


def hit_bound(mgr: Any, h: RequestBlockHasher) -> object:
    """``b``'s 8 tokens are all cached; a bound of 8 (above ``num_tokens - 1``) and of 5."""
    admit(mgr, h.new_request("a", [1] * 9))
    b = h.new_request("b", [1] * 8)
    return [mgr.get_computed_blocks(b, max_cache_hit_length=bound) for bound in (8, 5)]


def big_token(mgr: Any, h: RequestBlockHasher) -> object:
    """A token id of 2**31 in a prompt."""
    return admit(mgr, h.new_request("a", [1, 2, 1 << 31])).block_hashes


def lora_path(mgr: Any, h: RequestBlockHasher) -> object:
    """Two requests of one LoRA name with different paths: one cache entry or two?"""
    admit(mgr, h.new_request("a", [1] * 9, ExtraKeySource(lora=LoRA("x", 1, "/a"))))
    return mgr.get_computed_blocks(h.new_request("b", [1] * 9, ExtraKeySource(lora=LoRA("x", 1, "/b"))))


def mm_resume(mgr: Any, h: RequestBlockHasher) -> object:
    """Features at [0, 8) and [1, 9); the block completed after construction sees the first
    one too only with the switch, so its cache key changes."""
    mm = ExtraKeySource(mm_features=(MultiModalFeature("A", 0, 8), MultiModalFeature("B", 1, 8)))
    a = admit(mgr, h.new_request("a", [1] * 5, mm))
    a = h.with_output_tokens(a, [2, 3, 4])
    assert mgr.allocate_slots(a, 3) is not None
    return a.block_hashes


def hybrid_hit(mgr: Any, h: RequestBlockHasher) -> object:
    """A hit on a hybrid model (it may be refused for the profile)."""
    admit(mgr, h.new_request("a", [1] * 17))
    return mgr.get_computed_blocks(h.new_request("b", [1] * 17))


def events(mgr: Any, h: RequestBlockHasher) -> object:
    """A salted request's stored events: with or without extra keys and group."""
    admit(mgr, h.new_request("a", [1] * 9, ExtraKeySource(cache_salt="s")))
    return mgr.take_events()


def step_guard(mgr: Any, h: RequestBlockHasher) -> object:
    """A Mamba hit on a state cached in this very step: admitted or not."""
    admit(mgr, h.new_request("a", list(range(9))))
    b = h.new_request("b", [*range(8), 99, 98])
    hits, n = mgr.get_computed_blocks(b)
    return mgr.allocate_slots(b, 2, n, hits)


def partial_tail(mgr: Any, h: RequestBlockHasher) -> object:
    """A 13-token prompt grows to 16 tokens on FA(8): does block 1 also get a
    partial entry at the prompt's tail (12 tokens)?"""
    a = admit(mgr, h.new_request("a", list(range(13))))
    a = h.with_output_tokens(a, [13, 14, 15])
    return mgr.allocate_slots(a, 3)


def fa_tail_below(mgr: Any, h: RequestBlockHasher) -> object:
    """An 8-token prompt on FA(8): its tail at 8 tokens (a block boundary,
    nothing to register) or at 4 (a partial entry on block 0)?"""
    admit(mgr, h.new_request("a", list(range(8))))
    return mgr.get_computed_blocks(h.new_request("b", list(range(8))))


def mamba_tail(mgr: Any, h: RequestBlockHasher) -> object:
    """A held Mamba state evicted, then its owner's next step reaches the
    tail boundary: is the state keyed again, so that a sibling hits it?"""
    a = h.new_request("a", list(range(10)))
    assert mgr.allocate_slots(a, 8) is not None
    a = replace(a, num_computed_tokens=8, status=RequestStatus.RUNNING)
    mgr.new_step_starts()
    mgr.evict_blocks(range(1, 32))
    assert mgr.allocate_slots(a, 2) is not None
    mgr.new_step_starts()
    return mgr.get_computed_blocks(h.new_request("b", [*range(9), 99]))


def mamba_tail_keyed(mgr: Any, h: RequestBlockHasher) -> object:
    """``b`` hits ``a``'s state at the tail boundary and caches up to it; is
    that state marked cached in this step again, refusing ``c``'s same-step hit?"""
    a = h.new_request("a", list(range(10)))
    assert mgr.allocate_slots(a, 8) is not None
    a = replace(a, num_computed_tokens=8, status=RequestStatus.RUNNING)
    mgr.new_step_starts()
    assert mgr.allocate_slots(a, 2) is not None
    mgr.new_step_starts()
    admit(mgr, h.new_request("b", [*range(9), 99]))
    c = h.new_request("c", [*range(9), 98])
    hits, n = mgr.get_computed_blocks(c)
    return mgr.allocate_slots(c, 2, n, hits)


def mamba_tail_eagle(mgr: Any, h: RequestBlockHasher) -> object:
    """EAGLE model, 9-token prompt: the Mamba tail boundary is 8, or one hash
    unit lower (4). After evicting the 4-token state, caching up to 4 keys it
    again only at boundary 4."""
    a = h.new_request("a", list(range(9)))
    assert mgr.allocate_slots(a, 4) is not None
    mgr.new_step_starts()
    mgr.evict_blocks(range(1, 32))
    mgr.cache_blocks(a, 4)
    return mgr.get_computed_blocks(h.new_request("b", [*range(8), 99]))


def operation(name: str) -> Scenario:
    """A scenario calling facade operation ``name`` after one admission."""

    def call(mgr: Any, h: RequestBlockHasher) -> object:
        admit(mgr, h.new_request("a", [1] * 9))
        if name == "allocate_slots":
            return mgr.allocate_slots(h.new_request("b", [2] * 3), 3, has_scheduled_reqs=False)
        args: dict[str, tuple[object, ...]] = {
            "pop_blocks_for_free": ("a",),
            "get_block_ids_for_computed_tokens": ("a", 5),
        }
        return getattr(mgr, name)(*args.get(name, ()))

    call.__name__ = name
    return call


def mm_key(mgr: Any, h: RequestBlockHasher) -> object:
    """A feature ending exactly where the second block starts; prompt embeddings."""
    mm = ExtraKeySource(mm_features=(MultiModalFeature("A", 0, 4),), prompt_embeds=tuple(b"ab" for _ in range(9)))
    return admit(mgr, h.new_request("a", [1] * 9, mm)).block_hashes


def estimate(mgr: Any, h: RequestBlockHasher) -> object:
    """The scheduler's estimate of ``a``'s cached tokens after its admission."""
    return mgr.estimate_cached_tokens(admit(mgr, h.new_request("a", list(range(13)))))


def rezero(mgr: Any, h: RequestBlockHasher) -> object:
    """``a`` is admitted and its listing drained; then its blocks from token 4 on
    are listed for zeroing again (``take_new_block_ids`` in :func:`outcome` shows them)."""
    admit(mgr, h.new_request("a", list(range(13))))
    mgr.take_new_block_ids()
    return mgr.record_blocks_for_zeroing("a", 4)


def zeroing_range(mgr: Any, h: RequestBlockHasher) -> object:
    """``a`` is admitted with 8 tokens a connector loads later; the scheduler
    asks which block ids the load fills (vLLM 0.26.0 to 0.31.0)."""
    mgr.allocate_slots(h.new_request("a", list(range(13))), 5, num_external_computed_tokens=8, delay_cache_blocks=True)
    return mgr.get_zeroing_block_ids_in_range("a", 0, 8)


def skip_zeroing(mgr: Any, h: RequestBlockHasher) -> object:
    """``a`` is admitted with 8 tokens a connector loads later, its full-attention
    group's load destinations kept off the zeroing list (vLLM 0.32.0 on;
    ``take_new_block_ids`` in :func:`outcome` shows what is listed)."""
    request = h.new_request("a", list(range(13)))
    return mgr.allocate_slots(
        request, 5, num_external_computed_tokens=8, delay_cache_blocks=True, skip_zeroing_group_ids=(0,)
    )


def mtp_caching(mgr: Any, h: RequestBlockHasher) -> object:
    """``a`` computes 12 tokens under a drafter look-ahead of 3 (the last 2
    are not cached) and its window keeps 2 more tokens; ``b`` shares 13."""
    admit(mgr, h.new_request("a", list(range(12))))
    mgr.remove_skipped_blocks("a", 12)
    return mgr.get_computed_blocks(h.new_request("b", list(range(13))))


def hashed_only(mgr: Any, h: RequestBlockHasher) -> object:
    """Under look-ahead hashes of one token ``a`` (16 tokens) has 3 block hashes, so
    caching stops at 12 tokens until its next token exists; ``b`` shares 17 tokens."""
    admit(mgr, h.new_request("a", list(range(16))))
    return mgr.get_computed_blocks(h.new_request("b", list(range(17))))


def retained(mgr: Any, h: RequestBlockHasher) -> object:
    """A 70-token prompt under a retention interval: which blocks each group caches
    (the view's cache map)."""
    admit(mgr, h.new_request("a", list(range(70))))
    return None


def reannounced(mgr: Any, h: RequestBlockHasher) -> object:
    """``a`` (9 tokens) is cached and freed; a lookup of ``b`` in report mode
    "full" hits 8 tokens and (where the release has the mode) announces them."""
    admit(mgr, h.new_request("a", list(range(9))))
    mgr.free("a")
    return mgr.get_computed_blocks(h.new_request("b", list(range(9)), kv_cache_report_mode="full"))


def checkpoint(mgr: Any, h: RequestBlockHasher) -> object:
    """A 10-token prompt with a Mamba prefill checkpoint (blocks of 4), computed in one
    chunk, is freed; a longer prompt that shares it is looked up: does the Mamba table
    keep the slot before the running state (the state at 8 tokens), and is it a hit?"""
    a = h.new_request("a", list(range(10)))
    got = mgr.allocate_slots(a, 10)
    table = mgr.get_blocks("a")
    mgr.free("a")
    mgr.new_step_starts()
    return got, table, mgr.get_computed_blocks(h.new_request("b", [*range(10), 7, 7]))


CONNECTOR_HYBRID = (FullAttention(4), Mamba(4, "align"))
"""The hybrid of the connector lookup's cases."""


def connector_lookup(mgr: Any, h: RequestBlockHasher) -> object:
    """``a`` runs 8 then 5 tokens (full attention caches 12, Mamba a state at 8);
    a KV connector's lookup of ``b``, which shares the 13."""
    a = h.new_request("a", list(range(13)))
    mgr.allocate_slots(a, 8)
    mgr.allocate_slots(replace(a, num_computed_tokens=8), 5)
    mgr.cache_blocks(replace(a, num_computed_tokens=13), 13)
    mgr.free("a")
    mgr.new_step_starts()
    return mgr.get_computed_blocks_for_connector(h.new_request("b", [*range(13), 1, 2]))


def truncate_lagging(mgr: Any, h: RequestBlockHasher) -> object:
    """A lookup's lists cut to 12 tokens where the Mamba list ends at 8."""
    return mgr.truncate_computed_blocks(((1, 2, 4), (0, 3)), 12)


def connector_eagle(mgr: Any, h: RequestBlockHasher) -> object:
    """A connector's lookup under EAGLE of a 16-token ``b`` whose 16 tokens are
    cached: without the look-ahead full attention searches 15 and drops a block."""
    admit(mgr, h.new_request("a", list(range(17))))
    mgr.new_step_starts()
    return mgr.get_computed_blocks_for_connector(h.new_request("b", list(range(16))))


def prefix_hint(mgr: Any, h: RequestBlockHasher) -> object:
    """``a`` runs 8 then 9 tokens (Mamba states at 8 and 16); ``b`` shares 12:
    the hint is the uncached common prefix (4) or the boundary (12)."""
    a = h.new_request("a", list(range(17)))
    mgr.allocate_slots(a, 8)
    mgr.allocate_slots(replace(a, num_computed_tokens=8), 9)
    b = h.new_request("b", [*range(12), 99, 98, 97, 96, 95])
    return mgr.get_computed_blocks(b), mgr.get_prefix_hint(b)


def cow_hit(mgr: Any, h: RequestBlockHasher) -> object:
    """``a`` (12 tokens, a Mamba tail inside block 2 of the Mamba group) runs
    one more step, the copies are taken, ``b`` looks up the shared 12 tokens:
    with fine-grained hits the entry moves to a copy and ``b`` hits 12."""
    a = h.new_request("a", list(range(12)))
    first = mgr.allocate_slots(a, 12)
    mgr.new_step_starts()
    second = mgr.allocate_slots(replace(h.with_output_tokens(a, [12]), num_computed_tokens=12), 1)
    try:
        copies: object = mgr.take_kv_cache_block_copies()
    except UnsupportedOperationError:
        copies = "no take_kv_cache_block_copies"
    return first, second, copies, mgr.get_computed_blocks(h.new_request("b", [*range(12), 60]))


def early_return(mgr: Any, h: RequestBlockHasher) -> object:
    """17 of 20 tokens loaded by the connector: the Mamba allocation needs no
    block and returns early; is the request marked as allocated?

    NOTE: under kvspec's rule the owner of a tail entry always keeps its block
    (docs/divergences.md, mamba-cow-owner), and a Mamba align group without
    speculative blocks is the only one that meets this early return on a
    first allocation, so the mark changes no later result; the scenario
    reads the managers' bookkeeping, which both managers name alike."""
    r = h.new_request("r", [0] * 20)
    got = mgr.allocate_slots(r, 3, 0, None, 0, 17)
    return got, sorted(mgr.coordinator.managers[1].allocated_block_reqs)


def swa_mask(mgr: Any, h: RequestBlockHasher) -> object:
    """33 tokens in one step, no lookup (context-parallel SWA lookups refuse):
    which blocks the sliding-window cache mask lets through."""
    return mgr.allocate_slots(h.new_request("a", list(range(33))), 33)


EAGLE_HYBRID = {"groups": (FullAttention(4), SlidingWindow(4, 8)), "use_eagle": True}
TAIL_HYBRID = {"groups": (FullAttention(8), SlidingWindow(4, 4)), "enable_kv_cache_events": True}
MAMBA_TAILS = {"groups": (FullAttention(4), Mamba(4, "align", 0)), "enable_kv_cache_events": True}
COW_HYBRID = {"groups": (FullAttention(4), Mamba(8, "align", 0)), "enable_kv_cache_events": True}
FULL_EVENTS = {"groups": (FullAttention(4),), "enable_kv_cache_events": True}
MAMBA_HYBRID = {"groups": (FullAttention(4), SlidingWindow(4, 8), Mamba(4, "all", 0)), "enable_caching": False}
CASES = [
    Case("partial_tail_entries", VLLM_0_26_0, False, partial_tail, TAIL_HYBRID),
    Case("fa_tail_below_last_token", VLLM_0_32_0, False, fa_tail_below, TAIL_HYBRID),
    Case("mamba_tail_entries", VLLM_0_32_0, False, mamba_tail, MAMBA_TAILS),
    Case("mamba_tail_skip_keyed", VLLM_0_33_0, False, mamba_tail_keyed, MAMBA_TAILS),
    Case("mamba_tail_eagle", VLLM_0_32_0, "none", mamba_tail_eagle, {**MAMBA_TAILS, "use_eagle": True}),
    Case("free_unhashed_first", VLLM_0_25_1, False, free_order, {"groups": (FullAttention(4),)}),
    Case(
        "free_unhashed_needs_caching", VLLM_0_27_0, False, free_order,
        {"groups": (FullAttention(4),), "enable_caching": False},
    ),
    Case("sink_blocks_reserved", VLLM_0_30_0, True, sink_blocks, {"groups": (SinkFullAttention(4, 8),)}),
    Case("new_block_ids", VLLM_0_26_0, "full-mla", new_ids, {"groups": (FullAttention(4),)}),
    Case("new_block_ids", VLLM_0_28_0, "full-mla-with-mamba", new_ids, MAMBA_HYBRID),
    Case(
        "new_block_ids", VLLM_0_28_0, "full-mla-with-mamba", new_ids_with_cross,
        {**MAMBA_HYBRID, "groups": (FullAttention(4), CrossAttention(4), Mamba(4, "all", 0))},
    ),
    Case(
        "mamba_skip_spec_slack", VLLM_0_26_0, True, mamba_slack,
        {"groups": (Mamba(4, "all", 1),), "enable_caching": False},
    ),
    Case(
        "mamba_align_retired_mark", VLLM_0_30_0, False, mamba_retired,
        {"groups": (FullAttention(4), Mamba(4, "align", 0))},
    ),
    Case(
        "mamba_align_estimate_capped", VLLM_0_31_0, False, mamba_align_estimate,
        {"groups": (Mamba(4, "align", 1),), "num_blocks": 3},
    ),
    Case(
        "pop_drops_leading_nulls", VLLM_0_33_0, False, pop_nulls,
        {"groups": (SlidingWindow(4, 4),), "enable_caching": False},
    ),
    Case(
        "mamba_eagle_counts_verified", VLLM_0_26_0, False, eagle_mamba,
        {"groups": (FullAttention(4), SlidingWindow(4, 4), Mamba(4, "all", 0)), "use_eagle": True},
    ),
    Case("eagle_margin_hashed_cap", VLLM_0_32_0, False, eagle_hashed_cap, EAGLE_HYBRID),
    Case(
        "eagle_flags_need_use_eagle", VLLM_0_33_0, False, eagle_flags,
        {"groups": (FullAttention(4),), "eagle_groups": (0,)},
    ),
    Case("stats_at_lookup", VLLM_0_27_0, True, stats, {"groups": (FullAttention(4),), "log_stats": True}),
    Case("adopt_hit_without_new_tokens", VLLM_0_31_0, False, adopt_hit, {"groups": (FullAttention(4),)}),
    Case(
        "lookup_returns_boundary", VLLM_0_26_0, False, prefix_hint,
        {"groups": (FullAttention(4), Mamba(4, "align", 0))},
    ),
    Case(
        "report_mode_full", VLLM_0_26_0, False, reannounced,
        {"groups": (FullAttention(4), SlidingWindow(4, 4)), "enable_kv_cache_events": True},
    ),
    Case("common_prefix", VLLM_0_32_0, "tables", common_prefix, {"groups": (FullAttention(4),)}),
    # without the switch the release refuses the count, so one side of the pair is a refusal
    Case(
        "prefill_checkpoints", VLLM_0_29_0, "none", checkpoint,
        {"groups": (FullAttention(4), Mamba(4, "align", num_prefill_checkpoint_blocks=1))},
    ),
    Case("skip_on_processed_tokens", VLLM_0_26_0, False, in_flight_basis, {"groups": (SlidingWindow(4, 4),)}),
    Case("common_prefix", VLLM_0_34_0, "zero", common_prefix, {"groups": (FullAttention(4),)}),
    Case("num_cached_tokens_op", VLLM_0_34_0, False, num_cached, {"groups": (FullAttention(4),)}),
    Case("hit_limit_at_construction", VLLM_0_34_0, False, late_skip, {"groups": (FullAttention(4),)}),
    Case("prompt_logprobs_hit_cap", VLLM_0_34_0, False, logprob_cap, {"groups": (FullAttention(4),)}),
    Case("hit_length_bound", VLLM_0_34_0, "as-given", hit_bound, {"groups": (FullAttention(4),)}),
    Case("hit_length_bound", VLLM_0_33_0, "absent", hit_bound, {"groups": (FullAttention(4),)}),
    Case("token_ids_int32", VLLM_0_34_0, False, big_token, {"groups": (FullAttention(4),)}),
    Case(
        "extra_keys_tagged", VLLM_0_31_0, False, lora_path,
        {"groups": (FullAttention(4),), "enable_kv_cache_events": True},
    ),
    Case("mm_resume_from_first_feature", VLLM_0_31_0, False, mm_resume, {"groups": (FullAttention(4),)}),
    Case(
        "single_spec_group_hybrid", VLLM_0_29_0, False, hybrid_hit,
        {"groups": (FullAttention(4), FullAttention(4))},
    ),
    Case("mamba_caching_needs_align", VLLM_0_33_0, False, hybrid_hit, {"groups": (Mamba(4, "all", 0),)}),
    Case(  # a release whose fine-grained hits kvspec refuses (a ConfigError), the switch off runs
        "partial_hash_hits", VLLM_0_30_0, False, hybrid_hit,
        {"groups": (FullAttention(4), Mamba(8, "align", 0))},
    ),
    Case("partial_hash_hits", VLLM_0_26_0, False, cow_hit, COW_HYBRID),
    Case(  # the gate off: kvspec refuses the release's assertion (a ConfigError); on: no fine-grained hits
        "partial_hits_gated", VLLM_0_28_0, False, cow_hit,
        {**COW_HYBRID, "groups": (FullAttention(4), SlidingWindow(8, 4), Mamba(8, "align", 0))},
    ),
    Case(
        "cache_mask_hit_alignment", VLLM_0_29_0, False, swa_mask,
        {"groups": (FullAttention(4), Mamba(8, "align", 0), SlidingWindow(4, 2))},
    ),
    Case(
        "mamba_early_return_allocated", VLLM_0_28_0, False, early_return,
        {"groups": (FullAttention(8), Mamba(8, "align", 0), SlidingWindow(4, 1)), "hash_block_size": 4},
    ),
    Case(
        "event_annotations", VLLM_0_25_1, False, events,
        {"groups": (FullAttention(4),), "enable_kv_cache_events": True},
    ),
    Case("mamba_step_guard", VLLM_0_25_1, False, step_guard, {"groups": (Mamba(4, "all", 0),)}),
    Case("circular_buffer_kind", VLLM_0_29_0, False, hybrid_hit, {"groups": (FullAttention(4), CircularBuffer(2))}),
    Case("estimate_cached_tokens_op", VLLM_0_26_0, False, estimate, {"groups": (FullAttention(4),)}),
    Case("record_zeroing_op", VLLM_0_26_0, False, rezero, {"groups": (FullAttention(4), Mamba(4, "align"))}),
    Case("zeroing_range_op", VLLM_0_26_0, False, zeroing_range, {"groups": (FullAttention(4), Mamba(4, "align"))}),
    Case(
        "skip_zeroing_arg", VLLM_0_32_0, False, skip_zeroing,
        {"groups": (FullAttention(4), Mamba(4, "align")), "enable_caching": False},
    ),
    Case("connector_lookup_op", VLLM_0_27_0, False, connector_lookup, {"groups": CONNECTOR_HYBRID}),
    Case(
        "prefill_lookahead", VLLM_0_28_0, False, mtp_caching,
        {"groups": (SlidingWindow(4, 4, extra_retained_tokens=2),), "num_prefill_lookahead": 3},
    ),
    Case("truncate_mamba_lagging", VLLM_0_28_0, False, truncate_lagging, {"groups": CONNECTOR_HYBRID}),
    Case(
        "lookahead_block_hashes", VLLM_0_32_0, True, hashed_only,
        {"groups": (FullAttention(4),), "enable_kv_cache_events": True, "num_hash_lookahead_tokens": 1},
    ),
    Case(
        "per_group_eagle_margin", VLLM_0_32_0, False, connector_eagle,
        {"groups": CONNECTOR_HYBRID, "use_eagle": True},
    ),
    Case(
        "retention_kinds", VLLM_0_24_0, "swa", retained,
        {"groups": (FullAttention(4), SlidingWindow(4, 4), Mamba(4, "all")), "prefix_cache_retention_interval": 8,
         "max_model_len": 128, "num_blocks": 96},
    ),
    Case(
        "retention_boundaries", VLLM_0_30_0, "junction", retained,
        {"groups": (FullAttention(16), SlidingWindow(4, 8)), "use_eagle": True, "prefix_cache_retention_interval": 0,
         "max_model_len": 128, "num_blocks": 64},
    ),
    Case(
        "retention_zero_any_model", VLLM_0_29_0, False, retained,
        {"groups": (FullAttention(4),), "prefix_cache_retention_interval": 0, "max_model_len": 128},
    ),
    Case("estimate_skips_uncacheable", VLLM_0_30_0, False, estimate, {"groups": (FullAttention(4), CircularBuffer(2))}),
    Case("kpool_tail_kind", VLLM_0_30_0, False, hybrid_hit, {"groups": (FullAttention(4), KpoolTail(2, 8))}),
    Case(
        "cp_block_scaling", VLLM_0_33_0, "dcp-pcp", hybrid_hit,
        {"groups": (FullAttention(4),), "dcp_world_size": 2, "pcp_world_size": 2},
    ),
    Case(
        "cp_swa_mask_unscaled", VLLM_0_33_0, True, swa_mask,
        {"groups": (SlidingWindow(4, 5),), "dcp_world_size": 2},
    ),
    Case("eagle_group_flags", VLLM_0_25_1, False, eagle_flags, {"groups": (FullAttention(4),), "eagle_groups": (0,)}),
    Case("admission_controls", VLLM_0_25_1, False, operation("allocate_slots"), {"groups": (FullAttention(4),)}),
    Case("deferred_free", VLLM_0_25_1, False, operation("pop_blocks_for_free"), {"groups": (FullAttention(4),)}),
    Case("new_block_ids_list", VLLM_0_25_1, False, operation("take_new_block_ids"), {"groups": (FullAttention(4),)}),
    Case(
        "computed_block_ids_op", VLLM_0_25_1, False, operation("get_block_ids_for_computed_tokens"),
        {"groups": (FullAttention(4),)},
    ),
    Case("mm_key_with_offset", VLLM_0_25_1, False, mm_key, {"groups": (FullAttention(4),)}),
    Case("prompt_embeds_digest", VLLM_0_25_1, False, mm_key, {"groups": (FullAttention(4),)}),
    Case("coarse_hash_last_fine", VLLM_0_25_1, False, hybrid_hit, {"groups": (FullAttention(4), SlidingWindow(8, 8))}),
    Case(
        "hybrid_cache_reachable_only", VLLM_0_25_1, False, hybrid_hit,
        {"groups": (FullAttention(8), SlidingWindow(4, 4))},
    ),
    Case("hybrid_eagle_lookahead", VLLM_0_25_1, False, hybrid_hit, EAGLE_HYBRID),
    Case(  # the window's block is not the scheduler block: 0.16.0's assertion
        "hybrid_eagle_lookahead", VLLM_0_25_1, False, hybrid_hit,
        {"groups": (FullAttention(8), SlidingWindow(4, 8)), "use_eagle": True},
    ),
    Case("prefix_hint_op", VLLM_0_25_1, False, prefix_hint, {"groups": (FullAttention(4), SlidingWindow(4, 8))}),
    Case("external_cap_any_skip", VLLM_0_25_1, False, hybrid_hit, {"groups": (SlidingWindow(4, 1),)}),
    # the switches of the releases between 0.16.0 and 0.25.1
    Case("event_extra_keys", VLLM_0_17_0, False, events, FULL_EVENTS),
    Case("event_group_idx", VLLM_0_20_0, False, events, FULL_EVENTS),
    Case("skipped_unhashed_first", VLLM_0_23_0, False, free_order, {"groups": (SlidingWindow(4, 8),)}),
    Case(  # the window's block is not the scheduler block: 0.19.1 aligns again where 0.16.0 asserts
        "v016_swa_eagle_realign", VLLM_0_19_1, False, hybrid_hit,
        {"groups": (FullAttention(8), SlidingWindow(4, 8)), "use_eagle": True},
    ),
    Case(
        "hybrid_cache_eagle_reach", VLLM_0_23_0, False, hybrid_hit,
        {"groups": (FullAttention(8), SlidingWindow(4, 4)), "use_eagle": True},
    ),
    Case("full_sequence_arg", VLLM_0_21_0, False, must_fit, {"groups": (FullAttention(4),)}),
    Case("reserved_blocks_arg", VLLM_0_23_0, False, reserved, {"groups": (FullAttention(4),)}),
    Case("new_block_ids", VLLM_0_23_0, "full", new_ids, {"groups": (MLA(4),)}),
]  # fmt: skip

FEATURE_CASES: dict[str, tuple[SemanticsProfile, dict[str, Any]]] = {
    "partial-hash-hits": (VLLM_0_26_0, COW_HYBRID),
}
"""A configuration per state-adding feature kvspec models only for some
releases (fine-grained hits: those of ``PARTIAL_HASH_HITS_CHECKED``), which
the pure-Python manager models too and the native core declines."""


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.switch}-{c.base.release}-{c.scenario.__name__}")
def test_kvimpl_follows_the_switch(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    assert getattr(case.base, case.switch) != case.value, "the case must flip its switch"
    if case.base.name in profiles.PARTIAL_HASH_HITS_CHECKED:  # kvspec models the flipped release's hits too
        monkeypatch.setattr(
            profiles, "PARTIAL_HASH_HITS_CHECKED", profiles.PARTIAL_HASH_HITS_CHECKED | {case.flipped.name}
        )
    seen = {}
    for profile in (case.base, case.flipped):
        want = outcome(SpecManager, case, profile)
        got = outcome(ImplManager, case, profile)
        assert got == want, f"{case.switch} under {profile.name}: kvimpl {got} != kvspec {want}"
        seen[profile.name] = want
    base, flipped = seen.values()
    assert base != flipped, f"the scenario does not show {case.switch}: both profiles give {base}"


def test_every_switch_has_a_case() -> None:
    """Every switch has a case, or belongs to a feature kvimpl refuses."""
    switches = {f.name for f in fields(SemanticsProfile)} - {"name", "release"}
    assert switches == {c.switch for c in CASES} | REFUSED_FEATURE_SWITCHES
    assert switches == PROFILE_SWITCHES | REFUSED_FEATURE_SWITCHES
    assert (MODELLED_FEATURES | {"partial-hash-hits"}) - IMPL_FEATURES == set()
    assert set(FEATURE_CASES) == {"partial-hash-hits"} - MODELLED_FEATURES


@pytest.mark.parametrize("feature", sorted(FEATURE_CASES))
def test_the_adapter_runs_a_feature_kvspec_models_for_some_releases(feature: str) -> None:
    """kvspec runs the configuration; so do the impl adapter and both builds
    of ``create_manager`` (the native core declines it by the feature's name
    and hands it to the pure-Python manager), with kvspec's outcome."""
    profile, kw = FEATURE_CASES[feature]
    config = KVCacheConfig(profile=profile, num_blocks=32, max_model_len=64, **kw)
    assert feature in features_used(config) and feature in IMPL_FEATURES
    assert unmodelled_features(config) == []
    assert feature in (native_unsupported(config) or "")
    case = Case("", profile, None, cow_hit, kw)
    want = outcome(SpecManager, case, profile)
    assert isinstance(want, tuple) and want[0][2] == ([(4, 6)], [4, 6]), want  # the scenario reaches a copy
    assert outcome(make_impl_adapter, case, profile) == want
    for native in (True, False):
        assert type(create_manager(config, native=native)) is ImplManager
        assert outcome(partial(create_manager, native=native), case, profile) == want


def test_the_adapter_follows_every_profile() -> None:
    assert frozenset(PROFILES) == IMPL_PROFILES
    for profile in PROFILES.values():
        config = KVCacheConfig(num_blocks=8, groups=(FullAttention(4),), max_model_len=16, profile=profile)
        assert make_impl_adapter(config).config.profile == profile


@pytest.mark.parametrize(
    ("profile", "why"),
    [
        (replace(VLLM_0_33_0, name="vllm-9.9.9", release="9.9.9"), "not one of kvspec's profiles"),
        (replace(VLLM_0_33_0, common_prefix="tables"), "not one of kvspec's profiles"),
    ],
)
def test_the_adapter_refuses_a_profile_it_does_not_know(profile: SemanticsProfile, why: str) -> None:
    config = KVCacheConfig(num_blocks=8, groups=(FullAttention(4),), max_model_len=16, profile=profile)
    with pytest.raises(UnsupportedByProfileError, match=why):
        make_impl_adapter(config)


def test_the_adapter_refuses_a_switch_kvimpl_does_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A future release adds a switch: until kvimpl reads it, a profile that sets it is refused."""
    monkeypatch.setattr("kvref.adapters.impl.PROFILE_SWITCHES", PROFILE_SWITCHES - {"common_prefix"})
    assert unread_switches(VLLM_0_33_0) == ("common_prefix",)
    assert unread_switches(VLLM_0_31_0) == ()
    config = KVCacheConfig(num_blocks=8, groups=(FullAttention(4),), max_model_len=16, profile=VLLM_0_33_0)
    with pytest.raises(UnsupportedByProfileError, match="does not read common_prefix"):
        make_impl_adapter(config)


@pytest.mark.parametrize(
    ("groups", "feature"),
    [
        ((FullAttention(8), SlidingWindow(4, 8)), "partial-tail-entries"),
        ((FullAttention(4), Mamba(4, "align")), "mamba-tail-entries"),
    ],
)
def test_kvimpl_models_the_tail_features_in_python(groups: tuple[AttentionKind, ...], feature: str) -> None:
    """The pure-Python manager models these under the newest profile and the
    impl adapter runs them; the native core declines them (by the feature's
    name), so both builds give the pure-Python manager, which agrees with kvspec."""
    config = KVCacheConfig(num_blocks=32, groups=groups, max_model_len=64, profile=NEWEST)
    assert feature in features_used(config) and feature in IMPL_FEATURES
    assert unmodelled_features(config) == []
    assert feature in (native_unsupported(config) or "")
    case = Case("", NEWEST, None, hybrid_hit, {"groups": groups, "enable_kv_cache_events": True})
    want = outcome(SpecManager, case, NEWEST)
    for native in (True, False):
        assert type(create_manager(config, native=native)) is ImplManager
        assert outcome(partial(create_manager, native=native), case, NEWEST) == want
    assert make_impl_adapter(config).config == config


RING_CONFIG: dict[str, object] = {
    "num_blocks": 16, "groups": (FullAttention(4), CircularBuffer(2)), "max_model_len": 64, "profile": VLLM_0_30_0,
}  # fmt: skip
PYTHON_ONLY_FEATURES: list[tuple[str, KVCacheConfig]] = [
    *(
        ("ring-kinds", KVCacheConfig(**RING_CONFIG, enable_caching=caching))  # type: ignore[arg-type]  # a test's keyword bag
        for caching in (True, False)
    ),
]
"""Configurations of the features only the pure-Python manager models."""


@pytest.mark.parametrize(("feature", "config"), PYTHON_ONLY_FEATURES, ids=lambda v: v if isinstance(v, str) else "")
def test_python_manager_models_a_feature_the_native_core_declines(feature: str, config: KVCacheConfig) -> None:
    """The pure-Python manager runs the configuration (and the impl adapter
    accepts it); the native core declines it by name, so ``create_manager``
    hands it to the pure-Python manager even when the native build is asked for."""
    assert feature in features_used(config)
    assert unmodelled_features(config) == []
    reason = native_unsupported(config)
    assert reason is not None and (feature in reason or "not built" in reason), reason
    for native in (True, False):
        assert type(create_manager(config, native=native)) is ImplManager
    adapter = make_impl_adapter(config)
    assert hybrid_hit(adapter, RequestBlockHasher.for_config(config)) == hybrid_hit(
        SpecManager(config), RequestBlockHasher.for_config(config)
    )


@pytest.mark.skipif(native_module() is None, reason="the native extension is not built here")
@pytest.mark.parametrize("caching", [True, False])
def test_native_core_runs_one_group_under_cp(caching: bool) -> None:
    """Context parallelism (one group; several without caching up to vLLM 0.25.1, where kvspec models
    them): the core runs it at the managers' scaled block sizes and refuses the lookups the release
    refuses, as kvspec."""
    configs: list[tuple[tuple[AttentionKind, ...], SemanticsProfile]] = [
        ((FullAttention(4),), VLLM_0_33_0),
        ((SlidingWindow(4, 8),), VLLM_0_33_0),
    ]
    if not caching:
        configs.append(((FullAttention(4), SlidingWindow(4, 8)), VLLM_0_25_1))
    for groups, profile in configs:
        config = KVCacheConfig(
            num_blocks=16, groups=groups, max_model_len=64, dcp_world_size=2, enable_caching=caching,
            profile=profile,
        )  # fmt: skip
        assert native_unsupported(config) is None, groups
        native = create_manager(config, native=True)
        assert type(native).__name__ == "NativeKVCacheManager"
        spec = SpecManager(config)
        results = []
        for mgr in (spec, native):
            try:
                results.append(hybrid_hit(mgr, RequestBlockHasher.for_config(config)))
            except KVCacheError as exc:
                results.append(type(exc).__name__)
        assert results[0] == results[1] and spec.to_view() == native.to_view(), (groups, results)
        native.check_invariants()
