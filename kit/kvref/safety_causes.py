"""Which registered vLLM safety defect explains a wrong slot, and the table entries a step uses.

:class:`MonitorCauses` (a layer of :class:`kvref.safety.SafetyMonitor`)
compares slots, reads table entries, and names the defect of
:mod:`kvref.safety_defects` a violation comes from by its rule: a block freed
early under a step in flight, a failed connector load's skipped entries or
unfilled states, a Mamba chunk that started inside a block, a step taken back
out of its scheduling pass.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvref.content import describe, read_span
from kvref.content_states import stale_index, state_read_index, state_writes
from kvref.safety_base import COMPARED, MonitorState, SafetyViolation, StepEntry, Tables, Withdrawal
from kvref.safety_defects import (
    CHECKPOINT_REKEYED,
    CHECKPOINT_SCRATCH,
    EARLY_FREE,
    FAILED_LOAD_WINDOW,
    MAMBA_ALIGN_MIDBLOCK,
    MAMBA_FAILED_LOAD,
    SWA_EAGLE_WINDOW_LOST,
    WITHDRAWN_STEP,
)
from kvspec.config import Mamba


class MonitorCauses(MonitorState):
    """The slot comparison, the entries a step uses and the defects' rules."""

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
                checkpoint = self._checkpoint(kind, entry.start, entry.end)
                used += [checkpoint[0]] if checkpoint else []
                for i in used:
                    if i < min(len(prev[g]), len(tables[g])) and prev[g][i] and not tables[g][i]:
                        self.early[(rid, g, i)] = (prev[g][i], self.open.number)

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
            windowless = None if at is None else self.windowless.get((*at, index))
            if windowless is not None:
                raise SafetyViolation(
                    "content",
                    f"{what}: the table holds the null block there, which the request's hit of {windowless} tokens "
                    "returned inside the window of its end",
                    defect=SWA_EAGLE_WINDOW_LOST,
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
        mark = Withdrawal(entry.rid, entry.start, entry.end, self.contents.writes, after, entry if after else None)
        if after:
            self.withdrawals.append(mark)
        for g in self.checked:
            bs, table = self.contents.block_size(g), entry.tables[g]
            for p in range(entry.start, entry.end):
                if p // bs < len(table) and table[p // bs]:
                    self.withdrawn[table[p // bs]] = mark
        for g in self.mamba:
            for b, _ in self._state_blocks(self._mamba(g), entry.tables[g], entry.start, entry.end, step=True):
                self.withdrawn[b] = mark
        if not after:
            self._left_behind(entry)

    def _left_behind(self, entry: StepEntry) -> None:
        """A chunk that starts inside a Mamba block leaves it behind whether or not it runs: its
        allocation caches the block as the state at its end all the same (:meth:`_stale`, once the
        steps before it have written the block)."""
        for g in self.mamba:
            self._stale(self._mamba(g), g, entry.tables[g], entry.start, entry.end, entry.rid)

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

    def _attributed(self, b: int, g: int, length: int) -> tuple[str | None, str]:
        """The registered defect a wrong state in the Mamba block ``b`` comes
        from, by its rule, and the words that say why: a failed load was to
        fill it (:attr:`failed_states`), or a chunk that started inside it
        left it behind (:attr:`behind`), or it was a speculative block of a
        step without draft tokens (:attr:`scratch`), or a prefill checkpoint
        wrote a state at a position below its end into it and it is served as
        the state at its end, ``length`` (:attr:`checkpoints`), and since then
        nothing wrote it (zeroing aside) and nothing handed it out anew. A block
        a withdrawn step was to write names that defect first
        (:meth:`_withdrawn_cause`): the step would have written it."""
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
        withdrawn = self._withdrawn_cause(b, g, 0)  # a step that would have written it was taken back out
        if withdrawn[0] is not None:
            return withdrawn
        mark = self.checkpoints.get(b)
        if mark is not None and mark[0] == g and mark[3] == length and self._untouched(b, mark[4]):
            _, rid, position, _, _ = mark
            return CHECKPOINT_REKEYED, (
                f" (request {rid}'s prefill checkpoint wrote the state at {position} tokens into it, below the "
                f"block's end; nothing wrote the state at {length} tokens since)"
            )
        scratch = self.scratch.get(b)
        if scratch is not None and scratch[0] == g and self._untouched(b, scratch[3]):
            _, rid, end, _ = scratch
            return CHECKPOINT_SCRATCH, (
                f" (a speculative block of request {rid}'s step up to {end} tokens, which had no draft tokens, so "
                "nothing wrote a state into it; the manager cached it as the state at its end)"
            )
        return None, ""

    def _stale(self, kind: Mamba, g: int, table: Sequence[int], start: int, end: int, rid: str) -> None:
        """The block a step or load of ``[start, end)`` leaves behind a boundary
        (:func:`kvref.content_states.stale_index`): it keeps the state at ``start``,
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
