"""The Hypothesis internals of :mod:`kvref.hypothesis_compat` still work.

Each test fails if an upgrade of Hypothesis stops honouring one of them: the
seed hook, the shrink time limit, or the switch that keeps literal constants
of local modules out of the draws.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import engine, providers
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from kvref import hypothesis_compat
from kvref.hypothesis_compat import pin_drawn_constants, seed_machine, set_shrink_time_limit, shrink_time_limit


def _history(seed: int) -> list[int]:
    seen: list[int] = []

    class Machine(RuleBasedStateMachine):
        @rule(x=st.integers(0, 10**9))
        def draw(self, x: int) -> None:
            seen.append(x)

    seed_machine(Machine, seed)
    run_state_machine_as_test(Machine, settings=settings(max_examples=5, stateful_step_count=5, database=None))
    return seen


def test_seed_makes_runs_reproducible() -> None:
    assert _history(7) == _history(7)
    assert _history(7) != _history(8)


def test_shrink_time_limit_is_the_engine_constant() -> None:
    saved = shrink_time_limit()
    try:
        set_shrink_time_limit(3.7)
        assert engine.MAX_SHRINKING_SECONDS == 3 and shrink_time_limit() == 3.0
    finally:
        set_shrink_time_limit(saved)


def test_local_constants_are_pinned_off() -> None:
    pin_drawn_constants()
    assert hypothesis_compat.drawn_constants_pinned()
    provider = providers.HypothesisProvider(None)
    assert len(provider._local_constants) == 0
    assert providers._get_local_constants() is provider._local_constants


class _Counter:
    """A one-rule machine for ``run_steps``: each step adds a drawn number."""

    def __init__(self) -> None:
        self.values: list[int] = []
        self.finished = False


def _run_counter(
    seed: int, max_steps: int, fail_at: int | None = None, runs: list[_Counter] | None = None
) -> list[_Counter]:
    runs = [] if runs is None else runs

    def start(data: st.DataObject) -> _Counter:
        runs.append(_Counter())
        return runs[-1]

    def step(machine: _Counter, data: st.DataObject) -> None:
        machine.values.append(hypothesis_compat.integer(data, 0, 9))
        assert fail_at is None or sum(machine.values) < fail_at

    def finish(machine: _Counter) -> None:
        machine.finished = True

    run_settings = settings(max_examples=8, stateful_step_count=max_steps, database=None)
    hypothesis_compat.run_steps(start, step, finish, run_settings, seed)
    return runs


def test_run_steps_is_seeded_bounded_and_finishes_every_run() -> None:
    first = _run_counter(3, 6)
    assert [r.values for r in first] == [r.values for r in _run_counter(3, 6)]
    assert [r.values for r in first] != [r.values for r in _run_counter(4, 6)]
    assert all(len(r.values) <= 6 for r in first) and any(len(r.values) == 6 for r in first)
    assert all(r.finished for r in first)


def test_run_steps_shrinks_a_failure_to_the_steps_it_needs() -> None:
    """The shrinker deletes whole steps (each in its own span) and lowers the rest."""
    runs: list[_Counter] = []
    try:
        _run_counter(5, 30, fail_at=12, runs=runs)
    except AssertionError:
        pass
    else:
        raise AssertionError("no run reached a sum of 12")
    last = runs[-1]  # the final (shrunk) run Hypothesis replays to report the failure
    assert sum(last.values) >= 12 and len(last.values) == 2, last.values
    assert last.finished
