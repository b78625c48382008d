"""The hit-limit family (``kvref.machine.hit_limits``): under vLLM 0.33.0 and
0.34.0 the machine makes bounded admissions, asks ``get_num_cached_tokens``,
makes prompt-logprob requests, sets skip flags late, reuses the ids of freed
requests and sends token ids beyond 32 bits; each draw is counted in
``RunStats.hit_limits``. A fault planted in kvspec's 0.34.0 hit-limit rules is
caught by kvimpl's independent copy of them; against kvimpl's native core,
which declines lookups of another length, the draws are narrowed and the runs
agree; an older release draws none of them and gets the absent ones probed."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import Phase, settings

import kvspec.kv_cache_manager as spec_manager
from kvimpl.native import native_module
from kvref.adapters import load_factory
from kvref.hypothesis_compat import seed_machine
from kvref.lockstep import LockstepFailure, RunStats
from kvref.machine import hit_limits
from kvref.machine.hit_limits import BOUNDS, draw_bound
from kvref.stateful import MachineSetup, SchedulerMachine, run_machine
from kvspec.profiles import VLLM_0_25_1, VLLM_0_33_0, VLLM_0_34_0, SemanticsProfile

SETTINGS = settings(max_examples=40, stateful_step_count=60, database=None, phases=[Phase.generate])
EVERY_DRAW_0_34 = (
    "bounded lookup", "get_num_cached_tokens", "prompt-logprob request", "prompt-logprob request reading",
    "late skip set", "late skip cleared", "reused id", "wide token ids", "wide token id refused (prompt)",
    "wide token id refused (output)",
)  # fmt: skip


def _run(tmp_path: Path, profile: SemanticsProfile, target: str = "impl-python", seed: int = 0) -> RunStats:
    """One seeded batch of the machine on kvspec and ``target`` under ``profile``."""
    stats = RunStats()

    class Limited(SchedulerMachine):
        SETUP = MachineSetup([load_factory("spec"), load_factory(target)], stats, tmp_path, profile=profile)

    seed_machine(Limited, seed)
    run_machine(Limited, SETTINGS)
    return stats


def test_every_draw_happens_under_0_34(tmp_path: Path) -> None:
    stats = _run(tmp_path, VLLM_0_34_0)
    missing = [what for what in EVERY_DRAW_0_34 if not stats.hit_limits[what]]
    assert not missing, f"never drawn: {missing} (drawn: {dict(stats.hit_limits)})"
    assert stats.invalid_calls["add_request:InvalidRequestError"] > 0
    assert stats.unexplained == 0 and stats.steps > 0


def test_0_33_takes_bounds_and_wide_ids_and_lacks_the_probe(tmp_path: Path) -> None:
    """vLLM 0.33.0: bounded lookups (as given), late skips read at the lookup and
    wide ids all run on every side; ``get_num_cached_tokens`` is refused as absent."""
    stats = _run(tmp_path, VLLM_0_33_0)
    for what in ("bounded lookup", "late skip set", "reused id", "wide token ids"):
        assert stats.hit_limits[what] > 0, what
    assert not stats.hit_limits["get_num_cached_tokens"] and not stats.hit_limits["prompt-logprob request"]
    assert not stats.hit_limits["wide token id refused (prompt)"]
    assert stats.invalid_calls["get_num_cached_tokens:UnsupportedOperationError"] > 0
    assert stats.unexplained == 0


def test_an_older_release_draws_none_and_probes_both_absent(tmp_path: Path) -> None:
    stats = _run(tmp_path, VLLM_0_25_1, seed=1)
    assert not stats.hit_limits, dict(stats.hit_limits)
    assert stats.invalid_calls["get_num_cached_tokens:UnsupportedOperationError"] > 0
    assert stats.invalid_calls["get_computed_blocks:UnsupportedOperationError"] > 0
    assert stats.unexplained == 0


def test_a_capped_bound_taken_as_given_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kvspec's 0.34.0 lookup length with the bound replacing ``num_tokens - 1``
    (0.33.0's rule): kvimpl keeps its own copy of the rule, so the lockstep differs."""
    right = spec_manager.lookup_length

    def as_given(profile: SemanticsProfile, request: object, bound: int | None) -> int:
        length = right(profile, request, None)  # type: ignore[arg-type]  # the request the manager passes
        return length if bound is None else bound  # the planted fault: 0.34.0 caps the bound

    monkeypatch.setattr(spec_manager, "lookup_length", as_given)
    with pytest.raises(LockstepFailure, match="spec returned"):
        for seed in range(6):
            _run(tmp_path, VLLM_0_34_0, seed=seed)


def test_a_late_skip_read_at_the_lookup_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kvspec's 0.34.0 reads check with the skip flag as it is now (0.33.0's
    rule) instead of the limit fixed when the request was made."""

    def flag_now(profile: SemanticsProfile, request: object) -> bool:
        return not request.skip_reading_prefix_cache  # type: ignore[attr-defined]  # the planted fault

    monkeypatch.setattr(spec_manager, "reads_prefix_cache", flag_now)
    with pytest.raises(LockstepFailure):
        for seed in range(6):
            _run(tmp_path, VLLM_0_34_0, seed=seed)


@pytest.mark.skipif(native_module() is None, reason="kvimpl's native core is not built")
def test_the_native_core_takes_every_draw_and_agrees(tmp_path: Path) -> None:
    """The native core runs lookups of any length (its ``lookup_bounded``): no draw is narrowed
    for it, and the runs agree."""
    stats = _run(tmp_path, VLLM_0_34_0, target="impl-native")
    assert not any("narrowed" in k for k in stats.hit_limits), stats.hit_limits
    assert stats.hit_limits["get_num_cached_tokens"] > 0 and stats.hit_limits["late skip set"] > 0
    assert sum(n for k, n in stats.hit_limits.items() if k.startswith("bounded")) > 0, stats.hit_limits
    assert stats.unexplained == 0 and not stats.skipped


@pytest.mark.parametrize("how", BOUNDS)
def test_each_bound_is_where_its_name_says(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``draw_bound`` for a 10-token request (blocks of 4), every integer drawn
    at its lower end (as a shrunk history has it)."""
    monkeypatch.setattr(hit_limits, "integer", lambda data, lo, hi: lo)
    want = {"zero": 0, "below": 8, "at": 9, "above": 11, "whole": 10, "block": 0, "block_plus": 1, "any": 0}
    assert draw_bound(None, how, 10, 4) == want[how]  # type: ignore[arg-type]  # no draw reaches the data
