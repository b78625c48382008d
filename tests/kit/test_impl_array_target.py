"""``--target impl-array``: kvimpl's native manager through its array API, in lockstep with kvspec,
under every release whose requests fit the C request; a release whose requests do not is refused
with the reason, never run into a crash."""

from __future__ import annotations

import pytest

from kvref.adapters.impl_array import make_impl_array_adapter
from kvref.check import CheckRequest, run_lockstep, start
from kvref.settings import load_profile
from kvspec.config import FullAttention, KVCacheConfig, SlidingWindow
from kvspec.errors import UnsupportedByProfileError
from kvspec.profiles import VLLM_0_33_0, VLLM_0_34_0

pytest.importorskip("kvimpl._kvnative", reason="the native core is not built")


def test_a_release_whose_requests_are_python_ones_is_refused_with_the_reason() -> None:
    config = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=64, profile=VLLM_0_34_0)
    with pytest.raises(UnsupportedByProfileError, match=r"array API advances C requests only.*vllm-0\.34\.0"):
        make_impl_array_adapter(config)


def test_the_array_api_agrees_with_kvspec_under_0_33() -> None:
    config = KVCacheConfig(
        num_blocks=16, groups=(FullAttention(4), SlidingWindow(4, 8)), max_model_len=64, profile=VLLM_0_33_0
    )
    assert make_impl_array_adapter(config) is not None
    load_profile("dev")
    session = start(CheckRequest(target="impl-array", against="spec", semantics="vllm-0.33.0"))
    assert run_lockstep(session.setup, seed=0, goal=1_500) is None
    assert session.setup.stats.steps >= 1_500 and session.setup.stats.unexplained == 0
