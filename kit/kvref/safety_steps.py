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
from kvref.content_states import state_read_index, state_writes
from kvref.safety_base import Step, StepEntry
from kvref.safety_loads import LoadChecks
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
            for b, n in self._state_blocks(kind, table, entry.start, entry.end, step=True):
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
            for b, _ in self._state_blocks(kind, table, entry.start, entry.end, step=True):
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
        checkpoint = self._checkpoint(kind, entry.start, entry.end)
        optional = [checkpoint] if checkpoint and checkpoint[0] < len(table) and table[checkpoint[0]] else []
        self.counts["checkpoint states written"] += len(optional)
        for i, n in [*optional, *state_writes(kind, entry.start, entry.end)]:
            b = self._entry(table, i, f"{where} writes the state at {n} tokens (group {g})", (entry.rid, g), entry)
            self._loading(b, f"{where} writes its state at {n} tokens into it")
            self.contents.write(b, g, 0, want[n - 1])
            self.writers.setdefault(want[n - 1], f"request {entry.rid} at position {n - 1}")
        self._stale(kind, g, table, entry.start, entry.end, entry.rid)

    def _compare_state(self, b: int, g: int, want: int, what: str) -> None:
        """Compare the state ``b`` holds; a block left behind a boundary is not checked."""
        if self.contents.value(b, g, 0) == STALE:
            self.counts["states not checked"] += 1
            return
        defect, detail = self._attributed(b, g)
        self._compare(b, g, 0, want, what, of="state", defect=defect, detail=detail)
