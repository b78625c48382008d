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
from kvref.divergences import release_key
from kvref.safety import safety_replay
from kvref.safety_defects import (
    CHECKPOINT_REKEYED,
    CHECKPOINT_SCRATCH,
    EARLY_FREE,
    FAILED_LOAD_WINDOW,
    LOAD_ZEROING,
    MAMBA_ALIGN_MIDBLOCK,
    MAMBA_FAILED_LOAD,
    MAMBA_REJECTED_NULL,
    SWA_EAGLE_WINDOW_LOST,
    UNFENCED_FREE,
    WITHDRAWN_STEP,
    load_defects,
    registered,
)
from kvref.traces import Trace, load
from kvspec.config import Mamba, MambaMode
from kvspec.errors import ConfigError
from kvspec.profiles import profile_named

ROOT = Path(__file__).resolve().parents[2]
DEFECTS = {d.id: d for d in load_defects()}
SCHEDULER_FIXED = {MAMBA_ALIGN_MIDBLOCK, UNFENCED_FREE, SWA_EAGLE_WINDOW_LOST}
"""Defects a later release ends by never making the trace's calls (its scheduler, or for
swa-eagle-window-lost its lookup, whose hit the trace's allocation hands over; its manager still does
what the trace shows): the same history stays unsafe after the fix; the history that release makes
instead is checked on its own (``test_a_chunk_cut_at_the_block_end_leaves_no_state_behind``; the
deferred free of vLLM 0.24.0 in tests/kit/test_pipeline.py; the lookup of 0.20.0 by the known
divergence's trace, docs/divergences.md)."""
FIXED = sorted(d.id for d in DEFECTS.values() if d.fixed is not None and d.id not in SCHEDULER_FIXED)
VLLM = installed_vllm_version()


def _trace(defect: str, release: str | None = None) -> Trace:
    trace = load(ROOT / DEFECTS[defect].trace)
    if release is None:
        return trace
    return dataclasses.replace(trace, config=dataclasses.replace(trace.config, profile=profile_named(release)))


def test_the_registry_lists_the_defects_the_monitor_names() -> None:
    assert set(DEFECTS) == {
        EARLY_FREE, LOAD_ZEROING, FAILED_LOAD_WINDOW, MAMBA_FAILED_LOAD, MAMBA_ALIGN_MIDBLOCK, WITHDRAWN_STEP,
        CHECKPOINT_SCRATCH, CHECKPOINT_REKEYED, MAMBA_REJECTED_NULL, UNFENCED_FREE, SWA_EAGLE_WINDOW_LOST,
    }
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


SAFETY_TRACES = sorted((ROOT / "traces").glob("vllm-*/safety/*.jsonl"))
"""Every committed safety trace: each registry entry's minimal trace, and the same history under
an older release where that release lacks some of the trace's operations or arguments."""


@pytest.mark.parametrize("path", SAFETY_TRACES, ids=lambda p: f"{p.parent.parent.name}/{p.stem}")
def test_every_safety_trace_shows_its_defect_under_its_release(path: Path) -> None:
    """kvspec and kvimpl, under the trace's own release, meet the defect its header names at
    its step; the defect applies to that release."""
    trace = load(path)
    defect = trace.meta["safety_defect"]
    assert path.stem == defect and DEFECTS[defect].applies_to(trace.config.profile.release)
    for target in ("spec", "impl"):
        found = safety_replay(trace, load_factory(target)(trace.config))
        assert found is not None and (found[0], found[1].defect) == (trace.meta["safety_step"], defect), target


AFTER_FIXES = [
    (defect, release)
    for defect in FIXED
    for release in ("0.26.0", "0.29.0", "0.32.0", "0.33.0")
    if release_key(release) >= release_key(str(DEFECTS[defect].fixed))
]
"""Each fixed defect with releases from its fix on."""


@pytest.mark.parametrize(("defect", "release"), AFTER_FIXES)
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
    try:
        trace = _trace(defect, VLLM)
    except ConfigError as exc:  # a model of a later release (prefill checkpoints, look-ahead hashes)
        assert not DEFECTS[defect].applies_to(VLLM)
        pytest.skip(f"vLLM {VLLM} refuses the trace's model: {exc}")
    found = safety_replay(trace, load_factory("vllm")(trace.config))
    if DEFECTS[defect].applies_to(VLLM):
        assert found is not None and found[1].defect == defect
    elif defect in SCHEDULER_FIXED:  # the manager still does it; the release's scheduler never asks
        assert found is not None and registered(found[1].defect, found[1].oracle, VLLM) is None
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


def _mamba_failed_load(release: str, mode: MambaMode) -> Trace:
    """The minimal trace of ``mamba-failed-load`` under ``release`` in ``mode``, with what the release's
    scheduler adds or lacks: from 0.26.0 the blocks past the valid prefix are listed for zeroing again
    (``record_blocks_for_zeroing``); 0.16.0 has no step call and none of the later arguments."""
    trace = _trace(MAMBA_FAILED_LOAD, release)
    config = dataclasses.replace(trace.config, groups=(Mamba(2, mode),))
    steps: list[dict[str, object]] = []
    for step in trace.steps:
        steps.append(step)
        if step["op"] == "cache_blocks" and release_key(release) >= (0, 26, 0):
            steps.append({"op": "record_blocks_for_zeroing", "rid": step["rid"], "start_token": 2})
    if release == "0.16.0":
        steps = [s for s in steps if s["op"] != "new_step_starts"]
    return dataclasses.replace(trace, config=config, steps=steps)


MAMBA_RUNS = [
    (release, mode)
    for release in ("0.16.0", "0.25.1", "0.26.0", "0.29.0", "0.31.0", "0.34.0")
    for mode in ("align", "all")
    if mode == "align" or release_key(release) < (0, 33, 0)  # from 0.33.0 prefix caching needs align mode
]


@pytest.mark.parametrize(("release", "mode"), MAMBA_RUNS)
def test_a_failed_load_in_a_mamba_model_starts_from_a_skipped_state(release: str, mode: MambaMode) -> None:
    """A one-group Mamba model (``align`` or ``all``): the admission keeps only the state at the load's end,
    the failure moves the computed tokens back to the block before it, and the recomputation starts from
    the null block there, in every release (kvspec and kvimpl; real vLLM where installed, below)."""
    trace = _mamba_failed_load(release, mode)
    assert DEFECTS[MAMBA_FAILED_LOAD].applies_to(release)
    for engine in ("spec", "impl"):
        found = safety_replay(trace, load_factory(engine)(trace.config))
        assert found is not None and found[1].defect == MAMBA_FAILED_LOAD, (engine, found)


@pytest.mark.skipif(VLLM is None, reason="vLLM is not installed")
@pytest.mark.parametrize("mode", ["align", "all"])
def test_real_vllm_starts_a_mamba_recomputation_from_a_skipped_state(mode: MambaMode) -> None:
    assert VLLM is not None
    if mode == "all" and release_key(VLLM) >= (0, 33, 0):
        pytest.skip("prefix caching needs align mode from 0.33.0")
    trace = _mamba_failed_load(VLLM, mode)
    found = safety_replay(trace, load_factory("vllm")(trace.config))
    assert found is not None and found[1].defect == MAMBA_FAILED_LOAD, found


def _cut_at_the_block_end(release: str) -> Trace:
    """``mamba-align-midblock``'s history with the chunk vLLM 0.26.0's scheduler makes instead: after
    the load that ends inside block 1 (3 tokens), one token to the block's end, then the rest."""
    trace = _trace(MAMBA_ALIGN_MIDBLOCK, release)
    steps: list[dict[str, object]] = []
    for step in trace.steps:
        if step["op"] == "allocate_slots" and step.get("num_new_tokens") == 5:
            steps += [
                {"op": "allocate_slots", "rid": "r1", "num_new_tokens": 1},
                {"op": "set_request", "rid": "r1", "num_computed_tokens": 4, "status": "RUNNING"},
                {"op": "new_step_starts"},
                {"op": "allocate_slots", "rid": "r1", "num_new_tokens": 4},
            ]
        else:
            steps.append(step)
    return dataclasses.replace(trace, steps=steps)


@pytest.mark.parametrize("release", ["0.25.1", "0.26.0", "0.29.0", "0.34.0"])
def test_a_chunk_cut_at_the_block_end_leaves_no_state_behind(release: str) -> None:
    """The same load and hit with the prefill cut where 0.26.0's scheduler cuts it (a chunk that
    starts inside a block stops at its end, ``_mamba_block_aligned_split``): the block gets the state
    at its end, and the later hit is served it (kvspec and kvimpl; real vLLM where installed)."""
    trace = _cut_at_the_block_end(release)
    engines = ["spec", "impl"] + (["vllm"] if release == VLLM else [])
    for engine in engines:
        assert safety_replay(trace, load_factory(engine)(trace.config)) is None, engine


@pytest.mark.parametrize("release", ["0.16.0", "0.20.0", "0.24.0", "0.25.1"])
def test_a_chunk_past_the_block_end_caches_the_state_at_its_start_before_the_fix(release: str) -> None:
    """Before 0.26.0 the scheduler keeps a chunk that starts inside a block a whole number of blocks
    long, so it runs past the block's end: the block keeps the load's state and is served as the state
    at its end (kvspec and kvimpl under each release's profile; real vLLM 0.25.1 showed it too)."""
    trace = _trace(MAMBA_ALIGN_MIDBLOCK, release)
    if release == "0.16.0":
        trace = dataclasses.replace(trace, steps=[s for s in trace.steps if s["op"] != "new_step_starts"])
    assert DEFECTS[MAMBA_ALIGN_MIDBLOCK].applies_to(release)
    for engine in ("spec", "impl"):
        found = safety_replay(trace, load_factory(engine)(trace.config))
        assert found is not None and found[1].defect == MAMBA_ALIGN_MIDBLOCK, (engine, found)


@pytest.mark.parametrize("engine", ["spec", "impl"])
@pytest.mark.parametrize("name", ["withdrawn-midblock-chunk", "withdrawn-midblock-chunk-under-a-step"])
def test_a_chunk_past_the_block_end_taken_back_out_of_its_pass_still_leaves_the_block_behind(
    engine: str, name: str
) -> None:
    """Real vLLM 0.24.0 alone at the safety level (the whole catalogue, `--async-scheduling`, seed 1,
    shrunk): a Mamba align chunk of positions 3-4 starts inside the block of positions 2-3, and its
    request is preempted before the chunk is dispatched. The allocation has already cached that block
    as the state at 4 tokens, which holds the state at 3 (the previous step's). The chunk never runs,
    yet the block is left behind as when it runs: the monitor names the defect, not a bare violation.
    In the second history the previous step is still in flight at the preemption and writes the
    block after it."""
    trace = load(Path(__file__).with_name("safety_traces") / f"{name}.jsonl")
    found = safety_replay(trace, load_factory(engine)(trace.config))
    assert found is not None and found[1].defect == MAMBA_ALIGN_MIDBLOCK, found
    assert "chunk of positions 3-4 started inside the block" in str(found[1])
