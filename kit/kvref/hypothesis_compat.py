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
same test checks that it draws the same values), and :func:`integer`,
:func:`boolean`, :func:`choose` and :func:`byte_string` make one choice of
the run's choice sequence directly, without a strategy around it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.control import should_note
from hypothesis.internal.conjecture import engine as _engine
from hypothesis.internal.conjecture import providers as _providers
from hypothesis.internal.conjecture.data import ConjectureData
from hypothesis.internal.conjecture.utils import calc_label_from_name
from hypothesis.internal.constants_ast import Constants
from hypothesis.stateful import RuleBasedStateMachine
from hypothesis.strategies import DataObject, SearchStrategy

T = TypeVar("T")

_NO_LOCAL_CONSTANTS = Constants()


def seed_machine(machine: type[RuleBasedStateMachine], seed: int) -> None:
    """Make every later ``run_state_machine_as_test(machine)`` draw from ``seed``."""
    machine._hypothesis_internal_use_seed = seed  # read by Hypothesis' run_state_machine_as_test


def machine_seed(machine: type[RuleBasedStateMachine]) -> int | None:
    """The seed :func:`seed_machine` gave ``machine`` (None: unseeded)."""
    seed: int | None = getattr(machine, "_hypothesis_internal_use_seed", None)
    return seed


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


def integer(data: DataObject, min_value: int, max_value: int) -> int:
    """An integer in ``[min_value, max_value]``, as ``st.integers`` draws it
    for a range of up to 128 values: one integer choice, shrinking towards
    ``min_value`` (or 0 when inside the range).

    NOTE: a choice of the run's ``ConjectureData`` without a strategy around
    it. ``data.draw(st.integers(...))`` validates the strategy, computes its
    label and opens and closes a span for each draw; the machine draws about
    four values per step, and that wrapping was a third of a ci run
    (cProfile). The shrinker works on the choices, so it shrinks these as it
    shrinks any integer.
    """
    return _conjecture(data).draw_integer(min_value, max_value)


def boolean(data: DataObject) -> bool:
    """A fair boolean, as ``st.booleans()`` draws it (shrinks to False); see :func:`integer`."""
    return _conjecture(data).draw_boolean()


def choose(data: DataObject, options: Sequence[T]) -> T:
    """One of ``options``, as ``st.sampled_from`` picks it (one index choice,
    shrinking towards the first); see :func:`integer`."""
    if not options:
        raise ValueError("choose: nothing to choose from")
    return options[_conjecture(data).draw_integer(0, len(options) - 1)]


def byte_string(data: DataObject, min_size: int, max_size: int) -> bytes:
    """Between ``min_size`` and ``max_size`` bytes as one choice, as
    ``st.binary`` draws them (shrinking shorter, then towards zero bytes); see
    :func:`integer`."""
    return _conjecture(data).draw_bytes(min_size, max_size)


def _conjecture(data: DataObject) -> ConjectureData:
    conjecture: ConjectureData = data.conjecture_data
    return conjecture


def run_steps(
    start: Callable[[DataObject], Any],
    step: Callable[[Any, DataObject], None],
    finish: Callable[[Any], None],
    run_settings: settings,
    seed: int | None,
) -> None:
    """Run a state machine of one rule as ``run_state_machine_as_test`` runs
    it: per example, ``machine = start(data)``, then up to
    ``run_settings.stateful_step_count`` times ``step(machine, data)``, each
    in a span of its own as Hypothesis marks a state machine step (so the
    shrinker deletes whole steps), then ``finish(machine)``; seeded with
    ``seed`` as :func:`seed_machine` seeds a machine.

    NOTE: Hypothesis' runner picks each step's rule through its rule
    strategy (the precondition and feature-flag checks, the rule's argument
    strategies, its statistics): several choices and spans per step even
    for a machine of one rule, about a sixth of a ci lockstep run. This loop
    makes the one choice the runner makes to decide whether another step
    follows, with the same probability, and forces it at the step limit.
    """
    max_steps = run_settings.stateful_step_count

    @run_settings
    @given(st.data())
    def run(data: DataObject) -> None:
        conjecture = _conjecture(data)
        machine = start(data)
        try:
            steps = 0
            while True:
                conjecture.start_span(_STEP_LABEL)
                if conjecture.draw_boolean(p=2**-16, forced=True if steps >= max_steps else None):
                    conjecture.stop_span()
                    break
                steps += 1
                step(machine, data)
                conjecture.stop_span()
        finally:
            finish(machine)

    run._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]  # read by @given, as on a machine
    run()


_STEP_LABEL = calc_label_from_name("another state machine step")
"""The label Hypothesis gives a state machine step's span (the same, so the shrinker treats it alike)."""


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


@contextmanager
def pinned_constants() -> Iterator[None]:
    """:func:`pin_drawn_constants` for the body only: what it replaced is put
    back after (the pytest plugin runs kvref's machine inside a user's session,
    whose own tests must see Hypothesis as it was)."""
    previous = _providers._get_local_constants
    pin_drawn_constants()
    try:
        yield
    finally:
        _providers._get_local_constants = previous
        _providers.CONSTANTS_CACHE.cache.clear()


def drawn_constants_pinned() -> bool:
    """Whether :func:`pin_drawn_constants` is in effect."""
    return _providers._get_local_constants is _no_local_constants


def _no_local_constants() -> Constants:
    return _NO_LOCAL_CONSTANTS
