"""The kit must catch the deliberately wrong adapters of kvtools.buggy.

Each mutant is run through ``kvref check`` against the spec; the run must end
with an unexplained divergence and a shrunk trace of at most 15 operations
that fails when replayed against the mutant and passes against the spec.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvref.cli import main
from kvref.traces import load


@pytest.mark.parametrize("mutant", ["forward_free", "append_all_on_free"])
def test_check_catches_and_shrinks(mutant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kvref check fails on the mutant and leaves a small replayable trace."""
    monkeypatch.setenv("KVREF_FAILURE_DIR", str(tmp_path))
    target = f"kvtools.buggy:{mutant}"
    # one full-attention group, where both mutants live: the first configuration the whole catalogue
    # fails in moves with every change of the generator, and a hybrid's trace shrinks less far
    check = ["check", "--target", target, "--against", "spec", "--profile", "ci", "--seed", "0", "--shapes", "full"]
    assert main(check) == 1
    (trace,) = tmp_path.glob("failure-*.jsonl")
    assert len(load(trace).steps) <= 16
    assert main(["replay", str(trace), "--target", target]) == 1
    assert main(["replay", str(trace), "--target", "spec"]) == 0
