"""The asynchronous pipeline of the scheduler model: steps in flight, as vLLM's ``AsyncScheduler`` keeps them.

vLLM's asynchronous scheduler (the default) schedules the next step while the
device still runs the previous one: a step's output is processed only after
the next step was dispatched. :class:`PipelineScheduler` adds that to the
scheduler model (:class:`kvref.scheduler.Scheduler`); the machine family
:mod:`kvref.machine.pipeline` drives it. The rules (vLLM's ``AsyncScheduler``,
its engine core's queue of two batches, and the deferred free of vLLM#45357,
as of vLLM 0.25.1; a release before 0.24.0 frees at once, ``can_pop`` off):

* A *step* is what the scheduler allocated since the last dispatch; a
  request takes part in a step once (scheduling it again dispatches the open
  step first, as the scheduler's next pass would).
* At dispatch every request of the step gets its scheduled tokens in flight
  (``num_in_flight_tokens``); its computed tokens already count them.
* At most two steps are in flight: the dispatch that makes two first waits
  for the older one, whose output is processed before the next pass.
* A step that reaches the end of a request's known tokens produces an
  output later: a placeholder now (the next step may compute at its
  position before the scheduler knows its value), and the draft tokens of
  speculative decoding scheduled with it are placeholders too. A request's
  schedulable tokens are its tokens, its placeholders and the drafts for its
  next step (:meth:`PipelineScheduler.num_tokens`).
* When a step's output is processed, each request gets its in-flight tokens
  back; a running request gets its accepted drafts and its sampled token
  appended, its rejected drafts taken back from its computed tokens (the
  later step in flight then computes that many positions lower), and caches
  its full blocks up to its computed tokens less its placeholders
  (``cache_blocks``, as ``AsyncScheduler._update_request_with_output``
  does); a request preempted since the step was scheduled keeps the sampled
  tokens but rolls nothing back (its computed tokens start again from 0).
* Freeing a request whose last dispatched step is still in flight pops its
  blocks, and frees them, reversed, once that step's output is processed
  (the fence of vLLM#45357, from vLLM 0.24.0; under an earlier release,
  ``can_pop`` off, every free is immediate as its scheduler's is); any other
  free is immediate. A request freed
  before the open step is dispatched leaves that step (a preempted request
  is taken back out of the pass, and nothing of it runs).

A safety monitor (:class:`kvref.safety.SafetyMonitor`) learns the step
boundaries from the step events this model records (``step_dispatch`` with
the drafts, ``step_output`` with the rejected drafts per request:
``docs/traces.md``); they call no adapter.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvref.ops import RequestBook
from kvref.scheduler import ReqState, Scheduler
from kvspec.config import KVCacheConfig

Json = Any


@dataclass
class Part:
    """One request's part of a step: ``n`` tokens from position ``start``."""

    rid: str
    start: int
    n: int
    preemptions: int
    """The request's preemptions when scheduled (a later preemption drops the output)."""
    drafts: tuple[int, ...] = ()
    """Draft tokens scheduled in the step (its last ``len(drafts)`` positions)."""
    accept: int = 0
    """How many of ``drafts`` the output accepts."""
    sampled: int | None = None
    """The token the step samples (None: a prefill chunk, no output token)."""


@dataclass
class Step:
    """A step: its parts by request; ``seq`` numbers the dispatched steps from 1."""

    seq: int = 0
    parts: dict[str, Part] = field(default_factory=dict)


class PipelineScheduler(Scheduler):
    """The scheduler model with steps in flight (see the module docstring).

    Args:
        event: Records a step event (an operation that calls no adapter) and
            tells the safety monitor, if any.
        can_pop: Whether the adapters pop blocks for a deferred free (else
            every free is immediate).
        note_pending: Told the number of popped lists waiting for their free
            whenever it changes.
    """

    def __init__(
        self,
        config: KVCacheConfig,
        book: RequestBook,
        call: Callable[[Json], Json],
        record: Callable[[Json], None],
        event: Callable[[Json], None],
        can_pop: bool = True,
        note_pending: Callable[[int], None] | None = None,
        counts: Counter[str] | None = None,
    ) -> None:
        """No step yet."""
        super().__init__(config, book, self._allocating(call), record)
        self.counts: Counter[str] = Counter() if counts is None else counts
        """What happened: ``steps dispatched``, ``outputs processed``, ``drafts
        scheduled``, ``drafts rejected``, ``frees fenced``."""
        self.event = event
        self.can_pop = can_pop
        self.note_pending = note_pending
        self.open = Step()
        self.in_flight: list[Step] = []
        self.seq = 0
        """Steps dispatched so far (upstream ``sched_step_seq``)."""
        self.processed_seq = 0
        """Steps whose output was processed (upstream ``processed_step_seq``)."""
        self.fences: list[int] = []
        """Per popped list of :attr:`pending`, the step whose output frees it."""
        self.last_seq: dict[str, int] = {}
        """Per request, its last dispatched step (upstream ``last_sched_seq``)."""
        self.placeholders: dict[str, int] = {}
        """Per request, output tokens scheduled whose value is not known yet."""
        self.next_drafts: dict[str, tuple[tuple[int, ...], int]] = {}
        """Per request, the drafts its next step may schedule and how many of them its output accepts."""
        self.admitted_in_pass = False
        """Whether a request was admitted since the last dispatch (:meth:`withdrawable`)."""

    @staticmethod
    def _allocating(call: Callable[[Json], Json]) -> Callable[[Json], Json]:
        """``call``, with an allocation that fails with a caller error answered
        as refused (None): nothing of it runs. A valid history never meets one,
        but a release's own defect can (vLLM 0.25.1 returns hit lists for a
        second full-attention kind that it then refuses to take back), and a
        step must not be dispatched for it."""

        def checked(op: Json) -> Json:
            out = call(op)
            if op["op"] == "allocate_slots" and isinstance(out, dict) and "error" in out:
                return None
            return out

        return checked

    # -- the request's view -------------------------------------------------------

    def num_tokens(self, rid: str) -> int:
        """The tokens the scheduler may compute for ``rid``: its tokens, its
        placeholders and the drafts of its next step."""
        drafts = self.next_drafts.get(rid, ((), 0))[0]
        return super().num_tokens(rid) + self.placeholders.get(rid, 0) + len(drafts)

    def sample(self, rid: str, token: int) -> None:
        """``rid``'s step in the open step samples ``token``: a placeholder until
        its output is processed (a request outside the open step gets it at once)."""
        part = self.open.parts.get(rid)
        if part is None or part.sampled is not None:
            super().sample(rid, token)
            return
        part.sampled = token
        self.placeholders[rid] = self.placeholders.get(rid, 0) + 1

    def set_drafts(self, rid: str, drafts: tuple[int, ...], accept: int) -> None:
        """The drafts ``rid``'s next step may schedule, and how many of them its output accepts."""
        self.next_drafts[rid] = (drafts, min(accept, len(drafts)))

    # -- scheduling -------------------------------------------------------------------

    def admit(self, op: Json, hit: int, external: int = 0, delay: bool = False, looked_up: bool = True) -> bool:
        """As the base, in a step of its own if the request is in the open one."""
        self._once(op["rid"])
        done = super().admit(op, hit, external, delay, looked_up)
        self.admitted_in_pass = self.admitted_in_pass or done
        return done

    def advance(self, rid: str, new: int, lookahead: int = 0) -> bool:
        """As the base, in a step of its own if the request is in the open one."""
        self._once(rid)
        return super().advance(rid, new, lookahead)

    def advance_batch(self, items: list[tuple[str, int, int]]) -> list[bool]:
        """As the base, in a step of its own if a request is in the open one."""
        if any(rid in self.open.parts for rid, _, _ in items):
            self.dispatch()
        return super().advance_batch(items)

    def scheduled(self, st: ReqState, start: int, n: int) -> None:
        """``st``'s ``n`` tokens from ``start`` join the open step; those past its
        known tokens (tokens and placeholders) are drafts of its next step, now
        placeholders too (the drafts it does not reach are dropped)."""
        if n <= 0:
            return
        rid = st.rid
        known = super().num_tokens(rid) + self.placeholders.get(rid, 0)
        drafts, accept = self.next_drafts.pop(rid, ((), 0))
        drafts = drafts[: max(0, start + n - known)]
        self.placeholders[rid] = self.placeholders.get(rid, 0) + len(drafts)
        part = Part(rid, start, n, st.preemptions, drafts, min(accept, len(drafts)))
        self.open.parts[rid] = part

    def _once(self, rid: str) -> None:
        if rid in self.open.parts:
            self.dispatch()

    def withdrawable(self, rid: str) -> bool:
        """Whether ``rid`` may be taken back out of the open step, as vLLM's
        priority scheduler takes a running request scheduled earlier in the pass
        when a later allocation fails: it is in the step for a running step, and
        nothing was admitted in this pass (the pass schedules its running
        requests, and preempts, before it admits any)."""
        return rid in self.open.parts and not self.admitted_in_pass

    # -- steps ----------------------------------------------------------------------

    def dispatch(self, next_pass: bool = True) -> None:
        """The open step goes to the device; with two in flight the older one's
        output is processed first; then (``next_pass``) the next scheduling
        pass starts (``new_step_starts``). Nothing happens without an open step."""
        step = self.open
        if not step.parts:
            return
        self.admitted_in_pass = False
        self.seq += 1
        step.seq = self.seq
        self.open = Step()
        self.counts["steps dispatched"] += 1
        for rid, part in step.parts.items():
            self.last_seq[rid] = step.seq
            st = self.reqs.get(rid)
            if st is not None:
                st.in_flight += part.n
                self.sync(st)
        drafts = {rid: list(p.drafts) for rid, p in step.parts.items() if p.drafts}
        self.event({"op": "step_dispatch", **({"drafts": drafts} if drafts else {})})
        self.in_flight.append(step)
        if len(self.in_flight) > 1:
            self.process()
        if next_pass:
            if self.config.profile.partial_hash_hits and not self.copies:
                # the scheduler drains the copy-on-write copies every step (as the machine's new_step does)
                self.call({"op": "take_kv_cache_block_copies"})
            self.call({"op": "new_step_starts"})

    def process(self) -> None:
        """The oldest step in flight finished: process its output (see the module
        docstring), then free the popped blocks its output fences."""
        if not self.in_flight:
            return
        step = self.in_flight.pop(0)
        self.processed_seq = step.seq
        self.counts["outputs processed"] += 1
        live = {rid: p for rid, p in step.parts.items() if self._runs(p)}
        shifts = {rid: len(p.drafts) - p.accept for rid, p in live.items() if len(p.drafts) > p.accept}
        self.event({"op": "step_output", **({"shifts": shifts} if shifts else {})})
        for rid, part in step.parts.items():
            st = self.reqs.get(rid)
            if st is None:
                continue
            st.in_flight -= part.n
            if rid not in live:  # preempted since: the sampled tokens are kept, nothing is rolled back
                tokens = list(part.drafts[: part.accept]) + ([] if part.sampled is None else [part.sampled])
                if tokens:
                    self.record({"op": "append_tokens", "rid": rid, "tokens": tokens})
            appended = rid in live and self._output(st, part)
            self.sync(st)
            if appended:
                upto = st.computed - self.placeholders.get(rid, 0)
                self.call({"op": "cache_blocks", "rid": rid, "num_computed_tokens": upto})
        while self.fences and self.fences[0] <= self.processed_seq:
            self.fences.pop(0)
            self.deferred_free(0)
        if self.note_pending is not None:
            self.note_pending(len(self.pending))

    def finish_pipeline(self) -> None:
        """Dispatch the open step and process every step in flight (the end of a run)."""
        self.dispatch(next_pass=False)
        while self.in_flight:
            self.process()

    def _runs(self, part: Part) -> bool:
        """Whether ``part``'s request still runs as it did when the step was scheduled."""
        st = self.reqs.get(part.rid)
        return st is not None and st.status == "RUNNING" and st.preemptions == part.preemptions

    def _output(self, st: ReqState, part: Part) -> bool:
        """A running request's output: rejected drafts rolled back, accepted ones
        and the sampled token appended; whether any token was."""
        rejected = len(part.drafts) - part.accept
        self.counts["drafts scheduled"] += len(part.drafts)
        self.counts["drafts rejected"] += rejected
        if rejected and st.computed > 0:
            st.computed -= rejected
        done = len(part.drafts) + (part.sampled is not None)
        self.placeholders[st.rid] = self.placeholders.get(st.rid, 0) - done
        tokens = list(part.drafts[: part.accept]) + ([] if part.sampled is None else [part.sampled])
        if tokens:
            self.record({"op": "append_tokens", "rid": st.rid, "tokens": tokens})
        return bool(tokens)

    # -- freeing ----------------------------------------------------------------------

    def release(self, rid: str, pop: bool) -> list[int] | None:
        """Free ``rid``'s blocks, or pop them when its last dispatched step is
        still in flight (freed once that step's output is processed); ``pop``,
        the caller's choice, is overruled by that rule. The request leaves the
        open step and loses its placeholders and drafts."""
        self.open.parts.pop(rid, None)
        self.placeholders.pop(rid, None)
        self.next_drafts.pop(rid, None)
        if not (self.can_pop and self.last_seq.get(rid, 0) > self.processed_seq):
            self.call({"op": "free", "rid": rid})
            return None
        popped: list[int] = self.call({"op": "pop_blocks_for_free", "rid": rid})
        if popped:
            self.pending.append(popped)
            self.fences.append(self.seq)
            self.counts["frees fenced"] += 1
            if self.note_pending is not None:
                # the lockstep knows at once that popped blocks wait for their free (the
                # registered common-prefix-pending difference of 0.24.0-0.31.0 depends on it)
                self.note_pending(len(self.pending))
        return popped
