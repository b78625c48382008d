"""Which state-adding features a configuration exercises
(``kvspec.profiles.features_used``), and what stays refused."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import pytest

from kvspec.config import AttentionKind, CircularBuffer, FullAttention, KpoolTail, KVCacheConfig, Mamba, SlidingWindow
from kvspec.errors import UnsupportedByProfileError
from kvspec.kv_cache_manager import KVCacheManager
from kvspec.profiles import (
    FEATURE_SWITCHES,
    PARTIAL_HASH_HITS_CHECKED,
    PROFILES,
    VLLM_0_25_1,
    VLLM_0_26_0,
    VLLM_0_28_0,
    VLLM_0_29_0,
    VLLM_0_31_0,
    VLLM_0_32_0,
    VLLM_0_33_0,
    SemanticsProfile,
    features_used,
)
from kvspec.request import RequestBlockHasher

FA8_SWA4 = (FullAttention(8), SlidingWindow(4, 4))


def config(groups: tuple[AttentionKind, ...], profile: SemanticsProfile, caching: bool = True) -> KVCacheConfig:
    """A 32-block configuration of ``groups``."""
    return KVCacheConfig(num_blocks=32, groups=groups, max_model_len=64, enable_caching=caching, profile=profile)


@pytest.mark.parametrize(
    ("groups", "profile", "caching", "used"),
    [
        (FA8_SWA4, VLLM_0_25_1, True, set()),
        (FA8_SWA4, VLLM_0_26_0, True, {"partial-tail-entries"}),
        (FA8_SWA4, VLLM_0_26_0, False, set()),
        ((FullAttention(4), SlidingWindow(8, 4)), VLLM_0_33_0, True, set()),
        ((FullAttention(4), SlidingWindow(4, 4)), VLLM_0_33_0, True, set()),
        ((FullAttention(4), Mamba(4, "align")), VLLM_0_31_0, True, set()),
        ((FullAttention(4), Mamba(4, "align")), VLLM_0_32_0, True, {"mamba-tail-entries"}),
        ((Mamba(4, "align"),), VLLM_0_33_0, True, {"mamba-tail-entries"}),
        ((Mamba(4, "align"),), VLLM_0_33_0, False, set()),
        ((FullAttention(4), CircularBuffer(2)), VLLM_0_29_0, True, {"ring-kinds"}),
        ((FullAttention(4), KpoolTail(2, 8)), VLLM_0_31_0, False, {"ring-kinds"}),
    ],
)
def test_features_used(
    groups: tuple[AttentionKind, ...], profile: SemanticsProfile, caching: bool, used: set[str]
) -> None:
    """Partial tails need a cached hybrid with a coarse full-attention group;
    Mamba tails (0.32.0 on) any cached Mamba align group."""
    assert features_used(config(groups, profile, caching)) == used


def test_configurations_vllm_fails_on_are_refused() -> None:
    """Fine-grained hits with a coarse sliding-window group: vLLM 0.26.x and
    0.27.x fail an assertion at the first lookup, so kvspec refuses them;
    0.28.0 switches fine-grained hits off instead."""
    groups = (FullAttention(4), SlidingWindow(8, 4), Mamba(8, "align"))
    with pytest.raises(UnsupportedByProfileError, match="assertion"):
        config(groups, VLLM_0_26_0)
    if VLLM_0_28_0.name in PARTIAL_HASH_HITS_CHECKED:
        assert features_used(config(groups, VLLM_0_28_0)) == {"partial-hash-hits"}


@pytest.mark.parametrize("profile", list(PROFILES.values()), ids=lambda p: p.name)
def test_fine_grained_hits_are_refused_where_unchecked(profile: SemanticsProfile) -> None:
    """Fine-grained hits (a coarse Mamba align group) are modelled for the
    releases they were checked against, refused for the others."""
    groups = (FullAttention(4), Mamba(8, "align"))
    if not profile.partial_hash_hits or profile.name in PARTIAL_HASH_HITS_CHECKED:
        config(groups, profile)
        return
    with pytest.raises(UnsupportedByProfileError, match="fine-grained hits"):
        config(groups, profile)


def test_feature_switches_change_nothing_without_the_feature() -> None:
    """Every feature's switches are profile fields, and turning them all off
    changes nothing for a configuration that does not use the feature (an
    implementation that refuses the feature may ignore them)."""
    names = {f.name for f in fields(SemanticsProfile)}
    plain = (FullAttention(4), SlidingWindow(4, 4))
    for feature, switches in FEATURE_SWITCHES.items():
        assert switches <= names, feature
        changes: dict[str, Any] = {"name": "off", **dict.fromkeys(switches, False)}
        off = replace(VLLM_0_33_0, **changes)
        outcomes = []
        for profile in (VLLM_0_33_0, off):
            cfg = config(plain, profile)
            assert feature not in features_used(cfg)
            mgr = KVCacheManager(cfg)
            hasher = RequestBlockHasher.for_config(cfg)
            for rid in ("a", "b"):
                req = hasher.new_request(rid, [1] * 13)
                hits, n = mgr.get_computed_blocks(req)
                mgr.allocate_slots(req, req.num_tokens - n, n, hits if n else None)
            outcomes.append((mgr.to_view(), mgr.take_events()))
        assert outcomes[0] == outcomes[1], feature
