"""The context-parallel zoo entry (vLLM PR #26296): request hashes at the
unscaled block size while the managers use the DCP-scaled one."""

from __future__ import annotations

from typing import Any

import pytest

from kvref.adapters.spec import make_spec_adapter
from kvspec.config import FullAttention, KVCacheConfig, SlidingWindow
from kvspec.errors import UnsupportedByProfileError
from kvspec.profiles import VLLM_0_25_1
from kvspec.request import RequestBlockHasher
from kvspec.view import KVView
from kvtools.zoo.context_parallel import dcp_unscaled_request_hashes


def _after_one_request(adapter: Any, cfg: KVCacheConfig) -> KVView:
    req = RequestBlockHasher(cfg.hash_function, cfg.hash_seed, cfg.resolved_hash_block_size()).new_request(
        "r", list(range(20))
    )
    assert adapter.allocate_slots(req, 20, 0, ((),)) is not None
    view: KVView = adapter.to_view()
    return view


def test_the_fault_shows_in_the_cache_keys_under_dcp() -> None:
    cfg = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=64, dcp_world_size=2,
                        profile=VLLM_0_25_1)  # fmt: skip
    spec = _after_one_request(make_spec_adapter(cfg), cfg)
    mutant = _after_one_request(dcp_unscaled_request_hashes(cfg), cfg)
    assert spec.tables == mutant.tables
    assert spec.cached != mutant.cached


def test_without_context_parallelism_it_is_plain_kvimpl() -> None:
    cfg = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=64, profile=VLLM_0_25_1)
    assert _after_one_request(make_spec_adapter(cfg), cfg) == _after_one_request(dcp_unscaled_request_hashes(cfg), cfg)


def test_other_kinds_under_dcp_are_refused() -> None:
    cfg = KVCacheConfig(num_blocks=16, groups=(SlidingWindow(4, 5),), max_model_len=64, dcp_world_size=2,
                        enable_caching=False, profile=VLLM_0_25_1)  # fmt: skip
    with pytest.raises(UnsupportedByProfileError, match="only one full-attention"):
        dcp_unscaled_request_hashes(cfg)
