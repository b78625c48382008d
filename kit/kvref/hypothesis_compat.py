"""The Hypothesis internals kvref relies on, in one place.

Hypothesis has no public way to seed a state machine run outside a test
function (``@seed`` decorates tests, ``run_state_machine_as_test`` takes no
seed), to bound the time its shrinker spends, or to stop it from drawing
literal constants out of the source code of every loaded local module. kvref
needs all three: ``kvref check --seed N`` must be reproducible, the bug zoo
bounds shrinking separately from the hunt, and a seeded run must draw the
same values whatever else is loaded and whether kvref runs from an editable
install or a wheel (Hypothesis only collects constants from modules outside
``site-packages``, so the two would differ). Each is an attribute Hypothesis
reads at run time; ``tests/kit/test_hypothesis_compat.py`` fails when an
upgrade of Hypothesis stops honouring one, so the breakage shows up there and
nowhere else. :func:`draw` skips ``DataObject.draw``'s bookkeeping (the
same test checks that it draws the same values).
"""

from __future__ import annotations

from typing import TypeVar

from hypothesis.control import should_note
from hypothesis.internal.conjecture import engine as _engine
from hypothesis.internal.conjecture import providers as _providers
from hypothesis.internal.constants_ast import Constants
from hypothesis.stateful import RuleBasedStateMachine
from hypothesis.strategies import DataObject, SearchStrategy

T = TypeVar("T")

_NO_LOCAL_CONSTANTS = Constants()


def seed_machine(machine: type[RuleBasedStateMachine], seed: int) -> None:
    """Make every later ``run_state_machine_as_test(machine)`` draw from ``seed``."""
    machine._hypothesis_internal_use_seed = seed  # read by Hypothesis' run_state_machine_as_test


def draw(data: DataObject, strategy: SearchStrategy[T], label: str | None = None) -> T:
    """``data.draw(strategy, label)``, the same choices, without its per-draw bookkeeping.

    ``DataObject.draw`` wraps each draw in a check of the global ``random``
    state, a span record for the explain phase (which kvref's profiles turn
    off) and a note for the final report; the first two cost about a fifth of
    a ci lockstep step (cProfile). Outside the final (reporting) run this
    calls the underlying ``ConjectureData.draw`` directly: the choices, spans
    and labels are those ``data.draw`` makes, so a seeded run takes the same
    steps either way.
    """
    conjecture = getattr(data, "conjecture_data", None)
    if conjecture is None or should_note():
        return data.draw(strategy, label)
    return conjecture.draw(strategy)  # type: ignore[no-any-return]  # ConjectureData.draw is untyped


def shrink_time_limit() -> float:
    """Seconds Hypothesis may spend shrinking one failure."""
    return float(_engine.MAX_SHRINKING_SECONDS)


def set_shrink_time_limit(seconds: float) -> None:
    """Bound the time Hypothesis spends shrinking (read when shrinking starts
    and while it runs, so it can be lowered once a failure is found)."""
    _engine.MAX_SHRINKING_SECONDS = max(1, int(seconds))


def pin_drawn_constants() -> None:
    """Stop Hypothesis from mixing literals of local source files into its
    draws, so that a seeded run depends only on the seed, the strategies and
    the Hypothesis version (its built-in constants stay)."""
    _providers._get_local_constants = _no_local_constants
    _providers.CONSTANTS_CACHE.cache.clear()


def drawn_constants_pinned() -> bool:
    """Whether :func:`pin_drawn_constants` is in effect."""
    return _providers._get_local_constants is _no_local_constants


def _no_local_constants() -> Constants:
    return _NO_LOCAL_CONSTANTS
