"""Fine-grained hits with copy-on-write (vLLM 0.26.0 on, ``kvspec.partial_hits``):
one minimal scenario per rule, each failing if its rule is wrong.

The block ids, copies and events are what real vLLM 0.26.0 returns for the
same calls (FA(4) + Mamba(8, align): hash block 4, scheduler block 8).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvspec import profiles
from kvspec.block_pool import BlockId
from kvspec.config import MLA, AttentionKind, FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.errors import DoubleFreeError, UnsupportedOperationError
from kvspec.events import BlockStored
from kvspec.hashing import make_key
from kvspec.kv_cache_coordinator import HybridCoordinator
from kvspec.kv_cache_manager import KVCacheManager
from kvspec.partial_hits import fine_full_attention_hit, fine_mamba_hit, partial_hash_hits_enabled
from kvspec.profiles import VLLM_0_25_1, VLLM_0_26_0, VLLM_0_28_0, VLLM_0_29_0, VLLM_0_30_0, SemanticsProfile
from kvspec.request import Request, RequestBlockHasher, RequestStatus

FA4_MAMBA8 = (FullAttention(4), Mamba(8, "align"))


@pytest.fixture(autouse=True)
def every_profile_modelled(monkeypatch: pytest.MonkeyPatch) -> None:
    """These rules hold for every profile, checked in lockstep or not: lift
    the per-release refusal of fine-grained hits."""
    monkeypatch.setattr(profiles, "PARTIAL_HASH_HITS_CHECKED", frozenset(profiles.PROFILES))


def setup(
    groups: tuple[AttentionKind, ...] = FA4_MAMBA8,
    blocks: int = 20,
    profile: SemanticsProfile = VLLM_0_26_0,
    eagle: bool = False,
) -> tuple[KVCacheManager, RequestBlockHasher]:
    """A manager with events on."""
    cfg = KVCacheConfig(
        num_blocks=blocks,
        groups=groups,
        max_model_len=64,
        enable_kv_cache_events=True,
        use_eagle=eagle,
        profile=profile,
    )
    return KVCacheManager(cfg), RequestBlockHasher.for_config(cfg)


def running(req: Request, computed: int) -> Request:
    """``req`` running with ``computed`` tokens."""
    return replace(req, num_computed_tokens=computed, status=RequestStatus.RUNNING)


def owner_after_move(kv: KVCacheManager, hasher: RequestBlockHasher) -> Request:
    """``a`` (12 tokens) registers its Mamba tail at 12 in block 4; its next
    step moves the entry to block 6 and queues the copy 4 -> 6."""
    a = hasher.new_request("a", list(range(12)))
    assert kv.allocate_slots(a, 12) == ((1, 2, 3), (0, 4))
    kv.new_step_starts()
    a = running(hasher.with_output_tokens(a, [12]), 12)
    assert kv.allocate_slots(a, 1) == ((5,), ())
    kv.check_invariants()
    return a


def test_fine_grained_hits_need_a_coarse_mamba_align_group() -> None:
    """On from vLLM 0.26.0 for a cached hybrid with a Mamba align group coarser
    than the hash block; from 0.28.0 off with a coarse sliding-window group."""
    coarse_swa = (FullAttention(4), SlidingWindow(8, 4), Mamba(8, "align"))
    fine_swa = (FullAttention(8), SlidingWindow(4, 4), Mamba(8, "align"))
    assert partial_hash_hits_enabled(setup()[0].config)
    assert not partial_hash_hits_enabled(setup(profile=VLLM_0_25_1)[0].config)
    assert not partial_hash_hits_enabled(setup((FullAttention(4), Mamba(4, "align")))[0].config)
    assert not partial_hash_hits_enabled(setup(coarse_swa, 30, VLLM_0_28_0)[0].config)
    assert partial_hash_hits_enabled(setup(fine_swa, 30, VLLM_0_28_0)[0].config)


def test_mamba_tail_registers_a_partial_entry() -> None:
    """A 12-token prompt computed at once: Mamba block 4 is keyed at 12 tokens
    with a one-unit BlockStored after the group's (empty) full-block event."""
    kv, hasher = setup()
    a = hasher.new_request("a", list(range(12)))
    kv.allocate_slots(a, 12)
    events = [e for e in kv.take_events() if isinstance(e, BlockStored)]
    assert [(e.group_idx, len(e.block_hashes), e.block_size) for e in events] == [(0, 3, 4), (1, 0, 8), (1, 1, 4)]
    assert kv.block_pool.block_hash[BlockId(4)] == make_key(a.block_hashes[2], 1)


def test_owner_moves_its_tail_entry_to_a_copy() -> None:
    """The owner keeps block 4 (its table is append-only): the entry moves to
    block 6, which no table holds; both ends are retained until released."""
    kv, hasher = setup()
    a = owner_after_move(kv, hasher)
    pool = kv.block_pool
    assert pool.cached[make_key(a.block_hashes[2], 1)] == [6] and pool.block_hash[BlockId(4)] is None
    assert dict(kv.to_view().ref_cnt)[4] == 2 and dict(kv.to_view().ref_cnt)[6] == 1
    assert kv.take_kv_cache_block_copies() == ([(4, 6)], [4, 6])
    kv.free_blocks([4, 6])
    kv.check_invariants()
    assert 6 not in dict(kv.to_view().ref_cnt)


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
    kv.check_invariants()


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
    kv.check_invariants()


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
            assert kv.block_pool.get_num_free_blocks() == 1


def test_fine_full_attention_hit_probes_inside_the_next_block() -> None:
    """Full blocks first, then the highest cached hash boundary inside the
    next block; under EAGLE one hash unit less, so a full block may stay in
    the list for fewer tokens."""
    kv, hasher = setup((FullAttention(8), MLA(4), Mamba(8, "align")), 30)
    a = hasher.new_request("a", list(range(12)))
    kv.allocate_slots(a, 12)
    fine, pool = a.block_hashes, kv.block_pool
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
    pool = kv.block_pool
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
    with pytest.raises(DoubleFreeError):
        kv.free_blocks(retained)
    assert kv.reset_prefix_cache()
    with pytest.raises(UnsupportedOperationError):
        setup(profile=VLLM_0_25_1, groups=(FullAttention(4), Mamba(4, "align")))[0].take_kv_cache_block_copies()


def test_caching_mask_follows_the_hit_alignment_from_0_29() -> None:
    """FA(4) + Mamba(8) + SWA(4, window 2), 17 tokens: vLLM 0.28.0 caches the
    SWA blocks of each scheduler block's end only, 0.29.0 every one of them."""
    groups = (FullAttention(4), Mamba(8, "align"), SlidingWindow(4, 2))
    for profile, hashed in ((VLLM_0_28_0, [False, True, False, True, False]), (VLLM_0_29_0, [True] * 4 + [False])):
        kv, hasher = setup(groups, 30, profile)
        kv.allocate_slots(hasher.new_request("a", list(range(17))), 17)
        table = kv.get_blocks("a")[2]
        assert [kv.block_pool.block_hash[BlockId(b)] is not None for b in table] == hashed, profile.name


def test_eagle_lowers_the_mamba_tail_from_0_30() -> None:
    """EAGLE, a 12-token prompt: vLLM 0.29.0 keys the Mamba tail at 12 tokens;
    0.30.0 moves it one hash unit down, to 8, a block boundary: no entry."""
    for profile, stored in ((VLLM_0_29_0, True), (VLLM_0_30_0, False)):
        kv, hasher = setup(profile=profile, eagle=True)
        kv.allocate_slots(hasher.new_request("a", list(range(12))), 12)
        partial = [e for e in kv.take_events() if isinstance(e, BlockStored) and e.group_idx == 1 and e.block_size == 4]
        assert bool(partial) == stored, profile.name


def test_hybrid_hit_is_hash_aligned() -> None:
    """With fine-grained hits the hybrid hit may end on any hash boundary."""
    kv, hasher = setup()
    owner_after_move(kv, hasher)
    coord = kv.coordinator
    assert isinstance(coord, HybridCoordinator) and coord.hit_alignment == 4
