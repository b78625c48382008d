"""``kvref fuzz``: HypoFuzz runs the lockstep machine and saves what fails as a trace."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kvref.cli import build_parser, fuzz
from kvtools.processes import processes_naming

FAULT = "kvtools.zoo:unhashed_freed_to_tail"
"""A planted fault the machine finds in its first few steps (docs/reports/bug-zoo.md)."""


def test_fuzz_is_a_subcommand() -> None:
    args = build_parser().parse_args(["fuzz", "--target", "impl", "--budget", "5"])
    assert (args.target, args.against, args.budget, args.workers) == ("impl", "spec", 5.0, 1)


def test_fuzz_saves_a_trace_for_a_planted_fault(tmp_path: Path) -> None:
    pytest.importorskip("hypofuzz")
    out = tmp_path / "fuzz"
    cmd = [sys.executable, "-m", "kvref", "fuzz", "--target", FAULT, "--budget", "240", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=400)
    traces = sorted(out.glob("fuzz-*.jsonl"))
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert traces, done.stdout
    header = json.loads(traces[0].read_text().splitlines()[0])
    assert header["format"] == "kvref-trace" and header["failure"]
    assert f"kvref replay {traces[0]}" in done.stdout
    left = processes_naming(out)
    assert not left, f"fuzzer processes outlived kvref fuzz: {left}"


def _args(out: Path, budget: float) -> Any:
    return build_parser().parse_args(["fuzz", "--target", "impl", "--budget", str(budget), "--out", str(out)])


def test_a_fuzzer_that_runs_nothing_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    """The fuzzer process exits at once (as a ``hypothesis`` without HypoFuzz's
    ``fuzz`` command did): no machine run, so exit 2 with the fuzzer's log."""
    monkeypatch.setattr(fuzz, "_has_hypofuzz", lambda: True)
    monkeypatch.setattr(fuzz, "HYPOTHESIS_CLI", "import sys; print('no such command'); sys.exit(2)")
    assert fuzz.run(_args(tmp_path / "out", 60)) == 2
    err = capsys.readouterr().err
    assert "ran no machine run" in err and "no such command" in err


def test_a_fuzzer_that_stops_early_without_a_failure_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """Machine runs were counted, but the fuzzer stopped before the budget and saved nothing."""
    out = tmp_path / "out"
    folder = str(out / "progress")
    script = f"from pathlib import Path; from kvref.cli.fuzz import Progress; Progress(Path({folder!r})).update(3, 40)"
    monkeypatch.setattr(fuzz, "_has_hypofuzz", lambda: True)
    monkeypatch.setattr(fuzz, "HYPOTHESIS_CLI", script)
    assert fuzz.run(_args(out, 60)) == 2
    captured = capsys.readouterr()
    assert "3 machine runs, 40 lockstep steps" in captured.out
    assert "stopped after" in captured.err


def test_progress_adds_up_every_process(tmp_path: Path) -> None:
    (tmp_path / "1.json").write_text(json.dumps({"runs": 2, "steps": 30}))
    (tmp_path / "2.json").write_text(json.dumps({"runs": 5, "steps": 70}))
    (tmp_path / "3.json").write_text("{")  # being rewritten
    assert fuzz.read_progress(tmp_path) == (7, 100)


def test_stopping_the_fuzzer_stops_its_whole_process_group(tmp_path: Path) -> None:
    """HypoFuzz's worker processes outlive their parent when only the parent is
    stopped (they went on fuzzing through a whole CI run); ``stop_process_group``
    stops the parent and every process it started."""
    marker = tmp_path / "grandchild-marker"
    child = f"import time; time.sleep(600)  # {marker}"
    parent = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-c", parent], start_new_session=True)
    deadline = time.monotonic() + 30
    while not processes_naming(marker, settle_s=0) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_naming(marker, settle_s=0), "the grandchild did not start"
    fuzz.stop_process_group(proc, grace_s=5)
    assert proc.returncode is not None
    assert not processes_naming(marker), "a process of the group outlived stop_process_group"


def test_stopping_a_group_that_is_gone_is_no_error() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait()
    fuzz.stop_process_group(proc, grace_s=1)
    assert proc.returncode == 0
