"""A KV connector's lookup (``get_computed_blocks_for_connector``) and
``truncate_computed_blocks`` (vLLM 0.27.0 on): kvspec's answers, worked out
by hand here, and both kvimpl builds giving the same ones.

The situation: a full-attention group and a Mamba align group (block 4). A
first request computes 13 tokens in a chunk of 8 and one of 5, so full
attention caches three blocks (12 tokens) while Mamba kept a state only at
8. A second request with that prompt and more hits 8 tokens the reconciled
way; the connector's lookup reports full attention's 12, with the Mamba list
lagging at 8, and says the hit diverged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvimpl.kv_cache_manager import KVCacheManager as PythonManager
from kvimpl.native import NativeKVCacheManager, create_manager, native_enabled
from kvspec.config import FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.errors import InvalidTokenCountError, StaleHitError, UnsupportedOperationError
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.profiles import VLLM_0_26_0, VLLM_0_27_0, VLLM_0_29_0, VLLM_0_34_0, SemanticsProfile
from kvspec.request import Request, RequestBlockHasher

PROMPT = list(range(100, 113))
BUILDS: list[Any] = [
    SpecManager,
    PythonManager,
    pytest.param("native", marks=pytest.mark.skipif(not native_enabled(), reason="no native build")),
]
HYBRID = (FullAttention(4), Mamba(4, "align", 0))


def _manager(build: Any, config: KVCacheConfig) -> Any:
    if build == "native":
        manager = create_manager(config, native=True)
        assert isinstance(manager, NativeKVCacheManager), "the native core declines this configuration"
        return manager
    return build(config)


def _lagging(build: Any, profile: SemanticsProfile, groups: tuple[Any, ...] = HYBRID) -> tuple[Any, Request]:
    """A manager holding the cached first request, and the second request (not admitted)."""
    config = KVCacheConfig(num_blocks=24, groups=groups, max_model_len=64, profile=profile)
    kv = _manager(build, config)
    hasher = RequestBlockHasher.for_config(config)
    first = hasher.new_request("a", PROMPT)
    assert kv.allocate_slots(first, 8) is not None
    first = dataclasses.replace(first, num_computed_tokens=8)
    assert kv.allocate_slots(first, 5) is not None
    kv.cache_blocks(dataclasses.replace(first, num_computed_tokens=13), 13)
    kv.free("a")
    kv.new_step_starts()  # the next scheduler step: the Mamba states cached in this one may be hit
    return kv, hasher.new_request("b", [*PROMPT, 1, 2, 3])


@pytest.mark.parametrize("build", BUILDS)
def test_the_connector_lookup_reports_full_attention_and_flags_the_lagging_mamba_group(build: Any) -> None:
    kv, second = _lagging(build, VLLM_0_29_0)
    assert kv.get_computed_blocks(second) == (((1, 2), (0, 3)), 8)
    assert kv.get_computed_blocks_for_connector(second) == (((1, 2, 4), (0, 3)), 12, True)
    kv.check_invariants()


@pytest.mark.parametrize("build", BUILDS)
def test_an_allocation_takes_the_lagging_list_with_connector_tokens(build: Any) -> None:
    kv, second = _lagging(build, VLLM_0_29_0)
    hits, hit, diverged = kv.get_computed_blocks_for_connector(second)
    assert diverged
    # the Mamba state at 12 comes with the load; the Mamba hit blocks are all skipped (not touched)
    new = kv.allocate_slots(
        second, 2, num_new_computed_tokens=hit, new_computed_blocks=hits, num_external_computed_tokens=2
    )
    assert new is not None
    # full attention: the three hits and a block for the loaded and new tokens; Mamba: nulls up to
    # the block of the state at 12 (skipped) and one block for the state at 16 (align mode)
    assert kv.get_block_ids("b") == ((1, 2, 4, 6), (0, 0, 0, 5))
    kv.check_invariants()


@pytest.mark.parametrize("build", BUILDS)
def test_a_short_list_in_a_full_attention_group_is_still_refused(build: Any) -> None:
    kv, second = _lagging(build, VLLM_0_29_0)
    with pytest.raises(StaleHitError):
        kv.allocate_slots(second, 2, num_new_computed_tokens=12, new_computed_blocks=((1, 2), (0, 3)))
    kv.check_invariants()


@pytest.mark.parametrize("build", BUILDS)
def test_a_model_without_mamba_gets_the_reconciled_lookup(build: Any) -> None:
    groups = (FullAttention(4), SlidingWindow(4, 8))
    config = KVCacheConfig(num_blocks=24, groups=groups, max_model_len=64, profile=VLLM_0_34_0)
    kv = _manager(build, config)
    hasher = RequestBlockHasher.for_config(config)
    first = hasher.new_request("a", PROMPT)
    assert kv.allocate_slots(first, 13) is not None
    kv.cache_blocks(dataclasses.replace(first, num_computed_tokens=13), 13)
    kv.free("a")
    second = hasher.new_request("b", [*PROMPT, 1])
    blocks, n = kv.get_computed_blocks(second)
    assert n == 12
    assert kv.get_computed_blocks_for_connector(second) == (blocks, 12, False)


@pytest.mark.parametrize("build", BUILDS)
def test_truncation_slices_and_keeps_a_lagging_mamba_list_from_0_28_0(build: Any) -> None:
    kv, _ = _lagging(build, VLLM_0_29_0)
    assert kv.truncate_computed_blocks(((1, 2, 4), (0, 3)), 8) == ((1, 2), (0, 3))
    assert kv.truncate_computed_blocks(((1, 2, 4), (0, 3)), 12) == ((1, 2, 4), (0, 3))
    with pytest.raises(InvalidTokenCountError):  # not a multiple of the block size
        kv.truncate_computed_blocks(((1, 2, 4), (0, 3)), 6)
    with pytest.raises(InvalidTokenCountError):  # past full attention's list
        kv.truncate_computed_blocks(((1, 2), (0, 3)), 12)


@pytest.mark.parametrize("build", BUILDS)
def test_truncation_past_a_mamba_list_is_refused_in_0_27_0(build: Any) -> None:
    kv, _ = _lagging(build, VLLM_0_27_0)
    with pytest.raises(InvalidTokenCountError):  # vLLM 0.27.x asserts there
        kv.truncate_computed_blocks(((1, 2, 4), (0, 3)), 12)


@pytest.mark.parametrize("build", BUILDS)
def test_both_operations_are_absent_before_0_27_0(build: Any) -> None:
    kv, second = _lagging(build, VLLM_0_26_0)
    with pytest.raises(UnsupportedOperationError):
        kv.get_computed_blocks_for_connector(second)
    with pytest.raises(UnsupportedOperationError):
        kv.truncate_computed_blocks(((), ()), 0)
    with pytest.raises(StaleHitError):  # and the lagging list is no hit any lookup returns
        kv.allocate_slots(second, 2, num_new_computed_tokens=12, new_computed_blocks=((1, 2, 4), (0, 3)))
