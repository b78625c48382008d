"""Nothing observable is left uncompared: every machine run ends by draining
what is pending, and the consumer-side event check follows parent chains."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvref.adapters import load_factory
from kvref.lockstep import EventLog, RunStats
from kvref.stateful import MachineSetup, make_lockstep_machine

DRAIN = ["take_events", "take_new_block_ids", "make_prefix_cache_stats"]


def chain(hashes: list[Any], parent: Any, per_block: int = 2) -> dict[str, Any]:
    """A BlockStored of group 0 that stored every block of its range."""
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": [0] * per_block * len(hashes), "block_size": 2, "group_idx": 0}  # fmt: skip


def test_parent_chain_is_consistent() -> None:
    log = EventLog(int_block_hashes=True)
    assert log.consume([chain([1, 2], None), chain([3], 2), {"type": "AllBlocksCleared"}, chain([1, 2, 3], None)]) == ""


def test_a_second_parent_is_reported() -> None:
    log = EventLog(int_block_hashes=True)
    problem = log.consume([chain([1, 2], None), chain([2], 7)])
    assert "hash 2 (group 0) with parent 7" in problem and "parent 1" in problem


def test_a_call_that_skipped_blocks_tells_no_parent() -> None:
    """token_ids covering more blocks than were stored: a masked or null block sat between."""
    log = EventLog(int_block_hashes=True)
    assert log.consume([chain([1, 2], None), chain([2], 7, per_block=4)]) == ""


def test_every_run_ends_with_the_pending_drained(tmp_path: Path) -> None:
    stats = RunStats()
    setup = MachineSetup([load_factory("spec"), load_factory("impl")], stats, tmp_path, record_dir=tmp_path / "rec")
    machine = make_lockstep_machine(setup)
    run_state_machine_as_test(
        machine,
        settings=settings(max_examples=15, stateful_step_count=20, database=None, phases=[Phase.generate]),
    )
    traces = sorted((tmp_path / "rec").rglob("*.jsonl"))
    assert traces
    for path in traces:
        steps = [json.loads(line) for line in path.read_text().splitlines()[1:]]
        ops = [s["op"] for s in steps if "op" in s]
        assert ops[-3:] == DRAIN, (path, ops[-5:])
