"""The stored traces of fine-grained hits with copy-on-write replay on kvimpl.

The traces of ``tests/spec/test_partial_hits_traces.py`` (recorded under the
releases of ``kvspec.profiles.PARTIAL_HASH_HITS_CHECKED``, each agreeing with
that real vLLM release at every step, the directed ones with one tail-entry
move and four table copies) replay on the build ``--target impl`` gets and on
the pure-Python manager, step for step; the native core declines them by the
feature's name.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvref.adapters import load_factory
from kvref.traces import load, replay
from kvspec.profiles import PARTIAL_HASH_HITS_CHECKED, features_used

ROOT = Path(__file__).resolve().parents[2]
COW_SHAPE = "full@2x+mamba-align@2x+swa"
TRACES = sorted(
    p
    for release in PARTIAL_HASH_HITS_CHECKED
    for p in (ROOT / "traces" / release).glob("*/*.jsonl")
    if p.name.startswith((COW_SHAPE, "cow-"))
)


def test_there_are_traces_to_replay() -> None:
    """A directed copy-on-write trace per checked release that has traces."""
    assert len([p for p in TRACES if p.name == "cow-partial-hit.jsonl"]) >= 4, TRACES


@pytest.mark.parametrize("build", ["impl", "impl-python"])
@pytest.mark.parametrize("path", TRACES, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_trace_replays_on_impl(path: Path, build: str) -> None:
    trace = load(path)
    assert "partial-hash-hits" in features_used(trace.config)
    result = replay(trace, load_factory(build), str(path))
    assert result.ok, result.message
    assert result.steps == len(trace.steps)


@pytest.mark.parametrize("path", TRACES[:1], ids=lambda p: p.name)
def test_the_native_core_declines_them(path: Path) -> None:
    result = replay(load(path), load_factory("impl-native"), str(path))
    assert not result.ok and "partial-hash-hits" in result.skipped, result
