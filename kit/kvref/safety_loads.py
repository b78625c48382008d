"""Connector loads and zeroing under the in-flight oracle.

:class:`LoadChecks` (a layer of :class:`kvref.safety.SafetyMonitor`): a load
is issued when its step is dispatched and lands when it ends; until then no
step in flight may use its destinations, no other load may fill them and they
may not be zeroed. A load that fails part-way leaves marks the defects' rules
read (:mod:`kvref.safety_causes`).
"""

from __future__ import annotations

from collections.abc import Iterable

from kvref.content import GARBAGE, read_span
from kvref.content_states import stale_index
from kvref.safety_base import Load, SafetyViolation
from kvref.safety_causes import MonitorCauses
from kvref.safety_defects import (
    EARLY_FREE,
    LOAD_ZEROING,
    UNFENCED_FREE,
)


class LoadChecks(MonitorCauses):
    """Connector loads (issue, land, failure) and the zeroing of listed blocks."""

    def _issue(self, load: Load) -> None:
        """A connector load starts: its destinations (whole blocks: a transfer
        writes whole blocks) must be free of steps in flight and of other loads."""
        for g in self.checked:
            bs, table = self.contents.block_size(g), load.tables[g]
            read = read_span(self.kinds[g], load.end, load.end)
            for p in range(load.start_of(g), load.end):
                if p // bs < len(table) and table[p // bs]:
                    load.blocks[table[p // bs]] = g
                    if p >= read.start:
                        load.read.add(table[p // bs])
        for g in self.mamba:
            for b, _ in self._state_blocks(self._mamba(g), load.tables[g], load.start_of(g), load.end):
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
                        defect=EARLY_FREE if b in early else UNFENCED_FREE if b in self.unfenced else None,
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
            for p in range(load.start_of(g), min(end, len(table) * bs)):
                if table[p // bs]:
                    self.contents.write(table[p // bs], g, p % bs, want[p])
                    self.writers.setdefault(want[p], f"request {load.rid} at position {p} (connector)")
        for g in self.mamba:  # the load fills the states that computing its positions writes
            for b, n in self._state_blocks(self._mamba(g), load.tables[g], load.start_of(g), end):
                self.contents.write(b, g, 0, want[n - 1])
                self.writers.setdefault(want[n - 1], f"request {load.rid} at position {n - 1} (connector)")
            self._stale(self._mamba(g), g, load.tables[g], load.start_of(g), end, load.rid)

    def _failed(self, load: Load, valid: int) -> None:
        """``load`` failed past ``valid`` tokens: remember the request's null entries then."""
        tables = self.last_tables.get(load.rid)
        if tables is None or valid >= load.end:
            return
        for g in self.mamba:  # the states past the valid prefix were never filled: what the failure left
            for b, n in self._state_blocks(self._mamba(g), load.tables[g], load.start_of(g), load.end):
                if n > valid:
                    self.contents.write(b, g, 0, GARBAGE)
                    self.failed_states[b] = (load.rid, valid, self.contents.writes)
        for g in (*self.checked, *self.mamba):
            for i, b in enumerate(tables[g]):
                if b == 0:
                    self.failed_skips.setdefault(load.rid, {})[(g, i)] = (load.end, valid)

    def _load_done(self, rid: str, upto: int | None = None) -> None:
        self._land(self.loads.pop(rid), upto)

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
                    out.update(b for b, _ in self._state_blocks(kind, table, entry.start, entry.end, step=True))
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
