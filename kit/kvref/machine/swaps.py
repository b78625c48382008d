"""Directed: the same blocks of tokens after another prefix (the wrong-prefix trap).

A block's KV depends on every token before it, so a block whose own tokens
equal another's holds other KV when the prefixes differ. An engine that keys
its cache by a block's tokens, or keeps a stale entry for a block reused under
another prefix and checks only the block's tokens, serves KV computed after
the wrong prefix (upstream nano-vllm's block manager does: docs/safety.md).
Random prompts line this up rarely (the twin must reuse the very block the
first request's stale entry names, and a later request must look the first
one up again), so :meth:`SwapRules.prefix_swap` scripts it.

The family takes part in the runs of the safety level
(:attr:`kvref.machine.configuration.MachineSetup.safety`) with prefix caching
on; every other run draws as before.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kvref.hypothesis_compat import boolean, choose
from kvref.machine.base import Family, MachineBase
from kvref.machine.configuration import VOCAB, draw_tokens
from kvref.machine.scripted import ScriptedMoves

Json = Any


class SwapRules(ScriptedMoves):
    """A twin with the first block swapped, run and ended; then the original again."""

    def prefix_swap(self, data: st.DataObject) -> None:
        """Directed: take an earlier request's tokens ``A`` (at least two
        scheduler blocks); a twin ``B``, ``A`` with its first block's tokens
        changed, is admitted, prefilled whole and finished at once (its blocks
        go back to the free queue holding KV computed after B's first block);
        then a request continuing ``A`` (its tokens and a few more) arrives,
        and half the time its lookup and admission follow at once."""
        sched = self.cfg.scheduler_block_size
        pasts = [(t, e) for t, e in self.past if len(t) >= 2 * sched]
        if not pasts:
            return
        tokens, extra = choose(data, pasts)
        head = draw_tokens(data, sched, sched)
        if head == tokens[:sched]:
            head = [(t + 1) % VOCAB for t in head]
        twin = head + tokens[sched:]
        fields: Json = {"prompt": twin[: self._prompt_limit()]}
        if extra is not None:
            fields["extra"] = extra
        rid = self._add(fields, True)
        if self._admit_now(data, rid, connector=False) and self._prefill(data, rid, self._num_tokens(rid)):
            self._finish_now(rid)
        again: Json = {"prompt": (tokens + draw_tokens(data, 1, sched))[: self._prompt_limit()]}
        if extra is not None:
            again["extra"] = extra
        rid = self._add(again, True)
        if boolean(data):
            self._admit_now(data, rid, connector=False)

    def _finish_now(self, rid: str) -> None:
        """``rid`` ends now: its blocks are freed (or popped and freed at once)."""
        self._sched.forget(rid)
        popped = self._sched.release(rid, self._pop(False))
        if popped:
            self._sched.deferred_free(len(self.pending) - 1)


def _takes_part(m: MachineBase) -> bool:
    return m.SETUP.safety and m.cfg.enable_caching and not m.cross


FAMILY = Family("prefix_swap", (("prefix_swap", lambda m: bool(m.past)),), _takes_part)
"""The family, as :class:`kvref.stateful.SchedulerMachine` lists it."""
