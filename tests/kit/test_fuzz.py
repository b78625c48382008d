"""``kvref fuzz``: HypoFuzz runs the lockstep machine and saves what fails as a trace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvref.cli import build_parser

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
