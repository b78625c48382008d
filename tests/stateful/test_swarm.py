"""Swarm configuration (kvref.swarm): drawn per run, deterministic under the
seed, everything on when it is not drawn, and the machine keeps comparing."""

from __future__ import annotations

from pathlib import Path

from hypothesis import Phase, find, given, settings
from hypothesis.stateful import run_state_machine_as_test

from kvref.adapters import load_factory
from kvref.hypothesis_compat import seed_machine
from kvref.lockstep import RunStats
from kvref.stateful import MachineSetup, SchedulerMachine, make_lockstep_machine
from kvref.swarm import ALL_ON, LEVELS, SWARM_FEATURES, Swarm, swarms


def test_all_on_keeps_every_feature() -> None:
    assert all(ALL_ON.on(f) for f in SWARM_FEATURES)
    assert not Swarm(frozenset({"connector"})).on("connector")


@given(swarms())
def test_a_drawn_swarm_names_only_known_features(swarm: Swarm) -> None:
    assert swarm.off <= set(SWARM_FEATURES)


def test_the_simplest_swarm_is_everything_on() -> None:
    """Both draws shrink towards every feature on (k = 0 first)."""
    assert find(swarms(), lambda s: True) == ALL_ON
    assert LEVELS >= 2


def _swarms_of_a_seeded_batch(tmp_path: Path, seed: int) -> list[frozenset[str]]:
    seen: list[frozenset[str]] = []

    class Recording(SchedulerMachine):
        SETUP = MachineSetup([load_factory("spec")], RunStats(), tmp_path, swarm=True)

        def teardown(self) -> None:
            seen.append(self.swarm.off)
            super().teardown()

    seed_machine(Recording, seed)
    run_state_machine_as_test(
        Recording, settings=settings(max_examples=12, stateful_step_count=10, database=None, phases=[Phase.generate])
    )
    return seen


def test_the_swarm_is_deterministic_under_the_seed(tmp_path: Path) -> None:
    first = _swarms_of_a_seeded_batch(tmp_path, 7)
    assert first == _swarms_of_a_seeded_batch(tmp_path, 7)
    assert any(first), "a batch of runs drew no swarm that turned a feature off"


def test_a_swarmed_machine_still_compares_everything(tmp_path: Path) -> None:
    stats = RunStats()
    setup = MachineSetup([load_factory("spec"), load_factory("impl")], stats, tmp_path, swarm=True)
    run_state_machine_as_test(
        make_lockstep_machine(setup),
        settings=settings(max_examples=20, stateful_step_count=20, database=None, phases=[Phase.generate]),
    )
    assert stats.steps > 0 and stats.unexplained == 0

