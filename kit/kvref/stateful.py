"""A scheduler-driving Hypothesis state machine over :class:`Lockstep`.

The machine plays vLLM's scheduler: it admits waiting requests (prefix
lookup, then ``allocate_slots`` with the hit and a chunk of the prompt),
advances running ones (chunked prefill, then decode with sampled tokens and
lookahead slots), preempts on allocation failure, finishes requests with
``free`` or with ``pop_blocks_for_free`` and a later deferred free, loads
connector tokens (``delay_cache_blocks`` + ``cache_blocks``), and calls every
other facade operation, invalid calls included. Every call goes to every
adapter and everything is compared (see :mod:`kvref.lockstep`).

Use :func:`make_lockstep_machine` to build a machine class for your targets;
``TestX = make_lockstep_machine(...).TestCase`` runs it under pytest.

:class:`SchedulerMachine` is a thin composition: its one rule, ``step``,
takes an action of the step table :data:`ACTIONS`, and the actions are
methods of rule families, each a module of :mod:`kvref.machine` (setup and
configuration drawing, admission, running steps, speculative decoding,
connectors, read-only calls, invalid calls, the directed situations, the
recording at teardown). A family added later joins through
:attr:`SchedulerMachine.FAMILIES` (:class:`kvref.machine.base.Family`), so
that a seeded run it takes no part in draws exactly as before.
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from kvref.hypothesis_compat import choose, integer, machine_seed, run_steps
from kvref.machine import (
    admission,
    batched,
    connectors,
    flood,
    hit_limits,
    invalid,
    mamba_relost,
    past_slots,
    reads,
    running,
    tails,
)
from kvref.machine.admission import AdmissionRules
from kvref.machine.base import Action, Family
from kvref.machine.batched import BatchedRules
from kvref.machine.configuration import VOCAB, MachineSetup, configs, draw_tokens
from kvref.machine.connectors import ConnectorRules
from kvref.machine.flood import FloodRules
from kvref.machine.hit_limits import HitLimitRules
from kvref.machine.invalid import BAD_ALLOCATIONS, BAD_COUNTS, BAD_HITS, BAD_OTHERS, InvalidRules
from kvref.machine.invalid_inputs import BAD_CONFIGS, BAD_REQUESTS, bad_config
from kvref.machine.mamba_relost import MambaRelostRules
from kvref.machine.past_slots import PastSlotRules
from kvref.machine.pipeline import FAMILY as PIPELINE_FAMILY
from kvref.machine.pipeline import PipelineRules
from kvref.machine.reads import ReadRules
from kvref.machine.recording import RecordingRules
from kvref.machine.running import RunningRules
from kvref.machine.speculative import SpeculativeRules
from kvref.machine.swaps import FAMILY as SWAP_FAMILY
from kvref.machine.swaps import SwapRules
from kvref.machine.tails import TailRules

__all__ = [
    "ACTIONS",
    "BAD_ALLOCATIONS",
    "BAD_CONFIGS",
    "BAD_COUNTS",
    "BAD_HITS",
    "BAD_OTHERS",
    "BAD_REQUESTS",
    "ORDER",
    "VOCAB",
    "Action",
    "Family",
    "MachineSetup",
    "SchedulerMachine",
    "bad_config",
    "configs",
    "default_failure_dir",
    "draw_tokens",
    "make_lockstep_machine",
    "run_machine",
]

ORDER = (
    "idle", "add_request", "admit", "schedule_running", "finish", "new_step", "drain", "flood", "tail_pair",
    "deferred_free", "finish_remote_load", "common_prefix", "read_tables", "read_computed_tables",
    "estimate_cached", "cache_past_slots", "invalid_allocate", "invalid_other", "absent_operation", "rekeyed_tails",
)  # fmt: skip
"""The order of the step table: a seeded run draws indices into it, so this
order is part of every seeded run and never changes. A family added later
joins through :attr:`SchedulerMachine.FAMILIES`, not here."""
_READY = dict(
    (
        ("idle", lambda m: True),
        *admission.ACTIONS,
        *running.ACTIONS,
        *flood.ACTIONS,
        *tails.ACTIONS,
        *connectors.ACTIONS,
        *reads.ACTIONS,
        *past_slots.ACTIONS,
        *invalid.ACTIONS,
    )
)
ACTIONS: tuple[Action, ...] = tuple((name, _READY[name]) for name in ORDER)
"""What a scheduler step may do, each with when it is ready (the machine is
live): the names of :class:`SchedulerMachine`'s action methods, simplest
first. A shrunk step falls towards ``idle``, which does nothing: a step the
failure does not need then leaves no operation in the trace even where the
shrinker cannot delete it."""


def run_machine(machine: type[RuleBasedStateMachine], run_settings: settings) -> None:
    """Run ``machine`` once with ``run_settings``, as
    ``run_state_machine_as_test`` does, and seeded as :func:`kvref.hypothesis_compat.seed_machine`
    seeded it: a scheduler machine through its one rule in kvref's loop
    (:func:`kvref.hypothesis_compat.run_steps`, the same steps without
    Hypothesis's rule selection), any other machine through Hypothesis's runner.

    Raises:
        AssertionError: The (shrunk) failure of a run, as Hypothesis raises it.
    """
    if not issubclass(machine, SchedulerMachine):
        run_state_machine_as_test(machine, settings=run_settings)
        return
    scheduler = machine

    def start(data: st.DataObject) -> SchedulerMachine:
        m = scheduler()
        m.setup(data)
        return m

    run_steps(start, SchedulerMachine.step, SchedulerMachine.teardown, run_settings, machine_seed(machine))


def make_lockstep_machine(setup: MachineSetup) -> type[RuleBasedStateMachine]:
    """A state machine class driving ``setup.factories`` (reference first)."""

    class LockstepMachine(SchedulerMachine):
        SETUP = setup

    return LockstepMachine


class SchedulerMachine(  # each family before the families it builds on (Python's method order needs it)
    PipelineRules,
    SwapRules,
    BatchedRules,
    MambaRelostRules,
    HitLimitRules,
    AdmissionRules,
    TailRules,
    ConnectorRules,
    FloodRules,
    PastSlotRules,
    RunningRules,
    SpeculativeRules,
    ReadRules,
    InvalidRules,
    RecordingRules,
):
    """Plays a scheduler against the adapters of ``SETUP``: the rule families
    of :mod:`kvref.machine` (each family's module says what it does), and
    one rule that takes an action of theirs."""

    TABLE = ACTIONS
    FAMILIES: tuple[Family, ...] = (
        batched.FAMILY, SWAP_FAMILY, mamba_relost.FAMILY, PIPELINE_FAMILY, hit_limits.FAMILY,
        connectors.LOAD_TWIN_FAMILY, connectors.FAILED_LOAD_FAMILY, connectors.CONNECTOR_LOOKUP_FAMILY,
    )  # fmt: skip

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """Take one of this run's actions (:data:`ACTIONS`, then those of the
        :attr:`FAMILIES` taking part) that is ready and that this run's
        action swarm keeps; nothing once a known divergence stopped the
        comparison.

        NOTE: the actions were Hypothesis rules, each with its precondition.
        Hypothesis picks a rule by drawing a rule and asking the run's
        feature flags about it until one is ready and enabled: about ten
        choices (each with its span) per step, 72% of every choice a ci run
        made, and every choice also costs in Hypothesis' mutation and
        simulation of the choice tree. Here one index into :data:`ACTIONS`
        is drawn; if that action is not ready (or this run's action swarm,
        :func:`kvref.swarm.action_swarms`, left it out), a second choice
        picks among those that are: one or two choices per step, each ready
        action equally likely (``idle`` only on the first choice). The
        first index names an action whatever the state, as Hypothesis' rule
        index does, so the shrinker can delete a step without changing what
        the later steps do, and the simplest step does nothing (an index
        among the ready actions alone let a shrunk pick of 0 turn every step
        into ``add_request``, and shrunk traces grew by a third).
        """
        # NOTE: no precondition: setup rejects every run it builds no lockstep for, and
        # Hypothesis describes each precondition's source for its statistics at every step
        if self.lock is not None and self.lock.wants_restart:
            self.restart()
        if not self.live:
            return
        actions = self.actions
        ready = [name for name, ok in actions[1:] if name not in self.actions_off and ok(self)]
        name, ok = actions[integer(data, 0, len(actions) - 1)]
        if name == "idle":
            return
        if name in self.actions_off or not ok(self):
            # as Hypothesis keeps one rule flag on, a run whose swarm leaves nothing ready starts a step
            name = choose(data, ready) if len(ready) > 1 else (ready or ["new_step"])[0]
        getattr(self, name)(data)

    def idle(self, data: st.DataObject) -> None:
        """Nothing happens in this step (the simplest step, see :data:`ACTIONS`)."""


def default_failure_dir() -> Path:
    """Where failing traces go (``KVREF_FAILURE_DIR`` or ./kvref-failures)."""
    return Path(os.environ.get("KVREF_FAILURE_DIR", "kvref-failures"))
