"""The machine as a composition of rule families (kvref.machine).

The step table (``kvref.stateful.ACTIONS``) holds every action of today's
families once, in the order seeded runs draw from; a family added through
``FAMILIES`` leaves a seeded run it takes no part in exactly as it was, and
its actions are taken in the runs it takes part in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import Phase, settings
from hypothesis import strategies as st

from kvref.adapters import load_factory
from kvref.hypothesis_compat import integer, seed_machine
from kvref.lockstep import Lockstep, RunStats
from kvref.machine import admission, connectors, flood, invalid, past_slots, reads, running, tails
from kvref.machine.base import Family, MachineBase
from kvref.stateful import ACTIONS, ORDER, MachineSetup, SchedulerMachine, run_machine

FAMILY_MODULES = (admission, connectors, flood, invalid, past_slots, reads, running, tails)
SETTINGS = settings(max_examples=12, stateful_step_count=30, database=None, phases=[Phase.generate])


def test_the_table_holds_every_action_of_the_families_once() -> None:
    named = [name for module in FAMILY_MODULES for name, _ in module.ACTIONS]
    assert len(named) == len(set(named)), f"an action in two families: {sorted(named)}"
    assert sorted(["idle", *named]) == sorted(ORDER), (
        "a family action missing from ORDER, or a name there no family has"
    )
    assert [name for name, _ in ACTIONS] == list(ORDER)
    for name in ORDER:
        assert callable(getattr(SchedulerMachine, name, None)), f"{name} is in the table but no method"


def _probe(takes_part: bool, taken: list[str]) -> Family:
    def ready(m: MachineBase) -> bool:
        return bool(m.reqs)

    def setup(m: MachineBase, data: st.DataObject) -> None:
        taken.append(f"setup:{integer(data, 0, 3)}")

    return Family("probe", (("probe_tables", ready),), lambda m: takes_part, setup)


def _logs(tmp_path: Path, seed: int, family: Family | None, taken: list[str]) -> tuple[list[Any], RunStats]:
    """The operation log of every run of a seeded batch on spec and impl,
    with ``family`` added to the machine when given."""
    locks: list[Lockstep] = []
    stats = RunStats()

    class Probed(SchedulerMachine):
        SETUP = MachineSetup([load_factory("spec"), load_factory("impl")], stats, tmp_path)
        FAMILIES = (family,) if family is not None else ()

        def probe_tables(self, data: st.DataObject) -> None:
            assert self.family_on("probe") and not self.family_on("other")
            taken.append("probe_tables")
            self.read_tables(data)

        def setup(self, data: st.DataObject) -> None:  # not an @initialize: run_machine calls it
            super().setup(data)
            if self.lock is not None:
                locks.append(self.lock)

    seed_machine(Probed, seed)
    run_machine(Probed, SETTINGS)  # kvref's own loop, as kvref check runs a machine
    return [lock.log for lock in locks], stats


def test_a_family_that_takes_no_part_changes_no_draw(tmp_path: Path) -> None:
    before, _ = _logs(tmp_path, 5, None, [])
    taken: list[str] = []
    after, _ = _logs(tmp_path, 5, _probe(False, taken), taken)
    assert sum(len(log) for log in before) > 100, "the seeded batch ran too few operations to compare"
    assert after == before
    assert taken == []


def test_a_family_that_takes_part_is_drawn_and_compared(tmp_path: Path) -> None:
    taken: list[str] = []
    _, stats = _logs(tmp_path, 5, _probe(True, taken), taken)
    assert any(t.startswith("setup:") for t in taken), "the family's setup never ran"
    assert "probe_tables" in taken, "the family's action was never taken"
    assert stats.steps > 0 and stats.unexplained == 0
