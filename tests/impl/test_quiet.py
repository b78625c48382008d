"""kvimpl's quiet-step shortcut against kvspec.

kvimpl answers a running step that changes nothing (no block to take, none
to cache, none leaving the window) from three per-request limits without
calling the coordinator (``StepAPI._set_quiet`` in ``kvimpl.step_api``). These tests drive
kvspec and kvimpl with the same calls, including every call that must drop the
limits (free, pop for a deferred free, an explicit remove_skipped_blocks,
a delayed cache_blocks, a re-used request id, a preempted status under a
watermark), and compare results, views, events, new-block ids and
statistics after each one, under every semantics profile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvimpl.kv_cache_manager import KVCacheManager as ImplManager
from kvspec.config import MLA, AttentionKind, ChunkedLocal, FullAttention, KVCacheConfig, SlidingWindow
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.profiles import NEWEST, PROFILES, SemanticsProfile
from kvspec.request import Request, RequestBlockHasher, RequestStatus

SHAPES: dict[str, tuple[AttentionKind, ...]] = {
    "full": (FullAttention(4),),
    "swa": (SlidingWindow(4, 6),),
    "chunked": (ChunkedLocal(4, 8),),
    "full+swa": (FullAttention(4), SlidingWindow(4, 9)),
    "mla+chunked": (MLA(4), ChunkedLocal(4, 12)),
}
MAX_LEN = 64


class Both:
    """A spec manager and an impl manager fed the same calls."""

    def __init__(
        self,
        groups: tuple[AttentionKind, ...],
        caching: bool,
        eagle: bool,
        watermark: float,
        profile: SemanticsProfile = NEWEST,
    ) -> None:
        config = KVCacheConfig(
            num_blocks=40,
            groups=groups,
            max_model_len=MAX_LEN,
            enable_caching=caching,
            use_eagle=eagle,
            enable_kv_cache_events=caching,
            watermark=watermark,
            log_stats=True,
            profile=profile,
        )
        self.spec = SpecManager(config)
        self.impl = ImplManager(config)
        self.hasher = RequestBlockHasher.for_config(config)
        self.profile = profile

    def call(self, what: str, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn`` on both managers; results, views, events, new-block ids and statistics must agree."""
        want, got = fn(self.spec), fn(self.impl)
        assert got == want, f"{what}: impl {got} != spec {want}"
        self.impl.check_invariants()
        assert self.impl.to_view() == self.spec.to_view(), f"{what}: views differ"
        for name in ("take_events", "take_new_block_ids", "make_prefix_cache_stats"):
            mine, theirs = getattr(self.impl, name)(), getattr(self.spec, name)()
            assert mine == theirs, f"{what}: {name}: impl {mine} != spec {theirs}"
        return got


def _step(req: Request, lookahead: int, manager: Any) -> Any:
    return manager.allocate_slots(req, 1, num_lookahead_tokens=lookahead)


def _decode(both: Both, req: Request, steps: int, lookahead: int, token: int) -> Request:
    """Run ``steps`` one-token running steps; return the request after them."""
    for i in range(steps):
        if req.num_tokens >= MAX_LEN - lookahead:
            break
        got = both.call(f"decode {i}", partial(_step, req, lookahead))
        if got is None:
            break
        req = both.hasher.with_output_tokens(replace(req, num_computed_tokens=req.num_tokens), [token])
    return req


def _admit(both: Both, rid: str, prompt: list[int]) -> Request | None:
    req = both.hasher.new_request(rid, prompt)
    hits, n = both.call(f"lookup {rid}", lambda m: m.get_computed_blocks(req))
    got = both.call(f"admit {rid}", lambda m: m.allocate_slots(req, req.num_tokens - n, n, hits if any(hits) else None))
    if got is None:
        return None
    if not both.profile.stats_at_lookup:
        both.call(f"stats of {rid}", lambda m: m.record_prefix_cache_stats(req, n))
    running = replace(req, num_computed_tokens=req.num_tokens, status=RequestStatus.RUNNING)
    return both.hasher.with_output_tokens(running, [3])


@pytest.mark.parametrize(
    "profile", [n for n, p in PROFILES.items() if p.deferred_free and p.new_block_ids_list]
)  # 0.16.0 lacks pop_blocks_for_free and take_new_block_ids, which these steps call
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=st.sampled_from(sorted(SHAPES)),
    caching=st.booleans(),
    eagle=st.booleans(),
    prompt_len=st.integers(1, 14),
    steps=st.integers(1, 30),
    ending=st.sampled_from(["free", "pop", "remove_skipped", "delayed_cache", "preempted"]),
)
def test_quiet_steps_match_spec(
    profile: str, shape: str, caching: bool, eagle: bool, prompt_len: int, steps: int, ending: str
) -> None:
    assume(not (eagle and any(isinstance(k, ChunkedLocal) for k in SHAPES[shape])))  # a config error
    both = Both(SHAPES[shape], caching, eagle, 0.25 if ending == "preempted" else 0.0, PROFILES[profile])
    lookahead = 2 if eagle else 0
    admitted = _admit(both, "a", [1 + i % 5 for i in range(prompt_len)])
    assert admitted is not None
    req = _decode(both, admitted, steps, lookahead, 7)
    computed = req.num_computed_tokens
    if ending == "free":
        both.call("free", lambda m: m.free("a"))
    elif ending == "pop":
        popped = both.call("pop", lambda m: m.pop_blocks_for_free("a"))
        both.call("deferred free", lambda m: m.free_blocks(list(reversed(popped))))
    elif ending == "remove_skipped":
        both.call("remove_skipped", lambda m: m.remove_skipped_blocks("a", computed))
        req = _decode(both, req, 6, lookahead, 8)
    elif ending == "delayed_cache":
        if req.num_tokens < MAX_LEN - lookahead:
            both.call(
                "delayed", lambda m: m.allocate_slots(req, 1, num_lookahead_tokens=lookahead, delay_cache_blocks=True)
            )
            done = both.hasher.with_output_tokens(replace(req, num_computed_tokens=req.num_tokens), [9])
            if caching:
                both.call("cache_blocks", lambda m: m.cache_blocks(done, done.num_computed_tokens))
            req = _decode(both, done, 6, lookahead, 9)
    elif req.num_tokens < MAX_LEN - lookahead:  # "preempted": the watermark applies, never the shortcut
        pre = replace(req, status=RequestStatus.PREEMPTED)
        both.call("preempted step", lambda m: m.allocate_slots(pre, 1, num_lookahead_tokens=lookahead))
    # The id is re-used by a new request: nothing of the old limits may survive.
    both.call("free again", lambda m: m.free("a"))
    again = _admit(both, "a", [4, 4, 4, 4, 4][:prompt_len] or [4])
    if again is not None:
        _decode(both, again, steps, lookahead, 5)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_quiet_steps_are_taken(shape: str) -> None:
    """The shortcut is used (most one-token decode steps never reach the
    allocation path), so the comparison above exercises it."""
    both = Both(SHAPES[shape], True, False, 0.0)
    req = _admit(both, "a", [1, 2, 3])
    assert req is not None
    busy = 0
    original = both.impl._set_quiet

    def counting(request_id: str) -> None:
        nonlocal busy
        busy += 1
        original(request_id)

    # Every running step that is not quiet ends by setting new limits; count those on this instance only.
    both.impl._set_quiet = counting  # type: ignore[method-assign]  # patching a method of one instance
    start = req.num_tokens
    req = _decode(both, req, 40, 0, 7)
    steps = req.num_tokens - start
    assert steps >= 30
    # Block size 4: a step takes a block or fills one about every other token, plus window moves.
    assert 0 < busy < steps, f"{busy} of {steps} decode steps took the allocation path"
    assert set(both.impl._quiet) == {"a"}
