"""Registered vLLM safety defects (kit/kvref/safety_defects.toml, docs/safety.md).

Each entry's minimal trace shows its defect under the safety oracles on the
release that has it (kvspec and kvimpl model it faithfully; real vLLM where
installed) and names the entry; the same operations under a release after the
fix violate nothing. An entry names a violation only for a release in its range.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kvref.adapters import load_factory
from kvref.adapters.vllm import installed_vllm_version
from kvref.safety import safety_replay
from kvref.safety_defects import EARLY_FREE, FAILED_LOAD_WINDOW, LOAD_ZEROING, load_defects, registered
from kvref.traces import Trace, load
from kvspec.profiles import profile_named

ROOT = Path(__file__).resolve().parents[2]
DEFECTS = {d.id: d for d in load_defects()}
FIXED = sorted(d.id for d in DEFECTS.values() if d.fixed is not None)
VLLM = installed_vllm_version()


def _trace(defect: str, release: str | None = None) -> Trace:
    trace = load(ROOT / DEFECTS[defect].trace)
    if release is None:
        return trace
    return dataclasses.replace(trace, config=dataclasses.replace(trace.config, profile=profile_named(release)))


def test_the_registry_lists_the_defects_the_monitor_names() -> None:
    assert set(DEFECTS) == {EARLY_FREE, LOAD_ZEROING, FAILED_LOAD_WINDOW}
    for defect in DEFECTS.values():
        trace = load(ROOT / defect.trace)
        assert trace.meta["safety_defect"] == defect.id
        assert defect.applies_to(trace.config.profile.release)
        assert defect.upstream.startswith(("vLLM#", "not reported upstream"))


@pytest.mark.parametrize("defect", sorted(DEFECTS))
@pytest.mark.parametrize("engine", ["spec", "impl", "impl-python"])
def test_the_minimal_trace_shows_its_defect(defect: str, engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """kvspec and kvimpl (native core and pure Python) under the release's profile."""
    target = engine
    if engine == "impl-python":
        monkeypatch.setenv("KVREF_NATIVE", "0")
        target = "impl"
    trace = _trace(defect)
    found = safety_replay(trace, load_factory(target)(trace.config))
    assert found is not None, f"{target} shows no violation"
    index, violation = found
    assert (index, violation.defect) == (trace.meta["safety_step"], defect), str(violation)
    assert registered(violation.defect, violation.oracle, trace.config.profile.release) is DEFECTS[defect]


@pytest.mark.parametrize("defect", FIXED)
@pytest.mark.parametrize("release", ["0.26.0", "0.29.0", "0.33.0"])
def test_the_same_history_is_safe_after_the_fix(defect: str, release: str) -> None:
    """The trace's operations under a fixed release's profile: no violation."""
    trace = _trace(defect, release)
    for target in ("spec", "impl"):
        assert safety_replay(trace, load_factory(target)(trace.config)) is None, target


@pytest.mark.skipif(VLLM is None, reason="vLLM is not installed")
@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_real_vllm_shows_the_defect_where_it_has_it(defect: str) -> None:
    """The installed vLLM replays the trace (under its own release's profile):
    the violation where the entry applies, none where it is fixed."""
    assert VLLM is not None
    trace = _trace(defect, VLLM)
    found = safety_replay(trace, load_factory("vllm")(trace.config))
    if DEFECTS[defect].applies_to(VLLM):
        assert found is not None and found[1].defect == defect
    else:
        assert found is None


def test_an_entry_names_a_violation_only_in_its_range() -> None:
    assert registered(EARLY_FREE, "inflight", "0.25.1") is DEFECTS[EARLY_FREE]
    assert registered(EARLY_FREE, "content", "0.16.0") is DEFECTS[EARLY_FREE]
    assert registered(EARLY_FREE, "inflight", "0.26.0") is None
    assert registered(LOAD_ZEROING, "content", "0.25.1") is None  # not an oracle it violates
    assert registered(None, "content", "0.25.1") is None


@pytest.mark.parametrize("release", ["0.17.1", "0.18.0", "0.21.0", "0.24.0"])
def test_load_zeroing_goes_back_to_the_first_zeroing_list(release: str) -> None:
    """From 0.17.1 (the first release with the zeroing list) every scheduler
    zeroes each new block of a model with Mamba layers, a load's destinations
    included (vllm/v1/core/sched/scheduler.py, take_new_block_ids when
    needs_kv_cache_zeroing). The minimal history, without the operation and
    arguments 0.25.1 added, shows it there (kvspec and kvimpl; real vLLM
    0.18.0, 0.21.0 and 0.24.0 showed it too); 0.17.0 has no zeroing list."""
    trace = _trace(LOAD_ZEROING, release)
    older = ("full_sequence_must_fit", "reserved_blocks", "has_scheduled_reqs")
    steps = [{k: v for k, v in s.items() if k not in older} for s in trace.steps if s["op"] != "get_prefix_hint"]
    trace = dataclasses.replace(trace, steps=steps)
    assert DEFECTS[LOAD_ZEROING].applies_to(release)
    for engine in ("spec", "impl"):
        found = safety_replay(trace, load_factory(engine)(trace.config))
        assert found is not None and found[1].defect == LOAD_ZEROING, (engine, found)
    assert not DEFECTS[LOAD_ZEROING].applies_to("0.17.0")


@pytest.mark.parametrize("release", ["0.16.0", "0.26.0", "0.29.0", "0.34.0"])
def test_a_failed_load_reads_skipped_window_blocks_in_every_release(release: str) -> None:
    """No release recovers the window: the admission skips the blocks below the window of the load's
    end, the failure moves the computed tokens back to the valid prefix, and the recomputation reads
    a skipped block (kvspec and kvimpl under each release's profile; real vLLM 0.25.1 and 0.34.0
    showed it too)."""
    trace = _trace(FAILED_LOAD_WINDOW, release)
    if release == "0.16.0":  # the arguments and the step call 0.16.0 does not have
        older = ("full_sequence_must_fit", "reserved_blocks", "has_scheduled_reqs", "num_encoder_tokens")
        steps = [{k: v for k, v in s.items() if k not in older} for s in trace.steps]
        trace = dataclasses.replace(trace, steps=[s for s in steps if s["op"] != "new_step_starts"])
    assert DEFECTS[FAILED_LOAD_WINDOW].applies_to(release)
    for engine in ("spec", "impl"):
        found = safety_replay(trace, load_factory(engine)(trace.config))
        assert found is not None and found[1].defect == FAILED_LOAD_WINDOW, (engine, found)
