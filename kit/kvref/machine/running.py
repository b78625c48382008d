"""Running requests: their steps, finishes, preemptions and deferred frees.

``schedule_running`` advances a running request (a prefill chunk or one
decode token) and preempts the newest on allocation failure; ``finish`` ends
or aborts a request (``free``, or ``pop_blocks_for_free`` and a later
``deferred_free``) or preempts it for a more urgent one; ``drain`` ends every
running request in one step; ``new_step`` starts a scheduler step, with what
may follow it (events, statistics, usage, lost blocks, a prefix cache reset).

NOTE: the popped lists and their deferred free model vLLM's async
scheduling in its simplest form; the async pipeline (steps in flight, the
fence of their frees) is a family of its own
(:class:`kvref.machine.base.Family`), not more switches here.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import strategies as st

from kvref.hypothesis_compat import boolean, choose, integer
from kvref.machine.base import Action
from kvref.machine.speculative import SpeculativeRules

ACTIONS: tuple[Action, ...] = (
    ("schedule_running", lambda m: bool(m.running)),
    ("finish", lambda m: bool(m.reqs)),
    ("new_step", lambda m: True),
    ("drain", lambda m: len(m.running) >= 2),
    ("deferred_free", lambda m: bool(m.pending)),
)
"""The family's actions and when each is ready (their place in the step table: :data:`kvref.stateful.ORDER`)."""
STEP_EXTRAS = (
    "",
    "take_events",
    "take_new_block_ids",
    "make_prefix_cache_stats",
    "usage",
    "evict_blocks",
    "reset_prefix_cache",
)
"""What may follow ``new_step_starts`` in the ``new_step`` rule ("" = nothing)."""


class RunningRules(SpeculativeRules):
    """Steps of running requests, and how requests leave."""

    def schedule_running(self, data: st.DataObject) -> None:
        """Advance a running request (prefill chunk or one decode token);
        on failure preempt the newest running request."""
        rid = choose(data, tuple(self.running))
        st_ = self.reqs[rid]
        total = self._num_tokens(rid)
        if st_.computed >= total:
            self._finish(rid, data)
            return
        new = self._chunk(data, st_, st_.computed)
        look = self._lookahead(data)
        if not self._sched.advance(rid, new, look):
            self._preempt(self.running[-1], data)
            return
        if st_.computed == total and total < self.cfg.max_model_len:
            self._sample_token(data, rid)

    def finish(self, data: st.DataObject) -> None:
        """A request finishes or is aborted (``free`` or deferred free), or a
        running one is preempted for a more urgent request (priority
        scheduling): it waits again and is re-admitted through a prefix lookup."""
        rid = choose(data, tuple(sorted(self.reqs)))
        preempt = rid in self.running and choose(data, ("finish", "finish", "preempt")) == "preempt"
        if preempt and self._on("priority_preempt"):
            self._preempt(rid, data)
            return
        if rid in self.running and boolean(data) and self._on("remove_skipped"):
            self._call({"op": "remove_skipped_blocks", "rid": rid, "total_computed_tokens": self.reqs[rid].computed})
        self._finish(rid, data)

    def drain(self, data: st.DataObject, first: str | None = None) -> None:
        """Every running request finishes in the same step, ``first`` (when
        given) and then the others oldest first (the end of a burst): their
        blocks go back to the free queue in that order, so a later request
        that continues the first one (the next turn of a chat) finds its hits
        at the head of the queue, first in line for eviction by any fresh
        allocation."""
        for rid in sorted(self.running, key=lambda r: r != first):
            st_ = self._sched.forget(rid)
            if st_.reusable:
                self._remember(self._sched.tokens(rid), st_.extra)
            self._sched.release(rid, pop=self._pop(False))

    def deferred_free(self, data: st.DataObject) -> None:
        """The scheduler frees popped blocks later, reversed."""
        assert self.lock is not None
        self._sched.deferred_free(integer(data, 0, len(self.pending) - 1))
        self.lock.pending = len(self.pending)

    def new_step(self, data: st.DataObject) -> None:
        """A scheduler step begins; the scheduler may then drain events or
        fresh block ids or read statistics or usage, a KV connector may report
        blocks whose contents were lost, or the prefix cache may be reset
        (which fails while blocks are in use). Always ready (the step a run
        takes when its action swarm leaves nothing else ready).

        NOTE: these were four actions. As one action they leave
        more of a run to the scheduling actions, and cache loss (eviction,
        reset) no longer wipes out most prefix hits before they happen.
        """
        which = choose(data, STEP_EXTRAS)
        if self.cfg.profile.partial_hash_hits and not self._sched.copies:
            # The end of the previous step's scheduling: from vLLM 0.29.0 the scheduler drains the
            # copy-on-write copies every step, on every model (configurations with copies hand
            # them off after each allocation already: kvref.scheduler.Scheduler.hand_off_copies).
            self._call({"op": "take_kv_cache_block_copies"})
        drained = self.zeroes and self._allowed("op:take_new_block_ids")
        if drained:
            # The end of the previous step's scheduling: a scheduler whose model zeroes fresh
            # blocks (one with a Mamba group) drains the zeroing list every step (vLLM 0.24.0 on,
            # vllm/v1/core/sched/scheduler.py), so the list a step zeroes is that step's own.
            self._call({"op": "take_new_block_ids"})
        self._call({"op": "new_step_starts"})
        if which in ("evict_blocks", "reset_prefix_cache") and not self._on("cache_loss"):
            return
        if which == "evict_blocks":
            ids = [integer(data, 0, self.cfg.num_blocks - 1) for _ in range(integer(data, 0, 3))]
            multi = self._multi_key_blocks()
            if multi and boolean(data):
                ids = [choose(data, multi)]  # a block with secondary keys: every key leaves with it
            self._call({"op": "evict_blocks", "block_ids": ids})
        elif which and not (drained and which == "take_new_block_ids"):  # drained above: nothing new since
            self._call({"op": which})

    def _multi_key_blocks(self) -> tuple[int, ...]:
        """Blocks the reference caches under more than one key (a full block that
        also keeps a partial-tail or Mamba-tail key, vLLM 0.26.0 on)."""
        assert self.lock is not None
        keys = Counter(b for _, ids in self.lock.adapters[0].to_view().cached for b in ids)
        return tuple(sorted(b for b, n in keys.items() if n > 1))

    def _finish(self, rid: str, data: st.DataObject) -> None:
        st_ = self._sched.forget(rid)
        if st_.reusable:
            self._remember(self._sched.tokens(rid), st_.extra)
        self._release(rid, not boolean(data), data)

    def _release(self, rid: str, pop: bool, data: st.DataObject) -> None:
        """Free ``rid``'s blocks now, or pop them and free them later (async
        scheduling).

        NOTE: the next step is scheduled before the deferred free, so cascade
        attention may ask for a running request's common prefix while the
        popped blocks still hold their references; half the time it does so
        here.
        """
        pop = self._pop(pop)
        popped = self._sched.release(rid, pop)
        if pop:
            self._after_pop(rid, popped, data)

    def _after_pop(self, rid: str, popped: list[int] | None, data: st.DataObject) -> None:
        assert self.lock is not None
        self.lock.pending = len(self.pending)
        others = [r for r in self.running if r != rid]
        if popped and others and boolean(data):
            self._call({"op": "get_num_common_prefix_blocks", "rid": choose(data, tuple(others))})

    def _preempt(self, rid: str, data: st.DataObject) -> None:
        pop = self._pop(not boolean(data))
        popped = self._sched.preempt(rid, pop)
        if pop:
            self._after_pop(rid, popped, data)
