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
  (:func:`kvref.content.state_writes`);
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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvref.adapters import KVCacheAdapter
from kvref.content import (
    GARBAGE,
    STALE,
    BlockContents,
    PrefixIds,
    RequestPrefixes,
    checked_kind,
    describe,
    mamba_checked,
    read_span,
    stale_index,
    state_hit_index,
    state_read_index,
    state_writes,
)
from kvref.divergences import release_key
from kvref.ops import REQUEST_OPS, STEP_EVENTS, ZEROING_RANGE, RequestBook, execute
from kvref.safety_defects import (
    EARLY_FREE,
    FAILED_LOAD_WINDOW,
    LOAD_ZEROING,
    MAMBA_ALIGN_MIDBLOCK,
    MAMBA_FAILED_LOAD,
    WITHDRAWN_STEP,
)
from kvref.traces import Trace
from kvspec.config import CrossAttention, KVCacheConfig, Mamba
from kvspec.request import Request
from kvspec.view import KVView

Json = Any
COMPARED = {"KV": "slots compared", "state": "states compared", "encoder KV": "encoder slots compared"}
"""The run's count of each kind of slot :meth:`SafetyMonitor._compare` compares."""
Tables = tuple[tuple[int, ...], ...]


def safety_monitor(config: KVCacheConfig, book: RequestBook, counts: Counter[str] | None = None) -> SafetyMonitor:
    """The monitor a scheduler playing ``config.profile``'s release needs:
    from vLLM 0.26.0 on its scheduler leaves the destinations of connector
    loads out of the zeroing (it asks the manager for them), before it does
    not."""
    newer = release_key(config.profile.release) >= (0, 26, 0)
    return SafetyMonitor(config, book, skip_load_zeroing=newer, counts=counts)


class SafetyViolation(Exception):
    """A safety oracle failed.

    Attributes:
        oracle: ``content`` or ``inflight``.
        defect: The registered vLLM safety defect that explains it
            (:mod:`kvref.safety_defects`), or None.
    """

    def __init__(self, oracle: str, message: str, defect: str | None = None) -> None:
        """Remember which oracle failed."""
        super().__init__(message)
        self.oracle = oracle
        self.defect = defect


@dataclass
class StepEntry:
    """One request's part of a step: the positions it computes (``start`` to
    ``end``), with the table the worker got when the step was scheduled."""

    rid: str
    start: int
    end: int
    tables: Tables
    drafts: tuple[int, ...] = ()
    """Draft tokens of the positions past the request's tokens (speculative decoding)."""
    failed_skips: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    """The request's null entries its failed connector load left when the step was scheduled:
    (group, table index) -> (the load's end, the valid prefix); see ``SafetyMonitor.failed_skips``."""
    load: Load | None = None
    """A synchronous connector load that runs in this step, kept here once its request was freed
    while the step was in flight (the request may be admitted again, with a load of its own)."""
    encoder: int = 0
    """Encoder positions the step reads in each cross-attention group."""
    encoder_write: bool = False
    """Whether the step writes them first (the first step after the blocks were handed out)."""


@dataclass
class Step:
    """A scheduler step: its entries, and the blocks they use (known once dispatched)."""

    number: int
    entries: list[StepEntry] = field(default_factory=list)
    uses: dict[int, str] = field(default_factory=dict)
    """Block -> what the step does with it, e.g. ``r2 reads position 5``."""
    zeros: list[int] = field(default_factory=list)
    """Blocks the step zeroes before it runs (listed by ``take_new_block_ids`` while it was open)."""
    copies: list[tuple[int, int]] = field(default_factory=list)
    """Copy-on-write copies (source, destination) the step makes before it runs."""


@dataclass
class Withdrawal:
    """A step taken back out of its scheduling pass: ``rid``'s positions ``start`` to ``end``."""

    rid: str
    start: int
    end: int
    clock: int
    """The contents' clock as of which nothing wrote the step's blocks (what was written later was not the step)."""
    after: int
    """The last step in flight at the withdrawal (0 once it has run: the steps dispatched before the
    withdrawal write first, so :attr:`clock` moves past their writes then)."""


@dataclass
class Load:
    """A connector load in progress: ``rid``'s positions ``start`` to ``end``."""

    rid: str
    start: int
    end: int
    tables: Tables
    synchronous: bool = True
    """Whether the step that issues it waits for it (else the request waits: ``delay_cache_blocks``)."""
    blocks: dict[int, int] = field(default_factory=dict)
    """Destination block -> group."""
    read: set[int] = field(default_factory=set)
    """The destinations that hold a loaded position the request still reads from the load's end on
    (a sliding or chunked window drops the others: zeroing them wipes KV nothing reads)."""


class SafetyMonitor:
    """Both oracles over one adapter's operations (see the module docstring).

    Args:
        config: The configuration the adapter runs.
        book: The lockstep's request values (read, never changed).
        zeroing: Whether blocks ``take_new_block_ids`` lists are zeroed (vLLM
            zeroes them when the model needs it: a Mamba group).
        skip_load_zeroing: Whether the scheduler leaves the destinations of
            connector loads out of the zeroing (vLLM's scheduler from 0.26.0 on).
            The ids ``get_zeroing_block_ids_in_range`` answers (0.26.0 to
            0.31.0) are left out of the next drained list in any case.

            The state machine clears it where its scheduler model drains the
            list every pass and asks for the skips as the release's scheduler
            does (``Scheduler.drain_zeroing``, ``Scheduler.zeroing_skip``): the
            monitor then zeroes what the list holds, and a load's destination
            on it is a violation whatever the release.
    """

    def __init__(
        self,
        config: KVCacheConfig,
        book: RequestBook,
        zeroing: bool | None = None,
        skip_load_zeroing: bool = True,
        counts: Counter[str] | None = None,
    ) -> None:
        """Nothing written yet."""
        self.config = config
        self.book = book
        self.kinds = config.manager_groups()
        self.checked = tuple(g for g, k in enumerate(self.kinds) if checked_kind(k))
        self.mamba = tuple(g for g, k in enumerate(self.kinds) if mamba_checked(k, config.use_eagle))
        """Mamba groups whose states the content oracle checks."""
        self.cross = tuple(g for g, k in enumerate(self.kinds) if isinstance(k, CrossAttention))
        """Cross-attention groups (their encoder positions are checked)."""
        self.encoders: dict[str, list[int]] = {}
        """Requests whose cross-attention blocks are handed out: rid -> [encoder positions,
        whether a step that writes them was scheduled]."""
        self.drafted: set[str] = set()
        """Requests a step with draft tokens ran for since their table was new: their Mamba
        states are not checked (:meth:`_run_states`)."""
        self.zeroing = any(isinstance(k, Mamba) for k in config.groups) if zeroing is None else zeroing
        self.skip_load_zeroing = skip_load_zeroing
        self.range_skip: set[int] = set()
        """Block ids ``get_zeroing_block_ids_in_range`` answered since the last ``take_new_block_ids``:
        vLLM's scheduler (0.26.0 to 0.31.0) leaves them out of the zeroing list it drains next."""
        self.behind: dict[int, tuple[str, int, int, int]] = {}
        """Mamba ``align`` blocks a chunk starting inside them left behind (they keep the state at the
        chunk's start while the manager caches them as the state at their end), under a release that
        schedules such chunks: block -> (request, the chunk's start, its end, the clock then). Read by a
        step or a hit before anything writes it again, it meets
        :data:`kvref.safety_defects.MAMBA_ALIGN_MIDBLOCK` (:meth:`_attributed`)."""
        self.contents = BlockContents(config)
        self.prefixes = RequestPrefixes(PrefixIds())
        self.writers: dict[int, str] = {}
        self.loads: dict[str, Load] = {}
        self.pipelined = False
        """Whether steps wait for :meth:`dispatch` and :meth:`processed` (the async pipeline)."""
        self.open = Step(1)
        self.in_flight: list[Step] = []
        self.counts: Counter[str] = Counter() if counts is None else counts
        """What the oracles did: ``slots compared``, ``steps run``, ``hits checked``,
        ``loads``, ``blocks zeroed``, ``groups not checked`` (shared with the run's statistics)."""
        self.counts["groups not checked"] += len(self.kinds) - len(self.checked) - len(self.mamba) - len(self.cross)
        self.early: dict[tuple[str, int, int], tuple[int, int]] = {}
        """Blocks the release freed below a window while a step in flight still read them
        (a release before vLLM 0.26.0 frees on the computed tokens, steps in flight included):
        (request, group, table index) -> (block, the step that freed it), kept until that
        step's output is processed. See :mod:`kvref.safety_defects`."""
        self.failed_skips: dict[str, dict[tuple[int, int], tuple[int, int]]] = {}
        """Null table entries of a request whose connector load failed part-way, as the failure
        left them: request -> (group, table index) -> (the load's end, the valid prefix). The
        admission skipped them for the window of the load's end; a step that recomputes from the
        valid prefix and reads one meets :data:`kvref.safety_defects.FAILED_LOAD_WINDOW` (an attention
        group) or :data:`kvref.safety_defects.MAMBA_FAILED_LOAD` (the state a Mamba group starts from)."""
        self.failed_states: dict[int, tuple[str, int, int]] = {}
        """Mamba blocks a connector load that failed part-way was to fill a state into (past the
        valid prefix), holding :data:`kvref.content.GARBAGE` since: block -> (request, the valid
        prefix, the clock of that mark). Read by a step or a hit before anything writes it again,
        it meets :data:`kvref.safety_defects.MAMBA_FAILED_LOAD` (:meth:`_failed_state`)."""
        self.freed: set[str] = set()
        """Requests freed since their latest allocation: the next one starts a new table."""
        self.withdrawn: dict[int, Withdrawal] = {}
        """Blocks a step taken back out of its scheduling pass was to write (its allocation had
        already cached the full ones). Read by a step or a hit before anything writes it again,
        it meets :data:`kvref.safety_defects.WITHDRAWN_STEP` (:meth:`_withdrawn_cause`)."""
        self.withdrawals: list[Withdrawal] = []
        """Withdrawals made while steps were in flight: their clock moves past those steps'
        writes once the last of them has run (:meth:`processed`)."""
        self.last_tables: dict[str, Tables] = {}
        """Each request's tables after its latest allocation."""
        self.deferred = False
        """Without the pipeline: whether the open step waits for the copies of its
        copy-on-write hits (:meth:`_copies_may_follow`) before it runs."""

    # -- what the lockstep tells -------------------------------------------

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
        if name == "get_computed_blocks" and isinstance(out, dict) and "blocks" in out:
            self._check_hit(op["rid"], out["blocks"], out["num_tokens"])
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
            self.freed.add(op["rid"])  # its failed-load entries hold for its steps still in flight
            self.encoders.pop(op["rid"], None)  # its steps in flight keep their own encoder count

    # -- the async pipeline's hooks ---------------------------------------

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
        for entry in step.entries:
            self._execute(step, entry)
        self.early = {k: v for k, v in self.early.items() if v[1] > step.number}
        for mark in self.withdrawals:  # the steps dispatched before a withdrawal come before it
            if mark.after <= step.number:
                mark.clock, mark.after = self.contents.writes, 0
        self.withdrawals = [mark for mark in self.withdrawals if mark.after]
        for rid, n in (shifts or {}).items():
            for later in (*self.in_flight, self.open):
                for entry in later.entries:
                    if entry.rid == rid:
                        entry.start, entry.end = entry.start - n, entry.end - n

    # -- the oracles ---------------------------------------------------------

    def _check_hit(self, rid: str, blocks: Sequence[Sequence[int]], num_tokens: int) -> None:
        req = self.book.requests.get(rid)
        if req is None or not num_tokens:
            return
        want = self.prefixes.of(req, num_tokens)
        self.counts["hits checked"] += 1
        pending = self._pending_writes()
        for g in self.checked:
            bs = self.contents.block_size(g)
            for i, b in enumerate(blocks[g]):
                if b == 0 or b in pending:
                    continue
                self._loading(b, f"request {rid}'s hit reads it")
                for p in range(i * bs, min((i + 1) * bs, num_tokens)):
                    self._compare(b, g, p, want[p], f"request {rid} hit block {b} (group {g}) for position {p}")
        for g in self.mamba:
            i = state_hit_index(self._mamba(g), num_tokens)
            b = blocks[g][i] if i < len(blocks[g]) else 0
            if b == 0 or b in pending:  # no state served: the step that continues reads the null entry
                continue
            self._loading(b, f"request {rid}'s hit reads it")
            what = f"request {rid} hit block {b} (group {g}) for the state at {num_tokens} tokens"
            self._compare_state(b, g, want[num_tokens - 1], what)

    def _allocated(self, op: Json, out: list[list[int]], view: KVView) -> None:
        rid = op["rid"]
        req = self.book.requests[rid]
        if rid in self.freed:  # a new table: the null entries of a failed load were the old one's
            self.freed.discard(rid)
            self.failed_skips.pop(rid, None)
            self.drafted.discard(rid)
        tables = dict(view.tables).get(rid, tuple(() for _ in self.kinds))
        for ids in out:
            for b in ids:
                if b:
                    self.contents.handed_out(b)
        local = req.num_computed_tokens + op.get("num_new_computed_tokens", 0)
        external = op.get("num_external_computed_tokens", 0)
        new = op["num_new_tokens"]
        # without the pipeline a step runs at its allocation, unless it waits for its copies (the
        # copies run first, then its synchronous load, as on the device; see _copies_may_follow)
        defer = not self.pipelined and new > 0 and (self.deferred or self._copies_may_follow(op))
        if external:
            load = Load(rid, local, local + external, tables, synchronous=not op.get("delay_cache_blocks"))
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
            entry = StepEntry(rid, local + external, local + external + new, tables, failed_skips=failed)
            encoder = self.encoders.get(rid)
            if encoder is not None:  # the first step after the blocks were handed out runs the encoder
                entry.encoder, entry.encoder_write, encoder[1] = encoder[0], not encoder[1], 1
            self.open.entries.append(entry)
            if defer:
                self.deferred = True  # the step runs once the scheduler has handed off its copies
            elif not self.pipelined:
                self._run_open_step()

    def _copies_may_follow(self, op: Json) -> bool:
        """Whether the allocation ``op`` may have left copy-on-write copies for the
        scheduler to hand off (a prefix hit under a release with fine-grained
        hits, vLLM 0.29.0 on): its step reads the copies' destinations, so
        without the pipeline it runs only after them, at the next call (the
        scheduler hands copies off at the end of its pass, before the step)."""
        return bool(self.config.profile.partial_hash_hits and any(any(g) for g in op.get("new_computed_blocks") or ()))

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

    def _note_early(self, rid: str, total: int, in_flight: int, tables: Tables) -> None:
        """Blocks of ``rid`` this allocation freed below its window on the
        computed tokens ``total`` that the tokens in flight still read (those
        a step in flight started from ``total - in_flight`` reads), and, in a
        Mamba group, the state entries a step in flight reads or writes (an
        ``align`` group frees the state before its last one on the same
        count): remembered in :attr:`early`."""
        prev = self.last_tables.get(rid)
        if prev is None:
            return
        for g in self.checked:
            kind, bs = self.kinds[g], self.contents.block_size(g)
            low = read_span(kind, max(0, total - in_flight), max(0, total - in_flight)).start // bs
            high = read_span(kind, total, total).start // bs
            for i in range(low, min(high, len(prev[g]), len(tables[g]))):
                if prev[g][i] and not tables[g][i]:
                    self.early[(rid, g, i)] = (prev[g][i], self.open.number)
        for g in self.mamba:  # the state entries a step in flight reads or writes (an align group's last state)
            kind = self._mamba(g)
            for entry in (e for step in self.in_flight for e in step.entries if e.rid == rid):
                read = state_read_index(kind, entry.start)
                used = [j for j, _ in state_writes(kind, entry.start, entry.end)] + ([] if read is None else [read])
                for i in used:
                    if i < min(len(prev[g]), len(tables[g])) and prev[g][i] and not tables[g][i]:
                        self.early[(rid, g, i)] = (prev[g][i], self.open.number)

    def _record_uses(self, step: Step, entry: StepEntry) -> None:
        for g in self.checked:
            bs, table = self.contents.block_size(g), entry.tables[g]
            for p in read_span(self.kinds[g], entry.start, entry.end):
                if p // bs < len(table) and table[p // bs]:
                    verb = "writes" if p >= entry.start else "reads"
                    step.uses.setdefault(table[p // bs], f"request {entry.rid} {verb} position {p}")
        for g in self.mamba:
            table, kind = entry.tables[g], self._mamba(g)
            i = state_read_index(kind, entry.start)
            if i is not None and i < len(table) and table[i]:
                step.uses.setdefault(table[i], f"request {entry.rid} reads its state at {entry.start} tokens")
            for b, n in self._state_blocks(kind, table, entry.start, entry.end):
                step.uses.setdefault(b, f"request {entry.rid} writes its state at {n} tokens")
        verb = "writes" if entry.encoder_write else "reads"
        for g in self.cross:
            bs, table = self.contents.block_size(g), entry.tables[g]
            for e in range(entry.encoder):
                if e // bs < len(table) and table[e // bs]:
                    step.uses.setdefault(table[e // bs], f"request {entry.rid} {verb} encoder position {e}")

    def _execute(self, step: Step, entry: StepEntry) -> None:
        """The device runs ``entry``: writes, then the reads (checked)."""
        self.counts["steps run"] += 1
        load = self.loads.get(entry.rid)
        if entry.load is not None:
            self._land(entry.load)
            entry.load = None
        elif load is not None and load.synchronous:
            self._load_done(entry.rid)
        req = self.book.requests.get(entry.rid)
        if req is None:
            return
        want = self.prefixes.of(req, entry.end, entry.drafts)
        for g in self.checked:
            bs, table, kind = self.contents.block_size(g), entry.tables[g], self.kinds[g]
            where = f"step {step.number}: request {entry.rid}"
            for p in range(entry.start, entry.end):
                b = self._entry(table, p // bs, f"{where} writes position {p} (group {g})", (entry.rid, g), entry)
                self._loading(b, f"{where} writes position {p} into it")
                self.contents.write(b, g, p % bs, want[p])
                self.writers.setdefault(want[p], f"request {entry.rid} at position {p}")
            for p in read_span(kind, entry.start, entry.start):
                b = self._entry(table, p // bs, f"{where} reads position {p} (group {g})", (entry.rid, g), entry)
                self._loading(b, f"{where} reads position {p} in it")
                self._compare(b, g, p, want[p], f"{where} reads block {b} (group {g}) for position {p}")
        for g in self.mamba:
            self._run_states(step, entry, g, want)
        if entry.encoder:
            self._run_encoder(step, entry, req)

    def _run_encoder(self, step: Step, entry: StepEntry, req: Request) -> None:
        """The device runs ``entry`` in the cross-attention groups: the first
        step writes the encoder's KV, then every step reads all of it (checked)."""
        want = self.prefixes.encoder(req, entry.encoder)
        where = f"step {step.number}: request {entry.rid}"
        for g in self.cross:
            table, bs = entry.tables[g], self.contents.block_size(g)
            if entry.encoder_write:
                for e in range(entry.encoder):
                    b = self._entry(table, e // bs, f"{where} writes encoder position {e} (group {g})")
                    self._loading(b, f"{where} writes encoder position {e} into it")
                    self.contents.write(b, g, e % bs, want[e])
                    self.writers.setdefault(want[e], f"request {entry.rid}'s encoder at position {e}")
            for e in range(entry.encoder):
                b = self._entry(table, e // bs, f"{where} reads encoder position {e} (group {g})")
                self._loading(b, f"{where} reads encoder position {e} in it")
                what = f"{where} reads block {b} (group {g}) for encoder position {e}"
                self._compare(b, g, e, want[e], what, of="encoder KV")

    def _run_states(self, step: Step, entry: StepEntry, g: int, want: Sequence[int]) -> None:
        """The device runs ``entry`` in the Mamba group ``g``: it reads the
        state it starts from (checked), then writes the states of its mode."""
        kind, table = self._mamba(g), entry.tables[g]
        where = f"step {step.number}: request {entry.rid}"
        if entry.drafts or entry.rid in self.drafted:
            # drafts without speculative blocks (the kit draws them, vLLM never runs them on a Mamba
            # group): a rejected draft leaves a state past the accepted tokens; nothing is checked
            self.drafted.add(entry.rid)
            self.counts["states not checked"] += 1
            for b, _ in self._state_blocks(kind, table, entry.start, entry.end):
                self.contents.write(b, g, 0, STALE)
            return
        i = state_read_index(kind, entry.start)
        if i is not None:
            # a recomputation after a failed load may start from an entry its admission skipped (_entry names it)
            reads = f"{where} reads the state at {entry.start} tokens (group {g})"
            b = self._entry(table, i, reads, (entry.rid, g), entry)
            self._loading(b, f"{where} reads its state at {entry.start} tokens in it")
            what = f"{where} reads block {b} (group {g}) for the state at {entry.start} tokens"
            self._compare_state(b, g, want[entry.start - 1], what)
        for i, n in state_writes(kind, entry.start, entry.end):
            b = self._entry(table, i, f"{where} writes the state at {n} tokens (group {g})", (entry.rid, g), entry)
            self._loading(b, f"{where} writes its state at {n} tokens into it")
            self.contents.write(b, g, 0, want[n - 1])
            self.writers.setdefault(want[n - 1], f"request {entry.rid} at position {n - 1}")
        self._stale(kind, g, table, entry.start, entry.end, entry.rid)

    def _stale(self, kind: Mamba, g: int, table: Sequence[int], start: int, end: int, rid: str) -> None:
        """The block a step or load of ``[start, end)`` leaves behind a boundary
        (:func:`kvref.content.stale_index`): it keeps the state at ``start``,
        remembered for the defect's rule (:attr:`behind`). The scheduler model
        splits chunks as the release does
        (:func:`kvref.scheduler_chunks.schedule_chunk`), so from 0.26.0 on, where
        vLLM stops such a chunk at the block's end, only a scheduler of another
        policy (an engine without chunked prefill) gets here, and a read of the
        block is checked like any other."""
        i = stale_index(kind, start, end) if end > start else None
        if i is None or i >= len(table) or not table[i]:
            return
        b = table[i]
        if self.contents.owner.get(b) == g:
            self.behind[b] = (rid, start, end, self.contents.writes)

    def _compare_state(self, b: int, g: int, want: int, what: str) -> None:
        """Compare the state ``b`` holds; a block left behind a boundary is not checked."""
        if self.contents.value(b, g, 0) == STALE:
            self.counts["states not checked"] += 1
            return
        defect, detail = self._attributed(b, g)
        self._compare(b, g, 0, want, what, of="state", defect=defect, detail=detail)

    def _attributed(self, b: int, g: int) -> tuple[str | None, str]:
        """The registered defect a wrong state in the Mamba block ``b`` comes
        from, by its rule, and the words that say why: a failed load was to
        fill it (:attr:`failed_states`), or a chunk that started inside it
        left it behind (:attr:`behind`), and since then nothing wrote it
        (zeroing aside) and nothing handed it out anew."""
        if self.contents.owner.get(b) == g:
            failed = self.failed_states.get(b)
            if failed is not None and self._untouched(b, failed[2]):
                rid, valid, _ = failed
                return MAMBA_FAILED_LOAD, (
                    f" (request {rid}'s connector load was to fill it and failed past {valid} tokens; nothing wrote "
                    "a state into it since)"
                )
            behind = self.behind.get(b)
            if behind is not None and self._untouched(b, behind[3]):
                rid, start, end, _ = behind
                return MAMBA_ALIGN_MIDBLOCK, (
                    f" (request {rid}'s chunk of positions {start}-{end - 1} started inside the block and ran past "
                    f"its end, so the block kept the state at {start} tokens and was cached as the state at its end)"
                )
        return None, ""

    def _untouched(self, b: int, since: int) -> bool:
        """Whether nothing wrote ``b`` (zeroing aside) or handed it out after the clock ``since``."""
        return self.contents.written_at[b][0] <= since and self.contents.handed.get(b, 0) <= since

    def _mamba(self, g: int) -> Mamba:
        """The kind of the Mamba group ``g``."""
        kind = self.kinds[g]
        assert isinstance(kind, Mamba), f"group {g} is {kind!r}, not a Mamba group"
        return kind

    @staticmethod
    def _state_blocks(kind: Mamba, table: Sequence[int], start: int, end: int) -> list[tuple[int, int]]:
        """The non-null blocks of ``table`` that computing (or loading) ``[start,
        end)`` writes states into, each with the length whose state it gets."""
        if end <= start:
            return []
        return [(table[i], n) for i, n in state_writes(kind, start, end) if i < len(table) and table[i]]

    def _entry(
        self, table: Sequence[int], index: int, what: str, at: tuple[str, int] | None = None,
        step: StepEntry | None = None,
    ) -> int:
        """``table[index]``, the block a step uses (``at``: its request and group).

        Raises:
            SafetyViolation: No such entry, or the null block (a block freed
                early under a step in flight names its defect: :attr:`early`).
        """
        if index >= len(table):
            raise SafetyViolation("content", f"{what}: its table has {len(table)} blocks, no entry {index}")
        if table[index] == 0:
            early = None if at is None else self.early.get((*at, index))
            if early is not None:
                block = early[0]
                raise SafetyViolation(
                    "content",
                    f"{what}: the table holds the null block there; block {block} was freed while steps in "
                    "flight still read it (freed below the window on the computed tokens, in-flight ones included)",
                    defect=EARLY_FREE,
                )
            failed = None if at is None or step is None else step.failed_skips.get((at[1], index))
            if failed is not None and step is not None and at is not None and isinstance(self.kinds[at[1]], Mamba):
                raise SafetyViolation(
                    "content",
                    f"{what}: the table holds the null block there, skipped when request {step.rid}'s connector load "
                    f"was admitted (only the state at the load's end, {failed[0]} tokens, was to be filled); the load "
                    f"failed past {failed[1]} tokens and the recomputation from there starts from it",
                    defect=MAMBA_FAILED_LOAD,
                )
            if failed is not None and step is not None:
                raise SafetyViolation(
                    "content",
                    f"{what}: the table holds the null block there, skipped when request {step.rid}'s connector load "
                    f"was admitted (the window measured from the load's end, {failed[0]} tokens); the load failed "
                    f"past {failed[1]} tokens and the recomputation from there reads it",
                    defect=FAILED_LOAD_WINDOW,
                )
            raise SafetyViolation("content", f"{what}: the table holds the null block there")
        return table[index]

    def _compare(
        self, b: int, g: int, p: int, want: int, what: str, of: str = "KV", defect: str | None = None,
        detail: str = "",
    ) -> None:
        self.counts[COMPARED[of]] += 1
        got = self.contents.value(b, g, p % self.contents.block_size(g))
        if got != want:
            if defect is None:
                defect, detail = self._withdrawn_cause(b, g, p % self.contents.block_size(g))
            message = f"{what}, but the block holds {describe(got, self.writers, of)} there{detail}"
            raise SafetyViolation("content", message, defect=defect)

    def _withdraw(self, entry: StepEntry) -> None:
        """``entry`` leaves the open step before it runs: remember the blocks it
        was to write (:attr:`withdrawn`)."""
        self.counts["steps withdrawn"] += 1
        self.contents.writes += 1
        after = self.in_flight[-1].number if self.in_flight else 0
        mark = Withdrawal(entry.rid, entry.start, entry.end, self.contents.writes, after)
        if after:
            self.withdrawals.append(mark)
        for g in self.checked:
            bs, table = self.contents.block_size(g), entry.tables[g]
            for p in range(entry.start, entry.end):
                if p // bs < len(table) and table[p // bs]:
                    self.withdrawn[table[p // bs]] = mark
        for g in self.mamba:
            for b, _ in self._state_blocks(self._mamba(g), entry.tables[g], entry.start, entry.end):
                self.withdrawn[b] = mark

    def _withdrawn_cause(self, b: int, g: int, slot: int) -> tuple[str | None, str]:
        """:data:`kvref.safety_defects.WITHDRAWN_STEP` and the words that say why,
        when ``slot`` of ``b`` (read for group ``g``) is one a withdrawn step was
        to write and nothing wrote it (any slot, where another group wrote the
        block last) or handed the block out anew since (:attr:`withdrawn`)."""
        mark = self.withdrawn.get(b)
        if mark is None:
            return None, ""
        written = self.contents.written_at.get(b, [0])
        last = written[slot] if self.contents.owner.get(b) == g else max(written)
        if self.contents.handed.get(b, 0) > mark.clock or last > mark.clock:
            return None, ""
        return WITHDRAWN_STEP, (
            f" (request {mark.rid}'s step of positions {mark.start}-{mark.end - 1} was taken back out of its "
            "scheduling pass after its allocation had cached the block, so nothing computed it; nothing wrote it since)"
        )

    # -- connector loads and zeroing -----------------------------------------

    def _issue(self, load: Load) -> None:
        """A connector load starts: its destinations (whole blocks: a transfer
        writes whole blocks) must be free of steps in flight and of other loads."""
        for g in self.checked:
            bs, table = self.contents.block_size(g), load.tables[g]
            read = read_span(self.kinds[g], load.end, load.end)
            for p in range(load.start, load.end):
                if p // bs < len(table) and table[p // bs]:
                    load.blocks[table[p // bs]] = g
                    if p >= read.start:
                        load.read.add(table[p // bs])
        for g in self.mamba:
            for b, _ in self._state_blocks(self._mamba(g), load.tables[g], load.start, load.end):
                load.blocks[b] = g
                load.read.add(b)
        early = {b for b, _ in self.early.values()}
        for b in load.blocks:
            for step in self.in_flight:
                if b in step.uses:
                    raise SafetyViolation(
                        "inflight",
                        f"the connector load of request {load.rid} fills block {b} while step {step.number} is "
                        f"in flight and {step.uses[b].replace('request', 'its request', 1)} in it",
                        defect=EARLY_FREE if b in early else None,
                    )
            self._loading(b, f"the connector load of request {load.rid} fills it too")

    def _land(self, load: Load, upto: int | None = None) -> None:
        """The load's KV is in its blocks (up to position ``upto``, where it failed past it)."""
        req = self.book.requests.get(load.rid)
        if req is None:
            return
        want = self.prefixes.of(req, load.end)
        end = load.end if upto is None else min(load.end, upto)
        for g in self.checked:
            bs, table = self.contents.block_size(g), load.tables[g]
            for p in range(load.start, min(end, len(table) * bs)):
                if table[p // bs]:
                    self.contents.write(table[p // bs], g, p % bs, want[p])
                    self.writers.setdefault(want[p], f"request {load.rid} at position {p} (connector)")
        for g in self.mamba:  # the load fills the states that computing its positions writes
            for b, n in self._state_blocks(self._mamba(g), load.tables[g], load.start, end):
                self.contents.write(b, g, 0, want[n - 1])
                self.writers.setdefault(want[n - 1], f"request {load.rid} at position {n - 1} (connector)")
            self._stale(self._mamba(g), g, load.tables[g], load.start, end, load.rid)

    def _failed(self, load: Load, valid: int) -> None:
        """``load`` failed past ``valid`` tokens: remember the request's null entries then."""
        tables = self.last_tables.get(load.rid)
        if tables is None or valid >= load.end:
            return
        for g in self.mamba:  # the states past the valid prefix were never filled: what the failure left
            for b, n in self._state_blocks(self._mamba(g), load.tables[g], load.start, load.end):
                if n > valid:
                    self.contents.write(b, g, 0, GARBAGE)
                    self.failed_states[b] = (load.rid, valid, self.contents.writes)
        for g in (*self.checked, *self.mamba):
            for i, b in enumerate(tables[g]):
                if b == 0:
                    self.failed_skips.setdefault(load.rid, {})[(g, i)] = (load.end, valid)

    def _load_done(self, rid: str, upto: int | None = None) -> None:
        self._land(self.loads.pop(rid), upto)

    def _loading(self, block: int, what: str) -> None:
        for load in self.loads.values():
            if block in load.blocks:
                raise SafetyViolation(
                    "inflight", f"block {block} is still being filled by the connector load of request "
                    f"{load.rid} (positions {load.start}-{load.end - 1}), and {what}",
                )

    def _pending_writes(self) -> set[int]:
        """Blocks a step scheduled but not yet run will write or copy into, or a
        synchronous connector load of such a step will fill (their content is not there yet;
        a step that reads them runs with or after that step, which waits for
        its loads before attention reads)."""
        out: set[int] = {b for load in self.loads.values() if load.synchronous for b in load.blocks}
        for step in (*self.in_flight, self.open):
            out.update(dest for _, dest in step.copies)  # a copy runs on the device before its step
            for entry in step.entries:
                if entry.load is not None:  # the synchronous load of a freed request, run by its step
                    out.update(entry.load.blocks)
                for g in self.checked:
                    bs, table = self.contents.block_size(g), entry.tables[g]
                    out.update(table[p // bs] for p in range(entry.start, entry.end) if p // bs < len(table))
                for g in self.cross if entry.encoder_write else ():
                    bs, table = self.contents.block_size(g), entry.tables[g]
                    out.update(table[e // bs] for e in range(entry.encoder) if e // bs < len(table))
                for g in self.mamba:
                    kind, table = self._mamba(g), entry.tables[g]
                    out.update(b for b, _ in self._state_blocks(kind, table, entry.start, entry.end))
                    stale = stale_index(kind, entry.start, entry.end) if entry.end > entry.start else None
                    if stale is not None and stale < len(table):
                        out.add(table[stale])  # the step leaves it behind a boundary (_stale)
        return out

    def _zero(self, ids: Iterable[int]) -> None:
        ids = list(ids)
        self.contents.listed_for_zeroing([b for b in ids if b])
        for b in ids:
            if not b:
                continue
            # a synchronous load runs in its step after the step's zeroing; a delayed one may be under way
            loading = [load for load in self.loads.values() if b in load.read and not load.synchronous]
            if loading and self.skip_load_zeroing:
                continue  # the scheduler leaves a load's destinations out of the zeroing
            if loading:
                load = loading[0]
                raise SafetyViolation(
                    "inflight",
                    f"take_new_block_ids lists block {b} for zeroing while the connector load of request "
                    f"{load.rid} (positions {load.start}-{load.end - 1}) fills it: the zeroing may wipe the loaded KV",
                    defect=LOAD_ZEROING,
                )
            if self.pipelined:  # the zeroing runs on the device with the step now open, before it
                self.open.zeros.append(b)
                continue
            self.contents.zero(b)
            self.counts["blocks zeroed"] += 1


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
