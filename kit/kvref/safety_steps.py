"""What a step does on the device, under the content oracle.

:class:`StepChecks` (a layer of :class:`kvref.safety.SafetyMonitor`): a step
runs its synchronous load, writes the positions it computes, then reads its
attention span (checked); in a Mamba group it reads the state it starts from
(checked) and writes the states of its mode; in a cross-attention group the
first step writes the encoder's KV and every step reads it (checked).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvref.content import STALE, read_span
from kvref.content_states import accepted_copy, draft_row_writes, state_read_index, state_writes
from kvref.safety_base import SafetyViolation, Step, StepEntry
from kvref.safety_defects import MAMBA_REJECTED_NULL
from kvref.safety_loads import LoadChecks
from kvspec.config import Mamba
from kvspec.request import Request


class StepChecks(LoadChecks):
    """A step's uses (known when it is dispatched) and its run on the device."""

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
            writes, checkpoint = self._step_state_writes(kind, entry)
            for i, n in [*writes, *([checkpoint] if checkpoint else [])]:
                if i < len(table) and table[i]:
                    step.uses.setdefault(table[i], f"request {entry.rid} writes its state at {n} tokens")
        verb = "writes" if entry.encoder_write else "reads"
        for g in self.cross:
            bs, table = self.contents.block_size(g), entry.tables[g]
            for e in range(entry.encoder):
                if e // bs < len(table) and table[e // bs]:
                    step.uses.setdefault(table[e // bs], f"request {entry.rid} {verb} encoder position {e}")

    def _step_state_writes(
        self, kind: Mamba, entry: StepEntry
    ) -> tuple[list[tuple[int, int]], tuple[int, int] | None]:
        """The table entries a step writes states into in a Mamba group, each with the
        length whose state it gets, and the prefill checkpoint it writes (or None): a
        row with draft tokens in a group with speculative blocks writes the state after
        each token (:func:`kvref.content_states.draft_row_writes`) and no checkpoint;
        any other row writes its mode's states."""
        if entry.end <= entry.start:
            return [], None
        if kind.num_speculative_blocks and entry.drafts:
            return draft_row_writes(kind, entry.start, entry.end), None
        return state_writes(kind, entry.start, entry.end), self._checkpoint(kind, entry.start, entry.end)

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
        state it starts from (checked), then writes the states of its mode (a
        row with draft tokens in a group with speculative blocks: the state
        after each token, then the copy its accepted count decides)."""
        kind, table = self._mamba(g), entry.tables[g]
        where = f"step {step.number}: request {entry.rid}"
        spec = kind.num_speculative_blocks > 0
        unmodelled = not spec or len(entry.drafts) > kind.num_speculative_blocks
        if (entry.drafts or entry.rid in self.drafted) and unmodelled:
            # drafts without a speculative block each (the kit draws them, vLLM never runs them on a Mamba
            # group): a rejected draft leaves a state past the accepted tokens; nothing is checked
            self.drafted.add(entry.rid)
            self.counts["states not checked"] += 1
            for b, _ in self._state_blocks(kind, table, entry.start, entry.end, step=True):
                self.contents.write(b, g, 0, STALE)
            return
        i = state_read_index(kind, entry.start)
        row = self.worker_rows.get((entry.rid, g, entry.table)) if spec else None
        if i is not None and row is not None:
            i = row[0] + row[1]  # the worker's running block, and the accepted tokens' offset past it
        if i is not None:
            # a recomputation after a failed load may start from an entry its admission skipped (_entry names it)
            reads = f"{where} reads the state at {entry.start} tokens (group {g})"
            b = self._entry(table, i, reads, (entry.rid, g), entry)
            self._loading(b, f"{where} reads its state at {entry.start} tokens in it")
            what = f"{where} reads block {b} (group {g}) for the state at {entry.start} tokens"
            self._compare_state(b, g, want[entry.start - 1], what, entry.start)
        writes, checkpoint = self._step_state_writes(kind, entry)
        if not (spec and entry.drafts):
            first = (entry.end - 1) // kind.block_size
            for b in table[first + 1 : first + 1 + kind.num_speculative_blocks] if kind.mode == "align" else ():
                if b:
                    self.scratch[b] = (g, entry.rid, entry.end, self.contents.writes)
        optional = [checkpoint] if checkpoint and checkpoint[0] < len(table) and table[checkpoint[0]] else []
        self.counts["checkpoint states written"] += len(optional)
        writes = [*optional, *writes]
        for i, n in writes:
            if spec and i < len(table) and not table[i] and self._rolled_back_below(entry, kind, i):
                raise SafetyViolation(
                    "content",
                    f"{where} writes the state at {n} tokens (group {g}): the table holds the null block there "
                    f"(an allocation dropped that entry while it counted the request's drafts computed, up to "
                    f"{self.furthest[entry.rid]} tokens; the drafts were rejected and the request runs below)",
                    defect=MAMBA_REJECTED_NULL,
                )
            b = self._entry(table, i, f"{where} writes the state at {n} tokens (group {g})", (entry.rid, g), entry)
            self._loading(b, f"{where} writes its state at {n} tokens into it")
            self.contents.write(b, g, 0, want[n - 1])
            self.writers.setdefault(want[n - 1], f"request {entry.rid} at position {n - 1}")
        for i, n in optional:
            if n != (i + 1) * kind.block_size:  # a checkpoint below its block's end, as written just now
                self.checkpoints[table[i]] = (g, entry.rid, n, (i + 1) * kind.block_size, self.contents.writes)
        self._stale(kind, g, table, entry.start, entry.end, entry.rid)
        if spec:
            self._accepted(entry, g, table, where)

    def _rolled_back_below(self, entry: StepEntry, kind: Mamba, index: int) -> bool:
        """Whether table entry ``index`` lies below the running entry of the furthest step the
        request was allocated for, after drafts of it were rejected (a request that never rolled
        back never writes below its furthest running entry)."""
        furthest = self.furthest.get(entry.rid, 0)
        return entry.rid in self.rolled_back and self._current(entry) and index < (furthest - 1) // kind.block_size

    def _accepted(self, entry: StepEntry, g: int, table: Sequence[int], where: str) -> None:
        """The worker's step end in an ``align`` group with speculative blocks:
        the state at the last block boundary the accepted tokens reach is copied
        into the block ending there, and the next step of the request reads from
        the running block on (:func:`kvref.content_states.accepted_copy`)."""
        kind, drafts = self._mamba(g), len(entry.drafts)
        accepted = drafts - self.rejected.get(entry.rid, 0)
        copy, reset = accepted_copy(kind, entry.end, drafts, accepted)
        if copy is not None and copy[1] < len(table) and table[copy[1]]:
            # (a copy into the null block, where the manager kept no block for that boundary, is dropped)
            what = f"{where}: the worker copies the state at a block boundary (group {g})"
            source = self._entry(table, copy[0], f"{what} from entry {copy[0]}", (entry.rid, g), entry)
            self._loading(table[copy[1]], f"{what} into it")
            self.contents.write(table[copy[1]], g, 0, self.contents.value(source, g, 0))
            self.counts["accepted states copied"] += 1
        self.worker_rows[entry.rid, g, entry.table] = ((entry.end - 1) // kind.block_size, 0 if reset else accepted)

    def _compare_state(self, b: int, g: int, want: int, what: str, length: int) -> None:
        """Compare the state ``b`` holds with ``want``, the state at ``length``
        tokens; a block left behind a boundary is not checked."""
        if self.contents.value(b, g, 0) == STALE:
            self.counts["states not checked"] += 1
            return
        defect, detail = self._attributed(b, g, length)
        self._compare(b, g, 0, want, what, of="state", defect=defect, detail=detail)
