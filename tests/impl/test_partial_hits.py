"""kvimpl's fine-grained hits with copy-on-write (vLLM 0.26.0 on,
``kvimpl.partial_hits``): the scenarios of ``tests/spec/test_partial_hits.py``
run on kvimpl's pure-Python manager and on kvspec side by side, call for
call: every result (block ids, copies, retained ids, events, errors) and the
view after each call must agree, and the results are pinned to the ids real
vLLM 0.26.0 returns (FA(4) + Mamba(8, align): hash block 4, scheduler
block 8).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from kvimpl.config_rules import MODELLED_FEATURES, features_needed
from kvimpl.kv_cache_coordinator import HybridCoordinator
from kvimpl.kv_cache_manager import KVCacheManager as ImplManager
from kvimpl.native import create_manager, native_unsupported
from kvimpl.partial_hits import fine_full_attention_hit, fine_mamba_hit, partial_hash_hits_enabled
from kvspec import errors, profiles
from kvspec.block_pool import BlockId
from kvspec.config import MLA, AttentionKind, FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.errors import DoubleFreeError, KVCacheError, UnsupportedOperationError
from kvspec.events import BlockRemoved, BlockStored
from kvspec.hashing import make_key
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.profiles import VLLM_0_25_1, VLLM_0_26_0, VLLM_0_28_0, VLLM_0_29_0, VLLM_0_30_0, SemanticsProfile
from kvspec.request import Request, RequestBlockHasher, RequestStatus

FA4_MAMBA8 = (FullAttention(4), Mamba(8, "align"))


@pytest.fixture(autouse=True)
def every_profile_modelled(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in the spec's tests: lift kvspec's per-release refusal of
    fine-grained hits (one scenario compares 0.29.0 with 0.30.0)."""
    monkeypatch.setattr(profiles, "PARTIAL_HASH_HITS_CHECKED", frozenset(profiles.PROFILES))


class Both:
    """kvimpl's pure-Python manager and kvspec's, driven by the same calls.

    ``call(name, *args)`` runs the method on both, requires equal results
    (or the same error class and message), then equal views and both sides'
    invariants; it returns kvimpl's result.
    """

    def __init__(self, cfg: KVCacheConfig) -> None:
        self.impl = ImplManager(cfg)
        self.spec = SpecManager(cfg)

    def call(self, name: str, *args: Any) -> Any:
        outcomes = []
        for side in (self.impl, self.spec):
            try:
                outcomes.append(("ok", getattr(side, name)(*args)))
            except KVCacheError as exc:
                outcomes.append((type(exc).__name__, str(exc)))
        assert outcomes[0] == outcomes[1], f"{name}{args}: impl {outcomes[0]!r}, spec {outcomes[1]!r}"
        assert self.impl.to_view() == self.spec.to_view(), f"{name}{args}: views differ"
        self.impl.check_invariants()
        self.spec.check_invariants()
        kind, value = outcomes[0]
        if kind != "ok":
            raise getattr(errors, kind)(value)
        return value

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return lambda *args: self.call(name, *args)


def setup(
    groups: tuple[AttentionKind, ...] = FA4_MAMBA8,
    blocks: int = 20,
    profile: SemanticsProfile = VLLM_0_26_0,
    eagle: bool = False,
) -> tuple[Both, RequestBlockHasher]:
    """Both managers with events on."""
    cfg = KVCacheConfig(
        num_blocks=blocks, groups=groups, max_model_len=64, enable_kv_cache_events=True, use_eagle=eagle,
        profile=profile,
    )  # fmt: skip
    return Both(cfg), RequestBlockHasher.for_config(cfg)


def running(req: Request, computed: int) -> Request:
    """``req`` running with ``computed`` tokens."""
    return replace(req, num_computed_tokens=computed, status=RequestStatus.RUNNING)


def owner_after_move(kv: Both, hasher: RequestBlockHasher) -> Request:
    """``a`` (12 tokens) registers its Mamba tail at 12 in block 4; its next
    step moves the entry to block 6 and queues the copy 4 -> 6."""
    a = hasher.new_request("a", list(range(12)))
    assert kv.allocate_slots(a, 12) == ((1, 2, 3), (0, 4))
    kv.new_step_starts()
    a = running(hasher.with_output_tokens(a, [12]), 12)
    assert kv.allocate_slots(a, 1) == ((5,), ())
    return a


def test_the_pure_python_manager_models_the_feature() -> None:
    """kvimpl names the feature, models it in pure Python, and the native
    core still declines it (``create_manager`` hands it to Python)."""
    cfg = KVCacheConfig(num_blocks=20, groups=FA4_MAMBA8, max_model_len=64, profile=VLLM_0_26_0)
    assert "partial-hash-hits" in features_needed(cfg) and "partial-hash-hits" in MODELLED_FEATURES
    assert "partial-hash-hits" in (native_unsupported(cfg) or "")
    assert type(create_manager(cfg)) is ImplManager


def test_fine_grained_hits_need_a_coarse_mamba_align_group() -> None:
    """On from vLLM 0.26.0 for a cached hybrid with a Mamba align group coarser
    than the hash block; from 0.28.0 off with a coarse sliding-window group."""
    coarse_swa = (FullAttention(4), SlidingWindow(8, 4), Mamba(8, "align"))
    fine_swa = (FullAttention(8), SlidingWindow(4, 4), Mamba(8, "align"))
    assert partial_hash_hits_enabled(setup()[0].impl.config)
    assert not partial_hash_hits_enabled(setup(profile=VLLM_0_25_1)[0].impl.config)
    assert not partial_hash_hits_enabled(setup((FullAttention(4), Mamba(4, "align")))[0].impl.config)
    assert not partial_hash_hits_enabled(setup(coarse_swa, 30, VLLM_0_28_0)[0].impl.config)
    assert partial_hash_hits_enabled(setup(fine_swa, 30, VLLM_0_28_0)[0].impl.config)


def test_mamba_tail_registers_a_partial_entry() -> None:
    """A 12-token prompt computed at once: Mamba block 4 is keyed at 12 tokens
    with a one-unit BlockStored after the group's (empty) full-block event."""
    kv, hasher = setup()
    a = hasher.new_request("a", list(range(12)))
    kv.allocate_slots(a, 12)
    events = [e for e in kv.take_events() if isinstance(e, BlockStored)]
    assert [(e.group_idx, len(e.block_hashes), e.block_size) for e in events] == [(0, 3, 4), (1, 0, 8), (1, 1, 4)]
    assert kv.impl.block_pool.block_hash[BlockId(4)] == make_key(a.block_hashes[2], 1)


def test_owner_moves_its_tail_entry_to_a_copy() -> None:
    """The owner keeps block 4 (its table is append-only): the entry moves to
    block 6, which no table holds; both ends are retained until released."""
    kv, hasher = setup()
    a = owner_after_move(kv, hasher)
    pool = kv.impl.block_pool
    assert pool.cached[make_key(a.block_hashes[2], 1)] == [6] and pool.block_hash[BlockId(4)] is None
    ref = dict(kv.impl.to_view().ref_cnt)
    assert ref[4] == 2 and ref[6] == 1
    assert kv.take_kv_cache_block_copies() == ([(4, 6)], [4, 6])
    assert kv.take_kv_cache_block_copies() == ([], [])
    kv.free_blocks([4, 6])
    assert 6 not in dict(kv.impl.to_view().ref_cnt)
    assert not [e for e in kv.take_events() if isinstance(e, BlockRemoved)]  # the move is silent


def test_hit_inside_a_mamba_block_is_privatised() -> None:
    """``b`` hits 12 tokens (Mamba state in block 6); its allocation copies 6
    into a fresh block 9, returned first in the Mamba group."""
    kv, hasher = setup()
    owner_after_move(kv, hasher)
    kv.free_blocks(kv.take_kv_cache_block_copies()[1])
    kv.new_step_starts()
    kv.take_new_block_ids()
    b = hasher.new_request("b", [*range(12), 50, 51, 52, 53, 54])
    hit, n = kv.get_computed_blocks(b)
    assert (hit, n) == (((1, 2, 3), (0, 6)), 12)
    assert kv.allocate_slots(b, 5, n, hit) == ((7, 8), (9, 10))
    assert kv.get_blocks("b") == ((1, 2, 3, 7, 8), (0, 9, 10))
    assert kv.take_kv_cache_block_copies() == ([(6, 9)], [6, 9])
    assert kv.take_new_block_ids() == [7, 8]


def test_hit_inside_a_full_attention_block_is_privatised() -> None:
    """FA(8) + MLA(4) + Mamba(8): ``b`` hits 12 tokens, inside FA block 2 and
    Mamba block 6; both are copied, the FA copy first among fresh ids."""
    kv, hasher = setup((FullAttention(8), MLA(4), Mamba(8, "align")), 30)
    assert kv.allocate_slots(hasher.new_request("a", list(range(12))), 12) == ((1, 2), (3, 4, 5), (0, 6))
    kv.new_step_starts()
    kv.take_new_block_ids()
    b = hasher.new_request("b", [*range(12), 50, 51, 52, 53, 54])
    hit, n = kv.get_computed_blocks(b)
    assert (hit, n) == (((1, 2), (3, 4, 5), (0, 6)), 12)
    assert kv.allocate_slots(b, 5, n, hit) == ((7, 8), (9, 10), (11, 12))
    assert kv.get_blocks("b")[0] == (1, 7, 8)
    assert kv.take_kv_cache_block_copies() == ([(2, 7), (6, 11)], [2, 7, 6, 11])
    assert kv.take_new_block_ids() == [7, 8, 9, 10]
    assert kv.get_num_common_prefix_blocks("b") == (1, 3, 0)  # holder counts follow the copy


def test_a_hit_on_an_evicted_partial_entry_is_stale() -> None:
    """The last block of a fine-grained hit is valid under a key inside it;
    once evicted, both managers refuse the hit with the same StaleHitError."""
    kv, hasher = setup((FullAttention(8), MLA(4), Mamba(8, "align")), 30)
    kv.allocate_slots(hasher.new_request("a", list(range(12))), 12)
    kv.new_step_starts()
    b = hasher.new_request("b", [*range(12), 50, 51, 52, 53, 54])
    hit, n = kv.get_computed_blocks(b)
    kv.evict_blocks([2])
    with pytest.raises(errors.StaleHitError, match=r"hit block 2 \(group 0, index 1\) is no longer cached"):
        kv.allocate_slots(b, 5, n, hit)


def test_owner_estimate_reserves_a_second_block() -> None:
    """The owner's next step needs FA 1 + copy 1, but vLLM's estimate is
    ``1 + 1`` for Mamba on top: with 2 free blocks it is refused, with 3 it
    fits and leaves 1 free."""
    for blocks, fits in ((7, False), (8, True)):
        kv, hasher = setup(blocks=blocks)
        a = hasher.new_request("a", list(range(12)))
        assert kv.allocate_slots(a, 12) is not None
        kv.new_step_starts()
        a = running(hasher.with_output_tokens(a, [12]), 12)
        assert (kv.allocate_slots(a, 1) is not None) == fits, blocks
        if fits:
            assert kv.impl.block_pool.get_num_free_blocks() == 1


def test_fine_full_attention_hit_probes_inside_the_next_block() -> None:
    """Full blocks first, then the highest cached hash boundary inside the
    next block; under EAGLE one hash unit less, so a full block may stay in
    the list for fewer tokens."""
    kv, hasher = setup((FullAttention(8), MLA(4), Mamba(8, "align")), 30)
    a = hasher.new_request("a", list(range(12)))
    kv.allocate_slots(a, 12)
    fine, pool = a.block_hashes, kv.impl.block_pool
    assert fine_full_attention_hit(FullAttention(8), fine, 12, [0], pool, False, 4) == ([[1, 2]], 12)
    assert fine_full_attention_hit(FullAttention(8), fine, 12, [0], pool, True, 4) == ([[1]], 8)
    assert fine_full_attention_hit(FullAttention(8), fine, 11, [0], pool, False, 4) == ([[1]], 8)
    c = hasher.new_request("c", list(range(17)))
    kv.allocate_slots(c, 17)
    assert fine_full_attention_hit(FullAttention(8), c.block_hashes, 16, [0], pool, True, 4) == ([[1, 8]], 12)


def test_fine_mamba_hit_finds_the_rightmost_state() -> None:
    """The rightmost cached state at any hash boundary, nulls before it."""
    kv, hasher = setup()
    a = hasher.new_request("a", list(range(12)))
    kv.allocate_slots(a, 12)
    pool = kv.impl.block_pool
    assert fine_mamba_hit(Mamba(8, "align"), a.block_hashes, 12, [1], pool, 4) == ([[0, 4]], 12)
    assert fine_mamba_hit(Mamba(8, "align"), a.block_hashes, 8, [1], pool, 4) == ([[]], 0)


def test_retained_blocks_are_pending() -> None:
    """Retained ids may be freed once each; the pool cannot be reset while
    they are held; before vLLM 0.26.0 the operation does not exist."""
    kv, hasher = setup()
    owner_after_move(kv, hasher)
    kv.free("a")
    assert not kv.reset_prefix_cache()
    _, retained = kv.take_kv_cache_block_copies()
    kv.free_blocks(retained)
    with pytest.raises(DoubleFreeError, match="block 4 is freed 1 time"):
        kv.free_blocks(retained)
    assert kv.reset_prefix_cache()
    old, _ = setup(profile=VLLM_0_25_1, groups=(FullAttention(4), Mamba(4, "align")))
    with pytest.raises(UnsupportedOperationError, match=r"take_kv_cache_block_copies: not in vllm-0\.25\.1"):
        old.take_kv_cache_block_copies()


def test_caching_mask_follows_the_hit_alignment_from_0_29() -> None:
    """FA(4) + Mamba(8) + SWA(4, window 2), 17 tokens: vLLM 0.28.0 caches the
    SWA blocks of each scheduler block's end only, 0.29.0 every one of them."""
    groups = (FullAttention(4), Mamba(8, "align"), SlidingWindow(4, 2))
    for profile, hashed in ((VLLM_0_28_0, [False, True, False, True, False]), (VLLM_0_29_0, [True] * 4 + [False])):
        kv, hasher = setup(groups, 30, profile)
        kv.allocate_slots(hasher.new_request("a", list(range(17))), 17)
        table = kv.get_blocks("a")[2]
        assert [kv.impl.block_pool.block_hash[BlockId(b)] is not None for b in table] == hashed, profile.name


def test_eagle_lowers_the_mamba_tail_from_0_30() -> None:
    """EAGLE, a 12-token prompt: vLLM 0.29.0 keys the Mamba tail at 12 tokens;
    0.30.0 moves it one hash unit down, to 8, a block boundary: no entry."""
    for profile, stored in ((VLLM_0_29_0, True), (VLLM_0_30_0, False)):
        kv, hasher = setup(profile=profile, eagle=True)
        kv.allocate_slots(hasher.new_request("a", list(range(12))), 12)
        events = kv.take_events()
        partial = [e for e in events if isinstance(e, BlockStored) and e.group_idx == 1 and e.block_size == 4]
        assert bool(partial) == stored, profile.name


def test_hybrid_hit_is_hash_aligned() -> None:
    """With fine-grained hits the hybrid hit may end on any hash boundary."""
    kv, hasher = setup()
    owner_after_move(kv, hasher)
    coord = kv.impl.coordinator
    assert isinstance(coord, HybridCoordinator) and coord.hit_alignment == 4
    b = hasher.new_request("b", [*range(12), 60])
    assert kv.get_computed_blocks(b) == (((1, 2, 3), (0, 6)), 12)
