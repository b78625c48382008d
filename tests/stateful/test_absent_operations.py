"""Operations and arguments a release lacks: the machine sends them on purpose
(``absent_operation``) and every side must refuse them, changing nothing; an
adapter that runs one instead diverges, and such a step replays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvref.adapters import load_factory
from kvref.adapters.impl import ImplAdapter, make_impl_adapter
from kvref.adapters.spec import make_spec_adapter
from kvref.capabilities import RELEASE_OPERATIONS, absent_features
from kvref.lockstep import Lockstep, LockstepFailure, RunStats
from kvref.ops import ABSENT
from kvref.traces import Trace, replay
from kvspec.config import FullAttention, KVCacheConfig, SlidingWindow
from kvspec.profiles import NEWEST, PROFILES, VLLM_0_16_0, VLLM_0_25_1, VLLM_0_33_0

_RID = {"rid": "r1"}


def _probe(feature: str) -> dict[str, Any]:
    """The operation the machine's ``absent_operation`` sends for ``feature``."""
    name = feature.removeprefix("op:")
    if feature == "max_cache_hit_length":  # a lookup argument (vLLM 0.33.0 on)
        return {"op": "get_computed_blocks", **_RID, feature: 8}
    if not feature.startswith("op:"):
        value = {
            "full_sequence_must_fit": True, "reserved_blocks": 1, "has_scheduled_reqs": False,
            "skip_zeroing_group_ids": [0],
        }[feature]  # fmt: skip
        return {"op": "allocate_slots", **_RID, "num_new_tokens": 1, feature: value}
    extras: dict[str, dict[str, Any]] = {
        "get_block_ids_for_computed_tokens": {**_RID, "num_computed_tokens": 0},
        "record_prefix_cache_stats": {**_RID, "num_hits": 0},
        "pop_blocks_for_free": _RID,
        "estimate_cached_tokens": _RID,
        "get_prefix_hint": _RID,
        "get_num_cached_tokens": _RID,
        "get_num_common_prefix_blocks": _RID,
        "record_blocks_for_zeroing": {**_RID, "start_token": 0},
        "get_zeroing_block_ids_in_range": {**_RID, "start_token": 0, "end_token": 4},
        "get_computed_blocks_for_connector": _RID,
        "truncate_computed_blocks": {"blocks": [[], []], "num_computed_tokens": 0},
    }
    return {"op": name, **extras.get(name, {})}


def _lockstep(profile_name: str, tmp_path: Path, factories: list[Any] | None = None) -> Lockstep:
    cfg = KVCacheConfig(
        num_blocks=16, groups=(FullAttention(4), SlidingWindow(4, 8)), max_model_len=64, profile=PROFILES[profile_name]
    )
    lock = Lockstep(cfg, factories or [make_spec_adapter, make_impl_adapter], RunStats(), tmp_path)
    lock.request_op({"op": "add_request", "rid": "r1", "prompt": list(range(9))})
    return lock


def test_every_release_lacks_what_its_switches_say() -> None:
    # gone in vLLM 0.34.0 and 0.32.0
    assert absent_features(NEWEST) == {"op:get_num_common_prefix_blocks", "op:get_zeroing_block_ids_in_range"}
    assert absent_features(VLLM_0_16_0) >= {"op:new_step_starts", "op:get_prefix_hint", "reserved_blocks"}
    assert absent_features(VLLM_0_25_1) == {
        "op:estimate_cached_tokens", "op:record_prefix_cache_stats", "op:take_kv_cache_block_copies",
        "max_cache_hit_length", "op:get_num_cached_tokens", "op:record_blocks_for_zeroing",
        "op:get_computed_blocks_for_connector", "op:truncate_computed_blocks", "op:get_zeroing_block_ids_in_range",
        "skip_zeroing_group_ids",
    }  # fmt: skip
    assert absent_features(VLLM_0_33_0) == {"op:get_num_cached_tokens", "op:get_zeroing_block_ids_in_range"}
    assert {f for f, _ in RELEASE_OPERATIONS} == set().union(*(absent_features(p) for p in PROFILES.values()))


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_kvspec_and_kvimpl_refuse_every_absent_feature(profile: str, tmp_path: Path) -> None:
    lock = _lockstep(profile, tmp_path)
    for feature in sorted(lock.absent):
        before = [a.to_view() for a in lock.adapters]
        assert lock.call_absent(_probe(feature)) == ABSENT, feature
        assert [a.to_view() for a in lock.adapters] == before
    assert lock.stats.unexplained == 0 and not lock.skipped


def test_an_adapter_that_runs_an_absent_operation_diverges(tmp_path: Path) -> None:
    """kvimpl with ``get_prefix_hint`` answering under vLLM 0.16.0, which has none."""

    def runs_it(config: KVCacheConfig) -> ImplAdapter:
        adapter = ImplAdapter(config)
        adapter.get_prefix_hint = lambda request: 0  # type: ignore[method-assign]  # the planted fault
        return adapter

    lock = _lockstep(VLLM_0_16_0.name, tmp_path, [make_spec_adapter, runs_it])
    with pytest.raises(LockstepFailure, match="returned 0"):
        lock.call_absent(_probe("op:get_prefix_hint"))


def test_a_present_operation_is_not_probed(tmp_path: Path) -> None:
    lock = _lockstep(NEWEST.name, tmp_path)
    with pytest.raises(AssertionError, match="not absent"):
        lock.call_absent(_probe("op:get_prefix_hint"))


def test_a_probed_step_replays(tmp_path: Path) -> None:
    """The trace of a probe expects :data:`ABSENT`; replay takes the skip error as that answer."""
    lock = _lockstep(VLLM_0_16_0.name, tmp_path)
    lock.call_absent(_probe("op:new_step_starts"))
    trace = Trace(lock.config, lock.trace_log(), {})
    assert replay(trace, load_factory("spec")).ok
    assert replay(trace, load_factory("impl")).ok
