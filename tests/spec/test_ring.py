"""Ring kinds (``CircularBuffer`` from vLLM 0.29.0, ``KpoolTail`` from 0.30.0):
one block per request, never prefix-cached.

The scenario's outputs are what real vLLM 0.29.0 and 0.30.0 return for the
same calls (``FA(4)`` plus a ring of 2 tokens, 16 blocks, events on).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvspec.config import AttentionKind, CircularBuffer, FullAttention, KpoolTail, KVCacheConfig, Mamba
from kvspec.errors import ConfigError
from kvspec.events import BlockStored
from kvspec.kv_cache_manager import KVCacheManager
from kvspec.profiles import (
    VLLM_0_28_0,
    VLLM_0_29_0,
    VLLM_0_30_0,
    VLLM_0_31_0,
    VLLM_0_32_0,
    VLLM_0_33_0,
    SemanticsProfile,
)
from kvspec.request import Request, RequestBlockHasher, RequestStatus

RINGS: list[tuple[AttentionKind, SemanticsProfile]] = [
    (CircularBuffer(2), VLLM_0_29_0),
    (CircularBuffer(2), VLLM_0_30_0),
    (KpoolTail(2, 8), VLLM_0_30_0),
    (KpoolTail(2, 8), VLLM_0_31_0),
    (CircularBuffer(2), VLLM_0_33_0),
]


def setup(ring: AttentionKind, profile: SemanticsProfile) -> tuple[KVCacheManager, RequestBlockHasher]:
    """FA(4) + the ring: 16 blocks, events on."""
    cfg = KVCacheConfig(
        num_blocks=16,
        groups=(FullAttention(4), ring),
        max_model_len=64,
        enable_kv_cache_events=True,
        profile=profile,
    )
    return KVCacheManager(cfg), RequestBlockHasher.for_config(cfg)


def running(req: Request, computed: int) -> Request:
    """``req`` with ``computed`` tokens computed, running."""
    return replace(req, num_computed_tokens=computed, status=RequestStatus.RUNNING)


@pytest.mark.parametrize(("ring", "profile"), RINGS)
def test_scenario(ring: AttentionKind, profile: SemanticsProfile) -> None:
    """The ring is claimed once, at its group position; a sibling hits only
    the full-attention blocks; a freed ring goes to the free-queue front."""
    kv, hasher = setup(ring, profile)
    assert kv.coordinator.hash_block_size == 4
    assert kv.coordinator.scheduler_block_size == 4
    a = hasher.new_request("a", list(range(10)))
    assert kv.allocate_slots(a, 10) == ((1, 2, 3), (4,))
    a = hasher.with_output_tokens(running(a, 10), [10])
    assert kv.allocate_slots(a, 1) == ((), ())
    kv.check_invariants()
    if profile.common_prefix == "tables":
        assert kv.get_num_common_prefix_blocks("a") == (3, 0)
    b = hasher.new_request("b", [*range(10), 99])
    hit, n = kv.get_computed_blocks(b)
    assert (hit, n) == (((1, 2), ()), 8)
    assert kv.allocate_slots(b, 3, 8, hit) == ((5,), (6,))
    assert kv.get_blocks("b") == ((1, 2, 5), (6,))
    stored = [e for e in kv.take_events() if isinstance(e, BlockStored)]
    assert [(e.group_idx, len(e.block_hashes)) for e in stored] == [(0, 2)]
    assert kv.take_new_block_ids() == []
    kv.free("a")
    assert kv.to_view().free_queue[:3] == (4, 3, 7)
    assert kv.pop_blocks_for_free("b") == (1, 2, 5, 6)
    kv.check_invariants()


@pytest.mark.parametrize(("ring", "profile"), RINGS)
def test_external_claim_is_not_returned(ring: AttentionKind, profile: SemanticsProfile) -> None:
    """A ring claimed in the external phase is in the table but not returned."""
    kv, hasher = setup(ring, profile)
    e = hasher.new_request("e", list(range(9)))
    assert kv.allocate_slots(e, 1, num_external_computed_tokens=8) == ((4,), ())
    assert kv.get_blocks("e") == ((1, 2, 4), (3,))
    kv.check_invariants()


def test_unitary_ring_never_hits() -> None:
    """A ring alone with caching on: one block, no hit, nothing stored."""
    cfg = KVCacheConfig(num_blocks=8, groups=(CircularBuffer(4),), max_model_len=64, enable_kv_cache_events=True,
                        profile=VLLM_0_29_0)  # fmt: skip
    kv, hasher = KVCacheManager(cfg), RequestBlockHasher.for_config(cfg)
    assert kv.allocate_slots(hasher.new_request("a", list(range(9))), 9) == ((1,),)
    assert kv.get_computed_blocks(hasher.new_request("b", list(range(9)))) == (((),), 0)
    assert kv.take_events() == []


def test_kinds_need_their_release() -> None:
    """CircularBuffer from 0.29.0, KpoolTail in 0.30.0 and 0.31.0 only; a
    cached hybrid needs a prefix-cacheable group."""
    with pytest.raises(ConfigError, match=r"0\.29\.0"):
        KVCacheConfig(num_blocks=8, groups=(FullAttention(4), CircularBuffer(2)), max_model_len=64, profile=VLLM_0_28_0)
    with pytest.raises(ConfigError, match=r"0\.30\.0"):
        KVCacheConfig(num_blocks=8, groups=(FullAttention(4), KpoolTail(2, 8)), max_model_len=64, profile=VLLM_0_29_0)
    with pytest.raises(ConfigError, match=r"0\.31\.0 only"):
        KVCacheConfig(num_blocks=8, groups=(FullAttention(4), KpoolTail(2, 8)), max_model_len=64, profile=VLLM_0_32_0)
    rings = (CircularBuffer(2), KpoolTail(2, 8))
    with pytest.raises(ConfigError, match="prefix-cacheable"):
        KVCacheConfig(num_blocks=8, groups=rings, max_model_len=64, profile=VLLM_0_30_0)
    KVCacheConfig(num_blocks=8, groups=rings, max_model_len=64, enable_caching=False, profile=VLLM_0_30_0)


def test_hash_block_size_leaves_rings_out() -> None:
    """The hash block size is the GCD of the prefix-cacheable groups only."""
    cfg = KVCacheConfig(num_blocks=8, groups=(FullAttention(8), CircularBuffer(2)), max_model_len=64)
    assert (cfg.resolved_hash_block_size(), cfg.scheduler_block_size) == (8, 8)


@pytest.mark.parametrize(("ring", "reported"), [(CircularBuffer(4), False), (KpoolTail(4, 8), True)])
def test_new_block_ids(ring: AttentionKind, reported: bool) -> None:
    """With a Mamba group, a CircularBuffer ring is never reported to
    ``take_new_block_ids``; a KpoolTail ring (a sliding-window spec in vLLM)
    is, like every attention kind."""
    cfg = KVCacheConfig(num_blocks=16, groups=(FullAttention(4), ring, Mamba(4)), max_model_len=64,
                        enable_caching=False, profile=VLLM_0_30_0)  # fmt: skip
    kv, hasher = KVCacheManager(cfg), RequestBlockHasher.for_config(cfg)
    new = kv.allocate_slots(hasher.new_request("a", list(range(6))), 6)
    assert new is not None and new[:2] == ((1, 2), (3,))
    assert kv.take_new_block_ids() == ([1, 2, 3] if reported else [1, 2])
