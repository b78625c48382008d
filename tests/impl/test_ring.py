"""kvimpl's ring kinds (``CircularBuffer`` from vLLM 0.29.0, ``KpoolTail`` in
0.30.0 and 0.31.0): one block per request, never prefix-cached.

The scenarios of ``tests/spec/test_ring.py`` run on kvimpl's pure-Python
manager with the same exact block ids, and every step is compared with
kvspec's on the same calls (results, views, events, new-block ids). The native
core declines ring kinds (``tests/impl/test_profiles.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from kvimpl.config_rules import event_sliding_window, features_needed, hash_block_size, kind_name, prefix_cacheable
from kvimpl.kv_cache_manager import KVCacheManager as ImplManager
from kvimpl.native import create_manager
from kvimpl.single_type_kv_cache_manager import CircularBufferManager
from kvspec import config as spec_config
from kvspec.config import AttentionKind, CircularBuffer, FullAttention, KpoolTail, KVCacheConfig, Mamba, SlidingWindow
from kvspec.errors import KVCacheError, StaleHitError
from kvspec.events import BlockStored
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.profiles import VLLM_0_29_0, VLLM_0_30_0, VLLM_0_31_0, VLLM_0_33_0, SemanticsProfile
from kvspec.request import Request, RequestBlockHasher, RequestStatus

RINGS: list[tuple[AttentionKind, SemanticsProfile]] = [
    (CircularBuffer(2), VLLM_0_29_0),
    (CircularBuffer(2), VLLM_0_30_0),
    (KpoolTail(2, 8), VLLM_0_30_0),
    (KpoolTail(2, 8), VLLM_0_31_0),
    (CircularBuffer(2), VLLM_0_33_0),
]


class Both:
    """kvspec and kvimpl on one configuration: each call runs on both and
    must give the same result (or raise the same error type)."""

    def __init__(self, cfg: KVCacheConfig) -> None:
        self.spec = SpecManager(cfg)
        self.impl = create_manager(cfg, native=False)
        assert type(self.impl) is ImplManager

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            outcomes = []
            for mgr in (self.spec, self.impl):
                try:
                    outcomes.append(("ok", getattr(mgr, name)(*args, **kwargs)))
                except KVCacheError as exc:
                    outcomes.append(("raised", type(exc)))
            assert outcomes[0] == outcomes[1], f"{name}{args}: kvspec {outcomes[0]} != kvimpl {outcomes[1]}"
            self.check()
            kind, value = outcomes[0]
            if kind == "raised":
                raise value("raised by both")
            return value

        return call

    def check(self) -> None:
        self.spec.check_invariants()
        self.impl.check_invariants()
        assert self.impl.to_view() == self.spec.to_view()


def setup(ring: AttentionKind, profile: SemanticsProfile) -> tuple[Both, RequestBlockHasher]:
    """FA(4) + the ring: 16 blocks, events on."""
    cfg = KVCacheConfig(
        num_blocks=16, groups=(FullAttention(4), ring), max_model_len=64, enable_kv_cache_events=True, profile=profile
    )
    return Both(cfg), RequestBlockHasher.for_config(cfg)


def running(req: Request, computed: int) -> Request:
    """``req`` with ``computed`` tokens computed, running."""
    return replace(req, num_computed_tokens=computed, status=RequestStatus.RUNNING)


@pytest.mark.parametrize(("ring", "profile"), RINGS)
def test_scenario(ring: AttentionKind, profile: SemanticsProfile) -> None:
    """The ring is claimed once, at its group position; a sibling hits only
    the full-attention blocks; a freed ring goes to the free-queue front."""
    kv, hasher = setup(ring, profile)
    assert isinstance(kv.impl.coordinator.managers[1], CircularBufferManager)
    assert (kv.impl.coordinator.hash_block_size, kv.impl.coordinator.scheduler_block_size) == (4, 4)
    a = hasher.new_request("a", list(range(10)))
    assert kv.allocate_slots(a, 10) == ((1, 2, 3), (4,))
    a = hasher.with_output_tokens(running(a, 10), [10])
    assert kv.allocate_slots(a, 1) == ((), ())
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
    assert kv.impl.to_view().free_queue[:3] == (4, 3, 7)
    assert kv.pop_blocks_for_free("b") == (1, 2, 5, 6)


@pytest.mark.parametrize(("ring", "profile"), RINGS)
def test_external_claim_is_not_returned(ring: AttentionKind, profile: SemanticsProfile) -> None:
    """A ring claimed in the external phase is in the table but not returned."""
    kv, hasher = setup(ring, profile)
    e = hasher.new_request("e", list(range(9)))
    assert kv.allocate_slots(e, 1, num_external_computed_tokens=8) == ((4,), ())
    assert kv.get_blocks("e") == ((1, 2, 4), (3,))


@pytest.mark.parametrize(("ring", "profile"), RINGS)
def test_decode_steps_never_grow_the_ring(ring: AttentionKind, profile: SemanticsProfile) -> None:
    """Thirty decode steps (kvimpl's quiet-step fast path leaves the ring
    group out): the ring stays the one block of the first allocation."""
    kv, hasher = setup(ring, profile)
    a = hasher.new_request("a", list(range(5)))
    assert kv.allocate_slots(a, 5) == ((1, 2), (3,))
    for t in range(5, 35):
        a = hasher.with_output_tokens(running(a, t), [t])
        kv.allocate_slots(a, 1)
    assert kv.get_blocks("a") == ((1, 2, 4, 5, 6, 7, 8, 9, 10), (3,))
    kv.free("a")


@pytest.mark.parametrize(("ring", "profile"), RINGS)
def test_a_hit_in_the_ring_group_is_stale(ring: AttentionKind, profile: SemanticsProfile) -> None:
    """A caller-given hit in a ring group raises StaleHitError on both, and changes nothing."""
    kv, hasher = setup(ring, profile)
    a = hasher.new_request("a", list(range(10)))
    kv.allocate_slots(a, 10)
    kv.cache_blocks(a, 8)
    before = kv.impl.to_view()
    b = hasher.new_request("b", list(range(10)))
    with pytest.raises(StaleHitError):
        kv.allocate_slots(b, 2, 8, ((1, 2), (4,)))
    assert kv.impl.to_view() == before
    assert kv.impl.get_blocks("b") == ((), ())


def test_unitary_ring_never_hits() -> None:
    """A ring alone with caching on: one block, no hit, nothing stored."""
    cfg = KVCacheConfig(num_blocks=8, groups=(CircularBuffer(4),), max_model_len=64, enable_kv_cache_events=True,
                        profile=VLLM_0_29_0)  # fmt: skip
    kv, hasher = Both(cfg), RequestBlockHasher.for_config(cfg)
    a = hasher.new_request("a", list(range(9)))
    assert kv.allocate_slots(a, 9) == ((1,),)
    assert kv.get_computed_blocks(hasher.new_request("b", list(range(9)))) == (((),), 0)
    for t in range(9, 20):  # decode steps: nothing to take, nothing to cache
        a = hasher.with_output_tokens(running(a, t), [t])
        assert kv.allocate_slots(a, 1) == ((),)
    assert kv.get_blocks("a") == ((1,),)
    assert kv.take_events() == []


def test_rings_without_caching() -> None:
    """Two rings and a full-attention group, caching off: one block per ring."""
    cfg = KVCacheConfig(num_blocks=16, groups=(FullAttention(4), CircularBuffer(2), KpoolTail(2, 8)),
                        max_model_len=64, enable_caching=False, profile=VLLM_0_30_0)  # fmt: skip
    kv, hasher = Both(cfg), RequestBlockHasher.for_config(cfg)
    assert kv.allocate_slots(hasher.new_request("a", list(range(6))), 6) == ((1, 2), (3,), (4,))
    assert kv.allocate_slots(hasher.new_request("b", list(range(3))), 3) == ((5,), (6,), (7,))
    kv.free("a")
    assert kv.impl.to_view().free_queue[:3] == (4, 3, 2)


def test_hash_block_size_leaves_rings_out() -> None:
    """The hash block size is the GCD of the prefix-cacheable groups only."""
    cfg = KVCacheConfig(num_blocks=8, groups=(FullAttention(8), CircularBuffer(2)), max_model_len=64)
    assert hash_block_size(cfg) == cfg.resolved_hash_block_size() == 8
    assert Both(cfg).impl.coordinator.scheduler_block_size == 8


@pytest.mark.parametrize(("ring", "reported"), [(CircularBuffer(4), False), (KpoolTail(4, 8), True)])
def test_new_block_ids(ring: AttentionKind, reported: bool) -> None:
    """With a Mamba group, a CircularBuffer ring is never reported to
    ``take_new_block_ids``; a KpoolTail ring (a sliding-window spec in vLLM) is."""
    cfg = KVCacheConfig(num_blocks=16, groups=(FullAttention(4), ring, Mamba(4)), max_model_len=64,
                        enable_caching=False, profile=VLLM_0_30_0)  # fmt: skip
    kv, hasher = Both(cfg), RequestBlockHasher.for_config(cfg)
    new = kv.allocate_slots(hasher.new_request("a", list(range(6))), 6)
    assert new is not None and new[:2] == ((1, 2), (3,))
    assert kv.take_new_block_ids() == ([1, 2, 3] if reported else [1, 2])


@pytest.mark.parametrize(
    "kind", [CircularBuffer(2), KpoolTail(2, 8), SlidingWindow(4, 8), FullAttention(4), Mamba(4)], ids=repr
)
def test_kind_rules_agree_with_the_spec(kind: AttentionKind) -> None:
    """kvimpl's own copies of the event-kind rules give kvspec's answers."""
    assert kind_name(kind) == spec_config.kind_name(kind)
    assert event_sliding_window(kind) == spec_config.event_sliding_window(kind)
    assert prefix_cacheable(kind) == spec_config.prefix_cacheable(kind)


def test_features_needed_names_ring_kinds() -> None:
    cfg = KVCacheConfig(num_blocks=8, groups=(FullAttention(4), KpoolTail(2, 8)), max_model_len=64, profile=VLLM_0_31_0)
    assert features_needed(cfg) == ["ring-kinds"]
    cfg = replace(cfg, groups=(FullAttention(4),), profile=VLLM_0_33_0)
    assert features_needed(cfg) == []
