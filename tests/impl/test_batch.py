"""kvimpl's batched step API against the sequential calls it stands for.

One kvimpl manager runs ``allocate_slots_batch`` / ``free_batch``, an
identical one runs ``allocate_slots`` / ``free`` in the same order, and a
kvspec manager runs the same sequential calls; results, views, events,
new-block ids and statistics must agree after every step, under every
semantics profile (a configuration the profile refuses, or one using a
feature kvimpl does not model yet, is skipped, with the refusal as the
reason).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvimpl.kv_cache_manager import KVCacheManager
from kvref.adapters.impl import make_impl_adapter
from kvspec.config import MLA, AttentionKind, ChunkedLocal, FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.errors import ConfigError, ExceedsMaxModelLenError, InvalidTokenCountError
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.profiles import NEWEST, PROFILES, SemanticsProfile
from kvspec.request import Request, RequestBlockHasher, RequestStatus
from kvspec.view import BlockIds

SHAPES: dict[str, tuple[AttentionKind, ...]] = {
    "full": (FullAttention(4),),
    "full+mla": (FullAttention(4), MLA(8)),
    "full+mla-same-size": (FullAttention(4), MLA(4)),
    "full+swa": (FullAttention(4), SlidingWindow(4, 8)),
    "full+mamba-align": (FullAttention(4), Mamba(4, "align", 1)),
    "mla+swa": (MLA(4), SlidingWindow(4, 6)),
    "swa": (SlidingWindow(4, 6),),
    "chunked": (ChunkedLocal(4, 8),),
}
PREFIXES = ((1, 2, 3, 4, 5, 6, 7, 8), (9, 9, 9, 9, 8, 8, 8, 8))
MAX_LEN = 48


@dataclass
class Pair:
    """The batch side, the sequential side, the spec side, and the request builder."""

    batch: KVCacheManager
    seq: KVCacheManager
    spec: SpecManager
    hasher: RequestBlockHasher
    config: KVCacheConfig

    def sequential(self) -> tuple[KVCacheManager | SpecManager, ...]:
        """The managers that get the per-request calls."""
        return self.seq, self.spec

    def assert_same(self, what: str) -> None:
        self.batch.check_invariants()
        view = self.spec.to_view()
        assert self.batch.to_view() == view, f"{what}: batch view differs from the spec's"
        assert self.seq.to_view() == view, f"{what}: sequential view differs from the spec's"
        for name in ("take_events", "take_new_block_ids", "make_prefix_cache_stats"):
            got_b, got_s, want = (getattr(m, name)() for m in (self.batch, self.seq, self.spec))
            assert got_b == got_s == want, f"{what}: {name}: batch {got_b}, sequential {got_s}, spec {want}"


def make_config(
    profile: SemanticsProfile, groups: tuple[AttentionKind, ...], num_blocks: int, caching: bool, eagle: bool
) -> KVCacheConfig:
    return KVCacheConfig(
        num_blocks=num_blocks,
        groups=groups,
        max_model_len=MAX_LEN,
        enable_caching=caching,
        use_eagle=eagle,
        enable_kv_cache_events=caching,
        log_stats=True,
        profile=profile,
    )


def refusal(profile: SemanticsProfile, groups: tuple[AttentionKind, ...], caching: bool, eagle: bool) -> str | None:
    """Why the profile (or kvimpl: a feature it does not model yet) refuses the configuration, or None."""
    try:
        make_impl_adapter(make_config(profile, groups, 48, caching, eagle))
    except ConfigError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def make_pair(
    groups: tuple[AttentionKind, ...],
    num_blocks: int,
    caching: bool,
    eagle: bool,
    profile: SemanticsProfile | None = None,
) -> Pair:
    config = make_config(profile or NEWEST, groups, num_blocks, caching, eagle)
    hasher = RequestBlockHasher.for_config(config)
    return Pair(KVCacheManager(config), KVCacheManager(config), SpecManager(config), hasher, config)


def admit(pair: Pair, rid: str, prompt: list[int]) -> Request | None:
    """Admit on every side (hits included, recorded in the statistics where the
    profile's scheduler does); the running request, or None if it did not fit."""
    req = pair.hasher.new_request(rid, prompt)
    hits, n = pair.spec.get_computed_blocks(req)
    want = pair.spec.allocate_slots(req, req.num_tokens - n, n, hits)
    for impl in (pair.batch, pair.seq):
        assert impl.get_computed_blocks(req) == (hits, n)
        assert impl.allocate_slots(req, req.num_tokens - n, n, hits) == want
    if want is not None and not pair.config.profile.stats_at_lookup:
        for m in (pair.batch, pair.seq, pair.spec):
            m.record_prefix_cache_stats(req, n)
    pair.assert_same(f"admit {rid}")
    if want is None:
        return None
    running = replace(req, num_computed_tokens=req.num_tokens, status=RequestStatus.RUNNING)
    return pair.hasher.with_output_tokens(running, [len(prompt) % 7])


PROFILE_NAMES = tuple(n for n, p in PROFILES.items() if p.deferred_free and p.new_block_ids_list and p.mamba_step_guard)
"""Profiles whose release has every operation these steps drive (0.16.0 lacks
``pop_blocks_for_free``, ``take_new_block_ids`` and ``new_step_starts``)."""


@pytest.mark.parametrize("caching", [True, False], ids=["caching", "no-caching"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("profile", PROFILE_NAMES)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(eagle=st.booleans(), num_blocks=st.integers(12, 48), data=st.data())
def test_batch_equals_sequential(
    profile: str, shape: str, caching: bool, eagle: bool, num_blocks: int, data: st.DataObject
) -> None:
    prof = PROFILES[profile]
    reason = refusal(prof, SHAPES[shape], caching, False)
    if reason is not None:
        pytest.skip(f"{profile} refuses {shape} ({'caching' if caching else 'no caching'}): {reason}")
    assume(refusal(prof, SHAPES[shape], caching, eagle) is None)  # EAGLE with chunked local is a config error
    pair = make_pair(SHAPES[shape], num_blocks, caching, eagle, prof)
    running: dict[str, Request] = {}
    for i in range(data.draw(st.integers(2, 6), label="requests")):
        prefix = PREFIXES[data.draw(st.integers(0, 1))][: data.draw(st.integers(0, 8))]
        suffix = data.draw(st.lists(st.integers(10, 12), min_size=1, max_size=10))
        req = admit(pair, f"r{i}", [*prefix, *suffix])
        if req is not None:
            running[req.request_id] = req
    for step in range(data.draw(st.integers(1, 8), label="steps")):
        pair.batch.new_step_starts()
        pair.seq.new_step_starts()
        if not running:
            break
        ids = data.draw(st.lists(st.sampled_from(sorted(running)), min_size=1, max_size=8), label="batch")
        reqs, ns, ks = [], [], []
        for rid in ids:
            req = running[rid]
            n = req.num_tokens - req.num_computed_tokens + data.draw(st.integers(0, 2 if eagle else 0))
            if req.num_computed_tokens + n > MAX_LEN:
                continue
            reqs.append(req)
            ns.append(n)
            ks.append(data.draw(st.integers(0, 2)) if eagle else 0)
        if not reqs:
            break
        per_request = data.draw(st.booleans())
        look: int | list[int] = ks if per_request or any(k != ks[0] for k in ks) else ks[0]
        got = pair.batch.allocate_slots_batch(reqs, ns, look)
        for m in pair.sequential():
            want: list[BlockIds | None] = [
                m.allocate_slots(r, n, num_lookahead_tokens=k) for r, n, k in zip(reqs, ns, ks, strict=True)
            ]
            assert got == want, f"step {step}: batch {got} != sequential {want} ({type(m).__module__})"
        pair.assert_same(f"step {step}")
        failed = sorted({r.request_id for r, g in zip(reqs, got, strict=True) if g is None})
        for r in reqs:
            if r.request_id not in failed:
                done = replace(r, num_computed_tokens=r.num_tokens)
                running[r.request_id] = pair.hasher.with_output_tokens(done, [step % 5])
        finished = [rid for rid in sorted(running) if data.draw(st.integers(0, 4)) == 0] + failed
        pair.batch.free_batch(finished)
        for rid in finished:
            for m in pair.sequential():
                m.free(rid)
            running.pop(rid, None)
        pair.assert_same(f"free after step {step}")
        deferred = data.draw(st.booleans(), label="deferred free")
        if running and deferred:
            rid = data.draw(st.sampled_from(sorted(running)))
            popped = {pair.batch.pop_blocks_for_free(rid), *(m.pop_blocks_for_free(rid) for m in pair.sequential())}
            assert len(popped) == 1, f"pop {rid}: {popped}"
            for m in (pair.batch, *pair.sequential()):
                m.free_blocks(list(reversed(next(iter(popped)))))
            running.pop(rid)
            pair.assert_same(f"deferred free of {rid} after step {step}")


def _two_running(shape: str) -> tuple[Pair, Request, Request]:
    pair = make_pair(SHAPES[shape], 32, True, False)
    a = admit(pair, "a", [1, 2, 3, 4, 5])
    b = admit(pair, "b", [1, 2, 3, 4, 6, 7])
    assert a is not None and b is not None
    return pair, a, b


@pytest.mark.parametrize("shape", ["full", "full+swa"])
@pytest.mark.parametrize(
    ("bad_n", "error"),
    [(0, InvalidTokenCountError), (-1, InvalidTokenCountError), (MAX_LEN, ExceedsMaxModelLenError)],
)
def test_one_bad_request_changes_nothing(shape: str, bad_n: int, error: type[Exception]) -> None:
    pair, a, b = _two_running(shape)
    before = pair.batch.to_view()
    with pytest.raises(error):
        pair.batch.allocate_slots_batch([a, b], [1, bad_n])
    with pytest.raises(error):
        pair.seq.allocate_slots(b, bad_n)
    assert pair.batch.to_view() == before
    assert pair.seq.to_view() == before
    pair.assert_same("after the errors")


def test_bad_lookahead_and_lengths_change_nothing() -> None:
    pair, a, b = _two_running("full")
    before = pair.batch.to_view()
    with pytest.raises(InvalidTokenCountError, match="num_lookahead_tokens is -1"):
        pair.batch.allocate_slots_batch([a, b], [1, 1], [0, -1])
    with pytest.raises(InvalidTokenCountError, match="one count per request"):
        pair.batch.allocate_slots_batch([a, b], [1])
    with pytest.raises(InvalidTokenCountError, match="one count per request"):
        pair.batch.allocate_slots_batch([a, b], [1, 1], [0])
    assert pair.batch.to_view() == before


def test_empty_batch_is_a_no_op() -> None:
    pair, _, _ = _two_running("full")
    before = pair.batch.to_view()
    assert pair.batch.allocate_slots_batch([], []) == []
    pair.batch.free_batch([])
    assert pair.batch.to_view() == before
