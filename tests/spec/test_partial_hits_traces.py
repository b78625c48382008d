"""The stored traces of fine-grained hits with copy-on-write replay on kvspec.

Each was recorded under a release's profile and agreed with that real vLLM
release at every step: lockstep runs of the shape
``full@2x+mamba-align@2x+swa`` (``traces/vllm-<release>/golden/``) and a
directed script whose second and third requests hit inside a block, so the
table copy and the owner's tail-entry move both happen
(``traces/vllm-<release>/directed/cow-partial-hit.jsonl``). Only releases in
``kvspec.profiles.PARTIAL_HASH_HITS_CHECKED`` have such traces; kvimpl's
replays of them are ``tests/impl/test_partial_hits_traces.py``.
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


def test_every_checked_release_has_traces() -> None:
    """A directed copy-on-write trace and at least one lockstep trace per release."""
    for release in PARTIAL_HASH_HITS_CHECKED:
        names = [p.name for p in TRACES if p.parent.parent.name == release]
        assert "cow-partial-hit.jsonl" in names, release
        assert any(n.startswith(COW_SHAPE) for n in names), release


@pytest.mark.parametrize("path", TRACES, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_trace_replays_on_spec(path: Path) -> None:
    trace = load(path)
    assert "partial-hash-hits" in features_used(trace.config)
    result = replay(trace, load_factory("spec"), str(path))
    assert result.ok, result.message
    assert result.steps == len(trace.steps)
    if path.name.startswith("cow-"):
        copies = [c for st in trace.steps if st["op"] == "take_kv_cache_block_copies" for c in st["expect"]["copies"]]
        assert len(copies) == 5, copies  # the owner's move, then two table copies each for b and c
