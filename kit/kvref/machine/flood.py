"""Directed: a burst fills the pool and ends, then a conversation goes on.

The situation of vLLM#33775 (see :meth:`FloodRules.flood`), which random
search rarely lines up.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

from kvref.hypothesis_compat import integer
from kvref.machine.base import Action
from kvref.machine.configuration import VOCAB, draw_tokens
from kvref.machine.running import RunningRules
from kvref.machine.scripted import ScriptedMoves
from kvspec.config import FULL_TYPE_KINDS

Json = Any
ACTIONS: tuple[Action, ...] = (("flood", lambda m: bool(m.running) and m.cfg.enable_caching and not m.cross),)
"""The family's actions and when each is ready (their place in the step table: :data:`kvref.stateful.ORDER`)."""


class FloodRules(ScriptedMoves, RunningRules):
    """The flood and the admissions it scripts."""

    def flood(self, data: st.DataObject) -> None:
        """Directed: a burst fills the pool and ends, then one request's
        conversation goes on. The running request that computed the most is
        prefilled to a block boundary of every group; up to three fresh
        requests, each as long as the free blocks allow, are admitted and
        prefilled whole, so no never-used block is left; every running
        request finishes in the same step, the chosen one first
        (:meth:`drain`), so its blocks lead the free queue; in the next step
        a request that continues it (its tokens and a few more) is admitted
        with its prefix hit and connector tokens (:meth:`_admit_continued`).

        NOTE: directed because random search rarely lines up the situation
        of vLLM#33775 (0.16.0 touched each group's prefix hits just before
        that group allocated, so with connector tokens an earlier group could
        take a later group's still-free hit block): it needs a pool with no
        never-used block left, the continued request's blocks at the head of
        the queue, an admission with both a hit and connector tokens, and a
        later full-attention-type group whose hit stays in the table after
        the connector load (skipped Mamba states and out-of-window blocks
        hide it). The machine met all of them about once in 50,000 steps;
        with only the burst's end scripted, one seed in five still missed it
        in 160,000 steps. So the flood fires every time in runs with two
        full-attention-type groups and connector tokens, one pick in four
        elsewhere."""
        assert self.lock is not None
        fulls = sum(isinstance(k, FULL_TYPE_KINDS) for k in self.cfg.groups)
        shows = fulls >= 2 and self._allowed("external") and self._on("connector")
        if integer(data, 0, 3) and not shows:
            return  # three picks in four do nothing: a flood ends every running request
        chosen = max(self.running, key=lambda r: self.reqs[r].computed)  # the first that computed the most
        unit = math.lcm(*(k.block_size for k in self.cfg.manager_groups()))
        goal = (self.reqs[chosen].computed + unit - 1) // unit * unit
        if self.reqs[chosen].computed < goal < self._num_tokens(chosen):
            self._prefill(data, chosen, goal)  # its tables end on a block boundary of every group
        if chosen not in self.running:
            return
        state = self._sched.reqs[chosen]
        tokens, extra, reusable = self._sched.tokens(chosen), state.extra, state.reusable
        for token in (VOCAB - 1, VOCAB - 2, VOCAB - 3):  # fresh requests, each prefilled whole, while blocks are left
            free = len(self.lock.adapters[0].to_view().free_queue)
            fits = [n for n in range(1, self._prompt_limit() + 1)
                    if sum(-(-n // k.block_size) for k in self.cfg.manager_groups()) <= free]  # fmt: skip
            if not fits:
                break
            rid = self._add({"prompt": [token] * fits[-1]}, False)
            if not self._admit_step(rid) or not self._prefill(data, rid, fits[-1]):
                break
        self.drain(data, first=chosen)
        if not reusable:
            return  # multimodal or embedded prompts are not continued (see add_request)
        bs = self.cfg.manager_groups()[0].block_size
        more = draw_tokens(data, 1, 2 * self.cfg.scheduler_block_size)
        more += [0] * max(0, 2 * bs + 2 - len(more))  # room for connector tokens past the hit
        turn: Json = {"prompt": (tokens + more)[: self._prompt_limit()]}
        if extra is not None:
            turn["extra"] = extra
        self._call({"op": "new_step_starts"})  # the next turn comes later: a Mamba state cached now is usable
        self._admit_continued(data, self._add(turn, True))

    def _admit_continued(self, data: st.DataObject, rid: str) -> bool:
        """Admit waiting ``rid`` with its prefix hit and, where this run sends
        them, connector tokens: as many as make the first group's allocation
        for them reach the first free-queue block of a later group's hit that
        stays in the table (a full-attention-type group), where the request
        has tokens enough, else a drawn number; whether it runs."""
        assert self.lock is not None
        found = self._lookup(rid)
        total = self._num_tokens(rid)
        hit = found["num_tokens"] if found is not None else total
        if total - hit < 1:
            return False
        external = 0
        if found is not None and hit and total - hit > 1 and self._allowed("external") and self._on("connector"):
            external = integer(data, 1, total - hit - 1)
            blocks, kinds = found["blocks"], self.cfg.manager_groups()
            own = set(blocks[0])
            later = {b for g in range(1, len(blocks)) if isinstance(kinds[g], FULL_TYPE_KINDS) for b in blocks[g] if b}
            queue = [b for b in self.lock.adapters[0].to_view().free_queue if b not in own]
            before = next((k for k, b in enumerate(queue) if b in later), None)
            if before is not None:
                reach = (len(blocks[0]) + before) * kinds[0].block_size + 1
                if hit < reach < total:
                    external = reach - hit
        new = self._sched.chunk(rid, hit + external, total - hit - external, True)
        return self._first_allocation(rid, found, hit, external, new)

    def _admit_step(self, rid: str) -> bool:
        """Admit waiting ``rid`` with its prefix hit and one token (below any
        watermark; its later steps are not held to it), or its whole prompt
        where the adapters admit whole prompts only; whether it runs."""
        found = self._lookup(rid)
        hit = found["num_tokens"] if found is not None else self._num_tokens(rid)
        if self._num_tokens(rid) - hit < 1:
            return False
        new = self._num_tokens(rid) - hit if self._sched.whole_prefill else 1
        return self._first_allocation(rid, found, hit, 0, new)
