"""``kvref replay`` runs the adapter's own checks after every step: a fault that
shows only there (a device table out of step with the manager's tables, which
no output or view exposes) fails the replay; ``--no-checks`` turns them off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvref.cli import main

TRACE = Path(__file__).resolve().parents[2] / "traces" / "vllm-0.25.1" / "golden" / "full+swa-0001.jsonl"


def _stale_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device-table fault: the Python manager's tables stop writing changed rows after the first."""
    pytest.importorskip("torch")
    from kvimpl.device_tables import BlockTable  # noqa: PLC0415

    original = BlockTable.update
    written: set[str] = set()

    def update(self: Any, request_id: str, tables: Any) -> None:
        if request_id in written:
            return
        written.add(request_id)
        original(self, request_id, tables)

    monkeypatch.setattr(BlockTable, "update", update)


def test_replay_runs_the_adapters_checks(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    assert main(["replay", str(TRACE), "--target", "impl-batch"]) == 0
    out = capsys.readouterr().out
    assert "runs of the adapter's own check_invariants" in out


def test_a_device_table_fault_fails_the_replay_through_the_checks(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _stale_rows(monkeypatch)
    assert main(["replay", str(TRACE), "--target", "impl-batch", "--no-checks"]) == 0
    assert "were not run" in capsys.readouterr().out
    assert main(["replay", str(TRACE), "--target", "impl-batch"]) == 1
    assert "FAILED at step" in capsys.readouterr().out
