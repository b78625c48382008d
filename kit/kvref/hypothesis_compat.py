"""The two Hypothesis internals kvref relies on, in one place.

Hypothesis has no public way to seed a state machine run outside a test
function (``@seed`` decorates tests, ``run_state_machine_as_test`` takes no
seed), nor to bound the time its shrinker spends. kvref needs both: ``kvref
check --seed N`` must be reproducible, and the bug zoo bounds shrinking
separately from the hunt. Both are attributes Hypothesis reads at run time;
``tests/kit/test_hypothesis_compat.py`` fails when an upgrade of Hypothesis
stops honouring either, so the breakage shows up there and nowhere else.
"""

from __future__ import annotations

from hypothesis.internal.conjecture import engine as _engine
from hypothesis.stateful import RuleBasedStateMachine


def seed_machine(machine: type[RuleBasedStateMachine], seed: int) -> None:
    """Make every later ``run_state_machine_as_test(machine)`` draw from ``seed``."""
    machine._hypothesis_internal_use_seed = seed  # read by Hypothesis' run_state_machine_as_test


def shrink_time_limit() -> float:
    """Seconds Hypothesis may spend shrinking one failure."""
    return float(_engine.MAX_SHRINKING_SECONDS)


def set_shrink_time_limit(seconds: float) -> None:
    """Bound the time Hypothesis spends shrinking (read when shrinking starts
    and while it runs, so it can be lowered once a failure is found)."""
    _engine.MAX_SHRINKING_SECONDS = max(1, int(seconds))
