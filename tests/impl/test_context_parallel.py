"""kvimpl under decode/prefill context parallelism (``dcp_world_size``,
``pcp_world_size``): the scenarios of ``tests/spec/test_context_parallel.py``
on kvimpl's pure-Python manager, with the same exact block ids, compared with
kvspec on the same calls; and kvimpl's own copies of the rules
(:mod:`kvimpl.config_rules`) against kvspec's for every profile. The native
core declines context parallelism (``tests/impl/test_profiles.py``)."""

from __future__ import annotations

import itertools

import pytest

from kvimpl.config_rules import (
    admission_cap,
    cp_block_factor,
    cp_lookup_refusal,
    dcp_scales_kind,
    features_needed,
    hash_block_size,
    manager_kinds,
    scheduler_block_size,
    unmodelled_features,
)
from kvimpl.kv_cache_manager import KVCacheManager as ImplManager
from kvimpl.native import create_manager
from kvspec import config as spec_config
from kvspec.config import (
    MLA,
    AttentionKind,
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    KVCacheConfig,
    Mamba,
    SlidingWindow,
)
from kvspec.errors import ContextParallelLookupError, KVCacheError
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.profiles import PROFILES, SemanticsProfile, profile_named
from kvspec.request import Request, RequestBlockHasher

V016, V025, V026, V029, V030, V031, V033 = (
    profile_named(v) for v in ("0.16.0", "0.25.1", "0.26.0", "0.29.0", "0.30.0", "0.31.0", "0.33.0")
)


def _cfg(kind: AttentionKind, profile: SemanticsProfile, dcp: int = 1, pcp: int = 1, **kw: object) -> KVCacheConfig:
    fields: dict[str, object] = {"num_blocks": 24, "groups": (kind,), "max_model_len": 64, **kw}
    return KVCacheConfig(profile=profile, dcp_world_size=dcp, pcp_world_size=pcp, **fields)  # type: ignore[arg-type]  # fields is a test's keyword bag


def _pair(cfg: KVCacheConfig) -> tuple[SpecManager, ImplManager]:
    missing = unmodelled_features(cfg)
    if missing:  # a Mamba align group of 0.32.0 on also needs mamba-tail-entries
        pytest.skip(f"kvimpl does not model {', '.join(missing)} yet")
    impl = create_manager(cfg, native=False)
    assert type(impl) is ImplManager
    return SpecManager(cfg), impl


def _request(cfg: KVCacheConfig, rid: str, n: int) -> Request:
    return RequestBlockHasher(cfg.hash_function, cfg.hash_seed, cfg.resolved_hash_block_size()).new_request(
        rid, list(range(n))
    )


def _same_state(spec: SpecManager, impl: ImplManager) -> None:
    spec.check_invariants()
    impl.check_invariants()
    assert impl.to_view() == spec.to_view()


# (profile, kind, dcp, pcp) -> manager block size (as tests/spec/test_context_parallel.py)
SCALED = [
    (V016, FullAttention(4), 2, 2, 16),
    (V025, MLA(4), 2, 2, 16),
    (V025, SlidingWindow(4, 5), 1, 2, 8),
    (V025, Mamba(4), 2, 1, 8),
    (V026, FullAttention(4), 2, 2, 8),
    (V026, SlidingWindow(4, 5), 2, 1, 8),
    (V026, Mamba(4), 2, 1, 4),
    (V029, FullAttention(4), 4, 1, 16),
    (V029, SlidingWindow(4, 5), 2, 1, 4),
    (V029, ChunkedLocal(4, 8), 2, 1, 4),
    (V030, MLA(4), 2, 1, 8),
    (V031, SlidingWindow(4, 5), 2, 1, 8),
    (V031, CrossAttention(4), 2, 1, 8),
    (V033, Mamba(4), 4, 1, 4),
    (V033, FullAttention(4), 2, 2, 8),
]


@pytest.mark.parametrize(("profile", "kind", "dcp", "pcp", "bs"), SCALED)
def test_manager_block_size_by_release(
    profile: SemanticsProfile, kind: AttentionKind, dcp: int, pcp: int, bs: int
) -> None:
    cfg = _cfg(kind, profile, dcp, pcp, enable_caching=False)
    assert manager_kinds(cfg)[0].block_size == bs
    assert scheduler_block_size(cfg) == hash_block_size(cfg) == bs
    spec, impl = _pair(cfg)
    assert impl.coordinator.managers[0].block_size == bs
    assert (impl.coordinator.scheduler_block_size, impl.coordinator.hash_block_size) == (bs, bs)
    req = _request(cfg, "r", 17)
    blocks = impl.allocate_slots(req, 17, 0, ((),))
    assert blocks == spec.allocate_slots(req, 17, 0, ((),))
    assert blocks is not None
    if not isinstance(kind, CrossAttention | Mamba):  # sized by encoder tokens / by state
        assert len(blocks[0]) == -(-17 // bs)
    _same_state(spec, impl)


def test_without_context_parallelism_the_groups_are_unchanged() -> None:
    cfg = KVCacheConfig(num_blocks=8, groups=(FullAttention(4), SlidingWindow(4, 5)), max_model_len=32)
    assert manager_kinds(cfg) is cfg.groups


@pytest.mark.parametrize(
    ("profile", "cached"), [(V016, [1, 2, 3, 4]), (V025, [2, 4]), (V026, [2, 4]), (V033, [1, 2, 3, 4])]
)
def test_swa_cache_mask_counts_in_the_unscaled_size_until_0_30(profile: SemanticsProfile, cached: list[int]) -> None:
    """SWA(4, window 5), DCP 2, 33 tokens: 0.25.1 to 0.28.0 cache every
    second block (the mask's window and alignment use the unscaled size)."""
    cfg = _cfg(SlidingWindow(4, 5), profile, dcp=2)
    spec, impl = _pair(cfg)
    req = _request(cfg, "r", 33)
    assert impl.allocate_slots(req, 33, 0, ((),)) == spec.allocate_slots(req, 33, 0, ((),)) == ((1, 2, 3, 4, 5),)
    assert [b for b in range(cfg.num_blocks) if impl.block_pool.block_hash[b] is not None] == cached
    _same_state(spec, impl)


def test_admission_cap_stays_in_unscaled_blocks() -> None:
    """The full-sequence cap counts in the engine's block size while the
    manager's table counts in the scaled one, as in vLLM and kvspec."""
    kind = SlidingWindow(4, 8)
    cfg = _cfg(kind, V033, dcp=2, enable_caching=False, max_num_batched_tokens=8)
    spec, impl = _pair(cfg)
    assert impl.coordinator.managers[0].admission_cap == spec.coordinator.managers[0].admission_cap
    assert impl.coordinator.managers[0].admission_cap == admission_cap(kind, 8, 64) == 5
    req = _request(cfg, "r", 40)
    got = impl.allocate_slots(req, 8, full_sequence_must_fit=True)
    assert got == spec.allocate_slots(req, 8, full_sequence_must_fit=True) == ((1,),)
    _same_state(spec, impl)


@pytest.mark.parametrize(
    ("profile", "kind", "dcp", "pcp", "message"),
    [
        (V016, SlidingWindow(4, 5), 2, 1, "DCP not support sliding window attn now"),
        (V025, ChunkedLocal(4, 8), 1, 2, "PCP not support chunked local attn now"),
        (V025, Mamba(4), 2, 1, "DCP not support mamba now"),
        (V026, SlidingWindow(4, 5), 2, 1, "DCP not support sliding window attn now"),
        (V029, SlidingWindow(4, 5), 1, 2, "PCP not support sliding window attn now"),
        (V033, SlidingWindow(4, 5), 2, 1, "DCP not support sliding window attn now"),
        (V033, Mamba(4, "align"), 1, 2, "PCP not support mamba now"),
    ],
)
def test_lookup_refuses_and_changes_nothing(
    profile: SemanticsProfile, kind: AttentionKind, dcp: int, pcp: int, message: str
) -> None:
    """Both raise ContextParallelLookupError with the same message; neither state changes."""
    cfg = _cfg(kind, profile, dcp, pcp)
    spec, impl = _pair(cfg)
    first = _request(cfg, "a", 20)
    got = impl.allocate_slots(first, 20, 0, ((),))
    assert got is not None and got == spec.allocate_slots(first, 20, 0, ((),))
    before = impl.to_view()
    messages = []
    for mgr in (spec, impl):
        with pytest.raises(ContextParallelLookupError, match=message) as info:
            mgr.get_computed_blocks(_request(cfg, "b", 20))
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert impl.to_view() == before
    _same_state(spec, impl)


@pytest.mark.parametrize("profile", [V029, V030, V033])
def test_lookup_of_an_unscaled_group_does_not_refuse_dcp(profile: SemanticsProfile) -> None:
    """From 0.29.0 a lookup gets its manager's DCP size: 1 for Mamba (and,
    in 0.29.0 and 0.30.0, for sliding window)."""
    kind: AttentionKind = Mamba(4, "align") if profile is V033 else SlidingWindow(4, 5)
    cfg = _cfg(kind, profile, dcp=2)
    spec, impl = _pair(cfg)
    req = _request(cfg, "a", 9)
    assert impl.get_computed_blocks(req) == spec.get_computed_blocks(req) == (((),), 0)


def test_lookup_with_caching_off_never_refuses() -> None:
    cfg = _cfg(SlidingWindow(4, 5), V025, dcp=2, enable_caching=False)
    spec, impl = _pair(cfg)
    req = RequestBlockHasher(cfg.hash_function, cfg.hash_seed, 8).new_request("a", list(range(9)))
    assert impl.get_computed_blocks(req) == spec.get_computed_blocks(req) == (((),), 0)


@pytest.mark.parametrize("profile", [V016, V025, V031, V033])
def test_full_attention_hit_in_scaled_blocks(profile: SemanticsProfile) -> None:
    """FA(4) under DCP 2: the second request hits the first's scaled blocks
    (8 tokens each) and both managers agree step by step."""
    cfg = _cfg(FullAttention(4), profile, dcp=2, enable_kv_cache_events=True)
    spec, impl = _pair(cfg)
    a = _request(cfg, "a", 20)
    assert impl.allocate_slots(a, 20) == spec.allocate_slots(a, 20) == ((1, 2, 3),)
    b = _request(cfg, "b", 20)
    hit = impl.get_computed_blocks(b)
    assert hit == spec.get_computed_blocks(b) == (((1, 2),), 16)
    assert impl.allocate_slots(b, 4, 16, hit[0]) == spec.allocate_slots(b, 4, 16, hit[0]) == ((4,),)
    assert impl.take_events() == spec.take_events()
    _same_state(spec, impl)
    impl.free("a")
    spec.free("a")
    _same_state(spec, impl)


def test_a_hit_past_the_scaled_table_is_refused_the_same_way() -> None:
    """cache_blocks beyond the scaled tables: the same error on both, nothing changed."""
    cfg = _cfg(FullAttention(4), V033, dcp=2)
    spec, impl = _pair(cfg)
    a = _request(cfg, "a", 20)
    impl.allocate_slots(a, 8, delay_cache_blocks=True)
    spec.allocate_slots(a, 8, delay_cache_blocks=True)
    errors = []
    for mgr in (spec, impl):
        with pytest.raises(KVCacheError) as info:
            mgr.cache_blocks(a, 16)
        errors.append(type(info.value))
    assert errors[0] is errors[1]
    _same_state(spec, impl)


KINDS: list[AttentionKind] = [
    FullAttention(4), MLA(4), SlidingWindow(4, 5), ChunkedLocal(4, 8), Mamba(4), Mamba(4, "align"), CrossAttention(4),
]  # fmt: skip


@pytest.mark.parametrize("profile", list(PROFILES.values()), ids=lambda p: p.name)
def test_rules_agree_with_the_spec(profile: SemanticsProfile) -> None:
    """kvimpl's copies of the context-parallel rules give kvspec's answers
    for every kind and world size the configuration accepts."""
    checked = 0
    for kind, dcp, pcp, caching in itertools.product(KINDS, (1, 2, 4), (1, 2), (False, True)):
        try:
            cfg = _cfg(kind, profile, dcp, pcp, enable_caching=caching)
        except KVCacheError:
            continue
        checked += 1
        assert cp_block_factor(kind, cfg) == spec_config.cp_scale(kind, cfg)
        assert dcp_scales_kind(kind, profile.cp_block_scaling) == spec_config.scales_by_dcp(kind, profile)
        assert cp_lookup_refusal(kind, cfg) == spec_config.cp_lookup_refusal(kind, cfg)
        assert manager_kinds(cfg) == cfg.manager_groups()
        assert scheduler_block_size(cfg) == cfg.scheduler_block_size
        assert hash_block_size(cfg) == cfg.resolved_hash_block_size()
        assert ("context-parallelism" in features_needed(cfg)) == (dcp * pcp > 1)
    assert checked > 40
