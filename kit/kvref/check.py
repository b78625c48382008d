"""The library behind ``kvref check``: lockstep batches until a step goal.

:func:`run_lockstep` drives the scheduler machine of :mod:`kvref.stateful`
for ``setup`` in seeded batches of :data:`BATCH_EXAMPLES` runs each, until
``goal`` steps ran, a time budget ran out or a divergence that no registry
entry explains was found (Hypothesis has then shrunk it and the lockstep has
written its trace). Tools that hunt faults (the project's bug zoo) call it
exactly as the command does.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvref.hypothesis_compat import seed_machine
from kvref.stateful import MachineSetup, make_lockstep_machine

MIN_STEPS = {"dev": 2_000, "ci": 20_000, "nightly": 500_000, "crosshair": 200}
"""Default step goal of each settings profile."""
BATCH_EXAMPLES = 100
"""Machine runs per seeded batch."""
SEED_STRIDE = 1_000_003
"""Batch ``b`` of ``--seed s`` is seeded ``s * SEED_STRIDE + b``."""


def run_lockstep(
    setup: MachineSetup,
    seed: int,
    goal: int,
    budget: float | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> str | None:
    """Run batches until ``setup.stats.steps >= goal`` or ``budget`` seconds passed.

    Returns:
        None if every step agreed (or was explained), else the first line of
        the unexplained divergence.
    """
    stats = setup.stats
    deadline = None if budget is None else time.monotonic() + budget
    machine = make_lockstep_machine(setup)
    batch = 0
    while stats.steps < goal and (deadline is None or time.monotonic() < deadline):
        seed_machine(machine, seed * SEED_STRIDE + batch)
        try:
            run_state_machine_as_test(
                machine,
                settings=settings(
                    settings.default, max_examples=BATCH_EXAMPLES, database=None, report_multiple_bugs=False
                ),
            )
        except AssertionError as exc:
            return str(exc).splitlines()[0]
        batch += 1
        if on_batch is not None:
            on_batch(stats.steps)
    return None
