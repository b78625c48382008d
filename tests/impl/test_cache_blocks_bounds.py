"""``cache_blocks`` counts against a Mamba group's speculative blocks, on
kvspec and on both kvimpl builds.

A Mamba group's tables hold ``num_speculative_blocks`` spare blocks past the
request's tokens. A count whose full blocks reach into them is refused with
``CacheBeyondAllocationError`` and changes nothing (vLLM would key a spare
block as the state at a length no token reached); a count whose full blocks
the token blocks hold, even past the computed tokens, is accepted.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvimpl.config_rules import cacheable_blocks as impl_cacheable_blocks
from kvimpl.kv_cache_manager import KVCacheManager as ImplManager
from kvimpl.native import NativeKVCacheManager, native_module, native_unsupported
from kvspec.config import (
    CircularBuffer,
    CrossAttention,
    FullAttention,
    KVCacheConfig,
    Mamba,
    SlidingWindow,
    cacheable_blocks,
    speculative_blocks,
)
from kvspec.errors import CacheBeyondAllocationError
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.profiles import VLLM_0_25_1, VLLM_0_33_0, SemanticsProfile
from kvspec.request import RequestBlockHasher

BUILDS = [
    pytest.param(SpecManager, id="spec"),
    pytest.param(ImplManager, id="python"),
    pytest.param(
        NativeKVCacheManager,
        id="native",
        marks=pytest.mark.skipif(native_module() is None, reason="the native core is not built"),
    ),
]


def test_only_mamba_groups_have_speculative_blocks() -> None:
    assert speculative_blocks(Mamba(2, "align", num_speculative_blocks=2)) == 2
    assert speculative_blocks(FullAttention(4)) == 0


@pytest.mark.parametrize("rule", [cacheable_blocks, impl_cacheable_blocks], ids=["spec", "impl"])
def test_cacheable_blocks_leave_out_speculative_blocks_and_groups_that_cache_nothing(rule: Any) -> None:
    # The one rule kvspec, kvimpl, the vLLM adapter and the machine's cache_past_slots apply.
    assert rule(FullAttention(4), 3) == 3
    assert rule(SlidingWindow(4, 8), 0) == 0
    assert rule(Mamba(2, "align", num_speculative_blocks=2), 4) == 2
    assert rule(Mamba(2, "all", num_speculative_blocks=1), 0) == -1  # a table not allocated yet: nothing fits
    assert rule(CrossAttention(4), 5) is None
    assert rule(CircularBuffer(4), 1) is None


@pytest.mark.parametrize("profile", [VLLM_0_25_1, VLLM_0_33_0], ids=["0.25.1", "0.33.0"])
@pytest.mark.parametrize("build", BUILDS)
def test_a_count_into_the_speculative_blocks_is_refused(build: Any, profile: SemanticsProfile) -> None:
    cfg = KVCacheConfig(
        num_blocks=16,
        groups=(FullAttention(4), Mamba(2, "align", num_speculative_blocks=2)),
        max_model_len=32,
        profile=profile,
    )
    if build is NativeKVCacheManager and native_unsupported(cfg):
        pytest.skip(f"the native core: {native_unsupported(cfg)}")
    kv = build(cfg)
    req = RequestBlockHasher.for_config(cfg).new_request("r", [0] * 10)
    assert kv.allocate_slots(req, 4) is not None  # Mamba: 2 token blocks, then 2 speculative ones
    assert len(kv.get_block_ids("r")[1]) == 4
    before = kv.to_view()
    with pytest.raises(CacheBeyondAllocationError, match="holds 2 blocks for tokens"):
        kv.cache_blocks(req, 6)  # 3 full Mamba blocks: one of them speculative
    assert kv.to_view() == before
    kv.cache_blocks(req, 5)  # past the 4 computed tokens, but its full blocks are token blocks: accepted
    kv.check_invariants()
