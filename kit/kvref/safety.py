"""The safety oracles: no KV served for another prefix, no block reused under a step in flight.

Conformance asks "does the engine do what vLLM does?"; safety asks what must
hold whatever the policy (docs/safety.md). :class:`SafetyMonitor` watches the
operations a lockstep runs on one adapter (its outputs and tables) and keeps
what every block holds (:mod:`kvref.content`). Two oracles:

* *content*: every hit a lookup returns holds, at every position it covers,
  the KV of the request's own input prefix; every table entry a step reads
  (per attention kind, :func:`kvref.content.read_span`) holds the KV of that
  position, written by the step that computed it or the connector load that
  filled it; a block handed out fresh is never read before it is written.
  For a Mamba group the same holds of its recurrent state: a hit serves, and
  a step reads where the mode says, the state of the request's own prefix at
  that length, and a step writes its states where the mode says
  (:func:`kvref.content_states.state_writes`);
* *in flight*: a step runs on the device after it is dispatched and before
  its output is processed; steps run one after another in dispatch order,
  and within a step every KV write comes before every attention read, so a
  block a step uses may be handed to a request of a *later* step. A
  connector load is not ordered against the steps: from the moment it is
  issued (its step is dispatched) until it ends, no step in flight may read
  or write its destination blocks, no other load may fill them and they may
  not be zeroed.

How it learns what the scheduler did: from the operations alone
(``allocate_slots`` with the request's computed tokens says which positions
the step computes, which came from hits and which from a connector), so it
runs under any scheduler that drives a lockstep; the async pipeline
(:mod:`kvref.scheduler_pipeline`) also tells it when each step is dispatched
and when its output is processed (:meth:`SafetyMonitor.dispatch`,
:meth:`SafetyMonitor.processed`). Without the pipeline every step runs as
soon as it is scheduled (vLLM's synchronous scheduler).

A violation raises :class:`SafetyViolation`; the lockstep turns it into a
failure of aspect ``safety/content`` or ``safety/inflight``, shrunk and
written as a trace like a divergence. A declared policy difference never
silences it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from kvref.adapters import KVCacheAdapter
from kvref.content import read_span
from kvref.content_states import state_hit_index
from kvref.divergences import release_key
from kvref.ops import REQUEST_OPS, STEP_EVENTS, ZEROING_RANGE, RequestBook, execute
from kvref.safety_base import COMPARED, Json, Load, SafetyViolation, Step, StepEntry, Tables, Withdrawal
from kvref.safety_steps import StepChecks
from kvref.traces import Trace
from kvspec.config import KVCacheConfig
from kvspec.view import KVView

LOOKUPS = ("get_computed_blocks", "get_computed_blocks_for_connector")
"""The lookups whose hits the content oracle checks (a connector's may leave some groups behind)."""

__all__ = [
    "COMPARED",
    "Load",
    "SafetyMonitor",
    "SafetyViolation",
    "Step",
    "StepEntry",
    "Tables",
    "Withdrawal",
    "safety_monitor",
    "safety_replay",
]


def safety_monitor(config: KVCacheConfig, book: RequestBook, counts: Counter[str] | None = None) -> SafetyMonitor:
    """The monitor a scheduler playing ``config.profile``'s release needs:
    from vLLM 0.26.0 on its scheduler leaves the destinations of connector
    loads out of the zeroing (it asks the manager for them), before it does
    not."""
    newer = release_key(config.profile.release) >= (0, 26, 0)
    return SafetyMonitor(config, book, skip_load_zeroing=newer, counts=counts)


class SafetyMonitor(StepChecks):
    """Both oracles over one adapter's operations (see the module docstring;
    its state and arguments: :class:`kvref.safety_base.MonitorState`)."""

    def after(self, op: Json, out: Json, view: KVView) -> None:
        """``op`` ran on the adapter and answered ``out``; ``view`` is its state now.

        Raises:
            SafetyViolation: An oracle failed.
        """
        name = op["op"]
        if self.deferred and name != "take_kv_cache_block_copies":
            self._run_deferred()
        if isinstance(out, dict) and ("error" in out or "crash" in out) and name != "get_computed_blocks":
            return
        if name in LOOKUPS and isinstance(out, dict) and "blocks" in out:
            self._check_hit(op["rid"], out["blocks"], out["num_tokens"], bool(out.get("hit_diverged")))
        elif name == "allocate_slots" and isinstance(out, list):
            self._allocated(op, out, view)
        elif name == "allocate_slots" and out is None:
            self._refused(op, view)
        elif name == "allocate_slots_batch" and isinstance(out, list):
            for item, blocks in zip(op["items"], out, strict=False):
                if isinstance(blocks, list):  # one running request's step of the batch
                    self._allocated({"op": "allocate_slots", **item}, blocks, view)
                elif blocks is None:
                    self._refused({"op": "allocate_slots", **item}, view)
        elif name == ZEROING_RANGE and isinstance(out, list):
            self.range_skip.update(b for b in out if b)
        elif name == "take_new_block_ids" and isinstance(out, list):
            skip, self.range_skip = self.range_skip, set()
            if self.zeroing:  # the scheduler leaves out what it asked for since its last drain
                self._zero([b for b in out if b not in skip])
        elif name == "record_blocks_for_zeroing":
            self.contents.relisted()
        elif name == "take_kv_cache_block_copies" and isinstance(out, dict):
            for source, dest in out.get("copies", ()):
                if self.pipelined:  # the copy runs on the device with the step now open
                    self.open.copies.append((source, dest))
                else:
                    self.contents.copy(source, dest)
            if self.deferred:
                self._run_deferred()
        elif name == "cache_blocks" and op["rid"] in self.loads:
            # a load that failed part-way ends with the valid tokens cached: the rest was never written
            self._failed(self.loads[op["rid"]], op["num_computed_tokens"])
            self._load_done(op["rid"], op["num_computed_tokens"])
        elif name == "remove_skipped_blocks":
            self._removed(op["rid"], op["total_computed_tokens"], view)
        elif name in ("free", "pop_blocks_for_free"):
            # a request freed before its step is dispatched leaves that step (a preempted one is
            # taken back out of the scheduling pass): nothing of it runs
            for entry in self.open.entries:
                if entry.rid == op["rid"]:
                    self._withdraw(entry)
            self.open.entries = [e for e in self.open.entries if e.rid != op["rid"]]
            load = self.loads.get(op["rid"])
            carrier = next(
                (e for step in self.in_flight for e in step.entries if e.rid == op["rid"] and e.load is None), None
            )
            if load is not None and load.synchronous and carrier is not None:
                # a synchronous load runs in its step, already in flight, after that step's zeroing and
                # copies (the worker's order: vllm/v1/worker/gpu_model_runner.py, _update_states before the
                # connector's start_load_kv): it lands when that step runs (_execute)
                carrier.load = self.loads.pop(op["rid"])
            elif load is not None:
                # the scheduler frees a loading request's blocks once its load has ended (vLLM#32255)
                self._load_done(op["rid"])
            if name == "free":  # no fence: whatever its steps in flight use is free at once
                for step in self.in_flight:
                    for entry in (e for e in step.entries if e.rid == op["rid"]):
                        self.unfenced.update((b, step.number) for table in entry.tables for b in table if b)
            self.freed.add(op["rid"])  # its failed-load entries hold for its steps still in flight
            self.encoders.pop(op["rid"], None)  # its steps in flight keep their own encoder count

    def event(self, op: Json) -> None:
        """A step event of the asynchronous pipeline (``step_dispatch`` with its
        ``drafts``, ``step_output`` with its ``shifts``; :data:`kvref.ops.STEP_EVENTS`).

        Raises:
            SafetyViolation: An oracle failed.
        """
        if op["op"] == "step_dispatch":
            self.dispatch(op.get("drafts"))
        elif op["op"] == "step_output":
            self.processed(op.get("shifts"))

    def dispatch(self, drafts: Mapping[str, Sequence[int]] | None = None) -> None:
        """The open step goes to the device (its output comes later); ``drafts``
        gives a request's draft tokens (its positions past its tokens)."""
        step, self.open = self.open, Step(self.open.number + 1)
        if not (step.entries or step.zeros or step.copies):
            return
        for entry in step.entries:
            entry.drafts = tuple((drafts or {}).get(entry.rid, ()))
            self._record_uses(step, entry)
        self.in_flight.append(step)

    def processed(self, shifts: dict[str, int] | None = None) -> None:
        """The oldest step in flight finished and its output was processed:
        its writes land and its reads are checked now. ``shifts`` moves the
        later steps' entries of a request down by that many positions (draft
        tokens this step rejected: the device computes them where the
        accepted tokens end).

        Raises:
            SafetyViolation: An oracle failed.
        """
        if not self.in_flight:
            return
        step = self.in_flight.pop(0)
        for b in step.zeros:  # the zeroing (as of the block's listing) and the copies run first
            self.contents.zero(b)
            self.counts["blocks zeroed"] += 1
        for source, dest in step.copies:
            self.contents.copy(source, dest)
        self.rejected = dict(shifts or {})
        current = {e.rid for e in step.entries if self._current(e)}  # not a step of a table given up since
        self.rolled_back.update(rid for rid, n in self.rejected.items() if n and rid in current)
        for entry in step.entries:
            self._execute(step, entry)
        self.early = {k: v for k, v in self.early.items() if v[1] > step.number}
        self.unfenced = {b: n for b, n in self.unfenced.items() if n > step.number}
        for mark in self.withdrawals:  # the steps dispatched before a withdrawal come before it
            if mark.after <= step.number:
                mark.clock, mark.after = self.contents.writes, 0
                if mark.entry is not None:
                    self._left_behind(mark.entry)
        self.withdrawals = [mark for mark in self.withdrawals if mark.after]
        for rid, n in (shifts or {}).items():
            for later in (*self.in_flight, self.open):
                for entry in later.entries:
                    if entry.rid == rid:
                        entry.start, entry.end = entry.start - n, entry.end - n

    def _check_hit(self, rid: str, blocks: Sequence[Sequence[int]], num_tokens: int, lagging: bool = False) -> None:
        """A lookup's hit serves the request's own KV in every group; with
        ``lagging`` (a connector's lookup whose groups diverged) a group's own
        hit ends with its list (kvref runs that lookup at the safety level
        only without fine-grained hits, so every list ends on a block boundary)."""
        req = self.book.requests.get(rid)
        if req is None or not num_tokens:
            return
        want = self.prefixes.of(req, num_tokens)
        self.counts["hits checked"] += 1
        pending = self._pending_writes()
        if not lagging:
            self._note_windowless(rid, blocks, num_tokens)
        for g in self.checked:
            bs = self.contents.block_size(g)
            for i, b in enumerate(blocks[g]):
                if b == 0 or b in pending:
                    continue
                self._loading(b, f"request {rid}'s hit reads it")
                for p in range(i * bs, min((i + 1) * bs, num_tokens)):
                    self._compare(b, g, p, want[p], f"request {rid} hit block {b} (group {g}) for position {p}")
        for g in self.mamba:
            n = min(num_tokens, len(blocks[g]) * self.contents.block_size(g)) if lagging else num_tokens
            i = state_hit_index(self._mamba(g), n) if n else len(blocks[g])
            b = blocks[g][i] if i < len(blocks[g]) else 0
            if b == 0 or b in pending:  # no state served: the step that continues reads the null entry
                continue
            self._loading(b, f"request {rid}'s hit reads it")
            what = f"request {rid} hit block {b} (group {g}) for the state at {n} tokens"
            self._compare_state(b, g, want[n - 1], what, n)

    def _note_windowless(self, rid: str, blocks: Sequence[Sequence[int]], num_tokens: int) -> None:
        """Remember the null entries a hit of ``num_tokens`` for ``rid`` has inside
        the window of its end (:attr:`windowless`; they replace the request's earlier ones)."""
        self.windowless = {k: n for k, n in self.windowless.items() if k[0] != rid}
        for g in self.checked:
            bs = self.contents.block_size(g)
            first = read_span(self.kinds[g], num_tokens, num_tokens).start // bs
            for i in range(first, min(len(blocks[g]), (num_tokens + bs - 1) // bs)):  # the window's blocks
                if blocks[g][i] == 0:
                    self.windowless[(rid, g, i)] = num_tokens

    def _allocated(self, op: Json, out: list[list[int]], view: KVView) -> None:
        rid = op["rid"]
        req = self.book.requests[rid]
        if rid in self.freed:  # a new table: the null entries of a failed load were the old one's
            self.freed.discard(rid)
            self.failed_skips.pop(rid, None)
            self.drafted.discard(rid)
            self.furthest.pop(rid, None)
            self.rolled_back.discard(rid)
            self.tables_given[rid] = self.tables_given.get(rid, 0) + 1
        tables = dict(view.tables).get(rid, tuple(() for _ in self.kinds))
        for ids in out:
            for b in ids:
                if b:
                    self.contents.handed_out(b)
        local = req.num_computed_tokens + op.get("num_new_computed_tokens", 0)
        external = op.get("num_external_computed_tokens", 0)
        new = op["num_new_tokens"]
        hits = op.get("new_computed_blocks")
        if hits and op.get("num_new_computed_tokens", 0):  # the hit the scheduler hands over is the one used
            self._note_windowless(rid, hits, local)
        # without the pipeline a step runs at its allocation, unless it waits for its copies (the
        # copies run first, then its synchronous load, as on the device; see _copies_may_follow)
        defer = not self.pipelined and new > 0 and (self.deferred or self._copies_may_follow(op))
        if external:
            load = Load(rid, local, local + external, tables, synchronous=not op.get("delay_cache_blocks"))
            load.starts = self._lagging_starts(op.get("new_computed_blocks"), local)
            self.counts["loads"] += 1
            self._issue(load)
            if load.synchronous and not self.pipelined and not defer:
                self._land(load)
            else:
                self.loads[rid] = load  # lands when it ends, a synchronous one before its step runs
        if req.num_in_flight_tokens and not self.config.profile.skip_on_processed_tokens:
            self._note_early(rid, local + external, req.num_in_flight_tokens, tables)
        self.last_tables[rid] = tables
        if self.cross and op.get("num_encoder_tokens", 0) > 0 and rid not in self.encoders:
            self.encoders[rid] = [op["num_encoder_tokens"], 0]
        if new > 0:
            failed = dict(self.failed_skips.get(rid, {}))
            entry = StepEntry(rid, local + external, local + external + new, tables, failed_skips=failed,
                              table=self.tables_given.get(rid, 0))  # fmt: skip
            self.furthest[rid] = max(self.furthest.get(rid, 0), entry.end)
            encoder = self.encoders.get(rid)
            if encoder is not None:  # the first step after the blocks were handed out runs the encoder
                entry.encoder, entry.encoder_write, encoder[1] = encoder[0], not encoder[1], 1
            self.open.entries.append(entry)
            if defer:
                self.deferred = True  # the step runs once the scheduler has handed off its copies
            elif not self.pipelined:
                self._run_open_step()

    def _lagging_starts(self, hits: Sequence[Sequence[int]] | None, local: int) -> tuple[int, ...]:
        """Per group, where a connector load starts: a group whose hit list a
        connector's lookup left short of the ``local`` hit tokens (vLLM 0.27.0
        on, ``get_computed_blocks_for_connector`` in a Mamba hybrid) has the
        load fill on from its own hit; empty when no group lags."""
        if not hits:
            return ()
        starts = tuple(
            min(local, len(hits[g]) * self.contents.block_size(g)) if g < len(hits) else local
            for g in range(len(self.kinds))
        )
        return starts if min(starts) < local else ()

    def _copies_may_follow(self, op: Json) -> bool:
        """Whether the allocation ``op`` may have left copy-on-write copies for the
        scheduler to hand off, under a configuration with fine-grained hits: a
        prefix hit inside a block (its step reads the copy's destination), or a
        running request's step past its own Mamba tail entry (vLLM 0.29.0 moves
        that entry to a fresh block the copy fills, while the step writes on in
        the source). Without the pipeline the step then runs only after the
        copies, at the next call (the scheduler hands copies off at the end of
        its pass, before the step runs)."""
        del op
        return self.fine_hits

    def _run_deferred(self) -> None:
        """Run the step that waited for its copies (:attr:`deferred`)."""
        self.deferred = False
        self._run_open_step()

    def _run_open_step(self) -> None:
        """Without the pipeline: the open step runs and its output is processed at once."""
        self.dispatch()
        self.processed()

    def _refused(self, op: Json, view: KVView) -> None:
        """An allocation refused for want of blocks: it still freed what its
        windows skip on the computed tokens first (vLLM's ``allocate_slots``
        skips before it counts the blocks it needs), so it is checked for
        early frees as an allocation is (:meth:`_removed` on its computed tokens)."""
        req = self.book.requests.get(op["rid"])
        if req is not None:
            local = req.num_computed_tokens + op.get("num_new_computed_tokens", 0)
            self._removed(op["rid"], local + op.get("num_external_computed_tokens", 0), view)

    def _removed(self, rid: str, total: int, view: KVView) -> None:
        """``remove_skipped_blocks`` of ``rid`` on ``total`` computed tokens (a
        scheduler hands a finished request's table to a connector that way)."""
        req, tables = self.book.requests.get(rid), dict(view.tables).get(rid)
        if req is None or tables is None:
            return
        if req.num_in_flight_tokens and not self.config.profile.skip_on_processed_tokens:
            self._note_early(rid, total, req.num_in_flight_tokens, tables)
        self.last_tables[rid] = tables


def safety_replay(trace: Trace, adapter: KVCacheAdapter) -> tuple[int, SafetyViolation] | None:
    """Run ``trace`` on ``adapter`` under the safety oracles, with the step
    boundaries its step events give (a trace without any runs every step at
    once); the first violation and the index of the step that showed it, or None.

    NOTE: this drives the oracles, not a conformance replay (the one replay
    loop, :func:`kvref.traces.run_steps`, compares outputs and digests and
    never tells a monitor of the step events): outputs are not compared here.
    """
    book = RequestBook(trace.config)
    monitor = safety_monitor(trace.config, book)
    monitor.pipelined = any(step["op"] in STEP_EVENTS for step in trace.steps)
    for index, step in enumerate(trace.steps):
        op = {k: v for k, v in step.items() if k not in ("expect", "view")}
        try:
            if op["op"] in STEP_EVENTS:
                monitor.event(op)
            elif op["op"] in REQUEST_OPS:
                book.apply(op)
            else:
                monitor.after(op, execute(adapter, book, op), adapter.to_view())
        except SafetyViolation as exc:
            return index, exc
    return None
