"""The state every rule family of the scheduler machine shares, and its setup.

:class:`MachineBase` draws the run's configuration and builds the lockstep,
the scheduler model (:class:`kvref.scheduler.Scheduler`) and the prefix
universe in ``@initialize``; it holds the helpers every family uses (the
live request queues, what the adapters and this run's swarm allow, a
lockstep call, a drawn chunk). Each family is a subclass of it in a module
of its own (:mod:`kvref.machine`); :class:`kvref.stateful.SchedulerMachine`
composes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from hypothesis import reject
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize

from kvref.capabilities import CHUNKED_PREFILL
from kvref.hypothesis_compat import draw, integer
from kvref.lockstep import Lockstep, Refused
from kvref.machine import configuration
from kvref.machine.configuration import VOCAB, MachineSetup, draw_tokens, fine_tail_group
from kvref.ops import ZEROING_RANGE
from kvref.safety import safety_monitor
from kvref.scheduler import ReqState, Scheduler
from kvref.swarm import ALL_ON, Swarm, action_swarms, swarms
from kvspec.config import CrossAttention, Mamba
from kvspec.errors import UnsupportedByProfileError
from kvspec.partial_tail import registers_partial_tail

Json = Any
Ready: TypeAlias = Callable[["MachineBase"], bool]
"""Whether an action may be taken now (asked only while the machine is live)."""
Action: TypeAlias = tuple[str, Ready]
"""An entry of the step table: the name of an action method and when it is ready."""
PAST = 6
"""Token lists remembered for reuse."""
CONFORMANCE_ONLY = frozenset({"invalid_allocate", "invalid_other", "absent_operation", "cache_past_slots"})
"""Actions left out at the safety level: caller errors, and ``cache_blocks`` of
tokens no step computed and no load filled (both probe the error contract)."""


@dataclass(frozen=True)
class Family:
    """A rule family that joins the machine after the seeded step table.

    Its actions follow the table (:data:`kvref.stateful.ACTIONS`) in the runs
    it takes part in, and its ``setup`` draws after everything the base
    setup draws; a run it does not take part in draws exactly as before.
    A machine lists its families in :attr:`MachineBase.FAMILIES`.
    """

    name: str
    actions: tuple[Action, ...]
    """The family's actions (methods of the machine) and when each is ready."""
    takes_part: Callable[[MachineBase], bool]
    """Whether a run takes part, asked once the configuration is drawn and every adapter built."""
    setup: Callable[[MachineBase, st.DataObject], None] | None = None
    """The family's own draws at the end of the machine's setup, if any."""


class MachineBase(RuleBasedStateMachine):
    """The machine's shared state and setup (no rule: the composition adds it)."""

    SETUP: MachineSetup
    TABLE: tuple[Action, ...] = ()
    """The step table every run draws from (:data:`kvref.stateful.ACTIONS`)."""
    FAMILIES: tuple[Family, ...] = ()
    """Rule families added after :attr:`TABLE`: their actions follow it in the runs they take part in."""

    def __init__(self) -> None:
        """No configuration yet (drawn in :meth:`setup`)."""
        super().__init__()
        self.lock: Lockstep | None = None
        self.sched: Scheduler | None = None
        self.prefixes: list[list[int]] = []
        self.past: list[tuple[list[int], Json]] = []
        self.counter = 0
        self.swarm: Swarm = ALL_ON
        self.actions: tuple[Action, ...] = self.TABLE
        """This run's step table: :attr:`TABLE`, then the actions of the families taking part."""
        self.families: tuple[Family, ...] = ()
        self.actions_off: frozenset[str] = frozenset()
        self.cross = False
        self.zeroes = False
        """Whether the model zeroes fresh blocks (a Mamba group): its scheduler drains the zeroing list every step."""
        self.tail_group: int | None = None
        self.past_tail_groups: tuple[int, ...] = ()
        self.lookup_bound: int | None = None
        """The ``max_cache_hit_length`` of the lookups made now (None: unbounded;
        set around one admission by :mod:`kvref.machine.hit_limits`)."""

    # -- configuration -------------------------------------------------------

    @initialize(data=st.data())
    def setup(self, data: st.DataObject) -> None:
        """Draw a configuration; build every adapter and a prefix universe.

        A configuration the profile (or an adapter) refuses is counted with
        its reason and the run is rejected: it checks nothing."""
        setup = self.SETUP
        # looked up in its module at each run, so that a test may swap the strategy there
        strategy = configuration.configs(setup.shapes, setup.profile, setup.excluded)
        name, cfg = draw(data, strategy, label="config")
        stats = setup.stats
        if isinstance(cfg, str):
            stats.refused_configs[cfg.split(":", 1)[0]] += 1
            stats.refused_reasons[f"{name}: {cfg}"] += 1
            reject()
        self.cfg, self.shape = cfg, name
        self.cross = any(isinstance(k, CrossAttention) for k in cfg.groups)
        self.zeroes = any(isinstance(k, Mamba) for k in cfg.groups)
        self.tail_group = fine_tail_group(cfg)
        hbs = cfg.resolved_hash_block_size()
        self.past_tail_groups = tuple(
            g for g, k in enumerate(cfg.manager_groups())
            if cfg.enable_caching and registers_partial_tail(k, cfg.profile, hbs)
        )  # fmt: skip
        try:
            self.lock = Lockstep(
                cfg, setup.factories, stats, setup.failure_dir, name, setup.op_timeout, setup.known, setup.excluded
            )
        except UnsupportedByProfileError as exc:
            stats.refused_configs["UnsupportedByProfileError"] += 1
            stats.refused_reasons[f"{name}: {exc}"] += 1
            reject()
        except Refused as exc:
            stats.refused_configs[exc.kind] += 1
            stats.refused_reasons[f"{name}: {exc.reason}"] += 1
            if exc.feature:
                stats.skipped[f"construct: {exc.feature}"] += 1
            reject()
        self.sched = self._scheduler(self.lock)
        sched = cfg.scheduler_block_size
        for _ in range(3):
            n = integer(data, 1, 3) * sched + integer(data, 0, sched - 1)
            self.prefixes.append(draw_tokens(data, n, n))
        self.families = tuple(f for f in self.FAMILIES if f.takes_part(self))
        self.actions = self.TABLE + tuple(a for f in self.families for a in f.actions)
        names = tuple(action for action, _ in self.actions[1:])
        self.actions_off = draw(data, action_swarms(names, ("add_request",)), label="actions")
        if setup.safety:  # the error contract is conformance: the safety level drives valid histories only
            self.actions_off |= CONFORMANCE_ONLY
        if setup.swarm:
            self.swarm = draw(data, swarms(), label="swarm")
        for family in self.families:
            if family.setup is not None:
                family.setup(self, data)

    def _scheduler(self, lock: Lockstep) -> Scheduler:
        """A scheduler model over ``lock`` with no request (and the safety
        oracles over its requests, at the safety level); it admits whole
        prompts when an adapter lacks chunked prefill (:data:`kvref.capabilities.CHUNKED_PREFILL`)."""
        if self.SETUP.safety:
            lock.monitor = safety_monitor(self.cfg, lock.book, lock.stats.safety)
        sched = Scheduler(self.cfg, lock.book, lock.call, lock.request_op)
        sched.whole_prefill = not self._allowed(CHUNKED_PREFILL)
        if self.zeroes and self._allowed(f"op:{ZEROING_RANGE}"):
            sched.zeroing_skip = "range"
        elif self._allowed("skip_zeroing_group_ids"):
            sched.zeroing_skip = "groups"
        sched.drain_zeroing = self.zeroes and self._allowed("op:take_new_block_ids")
        if lock.monitor is not None and sched.drain_zeroing and sched.zeroing_skip:
            # the zeroing list the monitor sees is the scheduler's own, drained every pass: it zeroes
            # what the list holds, a load's destinations included if the release's skip misses them
            lock.monitor.skip_load_zeroing = False
        return sched

    def restart(self) -> None:
        """Start the comparison over after a declared difference or a known
        divergence class (:meth:`kvref.lockstep.Lockstep.restart`): every
        adapter built again, and a scheduler with no request."""
        assert self.lock is not None
        self.lock.restart()
        self.sched = self._scheduler(self.lock)

    # -- helpers -------------------------------------------------------------

    @property
    def live(self) -> bool:
        return self.lock is not None and not self.lock.halted

    def _allowed(self, feature: str) -> bool:
        """Whether the machine may use ``feature``: no adapter lacks it
        (:attr:`MachineSetup.excluded`) and the profile's release has it
        (:func:`kvref.capabilities.absent_features`)."""
        return feature not in self.SETUP.excluded and (self.lock is None or feature not in self.lock.absent)

    def family_on(self, name: str) -> bool:
        """Whether the family ``name`` takes part in this run (:attr:`FAMILIES`).

        NOTE: a family that changes a draw inside another family's action
        (a wider token range, a new allocation argument) asks this first, so
        that a run it takes no part in draws as before."""
        return any(f.name == name for f in self.families)

    def _on(self, feature: str) -> bool:
        """Whether this run's swarm keeps ``feature`` (:data:`kvref.swarm.SWARM_FEATURES`)."""
        return self.swarm.on(feature)

    def _swarmed(self, feature: str, value: int) -> int:
        """``value``, or 0 (its default) when this run's swarm turned ``feature`` off."""
        return value if self._on(feature) else 0

    def _pop(self, pop: bool) -> bool:
        """``pop`` (deferred free), unless the adapters lack one way of freeing
        (or this run's swarm turned deferred frees off)."""
        can_pop = self._allowed("op:pop_blocks_for_free") and self._allowed("op:free_blocks")
        pop = pop and (self._on("deferred_free") or not self._allowed("op:free"))
        if pop and not can_pop:
            return False
        return pop or (not self._allowed("op:free") and can_pop)

    @property
    def _sched(self) -> Scheduler:
        assert self.sched is not None
        return self.sched

    @property
    def reqs(self) -> dict[str, ReqState]:
        """Live requests (the scheduler model's states)."""
        return self._sched.reqs

    @property
    def waiting(self) -> list[str]:
        return self._sched.waiting

    @property
    def running(self) -> list[str]:
        return self._sched.running

    @property
    def remote(self) -> list[str]:
        return self._sched.remote

    @property
    def pending(self) -> list[list[int]]:
        return self._sched.pending

    def _call(self, op: Json, expect_unchanged: bool = False) -> Json:
        assert self.lock is not None
        return self.lock.call(op, expect_unchanged)

    def _num_tokens(self, rid: str) -> int:
        return self._sched.num_tokens(rid)

    def _chunk(self, data: st.DataObject, st_: ReqState, start: int, admission: bool = False) -> int:
        """Tokens to schedule from ``start``: a drawn chunk of what remains
        (see :func:`kvref.scheduler_chunks.schedule_chunk`), cut at the prefix hint's junction.
        One chunk in four asks for everything the step budget allows, as
        vLLM's scheduler does whenever the rest fits: a uniform draw rarely
        schedules a long prompt whole, the one admission where a Mamba align
        table ends past the block holding the prompt's tail boundary."""
        bound = self._sched.chunk_bound(st_.rid, start)
        n = bound if integer(data, 0, 3) == 0 else integer(data, 1, bound)
        return self._sched.chunk(st_.rid, start, n, admission)

    def _sample_token(self, data: st.DataObject, rid: str) -> None:
        assert self.lock is not None
        self._sched.sample(rid, integer(data, 0, VOCAB - 1))

    def _lookup(self, rid: str) -> Json | None:
        """``get_computed_blocks`` of ``rid`` (bounded by :attr:`lookup_bound`
        when set); None where the release fails the lookup with a typed error
        (context parallelism, vLLM 0.16.0's EAGLE alignment assertion), which
        changes nothing, or where the reference crashed (a known divergence
        that halts the run)."""
        op: Json = {"op": "get_computed_blocks", "rid": rid}
        if self.lookup_bound is not None:
            op["max_cache_hit_length"] = self.lookup_bound
        found = self._call(op)
        return found if isinstance(found, dict) and "num_tokens" in found else None

    def _held(self, rid: str) -> list[int]:
        assert self.lock is not None
        tables = self.lock.adapters[0].get_block_ids(rid)
        pending = {b for p in self.pending for b in p}
        return [b for g in tables for b in g if b != 0 and b not in pending]

    def _prompt_limit(self) -> int:
        """Prompt tokens at most: two below the model length, and no more than
        the pool holds for every group at once (a longer prompt could never be
        admitted and would block the queue)."""
        cfg = self.cfg
        per_group = cfg.num_blocks // len(cfg.groups) * min(k.block_size for k in cfg.groups)
        return max(1, min(cfg.max_model_len - 2, per_group))

    def _remember(self, tokens: list[int], extra: Json) -> None:
        """Keep the last few token lists for later requests to reuse."""
        self.past.append((list(tokens), extra))
        del self.past[:-PAST]
