"""Scripted scheduling moves for the directed situations.

The directed families (:mod:`kvref.machine.flood`, :mod:`kvref.machine.tails`,
:mod:`kvref.machine.past_slots`) line up a situation step by step instead of
leaving it to the random actions: they add a request with a given prompt,
admit it at once with its prefix hit, and prefill it to a chosen token count.
These moves go through the scheduler model like every other step.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kvref.hypothesis_compat import integer
from kvref.machine.base import MachineBase

Json = Any


class ScriptedMoves(MachineBase):
    """Add, admit at once and prefill, as a directed situation needs."""

    def _add(self, fields: Json, reusable: bool) -> str:
        """Add a waiting request with ``fields`` (its prompt, maybe extra keys); its id."""
        self.counter += 1
        rid = f"r{self.counter}"
        self._sched.add({"op": "add_request", "rid": rid, **fields}, 0, reusable)
        if reusable:
            self._remember(fields["prompt"], fields.get("extra"))
        return rid

    def _admit_whole(self, data: st.DataObject, fields: Json, reusable: bool, connector: bool) -> str | None:
        """Add a request and admit it at once: its prefix lookup, then one
        allocation of its hit and a chunk of the rest (with ``connector``,
        part of the rest loaded through the connector instead); its id if it
        was admitted."""
        rid = self._add(fields, reusable)
        return rid if self._admit_now(data, rid, connector) else None

    def _admit_now(self, data: st.DataObject, rid: str, connector: bool, upto: int | None = None) -> bool:
        """Admit waiting ``rid`` at once: its prefix lookup, then one allocation
        of its hit and a chunk of the rest (with ``connector``, part of the
        rest loaded through the connector instead; with ``upto``, a chunk
        that ends there at most); whether it runs."""
        found = self._lookup(rid)
        total = self._num_tokens(rid) if upto is None else min(upto, self._num_tokens(rid))
        hit = found["num_tokens"] if found is not None else total
        if total - hit < 1:
            return False
        external = integer(data, 1, total - hit - 1) if connector and hit and total - hit > 1 else 0
        if not (self._allowed("external") and self._on("connector")):
            external = 0
        new = self._sched.chunk(rid, hit + external, total - hit - external, True)
        return self._first_allocation(rid, found, hit, external, new)

    def _first_allocation(self, rid: str, found: Json | None, hit: int, external: int, new: int) -> bool:
        """The admission's ``allocate_slots``: the lookup's hit ``found`` of
        ``hit`` tokens, ``external`` connector tokens and ``new`` tokens to
        compute; whether the request runs."""
        if self._sched.whole_prefill:  # an engine without chunked prefill computes the rest at once
            new = self._num_tokens(rid) - hit - external
        op: Json = {"op": "allocate_slots", "rid": rid, "num_new_computed_tokens": hit,
                    "num_external_computed_tokens": external, "num_new_tokens": new}  # fmt: skip
        if found is not None and any(found["blocks"]):
            op["new_computed_blocks"] = found["blocks"]
        return self._sched.admit(op, hit, external)

    def _prefill(self, data: st.DataObject, rid: str, goal: int, tokens: list[int] | None = None) -> bool:
        """Advance running ``rid`` chunk by chunk until ``goal`` tokens are
        computed (sampling where its tokens end: a drawn token, or with
        ``tokens`` the one at that position, then 0); False if a step did not fit."""
        while rid in self.running and self.reqs[rid].computed < goal:
            state = self.reqs[rid]
            n = self._num_tokens(rid)
            if state.computed >= n:
                if tokens is None:
                    self._sample_token(data, rid)
                else:
                    self._sched.sample(rid, tokens[n] if n < len(tokens) else 0)
            if not self._sched.advance(rid, self._sched.chunk(rid, state.computed, goal - state.computed)):
                return False
        return rid in self.running
