"""Decode/prefill context parallelism (``dcp_world_size``, ``pcp_world_size``)
per vLLM release: the scaled manager block sizes, the sliding-window mask
quirk, the unscaled admission cap, the lookup refusals and what kvspec does
not model. The expected values were checked against the real vLLM releases."""

from __future__ import annotations

import pytest

from kvspec import KVCacheManager, RequestBlockHasher
from kvspec.config import (
    MLA,
    AttentionKind,
    ChunkedLocal,
    CircularBuffer,
    CrossAttention,
    FullAttention,
    KVCacheConfig,
    Mamba,
    SinkFullAttention,
    SlidingWindow,
    admission_cap,
)
from kvspec.errors import ConfigError, ContextParallelLookupError, UnsupportedByProfileError
from kvspec.profiles import PROFILES, SemanticsProfile, profile_named

V016, V025, V026, V029, V030, V031, V033 = (
    profile_named(v) for v in ("0.16.0", "0.25.1", "0.26.0", "0.29.0", "0.30.0", "0.31.0", "0.33.0")
)


def _cfg(kind: AttentionKind, profile: SemanticsProfile, dcp: int = 1, pcp: int = 1, **kw: object) -> KVCacheConfig:
    fields: dict[str, object] = {"num_blocks": 24, "groups": (kind,), "max_model_len": 64, **kw}
    return KVCacheConfig(profile=profile, dcp_world_size=dcp, pcp_world_size=pcp, **fields)  # type: ignore[arg-type]  # fields is a test's keyword bag


@pytest.mark.parametrize("name", ["dcp_world_size", "pcp_world_size"])
@pytest.mark.parametrize("value", [0, -2, 1.5, True, "2"])
def test_world_sizes_are_validated(name: str, value: object) -> None:
    with pytest.raises(ConfigError, match=name):
        KVCacheConfig(num_blocks=8, groups=(FullAttention(4),), max_model_len=32, **{name: value})  # type: ignore[arg-type]  # deliberately wrong types


# (profile, kind, dcp, pcp) -> manager block size
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
    assert cfg.manager_groups()[0].block_size == bs
    assert cfg.scheduler_block_size == bs
    assert cfg.resolved_hash_block_size() == bs
    kv = KVCacheManager(cfg)
    assert kv.coordinator.managers[0].block_size == bs
    hasher = RequestBlockHasher(cfg.hash_function, cfg.hash_seed, cfg.resolved_hash_block_size())
    req = hasher.new_request("r", list(range(17)))
    blocks = kv.allocate_slots(req, 17, 0, ((),))
    assert blocks is not None
    if not isinstance(kind, CrossAttention | Mamba):  # sized by encoder tokens / by state
        assert len(blocks[0]) == -(-17 // bs)


def test_without_context_parallelism_the_groups_are_unchanged() -> None:
    cfg = KVCacheConfig(num_blocks=8, groups=(FullAttention(4), SlidingWindow(4, 5)), max_model_len=32)
    assert cfg.manager_groups() is cfg.groups


def _cached_blocks(profile: SemanticsProfile) -> list[int]:
    cfg = _cfg(SlidingWindow(4, 5), profile, dcp=2)
    kv = KVCacheManager(cfg)
    req = RequestBlockHasher(cfg.hash_function, cfg.hash_seed, cfg.resolved_hash_block_size()).new_request(
        "r", list(range(33))
    )
    assert kv.allocate_slots(req, 33, 0, ((),)) == ((1, 2, 3, 4, 5),)
    return [b for b in range(cfg.num_blocks) if kv.block_pool.block_hash[b] is not None]


@pytest.mark.parametrize(
    ("profile", "cached"), [(V016, [1, 2, 3, 4]), (V025, [2, 4]), (V026, [2, 4]), (V033, [1, 2, 3, 4])]
)
def test_swa_cache_mask_counts_in_the_unscaled_size_until_0_30(profile: SemanticsProfile, cached: list[int]) -> None:
    """SWA(4, window 5), DCP 2, 33 tokens: 0.25.1 to 0.28.0 cache every
    second block (the mask's window and alignment use the unscaled size)."""
    assert _cached_blocks(profile) == cached


def test_admission_cap_stays_in_unscaled_blocks() -> None:
    """vLLM computes the full-sequence cap from the engine's block size and
    compares it with the manager's scaled table: about dcp times too loose."""
    kind = SlidingWindow(4, 8)
    cfg = _cfg(kind, V033, dcp=2, enable_caching=False, max_num_batched_tokens=8)
    kv = KVCacheManager(cfg)
    assert kv.coordinator.managers[0].admission_cap == admission_cap(kind, 8, 64) == 5


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
    cfg = _cfg(kind, profile, dcp, pcp)
    kv = KVCacheManager(cfg)
    hasher = RequestBlockHasher(cfg.hash_function, cfg.hash_seed, cfg.resolved_hash_block_size())
    first = hasher.new_request("a", list(range(20)))
    assert kv.allocate_slots(first, 20, 0, ((),)) is not None
    before = kv.to_view()
    with pytest.raises(ContextParallelLookupError, match=message):
        kv.get_computed_blocks(hasher.new_request("b", list(range(20))))
    assert kv.to_view() == before
    kv.check_invariants()


@pytest.mark.parametrize("profile", [V029, V030, V033])
def test_lookup_of_an_unscaled_group_does_not_refuse_dcp(profile: SemanticsProfile) -> None:
    """From 0.29.0 a lookup gets its manager's DCP size: 1 for Mamba (and,
    in 0.29.0 and 0.30.0, for sliding window)."""
    kind: AttentionKind = Mamba(4, "align") if profile is V033 else SlidingWindow(4, 5)
    cfg = _cfg(kind, profile, dcp=2)
    kv = KVCacheManager(cfg)
    req = RequestBlockHasher(cfg.hash_function, cfg.hash_seed, cfg.resolved_hash_block_size()).new_request(
        "a", list(range(9))
    )
    assert kv.get_computed_blocks(req) == (((),), 0)


def test_lookup_with_caching_off_never_refuses() -> None:
    cfg = _cfg(SlidingWindow(4, 5), V025, dcp=2, enable_caching=False)
    kv = KVCacheManager(cfg)
    req = RequestBlockHasher(cfg.hash_function, cfg.hash_seed, 8).new_request("a", list(range(9)))
    assert kv.get_computed_blocks(req) == (((),), 0)


def test_hash_block_size_must_equal_the_scaled_block_when_caching() -> None:
    with pytest.raises(ConfigError, match="must equal the context-parallel manager block size 8"):
        _cfg(FullAttention(4), V033, dcp=2, hash_block_size=4)
    assert _cfg(FullAttention(4), V033, dcp=2, hash_block_size=8).resolved_hash_block_size() == 8


@pytest.mark.parametrize(
    ("groups", "profile", "caching", "what"),
    [
        ((FullAttention(4), SlidingWindow(4, 5)), V033, True, "several KV-cache groups"),
        ((FullAttention(4), SlidingWindow(4, 5)), V026, False, "several KV-cache groups"),
        ((CircularBuffer(2),), V033, False, "ring kind"),
        ((FullAttention(4), Mamba(4, "all", 1)), V025, False, "speculative blocks"),
        ((Mamba(4, "align"),), V026, True, "cached Mamba group"),
        # 0.16.0's external-token cap for a chunk below the (scaled) block size is not modelled
        ((ChunkedLocal(4, 4),), V016, False, "chunk below the block size"),
    ],
)
def test_unmodelled_context_parallel_configs_are_refused(
    groups: tuple[AttentionKind, ...], profile: SemanticsProfile, caching: bool, what: str
) -> None:
    with pytest.raises(UnsupportedByProfileError, match=what):
        KVCacheConfig(
            num_blocks=24, groups=groups, max_model_len=64, enable_caching=caching, dcp_world_size=2, profile=profile
        )


def test_every_profile_names_its_scaling_rule() -> None:
    rules = {p.release: p.cp_block_scaling for p in PROFILES.values()}
    assert rules["0.16.0"] == rules["0.25.1"] == "dcp-pcp"
    assert rules["0.26.0"] == rules["0.28.0"] == "dcp"
    assert rules["0.29.0"] == rules["0.30.0"] == "dcp-full-attention"
    assert rules["0.31.0"] == rules["0.33.0"] == "dcp-sharded"
    masks = [p.release for p in PROFILES.values() if p.cp_swa_mask_unscaled]
    assert masks == ["0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0"]


@pytest.mark.parametrize("profile", [V016, V025, V030, V033])
def test_sinkfull_reserves_its_sink_in_scaled_blocks(profile: SemanticsProfile) -> None:
    """SinkFull(4, sink 8) under DCP 2 runs 8-token blocks: one sink block
    (up to 0.29.0; later releases reserve none), and a 9-token request takes
    two table blocks."""
    cfg = _cfg(SinkFullAttention(4, 8), profile, dcp=2)
    m = KVCacheManager(cfg)
    sink = 1 if profile.sink_blocks_reserved else 0
    assert m.to_view().free_queue == tuple(range(1 + sink, 24))
    req = RequestBlockHasher.for_config(cfg).new_request("a", list(range(9)))
    assert m.allocate_slots(req, 9) == ((1 + sink, 2 + sink),)
    m.check_invariants()


def test_sink_len_must_be_a_multiple_of_the_scaled_block() -> None:
    """vLLM's SinkFull manager asserts ``sink_len % block_size == 0`` on its scaled block size."""
    with pytest.raises(ConfigError, match="sink_len 8 must be a multiple of the context-parallel manager block size"):
        _cfg(SinkFullAttention(4, 8), V033, dcp=4)


@pytest.mark.parametrize("profile", [V016, V025])
def test_hybrids_with_caching_refuse_context_parallelism_up_to_0_25(profile: SemanticsProfile) -> None:
    """Up to vLLM 0.25.1 the hybrid coordinator refuses DCP and PCP; with
    caching off each group's manager runs its scaled block size."""
    groups = (FullAttention(4), SlidingWindow(4, 5), Mamba(4, "all", 0))
    with pytest.raises(ConfigError, match="several KV-cache groups with prefix caching refuse context parallelism"):
        KVCacheConfig(num_blocks=24, groups=groups, max_model_len=64, dcp_world_size=2, profile=profile)
    cfg = KVCacheConfig(
        num_blocks=24, groups=groups, max_model_len=64, enable_caching=False, pcp_world_size=2, profile=profile
    )
    assert [k.block_size for k in cfg.manager_groups()] == [8, 8, 8]
    m = KVCacheManager(cfg)
    req = RequestBlockHasher.for_config(cfg).new_request("a", list(range(9)))
    assert m.allocate_slots(req, 9) == ((1, 2), (3, 4), (5, 6))
    m.check_invariants()


@pytest.mark.parametrize("profile", [V016, V025, V033])
@pytest.mark.parametrize("kind", [FullAttention(8), Mamba(8, "align")])
def test_one_cached_group_needs_its_hash_block_to_be_its_block(profile: SemanticsProfile, kind: AttentionKind) -> None:
    """Every release's unitary coordinator asserts ``hash_block_size ==
    block_size`` with caching on: a finer hash block needs two groups."""
    with pytest.raises(ConfigError, match="hash_block_size 4 must equal the block size 8 for one group with caching"):
        _cfg(kind, profile, hash_block_size=4)
    assert _cfg(kind, profile, hash_block_size=4, enable_caching=False).groups == (kind,)
