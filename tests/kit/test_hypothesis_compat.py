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
