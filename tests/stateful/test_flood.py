"""The machine's directed ``flood`` (``SchedulerMachine.flood``): in hybrids
with two full-attention-type groups and connector tokens it lines up the
situation of vLLM#33775, where touching each group's prefix hits only just
before that group allocates lets an earlier group take a later group's
still-free hit block. The zoo's ``hits_touched_per_group`` plants that fault
into kvimpl; seeded runs of those shapes catch it, and the same runs on the
unmutated kvimpl agree with kvspec."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvref.adapters import load_factory
from kvref.hypothesis_compat import seed_machine
from kvref.lockstep import LockstepFailure, RunStats
from kvref.shapes import SHAPES
from kvref.stateful import MachineSetup, SchedulerMachine
from kvspec.profiles import VLLM_0_25_1

TWO_FULL_TYPE_GROUPS = [s for s in SHAPES if s.name in ("full+full+swa", "full+mla+swa")]


def _run(tmp_path: Path, target: str, seed: int) -> RunStats:
    """One seeded batch of the machine on kvspec and ``target`` over the two shapes."""
    stats = RunStats()

    class Flooding(SchedulerMachine):
        SETUP = MachineSetup(
            [load_factory("spec"), load_factory(target)], stats, tmp_path, shapes=TWO_FULL_TYPE_GROUPS,
            profile=VLLM_0_25_1,
        )  # fmt: skip

    seed_machine(Flooding, seed)
    run_state_machine_as_test(
        Flooding,
        settings=settings(max_examples=60, stateful_step_count=80, database=None, phases=[Phase.generate]),
    )
    return stats


def test_the_flood_catches_hits_touched_per_group(tmp_path: Path) -> None:
    # caught where the hits' blocks are touched (the views differ) or where a later
    # allocation hands out the blocks that order left free (the outputs differ)
    with pytest.raises(LockstepFailure, match=r"views differ after allocate_slots|hits_touched_per_group returned"):
        for seed in range(3):
            _run(tmp_path, "kvtools.zoo:hits_touched_per_group", seed)


def test_the_same_runs_agree_on_the_unmutated_impl(tmp_path: Path) -> None:
    stats = _run(tmp_path, "impl", 0)
    assert stats.steps > 0 and stats.unexplained == 0
