"""The asynchronous pipeline: steps in flight, placeholders, rejected drafts, fenced frees.

vLLM's scheduler runs asynchronously by default: it schedules a step while
the device still runs the previous one. In the runs this family takes part
in, the machine's scheduler model is a :class:`kvref.scheduler_pipeline.PipelineScheduler`:
what the machine allocates goes into the open step, ``dispatch_step`` sends
it to the device (and starts the next scheduling pass), ``process_output``
processes the oldest step's output (tokens appended, rejected drafts rolled
back, fenced frees done), and a dispatch that leaves two steps in flight
processes the older one first. A running request's next step may then
compute its placeholder and its draft tokens before their values are known:
with speculative decoding drawn for the run (up to 3 drafts a step, some
rejected), the drafts and how many the output accepts are drawn where the
step's token is sampled.

What changes in the other families' actions in these runs: a running step,
a finish and a drain of a request already in the open step dispatch that
step first (a request takes part in a step once), and a preemption for a
more urgent request (priority scheduling) dispatches it first too, while the
family's own ``withdraw_step`` takes a running request back out of the open
step before anything was admitted in the pass, as vLLM's priority scheduler
does when a later allocation of the pass fails (its allocation stands, its
step never runs); a finish that frees skipped
blocks first frees them on the computed tokens the release's scheduler uses
(from vLLM 0.26.0 on less those in flight, vLLM#47728); the popped lists are
freed by the fence, not by ``deferred_free``; the directed families, which
line up a situation call by call, and the batched steps stay out. At the
safety level the monitor learns each step's dispatch and output
(:meth:`kvref.safety.SafetyMonitor.event`), so the in-flight oracle sees what
each step in flight reads and writes.

The family takes part in the runs of a machine set up with
:attr:`kvref.machine.configuration.MachineSetup.asynchronous` (``kvref check
--async-scheduling``) whose adapters pop blocks for a deferred free (vLLM
0.24.0 on), or whose release has none (before 0.24.0 its scheduler frees a
request's blocks at once, steps in flight or not, and so does the pipeline:
the registered ``unfenced-free``); every other run draws as before.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kvref.hypothesis_compat import boolean, choose, integer
from kvref.machine.base import Action, Family, MachineBase
from kvref.machine.configuration import VOCAB
from kvref.machine.recording import RecordingRules
from kvref.machine.running import RunningRules
from kvref.scheduler_pipeline import PipelineScheduler
from kvspec.config import Mamba

Json = Any
NAME = "async_pipeline"
MAX_DRAFTS = 3
"""Draft tokens a step of a run with speculative decoding schedules at most."""
OFF = frozenset(
    {"deferred_free", "flood", "tail_pair", "rekeyed_tails", "cache_past_slots", "prefix_swap", "tail_relost",
     "load_twin", "schedule_batch"}
)  # fmt: skip
"""Actions left out of the family's runs: the fence frees popped lists, and
the directed families and batched steps schedule requests call by call."""


def _pipeline(m: MachineBase) -> PipelineScheduler | None:
    sched = m.sched
    return sched if isinstance(sched, PipelineScheduler) else None


def _withdrawable(m: MachineBase) -> bool:
    p = _pipeline(m)
    return p is not None and m._on("priority_preempt") and any(p.withdrawable(rid) for rid in m.running)


ACTIONS: tuple[Action, ...] = (
    *(("dispatch_step", lambda m: (p := _pipeline(m)) is not None and bool(p.open.parts)),) * 3,
    *(("process_output", lambda m: (p := _pipeline(m)) is not None and bool(p.in_flight)),) * 2,
    *(("withdraw_step", _withdrawable),) * 3,
)
"""The family's actions and when each is ready (listed more than once: a scheduler dispatches a step
and processes an output on every pass, as often as it schedules; a withdrawal is ready only in a pass
that has admitted nothing yet, and its defect needs the withdrawn step to have cached a block)."""


def _pops(m: MachineBase) -> bool:
    """Whether the adapters pop blocks for a deferred free (and free popped lists)."""
    return m._allowed("op:pop_blocks_for_free") and m._allowed("op:free_blocks")


def _takes_part(m: MachineBase) -> bool:
    # a release without the deferred free (before vLLM 0.24.0) frees a request's blocks at once, steps in
    # flight or not, as its scheduler does
    return m.SETUP.asynchronous and (_pops(m) or (not m.SETUP.profile.deferred_free and m._allowed("op:free")))


def _setup(m: MachineBase, data: st.DataObject) -> None:
    assert isinstance(m, PipelineRules)
    m.start_pipeline(data)


FAMILY = Family(NAME, ACTIONS, _takes_part, _setup)
"""Joins the runs of an asynchronous machine (:attr:`MachineSetup.asynchronous`)."""


class PipelineRules(RunningRules, RecordingRules):
    """The pipeline's actions, and what the others do differently in its runs."""

    def __init__(self) -> None:
        """No pipeline yet (:meth:`start_pipeline`)."""
        super().__init__()
        self.max_drafts = 0
        """Draft tokens a step schedules at most in this run (0: no speculative decoding)."""

    def start_pipeline(self, data: st.DataObject) -> None:
        """Draw the run's speculative decoding (0: none) and put the pipeline in
        place of the scheduler model (nothing was scheduled yet)."""
        lock, old = self.lock, self.sched
        assert lock is not None and old is not None
        if lock.monitor is not None:
            lock.monitor.pipelined = True

        def event(op: Json) -> None:
            lock.request_op(op)
            if lock.monitor is not None:
                lock.watch(lambda monitor: monitor.event(op), op)

        def note_pending(n: int) -> None:
            lock.pending = n

        sched = PipelineScheduler(
            self.cfg, lock.book, lock.call, lock.request_op, event, _pops(self), note_pending, lock.stats.pipeline
        )
        sched.whole_prefill, sched.zeroing_skip, sched.drain_zeroing = (
            old.whole_prefill, old.zeroing_skip, old.drain_zeroing
        )
        self.sched = sched
        self.max_drafts = integer(data, 0, MAX_DRAFTS)
        spec_blocks = [k.num_speculative_blocks for k in self.cfg.groups if isinstance(k, Mamba)]
        if spec_blocks:
            # vLLM gives a Mamba group one block per speculative token: a model drafts no more
            # tokens a step than its Mamba groups have speculative blocks
            self.max_drafts = min(self.max_drafts, *spec_blocks)
        # the pipeline's own actions stay on whatever the run's action swarm drew: a scheduler
        # without them would dispatch only when it schedules a request twice
        self.actions_off = (self.actions_off | OFF) - {name for name, _ in ACTIONS}

    @property
    def _pipe(self) -> PipelineScheduler:
        sched = _pipeline(self)
        assert sched is not None
        return sched

    def dispatch_step(self, data: st.DataObject) -> None:
        """The scheduling pass ends: every running request not in the open step
        yet, oldest first, gets its chunk or its decode step, until one does not
        fit (the newest running request is then preempted); the open step goes
        to the device."""
        for rid in list(self.running):
            if rid in self.running and rid not in self._pipe.open.parts and not self._step(data, rid):
                break
        self._pipe.dispatch()

    def process_output(self, data: st.DataObject) -> None:
        """The oldest step in flight finished: its output is processed."""
        self._pipe.process()

    def withdraw_step(self, data: st.DataObject) -> None:
        """Priority scheduling: a running request scheduled in this pass is
        preempted and taken back out of it, as vLLM's ``Scheduler.schedule``
        does when a later allocation of the pass fails and the request has the
        lowest priority (every release from 0.16.0 to 0.34.0). Its allocation
        stands (the full blocks of the tokens it was to compute are cached);
        its step never runs."""
        rid = choose(data, tuple(r for r in self.running if self._pipe.withdrawable(r)))
        self._pipe.counts["steps withdrawn"] += 1
        RunningRules._preempt(self, rid, data)

    def schedule_running(self, data: st.DataObject) -> None:
        """As :meth:`RunningRules.schedule_running`; a request already in the
        open step dispatches it first."""
        if not self.family_on(NAME):
            super().schedule_running(data)
            return
        rid = choose(data, tuple(self.running))
        if rid in self._pipe.open.parts:
            self._pipe.dispatch()
        self._step(data, rid)

    def _step(self, data: st.DataObject, rid: str) -> bool:
        """Schedule running ``rid`` into the open step: a chunk, or a decode step
        of its token and every draft (vLLM schedules them all, within the step
        budget); a request with nothing left finishes. False when it did not fit
        (the newest running request was preempted)."""
        st_ = self.reqs[rid]
        if st_.computed >= self._num_tokens(rid):
            self._finish(rid, data)
            return True
        drafts = len(self._pipe.next_drafts.get(rid, ((), 0))[0])
        new = self._num_tokens(rid) - st_.computed if drafts else self._chunk(data, st_, st_.computed)
        if not self._sched.advance(rid, new, self._lookahead(data)):
            self._preempt(self.running[-1], data)
            return False
        if st_.computed == self._num_tokens(rid) < self.cfg.max_model_len:
            self._sample_token(data, rid)
        return True

    def finish(self, data: st.DataObject) -> None:
        """As :meth:`RunningRules.finish`; skipped blocks are freed first on the
        computed tokens the release's scheduler uses (from vLLM 0.26.0 on less
        those in flight: ``Scheduler._connector_finished``)."""
        if not self.family_on(NAME):
            super().finish(data)
            return
        rid = choose(data, tuple(sorted(self.reqs)))
        preempt = rid in self.running and choose(data, ("finish", "finish", "preempt")) == "preempt"
        if preempt and self._on("priority_preempt"):
            self._preempt(rid, data)
            return
        if rid in self._pipe.open.parts:  # it ends after this pass: the pass is dispatched
            self._pipe.dispatch()
        if rid in self.running and boolean(data) and self._on("remove_skipped"):
            st_ = self.reqs[rid]
            total = st_.computed - (st_.in_flight if self.cfg.profile.skip_on_processed_tokens else 0)
            self._call({"op": "remove_skipped_blocks", "rid": rid, "total_computed_tokens": max(0, total)})
        self._finish(rid, data)

    def drain(self, data: st.DataObject, first: str | None = None) -> None:
        """As :meth:`RunningRules.drain`, after dispatching the open step."""
        if self.family_on(NAME):
            self._pipe.dispatch()
        super().drain(data, first)

    def _finish(self, rid: str, data: st.DataObject) -> None:
        """As the base; a request in the open step dispatches it first."""
        if self.family_on(NAME) and rid in self._pipe.open.parts:
            self._pipe.dispatch()
        super()._finish(rid, data)

    def _preempt(self, rid: str, data: st.DataObject) -> None:
        """As the base; a request in the open step dispatches it first.

        NOTE: vLLM's first-come-first-served scheduler preempts the newest
        running request, which its pass has not scheduled yet; a request
        scheduled in the pass is taken back out of it only under priority
        scheduling (``Scheduler.schedule`` removes it from the pass's
        scheduled requests, every release from 0.16.0 to 0.34.0), whose
        allocation has then already cached blocks its withdrawn step never
        computes: :meth:`withdraw_step` draws that path; this one keeps the
        pass's order."""
        if self.family_on(NAME) and rid in self._pipe.open.parts:
            self._pipe.dispatch()
        super()._preempt(rid, data)

    def _sample_token(self, data: st.DataObject, rid: str) -> None:
        """As the base; with speculative decoding, also the drafts of the
        request's next step and how many of them its output accepts."""
        if not self.family_on(NAME):
            super()._sample_token(data, rid)
            return
        self._sched.sample(rid, integer(data, 0, VOCAB - 1))
        room = self.cfg.max_model_len - self.reqs[rid].computed - 1
        n = integer(data, 0, min(self.max_drafts, room)) if self.max_drafts and room > 0 else 0
        if n:
            drafts = tuple(integer(data, 0, VOCAB - 1) for _ in range(n))
            self._pipe.set_drafts(rid, drafts, integer(data, 0, n))

    def teardown(self) -> None:
        """Every step in flight finishes first (its reads checked, its fenced frees done)."""
        if self.family_on(NAME) and self.live:
            self._pipe.finish_pipeline()
        super().teardown()
