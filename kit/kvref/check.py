"""The library behind ``kvref check``: lockstep batches until a step goal.

:func:`run_lockstep` drives the scheduler machine of :mod:`kvref.stateful`
for ``setup`` in seeded batches of :data:`BATCH_EXAMPLES` runs each, until
``goal`` steps ran, a time budget ran out or a divergence that no registry
entry explains was found (Hypothesis has then shrunk it and the lockstep has
written its trace). Tools that hunt faults (the project's bug zoo) call it
exactly as the command does.
"""

from __future__ import annotations

import re
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from hypothesis import settings
from hypothesis.errors import Unsatisfiable
from hypothesis.stateful import RuleBasedStateMachine

from kvref.hypothesis_compat import seed_machine
from kvref.lockstep import DivergenceClass
from kvref.stateful import MachineSetup, make_lockstep_machine, run_machine

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
    first_batch: int = 0,
    machine: type[RuleBasedStateMachine] | None = None,
) -> str | None:
    """Run batches until ``setup.stats.steps >= goal`` or ``budget`` seconds passed.

    ``machine`` is the state machine class (default: the facade's scheduler
    machine for ``setup``; :func:`kvref.layers.pool_machine.make_pool_machine`
    for the pool layer).

    Returns:
        None if every step agreed (or was explained), else the first line of
        the unexplained divergence.
    """
    stats = setup.stats
    deadline = None if budget is None else time.monotonic() + budget
    machine = machine or make_lockstep_machine(setup)
    batch = first_batch
    setup.next_batch = batch
    while stats.steps < goal and (deadline is None or time.monotonic() < deadline):
        seed_machine(machine, seed * SEED_STRIDE + batch)
        steps_before = stats.steps
        try:
            run_machine(
                machine,
                settings(settings.default, max_examples=BATCH_EXAMPLES, database=None, report_multiple_bugs=False),
            )
        except AssertionError as exc:
            setup.next_batch = batch + 1
            return str(exc).splitlines()[0]
        except Unsatisfiable:
            if stats.steps == steps_before:
                break  # every configuration was refused (counted): more batches would check nothing
        batch += 1
        setup.next_batch = batch
        learn_skips(setup)
        if on_batch is not None:
            on_batch(stats.steps)
    return None


def learn_skips(setup: MachineSetup) -> frozenset[str]:
    """Leave out, from now on, the features adapters raised a skip for (an
    unsupported operation, argument or switch); returns the newly left out.

    NOTE: only between batches: within one, Hypothesis replays examples while
    it shrinks, and a machine that changed in between would be flaky.
    """
    if not setup.learn_skips:
        return frozenset()
    learned = {key.rsplit(": ", 1)[-1] for key in setup.stats.skipped} - {"op:allocate_slots", "config"}
    new = frozenset(learned - setup.excluded)
    setup.excluded = setup.excluded | new
    return new


def run_keep_going(
    setup: MachineSetup,
    seed: int,
    goal: int,
    out_dir: Path,
    budget: float | None = None,
    max_classes: int = 50,
    on_batch: Callable[[int], None] | None = None,
    machine: type[RuleBasedStateMachine] | None = None,
    accept: Callable[[Path], str | None] | None = None,
) -> list[DivergenceClass]:
    """Like :func:`run_lockstep`, but go on after an unexplained divergence.

    Each divergence is classified by the operation where it shows and the
    aspect that differs (:class:`kvref.lockstep.DivergenceClass`). The first
    one of a class is shrunk and its trace copied to ``out_dir`` as
    ``<class>.jsonl``. Then ``accept`` (``kvref drift``'s attribution,
    :mod:`kvref.drift`) may explain the trace and change ``setup`` so that
    the behaviour is expected from now on; it returns what explained it.
    Otherwise the class counts as known for the rest of the run (a run that
    meets it again halts quietly, like one meeting a registered halting
    divergence). The hunt goes on until the step goal, the budget or
    ``max_classes`` classes.

    Returns:
        The classes found, accepted ones included, in the order they were found.
    """
    stats = setup.stats
    stats.keep_going = True
    deadline = None if budget is None else time.monotonic() + budget
    batch = 0
    found_order: list[DivergenceClass] = []
    while stats.steps < goal and len(found_order) < max_classes:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            break
        steps_before = stats.steps
        failure = run_lockstep(setup, seed, goal, left, on_batch, first_batch=batch, machine=machine)
        batch = setup.next_batch
        if failure is None:
            break
        key = stats.last_failure_key or "unknown"
        trace = None
        ops = 0
        if stats.last_failure is not None and stats.last_failure.exists():
            out_dir.mkdir(parents=True, exist_ok=True)
            trace = out_dir / f"{re.sub(r'[^A-Za-z0-9_.+-]', '_', key)}.jsonl"
            shutil.copyfile(stats.last_failure, trace)
            ops = len(trace.read_text().splitlines()) - 1
        found = stats.class_found_at.pop(key, steps_before)
        cls = DivergenceClass(key, failure, trace, ops, found, shapes=Counter({stats.last_failure_shape: 1}))
        stats.unexplained -= 1  # counted as a class, not as a stop
        cls.explained_by = (accept(trace) if accept is not None and trace is not None else None) or ""
        if cls.explained_by and trace is not None:
            # the same operation/aspect may show again with another cause: keep each trace
            cls.trace = trace.rename(trace.with_name(f"{trace.stem}-{len(stats.accepted) + 1}.jsonl"))
            stats.accepted.append(cls)
        else:
            stats.classes[key] = cls
        found_order.append(cls)
    return found_order
