"""The mutation kill test's lockstep stage, shared by the test and the mutmut runner.

The kill test (``tests/tools/mutation/test_kill.py``) runs :func:`lockstep_kill`
unshrunk, once per configuration shape, as its last and most expensive
stage; the mutmut runner (:mod:`kvtools.mutants`) runs it again with
shrinking for every mutant the stage killed, to report a minimal trace. Both
must run exactly the same seeded machine runs, so the stage and its
constants live here, in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings

from kvref.adapters import load_factory
from kvref.hypothesis_compat import seed_machine
from kvref.lockstep import RunStats
from kvref.shapes import SHAPES
from kvref.stateful import MachineSetup, make_lockstep_machine, run_machine
from kvspec.profiles import VLLM_0_25_1

KILL_EXAMPLES = 12
"""Lockstep machine runs per shape in the kill test (each up to ``KILL_STEPS`` rules)."""
KILL_STEPS = 50
KILL_SEED = 20_251_129
"""Hypothesis seed of the kill test's lockstep run for the first shape (+ the shape's index)."""


def lockstep_kill(
    shape: str,
    failure_dir: Path,
    shrink: bool = False,
    seed_offset: int = 0,
    examples: int = KILL_EXAMPLES,
    skip_rules: Sequence[str] = (),
) -> None:
    """The kill test's lockstep stage for one shape: kvspec and kvimpl in
    lockstep over ``examples`` seeded machine runs.

    ``skip_rules`` names machine rules (or helpers) made no-ops (for configurations they do
    not fit). Without ``shrink`` (the kill test) the first failing run is reported as it
    is; with it (the runner, after mutmut) Hypothesis shrinks it first. Either
    way the failing history is in ``failure_dir`` (see :class:`kvref.lockstep.Lockstep`).

    Raises:
        LockstepFailure: On the first difference.
    """
    names = [s.name for s in SHAPES]
    shapes = tuple(s for s in SHAPES if s.name == shape)
    setup = MachineSetup(
        [load_factory("spec"), load_factory("impl")], RunStats(), failure_dir, shapes=shapes, profile=VLLM_0_25_1
    )
    machine = make_lockstep_machine(setup)
    if skip_rules:  # a plain method shadows the rule of the same name
        machine = type(machine.__name__, (machine,), dict.fromkeys(skip_rules, _not_a_rule))
    seed_machine(machine, KILL_SEED + names.index(shape) + seed_offset)
    phases = [Phase.explicit, Phase.generate, *([Phase.shrink] if shrink else [])]
    run_machine(
        machine,
        settings(
            max_examples=examples,
            stateful_step_count=KILL_STEPS,
            deadline=None,
            database=None,
            print_blob=False,
            report_multiple_bugs=False,
            suppress_health_check=list(HealthCheck),
            phases=phases,
        ),
    )


def _not_a_rule(*args: object, **kwargs: object) -> None:
    """Stands in for a machine rule that a configuration cannot take."""
