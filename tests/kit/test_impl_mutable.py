"""``--target impl-mutable``: the mirrors advance with the values, and a wrong hash is caught."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvref.adapters.impl_mutable import make_impl_mutable_adapter
from kvref.adapters.spec import make_spec_adapter
from kvspec import FullAttention, KVCacheConfig, RequestBlockHasher
from kvspec.profiles import VLLM_0_33_0

CFG = KVCacheConfig(num_blocks=32, groups=(FullAttention(4),), max_model_len=256, profile=VLLM_0_33_0)
"""Under vLLM 0.33.0, whose requests both kvimpl request classes hold (from 0.34.0 on only the Python one)."""


def test_mirrors_follow_the_values_and_agree_with_the_spec() -> None:
    mutable, spec = make_impl_mutable_adapter(CFG), make_spec_adapter(CFG)
    hasher = RequestBlockHasher.for_config(CFG)
    req = hasher.new_request("r1", list(range(10)))
    for a in (mutable, spec):
        assert a.allocate_slots(req, 10) == ((1, 2, 3),)
    for step in range(6):
        req = hasher.with_output_tokens(replace(req, num_computed_tokens=req.num_tokens), [100 + step])
        assert mutable.allocate_slots(req, 1) == spec.allocate_slots(req, 1)
        assert mutable.to_view() == spec.to_view()
    mirror = mutable._mirrors["r1"].request
    assert (mirror.num_tokens, mirror.num_computed_tokens) == (16, 15)
    assert tuple(mirror.block_hashes) == req.block_hashes
    mutable.free("r1")
    assert "r1" not in mutable._mirrors
    other = hasher.new_request("r2", list(range(8)))
    mutable.get_computed_blocks(other)
    assert type(mutable._mirrors["r2"].request) is not type(mirror)  # the two request classes alternate


def test_a_mirror_whose_hashes_differ_from_kvspec_is_an_error() -> None:
    mutable = make_impl_mutable_adapter(CFG)
    hasher = RequestBlockHasher.for_config(CFG)
    req = hasher.new_request("r1", list(range(10)))
    mutable.allocate_slots(req, 10)
    mirror = mutable._mirrors["r1"].request  # the first mirror: the pure-Python class
    mirror._hashes[-1] = bytes(32)  # a wrong digest for the last full block
    mirror._hashes_tuple = None
    req = hasher.with_output_tokens(replace(req, num_computed_tokens=10), [7])
    with pytest.raises(AssertionError, match="incremental block hashes"):
        mutable.allocate_slots(req, 1)
