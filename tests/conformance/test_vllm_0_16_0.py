"""The vLLM 0.16.0 semantics profile: small scenarios with exact block ids,
each run on kvspec, on kvimpl's pure-Python manager and, when vLLM 0.16.0 is
installed, on real vLLM through kvref's adapter (skipped otherwise)."""

from __future__ import annotations

from typing import Any

import pytest

from kvimpl.kv_cache_manager import KVCacheManager as ImplManager
from kvimpl.request import RequestHasher
from kvspec.config import ChunkedLocal, FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.errors import EagleAlignmentLookupError, UnsupportedByProfileError, UnsupportedOperationError
from kvspec.events import BlockRemoved, BlockStored
from kvspec.hashing import ExtraKeySource, MultiModalFeature, block_extra_keys
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.profiles import VLLM_0_16_0, VLLM_0_25_1
from kvspec.request import RequestBlockHasher


def _vllm_0_16_0() -> bool:
    try:
        from kvref.adapters.vllm import installed_vllm_version  # noqa: PLC0415 - optional dependency
    except ImportError:
        return False
    return installed_vllm_version() == "0.16.0"


SIDES = ("spec", "impl")
ALL_SIDES = [*SIDES, pytest.param("vllm", marks=pytest.mark.skipif(not _vllm_0_16_0(), reason="needs vLLM 0.16.0"))]


def build(side: str, config: KVCacheConfig) -> tuple[Any, Any]:
    """A manager of ``side`` and the request factory that goes with it."""
    if side == "spec":
        return SpecManager(config), RequestBlockHasher.for_config(config)
    if side == "impl":
        return ImplManager(config), RequestHasher.for_config(config, native=False)
    from kvref.adapters.vllm import make_vllm_adapter  # noqa: PLC0415 - only with vLLM installed

    return make_vllm_adapter(config), RequestBlockHasher.for_config(config)


def fa4(**kw: Any) -> KVCacheConfig:
    """FullAttention(4) with 8 blocks under 0.16.0."""
    args: dict[str, Any] = {"num_blocks": 8, "groups": (FullAttention(4),), "max_model_len": 64, **kw}
    return KVCacheConfig(profile=VLLM_0_16_0, **args)


@pytest.mark.parametrize("side", ALL_SIDES)
def test_freed_blocks_all_go_to_the_tail(side: str) -> None:
    """10 tokens take blocks 1-3 and cache 1 and 2; freeing appends all three
    (last first) to the tail, the unhashed block 3 included."""
    mgr, hasher = build(side, fa4())
    a = hasher.new_request("a", list(range(10)))
    assert mgr.allocate_slots(a, 10) == ((1, 2, 3),)
    mgr.free("a")
    assert mgr.to_view().free_queue == (4, 5, 6, 7, 3, 2, 1)


@pytest.mark.parametrize("side", ALL_SIDES)
def test_events_have_no_extra_keys_or_group(side: str) -> None:
    """Stored and removed events carry neither the group index nor extra keys."""
    mgr, hasher = build(side, fa4(enable_kv_cache_events=True, num_blocks=3))
    salted = hasher.new_request("a", list(range(4)), ExtraKeySource(cache_salt="s"))
    mgr.allocate_slots(salted, 4)
    mgr.free("a")
    other = hasher.new_request("b", [9] * 8)
    mgr.allocate_slots(other, 8)  # takes both free blocks: evicts a's cached block
    events = mgr.take_events()
    stored = [e for e in events if isinstance(e, BlockStored)]
    removed = [e for e in events if isinstance(e, BlockRemoved)]
    assert stored and removed
    assert all(e.group_idx is None and e.extra_keys is None and e.kv_cache_spec_kind is None for e in stored)
    assert all(e.group_idx is None for e in removed)


def test_multimodal_key_is_the_identifier_closed_at_the_end() -> None:
    """A feature at [2, 8) keys blocks [0,4), [4,8) and also [8,12), which
    starts exactly at its end; 0.25.1 keys only the overlapping blocks, with
    the offset."""
    src = ExtraKeySource(mm_features=(MultiModalFeature("img1", 2, 6),))
    old = [block_extra_keys(src, s, s + 4, 0, v025_forms=False)[0] for s in (0, 4, 8, 12)]
    new = [block_extra_keys(src, s, s + 4, 0)[0] for s in (0, 4, 8, 12)]
    assert old == [("img1",), ("img1",), ("img1",), None]
    assert new == [(("img1", 2),), (("img1", -2),), None, None]


def test_prompt_embeds_key_is_the_raw_bytes() -> None:
    """The prompt-embedding key of a block is its rows' bytes, not their digest."""
    rows = tuple(bytes([i, 0, i, 1]) for i in range(4))
    src = ExtraKeySource(prompt_embeds=rows)
    assert block_extra_keys(src, 0, 4, 0, v025_forms=False)[0] == (b"".join(rows),)
    assert len(block_extra_keys(src, 0, 4, 0)[0][0]) == 32  # type: ignore[index]  # one key, a digest


@pytest.mark.parametrize("side", ALL_SIDES)
@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.pop_blocks_for_free("a"),
        lambda m: m.take_new_block_ids(),
        lambda m: m.new_step_starts(),
    ],
    ids=["pop_blocks_for_free", "take_new_block_ids", "new_step_starts"],
)
def test_missing_operations_raise(side: str, call: Any) -> None:
    """Operations 0.16.0 does not have are refused, not emulated."""
    mgr, _ = build(side, fa4())
    with pytest.raises(UnsupportedOperationError, match=r"0\.16\.0"):
        call(mgr)


@pytest.mark.parametrize("side", ALL_SIDES)
@pytest.mark.parametrize(
    "kw", [{"full_sequence_must_fit": True}, {"reserved_blocks": 1}, {"has_scheduled_reqs": False}]
)
def test_admission_arguments_are_refused(side: str, kw: dict[str, Any]) -> None:
    """``allocate_slots`` has no admission arguments in 0.16.0; nothing changes."""
    mgr, hasher = build(side, fa4())
    before = mgr.to_view()
    with pytest.raises(UnsupportedOperationError):
        mgr.allocate_slots(hasher.new_request("a", [1, 2, 3]), 3, **kw)
    assert mgr.to_view() == before


@pytest.mark.parametrize(
    "kw",
    [
        {"watermark": 0.1},
        {"max_num_batched_tokens": 8},
        {"eagle_groups": (0,)},
        {"groups": (SlidingWindow(4, 1),)},
        {"groups": (ChunkedLocal(4, 2),), "enable_caching": False},
    ],
)
def test_configurations_refused(kw: dict[str, Any]) -> None:
    """Options 0.16.0 lacks, and rules kvspec does not model for it, are refused."""
    args: dict[str, Any] = {"num_blocks": 8, "groups": (FullAttention(4),), "max_model_len": 64, **kw}
    with pytest.raises(UnsupportedByProfileError, match=r"vllm-0\.16\.0"):
        KVCacheConfig(profile=VLLM_0_16_0, **args)
    KVCacheConfig(profile=VLLM_0_25_1, **args)


def test_hybrid_without_caching_is_modelled() -> None:
    """A hybrid without caching takes its blocks group by group."""
    cfg = KVCacheConfig(
        num_blocks=20, groups=(FullAttention(4), SlidingWindow(4, 8)), max_model_len=64,
        enable_caching=False, profile=VLLM_0_16_0,
    )  # fmt: skip
    for side in SIDES:
        mgr, hasher = build(side, cfg)
        assert mgr.allocate_slots(hasher.new_request("a", list(range(17))), 17) == ((1, 2, 3, 4, 5), (6, 7, 8, 9, 10))


def hybrid(*groups: Any, **kw: Any) -> KVCacheConfig:
    """A cached hybrid of 24 blocks under 0.16.0."""
    return KVCacheConfig(profile=VLLM_0_16_0, num_blocks=24, groups=groups, max_model_len=64, **kw)


def _hit_after_17(side: str, cfg: KVCacheConfig) -> tuple[Any, Any]:
    """``a`` (17 tokens) is allocated and cached; the lookup of ``b``, which
    shares those 17 tokens and has one more, and the manager."""
    mgr, hasher = build(side, cfg)
    mgr.allocate_slots(hasher.new_request("a", list(range(17))), 17)
    return mgr.get_computed_blocks(hasher.new_request("b", [*range(17), 99])), mgr


@pytest.mark.parametrize("side", ALL_SIDES)
def test_coarse_block_key_is_the_concatenation_of_its_fine_hashes(side: str) -> None:
    """FA(4) + SWA(8): the hash block is 4, so each SWA block covers two fine
    hashes; 0.16.0 keys it by both, concatenated (0.25.1: by the second)."""
    cfg = hybrid(FullAttention(4), SlidingWindow(8, 8))
    mgr, hasher = build(side, cfg)
    a = hasher.new_request("a", list(range(17)))
    assert mgr.allocate_slots(a, 17) == ((1, 2, 3, 4, 5), (6, 7, 8))
    cached = dict(mgr.to_view().cached)
    h = a.block_hashes
    assert cached[h[0] + h[1] + (1).to_bytes(4, "big")] == (6,)
    assert cached[h[2] + h[3] + (1).to_bytes(4, "big")] == (7,)
    assert h[1] + (1).to_bytes(4, "big") not in cached


@pytest.mark.parametrize("side", ALL_SIDES)
def test_every_full_block_of_a_window_group_is_cached(side: str) -> None:
    """FA(8) + SWA(4, window 4): 0.16.0 caches all four full SWA blocks of a
    17-token prompt (0.25.1 only the two a hit ending on the scheduler block
    of 8 can use); the hit of 16 tokens needs only the last one."""
    (hit, n), mgr = _hit_after_17(side, hybrid(FullAttention(8), SlidingWindow(4, 4)))
    assert (hit, n) == (((1, 2), (0, 0, 0, 7)), 16)
    window_entries = sorted(ids for key, ids in mgr.to_view().cached if key[-4:] == (1).to_bytes(4, "big"))
    assert window_entries == [(4,), (5,), (6,), (7,)]


@pytest.mark.parametrize("side", ALL_SIDES)
def test_eagle_in_a_simple_hybrid_drops_once(side: str) -> None:
    """FA(4) + SWA(4, window 8) under EAGLE: full attention finds 16 tokens and
    drops one block (12); the window group, searching within 12, drops its
    last block too (8); a two-kind hybrid with full attention first stops
    after one pass (0.25.1's look-ahead keeps 12)."""
    (hit, n), _ = _hit_after_17(side, hybrid(FullAttention(4), SlidingWindow(4, 8), use_eagle=True))
    assert (hit, n) == (((1, 2), (6, 7)), 8)


@pytest.mark.parametrize("side", ALL_SIDES)
def test_eagle_in_a_three_kind_hybrid_spirals_to_no_hit(side: str) -> None:
    """FA + SWA + Mamba under EAGLE: every pass asks the window group again
    and it drops a block each time, so the fixed point is 0 tokens (16
    without EAGLE)."""
    kinds = (FullAttention(4), SlidingWindow(4, 8), Mamba(4, "all"))
    (hit, n), _ = _hit_after_17(side, hybrid(*kinds))
    assert (hit, n) == (((1, 2, 3, 4), (0, 0, 8, 9), (0, 0, 0, 14)), 16)
    (hit, n), _ = _hit_after_17(side, hybrid(*kinds, use_eagle=True))
    assert (hit, n) == (((), (), ()), 0)


@pytest.mark.parametrize("side", ALL_SIDES)
def test_eagle_window_hit_off_the_scheduler_block_fails(side: str) -> None:
    """FA(8) + SWA(4, window 8) under EAGLE: the window group finds a hit but
    its block (4) is not the scheduler block (8); 0.16.0 fails an assertion,
    a typed error here, and nothing changes."""
    mgr, hasher = build(side, hybrid(FullAttention(8), SlidingWindow(4, 8), use_eagle=True))
    mgr.allocate_slots(hasher.new_request("a", list(range(17))), 17)
    before = mgr.to_view()
    with pytest.raises(EagleAlignmentLookupError):
        mgr.get_computed_blocks(hasher.new_request("b", [*range(17), 99]))
    assert mgr.to_view() == before


@pytest.mark.parametrize("side", SIDES)
def test_no_prefix_hint(side: str) -> None:
    """0.16.0's scheduler reads no prefix hint: the operation does not exist."""
    mgr, hasher = build(side, hybrid(FullAttention(4), SlidingWindow(4, 8)))
    b = hasher.new_request("b", list(range(9)))
    mgr.get_computed_blocks(b)
    with pytest.raises(UnsupportedOperationError):
        mgr.get_prefix_hint(b)


@pytest.mark.parametrize("side", ALL_SIDES)
def test_mamba_state_cached_this_step_is_usable_at_once(side: str) -> None:
    """Mamba(4, all): a's state at 8 tokens is cached while a allocates; b,
    sharing 8 tokens, hits it and is admitted in the same step (0.25.1 waits
    for ``new_step_starts``)."""
    cfg = KVCacheConfig(num_blocks=10, groups=(Mamba(4, "all"),), max_model_len=64, profile=VLLM_0_16_0)
    mgr, hasher = build(side, cfg)
    assert mgr.allocate_slots(hasher.new_request("a", list(range(9))), 9) == ((1, 2, 3),)
    b = hasher.new_request("b", [*range(8), 99, 98])
    hit, n = mgr.get_computed_blocks(b)
    assert (hit, n) == (((0, 2),), 8)
    assert mgr.allocate_slots(b, 2, 8, hit) == ((4,),)


def test_profile_reads_oldest_first() -> None:
    """0.25.1 is the dataclass defaults, built from 0.16.0."""
    from kvspec.profiles import PROFILES, SemanticsProfile  # noqa: PLC0415 - local to this check

    assert next(iter(PROFILES)) == "vllm-0.16.0"
    assert SemanticsProfile("vllm-0.25.1", "0.25.1") == VLLM_0_25_1
