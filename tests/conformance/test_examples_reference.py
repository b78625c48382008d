"""Executed scenarios of vLLM 0.25.1's KV-cache core, on every target.

Each test is a short scheduler history whose exact results (block ids, free
order, hit lengths, events) were confirmed by running real vLLM 0.25.1: free
order and re-hits, hybrid hit lengths, sliding-window lookups, Mamba and
sliding-window decode, external tokens, admission gates, common prefixes,
cache masks, and a list of sharp edges (hit caps, duplicate keys, table
aliasing, sink blocks, window 1, three-kind hybrids, EAGLE with Mamba).
Only vLLM 0.25.1 behaviour is asserted.
Where the spec deliberately differs from 0.25.1 (``kit/kvref/divergences.toml``), the
test asserts the spec's value on the spec target and vLLM's on the vllm target,
naming the divergence id.

Notation: ``N`` = the null block (id 0), ``h`` = hashed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from kvref.testing import KV, computed
from kvref.testing import make_kv as make_any_kv
from kvspec.config import MLA, AttentionKind, ChunkedLocal, FullAttention, Mamba, SinkFullAttention, SlidingWindow
from kvspec.events import BlockRemoved, BlockStored
from kvspec.hashing import external_block_hash
from kvspec.profiles import VLLM_0_25_1

pytestmark = pytest.mark.semantics(VLLM_0_25_1.name)
"""Every example pins vLLM 0.25.1's behaviour (real vLLM: only that release)."""


def make_kv(target: str, *groups: AttentionKind, **kw: Any) -> KV:
    """:func:`kvref.testing.make_kv` under the 0.25.1 profile."""
    return make_any_kv(target, *groups, profile=VLLM_0_25_1, **kw)


N = 0  # the null block


def stored(events: Sequence[object]) -> list[BlockStored]:
    """The BlockStored events of ``events``."""
    return [e for e in events if isinstance(e, BlockStored)]


def pattern(kv: KV, ids: Sequence[int]) -> str:
    """``h`` for each hashed block of ``ids``, ``-`` otherwise."""
    hashed = kv.hashed()
    return "".join("h" if b in hashed else "-" for b in ids)


# --------------------------------------------------------------------------- free order and re-hits


def test_free_order_and_rehit(target: str) -> None:
    """Free order, then the same prompt hits."""
    kv = make_kv(target, FullAttention(4), num_blocks=8)
    a = kv.req("a", range(14))
    assert kv.a.get_computed_blocks(a) == (((),), 0)
    assert kv.a.allocate_slots(a, 14) == ((1, 2, 3, 4),)
    assert kv.hashed() == {1, 2, 3}
    kv.a.free("a")
    # 4 is unhashed (partial) -> front; 3, 2, 1 are hashed -> tail, in the given (reversed) order.
    assert kv.a.to_view().free_queue == (4, 5, 6, 7, 3, 2, 1)
    b = kv.req("b", range(14))
    hits, n = kv.a.get_computed_blocks(b)
    assert (hits, n) == (((1, 2, 3),), 12)
    assert kv.a.allocate_slots(b, 2, n, hits) == ((4,),)
    assert kv.table("b") == ((1, 2, 3, 4),)


def test_successive_frees_stack_prepends(target: str) -> None:
    """Successive free_blocks calls stack prepends (the last call's unhashed blocks frontmost)."""
    kv = make_kv(target, FullAttention(4), num_blocks=10)
    assert kv.a.allocate_slots(kv.req("a", range(6)), 6) == ((1, 2),)
    assert kv.a.allocate_slots(kv.req("b", range(100, 106)), 6) == ((3, 4),)
    kv.a.free("a")
    assert kv.a.to_view().free_queue == (2, 5, 6, 7, 8, 9, 1)
    kv.a.free("b")
    assert kv.a.to_view().free_queue == (4, 2, 5, 6, 7, 8, 9, 1, 3)


def test_free_and_deferred_free_order_differ(target: str) -> None:
    """Free() frees per group in group order; the popped-then-reversed path is one call."""
    groups: tuple[AttentionKind, ...] = (FullAttention(4), SlidingWindow(4, 8))
    kv = make_kv(target, *groups, num_blocks=10)
    assert kv.a.allocate_slots(kv.req("a", range(10)), 10) == ((1, 2, 3), (4, 5, 6))
    kv.a.free("a")
    assert kv.a.to_view().free_queue == (6, 3, 7, 8, 9, 2, 1, 5, 4)

    kv = make_kv(target, *groups, num_blocks=10)
    assert kv.a.allocate_slots(kv.req("a", range(10)), 10) == ((1, 2, 3), (4, 5, 6))
    popped = kv.a.pop_blocks_for_free("a")
    assert popped == (1, 2, 3, 4, 5, 6)
    kv.a.free_blocks(list(reversed(popped)))
    assert kv.a.to_view().free_queue == (6, 3, 7, 8, 9, 5, 4, 2, 1)


# --------------------------------------------------------------------------- A.2


A2_CASES: list[tuple[str, tuple[AttentionKind, ...], bool, int]] = [
    ("fa+swa8", (FullAttention(4), SlidingWindow(4, 8)), False, 40),
    ("fa+swa8 eagle", (FullAttention(4), SlidingWindow(4, 8)), True, 36),
    ("fa+swa8+swa16 eagle", (FullAttention(4), SlidingWindow(4, 8), SlidingWindow(4, 16)), True, 36),
    ("fa eagle", (FullAttention(4),), True, 36),
    ("swa8 eagle", (SlidingWindow(4, 8),), True, 36),
]


@pytest.mark.parametrize(("groups", "use_eagle", "hit"), [c[1:] for c in A2_CASES], ids=[c[0] for c in A2_CASES])
def test_eagle_across_coordinators(
    target: str, groups: tuple[AttentionKind, ...], use_eagle: bool, hit: int
) -> None:
    """40-token prompt cached, then a 41-token prompt; 0.25.1 hit lengths."""
    kv = make_kv(target, *groups, num_blocks=64, use_eagle=use_eagle)
    prompt = list(range(40))
    assert kv.a.allocate_slots(kv.req("a", prompt), 40) is not None
    hits, n = kv.a.get_computed_blocks(kv.req("b", [*prompt, 999]))
    assert n == hit
    for g, kind in zip(hits, groups, strict=True):
        assert len(g) * kind.block_size == hit


# --------------------------------------------------------------------------- A.3


def swa_lookup(kv: KV, swa_group: int, cached: set[int]) -> tuple[tuple[tuple[int, ...], ...], int, list[int]]:
    """Cache a 41-token prompt, evict the SWA blocks whose index is not in ``cached``
    (indices 0-9: max_length 40 -> 10 blocks), look up the same prompt again.
    Returns the hit, its length and the first request's SWA table."""
    prompt = list(range(41))
    assert kv.a.allocate_slots(kv.req("a", prompt), 41) is not None
    swa = list(kv.table("a")[swa_group])
    kv.a.evict_blocks([swa[i] for i in range(10) if i not in cached])
    hits, n = kv.a.get_computed_blocks(kv.req("b", prompt))
    return hits, n, swa


@pytest.mark.parametrize(
    ("window", "use_eagle", "cached", "nulls", "real", "tokens"),
    [
        (8, False, set(range(8)), 6, [6, 7], 32),
        (8, False, {0, 1, 2, 4, 5, 7}, 4, [4, 5], 24),
        (8, False, {0}, 0, [0], 4),
        (8, True, {0, 1, 2, 4, 5, 6, 7}, 5, [5, 6], 28),
    ],
    ids=["w8 cached 0-7", "w8 cached 0,1,2,4,5,7", "w8 cached 0", "w8 eagle cached 0-2,4-7"],
)
def test_swa_lookup(
    target: str, window: int, use_eagle: bool, cached: set[int], nulls: int, real: list[int], tokens: int
) -> None:
    """SWA lookups (bs 4, max_length 40) as 'nulls + indices of the real blocks'."""
    kv = make_kv(target, SlidingWindow(4, window), num_blocks=16, use_eagle=use_eagle)
    hits, n, swa = swa_lookup(kv, 0, cached)
    assert (hits, n) == (((N,) * nulls + tuple(swa[i] for i in real),), tokens)


def test_swa_lookup_misaligned_run_start(target: str) -> None:
    """W8, align 8, cached 0-6 -> N x4 + idx 4,5 (24; idx 6 is a misaligned run start)."""
    kv = make_kv(target, FullAttention(8), SlidingWindow(4, 8), num_blocks=32)
    hits, n, swa = swa_lookup(kv, 1, set(range(7)))
    fa = kv.table("a")[0]
    assert n == 24
    assert hits == (fa[:3], (N,) * 4 + (swa[4], swa[5]))


def test_swa_eagle_fallback_alignment(target: str) -> None:
    """W13+EAGLE, align 8, cached {0,1,2} -> [] in 0.25.1."""
    kv = make_kv(target, FullAttention(8), SlidingWindow(4, 13), num_blocks=32, use_eagle=True)
    assert kv.config.resolved_hash_block_size() == 4
    hits, n, swa = swa_lookup(kv, 1, {0, 1, 2})
    fa = kv.table("a")[0]
    if not kv.is_vllm:
        # divergence "swa-eagle-fallback": the run at the start (3 blocks) minus the
        # EAGLE block is 2 blocks = 8 tokens, aligned; the spec keeps it.
        assert (hits, n) == ((fa[:1], (swa[0], swa[1])), 8)
    else:
        # vLLM 0.25.1 aligns (3 -> 2), pops the EAGLE block (-> 1), aligns again (-> 0).
        assert (hits, n) == (((), ()), 0)


# --------------------------------------------------------------------------- A.4


def test_mamba_all_decode(target: str) -> None:
    """Mamba all, 10-token prompt, decode @10..@13."""
    kv = make_kv(target, Mamba(4, "all"))
    a = kv.req("a", range(10))
    assert kv.a.allocate_slots(a, 10) == ((1, 2, 3),)
    assert kv.table("a") == ((1, 2, 3),)
    assert kv.hashed() == {1, 2}
    a, _ = kv.decode(a, 100)  # @10
    assert kv.table("a") == ((N, N, 3),)
    assert kv.hashed() == {1, 2}
    a, _ = kv.decode(a, 101)  # @11
    assert kv.table("a") == ((N, N, 3),)
    assert 3 in kv.hashed()
    a, new = kv.decode(a, 102)  # @12
    assert new == ((4,),)
    assert kv.table("a") == ((N, N, 3, 4),)
    a, _ = kv.decode(a, 103)  # @13
    assert kv.table("a") == ((N, N, N, 4),)
    assert 4 not in kv.hashed()


def test_mamba_align_spec0(target: str) -> None:
    """Mamba align, no speculative blocks, prompt in chunks 8+2, decode to @13."""
    kv = make_kv(target, Mamba(4, "align"))
    a = kv.req("a", range(10))
    assert kv.a.allocate_slots(a, 8) == ((N, 1),)  # the returned slice includes the null padding
    assert kv.table("a") == ((N, 1),)
    assert kv.hashed() == {1}
    a = computed(a, 8)
    assert kv.a.allocate_slots(a, 2) == ((2,),)
    assert kv.table("a") == ((N, 1, 2),)
    a, _ = kv.decode(a, 100)  # @10
    assert kv.table("a") == ((N, N, 2),)
    a, _ = kv.decode(a, 101)  # @11
    assert kv.table("a") == ((N, N, 2),)
    assert 2 in kv.hashed()
    a, _ = kv.decode(a, 102)  # @12
    assert kv.table("a") == ((N, N, 2, 3),)
    a, _ = kv.decode(a, 103)  # @13
    assert kv.table("a") == ((N, N, N, 3),)


def test_mamba_align_spec1(target: str) -> None:
    """Mamba align, 1 speculative block; @12 and @13 keep [N,N,2h,3,4]."""
    kv = make_kv(target, Mamba(4, "align", 1))
    a = kv.req("a", range(10))
    assert kv.a.allocate_slots(a, 8) == ((N, 1, 2),)
    a = computed(a, 8)
    assert kv.a.allocate_slots(a, 2) == ((3,),)
    assert kv.table("a") == ((N, 1, 2, 3),)
    a, _ = kv.decode(a, 100)  # @10
    assert kv.table("a") == ((N, N, 2, 3),)
    a, _ = kv.decode(a, 101)  # @11
    a, new = kv.decode(a, 102)  # @12
    assert new == ((4,),)
    assert kv.table("a") == ((N, N, 2, 3, 4),)
    assert 2 in kv.hashed()
    a, _ = kv.decode(a, 103)  # @13: 0.25.1 subtracts the speculative block count -> nothing freed
    assert kv.table("a") == ((N, N, 2, 3, 4),)


def test_swa_chunks(target: str) -> None:
    """Swa(4,8), 20-token prompt in chunks 8+8+4, then decode to @23."""
    kv = make_kv(target, SlidingWindow(4, 8))
    a = kv.req("a", range(20))
    assert kv.a.allocate_slots(a, 8) == ((1, 2),)
    assert kv.hashed() == {1, 2}
    a = computed(a, 8)
    assert kv.a.allocate_slots(a, 8) == ((3, 4),)
    assert kv.table("a") == ((1, 2, 3, 4),)
    assert kv.hashed() == {1, 2, 3, 4}
    a = computed(a, 16)
    assert kv.a.allocate_slots(a, 4) == ((5,),)
    assert kv.table("a") == ((N, N, 3, 4, 5),)
    assert {3, 4, 5} <= kv.hashed()
    a, new = kv.decode(a, 100)  # @20
    assert new == ((6,),)
    assert kv.table("a") == ((N, N, N, 4, 5, 6),)
    assert 6 not in kv.hashed()
    a, _ = kv.decode(a, 101)  # @21
    a, _ = kv.decode(a, 102)  # @22
    a, _ = kv.decode(a, 103)  # @23
    assert kv.table("a") == ((N, N, N, N, 5, 6),)
    assert {5, 6} <= kv.hashed()


def test_fa_mamba_align_and_rehit(target: str) -> None:
    """FA + Mamba(align), 14-token prompt in 8+6, decode; then a 16-token hit."""
    kv = make_kv(target, FullAttention(4), Mamba(4, "align"))
    prompt = list(range(14))
    a = kv.req("a", prompt)
    assert kv.a.allocate_slots(a, 8) == ((1, 2), (N, 3))
    a = computed(a, 8)
    assert kv.a.allocate_slots(a, 6) == ((4, 5), (N, 6))
    assert kv.table("a") == ((1, 2, 4, 5), (N, 3, N, 6))
    assert kv.hashed() == {1, 2, 4, 3}
    a, _ = kv.decode(a, 500)  # @14
    assert kv.table("a") == ((1, 2, 4, 5), (N, N, N, 6))
    a, _ = kv.decode(a, 501)  # @15: 16 tokens known, caches block 3 of both groups
    assert {5, 6} <= kv.hashed()
    kv.a.free("a")
    kv.a.new_step_starts()
    b = kv.req("b", [*prompt, 500, 501, 777])
    assert kv.a.get_computed_blocks(b) == (((1, 2, 4, 5), (N, N, N, 6)), 16)


# --------------------------------------------------------------------------- A.5


def test_issue_33775_hit_plus_external_tokens(target: str) -> None:
    """VLLM issue #33775: hit 12, E=4, N=1 -> ([1,2,3,8,5],[N,N,6,7,4]), all ref_cnt <= 1."""
    kv = make_kv(target, FullAttention(4), SlidingWindow(4, 8), num_blocks=9)
    prompt = list(range(12))
    assert kv.a.allocate_slots(kv.req("a", prompt), 12) == ((1, 2, 3), (4, 5, 6))
    assert kv.a.allocate_slots(kv.req("d", [50, 51, 52]), 3) == ((7,), (8,))
    kv.a.free("a")
    kv.a.free("d")
    assert kv.a.to_view().free_queue == (8, 7, 3, 2, 1, 6, 5, 4)
    b = kv.req("b", [*prompt, 60, 61, 62, 63, 64])
    hits, n = kv.a.get_computed_blocks(b)
    assert n == 12
    assert hits == ((1, 2, 3), (N, 5, 6))
    assert kv.a.allocate_slots(b, 1, n, hits, num_external_computed_tokens=4) == ((5,), (4,))
    assert kv.table("b") == ((1, 2, 3, 8, 5), (N, N, 6, 7, 4))
    assert all(cnt <= 1 for _, cnt in kv.a.to_view().ref_cnt)


# --------------------------------------------------------------------------- A.6


def test_full_sequence_gate(target: str) -> None:
    """NB=8, mnbt=8, 100-token prompt, N=8: fa -> None, swa(4,8) -> allowed (cap 5 <= 7)."""
    prompt = list(range(100))
    fa = make_kv(target, FullAttention(4), num_blocks=8, max_num_batched_tokens=8)
    assert fa.a.allocate_slots(fa.req("a", prompt), 8, full_sequence_must_fit=True) is None
    assert fa.a.to_view().tables == ()
    swa = make_kv(target, SlidingWindow(4, 8), num_blocks=8, max_num_batched_tokens=8)
    assert swa.a.allocate_slots(swa.req("a", prompt), 8, full_sequence_must_fit=True) == ((1, 2),)


def test_watermark(target: str) -> None:
    """Watermark 0.3, NB=10 (3 blocks): 24 tokens fit, 28 -> None unless nothing scheduled."""
    kw = {"num_blocks": 10, "watermark": 0.3}
    kv = make_kv(target, FullAttention(4), **kw)
    assert kv.a.allocate_slots(kv.req("a", [1] * 24), 24) == ((1, 2, 3, 4, 5, 6),)
    kv = make_kv(target, FullAttention(4), **kw)
    assert kv.a.allocate_slots(kv.req("b", [1] * 28), 28) is None
    assert kv.a.allocate_slots(kv.req("b", [1] * 28), 28, has_scheduled_reqs=False) == ((1, 2, 3, 4, 5, 6, 7),)


def test_reserved_blocks(target: str) -> None:
    """28 tokens on NB=10: reserved_blocks=3 -> None, reserved_blocks=2 -> allowed."""
    kv = make_kv(target, FullAttention(4), num_blocks=10)
    req = kv.req("a", [1] * 28)
    assert kv.a.allocate_slots(req, 28, reserved_blocks=3) is None
    assert kv.a.allocate_slots(req, 28, reserved_blocks=2) == ((1, 2, 3, 4, 5, 6, 7),)


def test_mamba_same_step_hit(target: str) -> None:
    """Mamba all, same prompt in the same step -> None; next step -> [N,2,4]."""
    kv = make_kv(target, Mamba(4, "all"))
    assert kv.a.allocate_slots(kv.req("a", range(10)), 10) == ((1, 2, 3),)
    b = kv.req("b", range(10))
    hits, n = kv.a.get_computed_blocks(b)
    assert (hits, n) == (((N, 2),), 8)
    assert kv.a.allocate_slots(b, 2, n, hits) is None
    kv.a.new_step_starts()
    assert kv.a.allocate_slots(b, 2, n, hits) == ((4,),)
    assert kv.table("b") == ((N, 2, 4),)
    assert dict(kv.a.to_view().ref_cnt)[2] == 2


# --------------------------------------------------------------------------- A.7


def common_prefix_setup(kv: KV) -> None:
    """A = 10 tokens -> [1,2,3]; b shares 9 tokens -> [1,2,4]."""
    assert kv.a.allocate_slots(kv.req("a", range(10)), 10) == ((1, 2, 3),)
    b = kv.req("b", [*range(9), 99])
    hits, n = kv.a.get_computed_blocks(b)
    assert (hits, n) == (((1, 2),), 8)
    assert kv.a.allocate_slots(b, 2, n, hits) == ((4,),)
    assert kv.table("b") == ((1, 2, 4),)


def test_common_prefix(target: str) -> None:
    """Tables [1,2,3], [1,2,4] -> common 2; a third unrelated request -> 0."""
    kv = make_kv(target, FullAttention(4))
    common_prefix_setup(kv)
    assert kv.a.get_num_common_prefix_blocks("a") == (2,)
    assert kv.a.allocate_slots(kv.req("c", [50] * 10), 10) == ((5, 6, 7),)
    assert kv.a.get_num_common_prefix_blocks("a") == (0,)


def test_common_prefix_pending_under_report(target: str) -> None:
    """Unrelated request freed, b popped not freed -> vLLM 0 (ref_cnt 2 vs 1 table)."""
    kv = make_kv(target, FullAttention(4))
    common_prefix_setup(kv)
    assert kv.a.allocate_slots(kv.req("c", [50] * 10), 10) == ((5, 6, 7),)
    kv.a.free("c")
    popped = kv.a.pop_blocks_for_free("b")
    assert popped == (1, 2, 4)
    # divergence "common-prefix-pending": the spec counts blocks held by every table
    # (only a's table remains: all 3); vLLM compares ref_cnt (2 with b's pending
    # blocks) with the number of tables (1).
    assert kv.a.get_num_common_prefix_blocks("a") == ((0,) if kv.is_vllm else (3,))
    kv.a.free_blocks(list(reversed(popped)))
    assert kv.a.get_num_common_prefix_blocks("a") == (3,)


def test_common_prefix_pending_over_report(target: str) -> None:
    """Unrelated request allocated, b popped not freed -> vLLM 2 (over-report)."""
    kv = make_kv(target, FullAttention(4))
    common_prefix_setup(kv)
    assert kv.a.allocate_slots(kv.req("c", [50] * 10), 10) == ((5, 6, 7),)
    popped = kv.a.pop_blocks_for_free("b")
    # divergence "common-prefix-pending": no block of a is in c's table -> spec 0;
    # vLLM counts blocks 1, 2 (ref_cnt 2 = a + b's pending reference = 2 tables).
    assert kv.a.get_num_common_prefix_blocks("a") == ((2,) if kv.is_vllm else (0,))
    kv.a.free_blocks(list(reversed(popped)))
    assert kv.a.get_num_common_prefix_blocks("a") == (0,)


# --------------------------------------------------------------------------- A.8


@pytest.mark.parametrize(
    ("use_eagle", "swa_pattern", "swa_tokens"),
    [(False, "--hh--hh--hh--hh", 64), (True, "--hhh-hhh-hhh-hhh", 68)],
    ids=["no eagle", "eagle"],
)
def test_swa_cache_mask(target: str, use_eagle: bool, swa_pattern: str, swa_tokens: int) -> None:
    """BlockStored token_ids span unstored blocks: fa(16)+swa(4,8), 70 tokens."""
    kv = make_kv(
        target, FullAttention(16), SlidingWindow(4, 8), num_blocks=32, use_eagle=use_eagle, enable_kv_cache_events=True
    )
    assert kv.config.scheduler_block_size == 16
    a = kv.req("a", range(70))
    assert kv.a.allocate_slots(a, 70) is not None
    fa, swa = kv.table("a")
    assert (len(fa), len(swa)) == (5, 18)
    assert pattern(kv, fa) == "hhhh-"
    assert pattern(kv, swa) == swa_pattern + "-" * (18 - len(swa_pattern))
    fa_ev, swa_ev = stored(kv.a.take_events())
    assert (fa_ev.group_idx, len(fa_ev.block_hashes), fa_ev.token_ids) == (0, 4, tuple(range(64)))
    assert (swa_ev.group_idx, len(swa_ev.block_hashes)) == (1, swa_pattern.count("h"))
    assert swa_ev.token_ids == tuple(range(swa_tokens))
    expected = [external_block_hash(a.block_hashes[i], True) for i, c in enumerate(swa_pattern) if c == "h"]
    assert list(swa_ev.block_hashes) == expected


@pytest.mark.parametrize(
    ("retention", "use_eagle", "swa_cached"),
    [
        (0, False, [14, 15]),
        (32, False, [6, 7, 14, 15]),
        (0, True, [14, 15, 16]),
        (32, True, [6, 7, 8, 14, 15, 16]),
    ],
    ids=["retention 0", "retention 32", "retention 0 eagle", "retention 32 eagle"],
)
def test_swa_cache_mask_retention(target: str, retention: int, use_eagle: bool, swa_cached: list[int]) -> None:
    """The same prompt under a retention interval (upstream the environment
    variable ``VLLM_PREFIX_CACHE_RETENTION_INTERVAL``): 0 keeps only the
    blocks a replay of the prompt reads (ending at 64, the last scheduler-block
    boundary below its last token), 32 also those a hit ending at 32 reads;
    full attention is not thinned."""
    kv = make_kv(
        target, FullAttention(16), SlidingWindow(4, 8), num_blocks=32, use_eagle=use_eagle,
        prefix_cache_retention_interval=retention,
    )  # fmt: skip
    a = kv.req("a", range(70))
    assert kv.a.allocate_slots(a, 70) is not None
    fa, swa = kv.table("a")
    hashed = kv.hashed()
    assert pattern(kv, fa) == "hhhh-"
    assert [i for i, b in enumerate(swa) if b in hashed] == swa_cached


def test_mamba_cache_mask_retention(target: str) -> None:
    """Mamba ``all`` mode under retention 8 (two blocks of 4): the states
    ending on a multiple of 8 and the replay state (ending at 24, the last
    block boundary at or below the prompt's last token, 25); without
    retention every block."""
    for retention, cached in ((None, [0, 1, 2, 3, 4, 5]), (8, [1, 3, 5])):
        kv = make_kv(
            target, FullAttention(4), Mamba(4, "all"), num_blocks=32, prefix_cache_retention_interval=retention
        )
        a = kv.req("a", range(26))
        assert kv.a.allocate_slots(a, 26) is not None
        hashed = kv.hashed()
        assert [i for i, b in enumerate(kv.table("a")[1]) if b in hashed] == cached, retention


# --------------------------------------------------------------------------- sharp edges


def test_chunked_local_hit_without_lookups(target: str) -> None:
    """Empty cache, 17-token prompt, chunk 8, bs 4 -> a 16-token hit of nulls."""
    kv = make_kv(target, ChunkedLocal(4, 8))
    req = kv.req("a", range(17))
    hits, n = kv.a.get_computed_blocks(req)
    assert (hits, n) == (((N, N, N, N),), 16)
    assert kv.a.allocate_slots(req, 1, n, hits) == ((1,),)
    assert kv.table("a") == ((N, N, N, N, 1),)


def test_hybrid_caches_up_to_scheduler_block(target: str) -> None:
    """Hybrid cache_blocks only hashes up to the scheduler block size; unitary all."""
    kv = make_kv(target, FullAttention(4), SlidingWindow(8, 16))
    assert kv.config.scheduler_block_size == 8
    assert kv.a.allocate_slots(kv.req("a", range(12)), 12) == ((1, 2, 3), (4, 5))
    assert kv.hashed() == {1, 2, 4}
    unitary = make_kv(target, FullAttention(4))
    assert unitary.a.allocate_slots(unitary.req("a", range(12)), 12) == ((1, 2, 3),)
    assert unitary.hashed() == {1, 2, 3}


def test_duplicate_blocks_under_one_key(target: str) -> None:
    """Two requests computing the same blocks -> two entries per key, two BlockStored."""
    kv = make_kv(target, FullAttention(4), enable_kv_cache_events=True)
    prompt = list(range(8))
    a = kv.req("a", prompt)
    assert kv.a.allocate_slots(a, 8) == ((1, 2),)
    assert kv.a.allocate_slots(kv.req("b", prompt), 8) == ((3, 4),)
    assert sorted(ids for _, ids in kv.a.to_view().cached) == [(1, 3), (2, 4)]
    events = kv.a.take_events()
    assert len(events) == 2
    first, second = stored(events)
    assert first.block_hashes == second.block_hashes
    assert first.block_hashes == tuple(external_block_hash(h, True) for h in a.block_hashes)
    c = kv.req("c", [*prompt, 8])
    assert kv.a.get_computed_blocks(c) == (((1, 2),), 8)  # the oldest entry
    kv.a.evict_blocks([1])
    assert kv.a.take_events() == [BlockRemoved((external_block_hash(a.block_hashes[0], True),), "GPU", 0)]
    assert kv.a.get_computed_blocks(c) == (((3, 2),), 8)  # the oldest surviving one


def test_results_are_snapshots(target: str) -> None:
    """vLLM aliases live tables; adapters return snapshots, later calls see the growth."""
    kv = make_kv(target, FullAttention(4))
    a = kv.req("a", range(4))
    first = kv.a.allocate_slots(a, 4)
    before = kv.table("a")
    a = computed(kv.out(a, 4, 5, 6, 7), 4)
    assert kv.a.allocate_slots(a, 4) == ((2,),)
    assert first == before == ((1,),)
    assert kv.table("a") == ((1, 2),)


def test_sink_full_attention(target: str) -> None:
    """Sink blocks come from the queue head and are never returned."""
    kv = make_kv(target, SinkFullAttention(4, 8), num_blocks=10)
    # divergence "sinkfull-ctor": vLLM 0.25.1 cannot construct the manager (TypeError);
    # the vLLM adapter applies its documented constructor shim, then behaviour matches.
    assert kv.workaround == ("sinkfull-ctor" if kv.is_vllm else None)
    assert kv.a.to_view().free_queue == (3, 4, 5, 6, 7, 8, 9)
    assert kv.a.usage == pytest.approx(2 / 9)
    assert kv.a.allocate_slots(kv.req("a", range(9)), 9) == ((3, 4, 5),)
    kv.a.free("a")
    assert kv.a.to_view().free_queue == (5, 6, 7, 8, 9, 4, 3)
    assert kv.a.reset_prefix_cache() is False


def test_window_one_is_never_hashed(target: str) -> None:
    """Sliding_window 1 -> nothing hashed, still one BlockStored per call."""
    kv = make_kv(target, SlidingWindow(4, 1), enable_kv_cache_events=True)
    a = kv.req("a", range(12))
    assert kv.a.allocate_slots(a, 12) == ((1, 2, 3),)
    assert kv.a.to_view().cached == ()
    events = kv.a.take_events()
    assert len(events) == 1
    (ev,) = stored(events)
    assert (ev.block_hashes, ev.token_ids, ev.extra_keys) == ((), tuple(range(12)), None)
    assert kv.a.get_computed_blocks(kv.req("b", range(13))) == (((),), 0)


def test_second_full_type_group(target: str) -> None:
    """FA + MLA + SWA -> hit 32 tokens; vLLM returns 10 MLA blocks."""
    kv = make_kv(target, FullAttention(4), MLA(4), SlidingWindow(4, 8), num_blocks=48)
    prompt = list(range(41))
    assert kv.a.allocate_slots(kv.req("a", prompt), 41) is not None
    fa, mla, swa = kv.table("a")
    kv.a.evict_blocks([swa[8], swa[9]])
    hits, n = kv.a.get_computed_blocks(kv.req("b", prompt))
    assert n == 32
    assert hits[0] == fa[:8]
    assert hits[2] == (N,) * 6 + (swa[6], swa[7])
    # divergence "second-full-group": vLLM trims only the first full-type spec group.
    assert hits[1] == (mla[:10] if kv.is_vllm else mla[:8])


def test_eagle_mamba_hit(target: str) -> None:
    """FA+Mamba, EAGLE, no group flagged, 16 cached: vLLM hit 16, 3 FA blocks."""
    kv = make_kv(target, FullAttention(4), Mamba(4, "all"), use_eagle=True)
    prompt = list(range(17))
    assert kv.a.allocate_slots(kv.req("a", prompt), 17) == ((1, 2, 3, 4, 5), (6, 7, 8, 9, 10))
    assert kv.hashed() == {1, 2, 3, 4, 6, 7, 8, 9}
    kv.a.new_step_starts()
    hits, n = kv.a.get_computed_blocks(kv.req("b", prompt))
    if not kv.is_vllm:
        # divergence "eagle-mamba-hit": every group's list covers exactly the hit.
        assert (hits, n) == (((1, 2, 3), (N, N, 8)), 12)
    else:
        # vLLM 0.25.1: the Mamba group takes the EAGLE look-ahead but never drops.
        assert (hits, n) == (((1, 2, 3), (N, N, N, 9)), 16)
