"""The stored traces replay on the spec, and replay notices a wrong step.

``ci/test.sh`` replays the whole corpus with ``kvref replay``; this test keeps
a small, fast slice of it inside pytest and makes sure a replay cannot pass
silently: a trace with one corrupted output (or view digest) must fail at
exactly that step.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from kvref.adapters import load_factory
from kvref.ops import REQUEST_OPS
from kvref.traces import Trace, load, replay
from kvspec.profiles import NEWEST
from kvtools.directed import write_all

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = sorted((ROOT / "traces" / "vllm-0.25.1" / "golden").glob("*.jsonl"))
SAMPLE = GOLDEN[:: max(1, len(GOLDEN) // 10)][:10]
"""Ten golden traces spread over the shapes (the files sort by shape name)."""


NEWEST_GOLDEN = sorted((ROOT / "traces" / f"vllm-{NEWEST.release}" / "golden").glob("*.jsonl"))
NEWEST_SAMPLE = NEWEST_GOLDEN[:: max(1, len(NEWEST_GOLDEN) // 10)][:10]


def test_corpus_is_present() -> None:
    assert len(GOLDEN) >= 200
    assert len(NEWEST_GOLDEN) >= 100, f"no golden corpus for the newest profile {NEWEST.name}"


def test_every_trace_sits_in_its_profiles_folder() -> None:
    """``traces/vllm-X/...`` holds exactly the traces whose header names profile ``vllm-X``."""
    misplaced = [
        f"{path.relative_to(ROOT)}: semantics {load(path).config.profile.name}"
        for path in sorted((ROOT / "traces").glob("vllm-*/*/*.jsonl"))
        if load(path).config.profile.name != path.parent.parent.name
    ]
    assert not misplaced, misplaced[:5]


@pytest.mark.parametrize("path", NEWEST_SAMPLE, ids=lambda p: p.name)
def test_newest_golden_trace_replays_on_spec(path: Path) -> None:
    result = replay(load(path), load_factory("spec"), str(path))
    assert result.ok, result.message
    assert result.steps == len(load(path).steps)


@pytest.mark.parametrize("path", SAMPLE, ids=lambda p: p.name)
def test_golden_trace_replays_on_spec(path: Path) -> None:
    result = replay(load(path), load_factory("spec"), str(path))
    assert result.ok, result.message
    assert result.steps == len(load(path).steps)


def _facade_steps(trace: Trace) -> list[int]:
    return [i for i, step in enumerate(trace.steps) if step["op"] not in REQUEST_OPS]


@pytest.mark.parametrize("field", ["expect", "view"])
@pytest.mark.parametrize("path", SAMPLE[:3], ids=lambda p: p.name)
def test_corrupted_step_fails_there(path: Path, field: str) -> None:
    trace = load(path)
    steps = _facade_steps(trace)
    target = steps[len(steps) // 2]
    broken = copy.deepcopy(trace)
    broken.steps[target][field] = {"corrupted": True} if field == "expect" else "0" * 64
    result = replay(broken, load_factory("spec"), "<corrupted>")
    assert not result.ok
    assert result.failed_step == target


def test_missing_expect_means_null() -> None:
    """A facade step without ``expect`` must return null (not be skipped)."""
    trace = load(SAMPLE[0])
    target = next(i for i in _facade_steps(trace) if trace.steps[i].get("expect") is not None)
    broken = copy.deepcopy(trace)
    del broken.steps[target]["expect"]
    result = replay(broken, load_factory("spec"), "<no expect>")
    assert (result.ok, result.failed_step) == (False, target)


@pytest.mark.parametrize("path", sorted((ROOT / "traces").glob("vllm-*/divergences/*.jsonl")), ids=lambda p: p.name)
def test_divergence_trace_replays_on_spec(path: Path) -> None:
    trace = load(path)
    assert trace.meta["known_divergence"] == path.stem
    assert -1 <= trace.meta["divergence_step"] < len(trace.steps)
    result = replay(trace, load_factory("spec"), str(path))
    assert result.ok, result.message


DIRECTED = sorted((ROOT / "traces" / "vllm-0.25.1" / "directed").glob("*.jsonl"))


def test_directed_traces_are_current(capsys: pytest.CaptureFixture[str]) -> None:
    """The committed directed traces are what ``python -m kvtools directed`` records now."""
    assert len(DIRECTED) >= 100
    assert write_all(ROOT / "traces" / "vllm-0.25.1" / "directed", check=True) == 0, capsys.readouterr().err


def test_directed_traces_replay(target: str) -> None:
    """Every directed trace passes; on vLLM one marked with a known divergence
    fails exactly at its divergence step instead."""
    failures = []
    for path in DIRECTED:
        trace = load(path)
        result = replay(trace, load_factory(target), str(path))
        if target == "vllm" and "known_divergence" in trace.meta:
            if result.ok or result.failed_step != trace.meta["divergence_step"]:
                failures.append(f"{path.name}: known divergence not at step {trace.meta['divergence_step']}")
        elif not result.ok:
            failures.append(f"{path.name}: step {result.failed_step}: {result.message}")
    assert not failures, failures
