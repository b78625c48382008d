"""Batched steps: several running requests scheduled in one ``allocate_slots_batch``.

A scheduler on kvimpl schedules a step's running requests in one call
(``allocate_slots_batch``): two to eight distinct running requests, each with
its own chunk (a prefill chunk or one decode token) and its own lookahead
count, in one operation. Every adapter runs it: one with a batch method runs
its batch, any other the same ``allocate_slots`` calls one after another
(:func:`kvref.ops.execute`), which is what the batch must equal. A request
that did not fit leads to the preemption of the newest running request, as
in a single step.

The family takes part in runs where an adapter has a batch method (kvimpl's,
either build): runs against kvspec and vLLM alone draw as before.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvref.hypothesis_compat import integer
from kvref.machine.base import Action, Family, MachineBase
from kvref.machine.running import RunningRules

ACTIONS: tuple[Action, ...] = (("schedule_batch", lambda m: len(m.running) >= 2),) * 2
"""The family's one action (listed twice: a scheduler on kvimpl steps its running requests this way) and
when it is ready."""


def _takes_part(m: MachineBase) -> bool:
    lock = m.lock
    return lock is not None and any(callable(getattr(a, "allocate_slots_batch", None)) for a in lock.adapters)


FAMILY = Family("batched", ACTIONS, _takes_part)
"""Joins the runs where an adapter has a batch method."""


class BatchedRules(RunningRules):
    """One step of several running requests."""

    def schedule_batch(self, data: st.DataObject) -> None:
        """Two to eight running requests (all of them, where there are no
        more), in a drawn order, each with its own chunk and lookahead, in one
        batch; on a failure the newest running request is preempted."""
        running = list(self.running)
        n = integer(data, 2, min(8, len(running)))
        chosen: list[str] = []
        while len(chosen) < n:
            rid = running[integer(data, 0, len(running) - 1)]
            if rid not in chosen:
                chosen.append(rid)
        items = []
        for rid in chosen:
            st_ = self.reqs[rid]
            if st_.computed >= self._num_tokens(rid):
                continue  # nothing left to compute: it takes no part in the step
            items.append((rid, self._chunk(data, st_, st_.computed), self._lookahead(data)))
        if not items:
            return
        fits = self._sched.advance_batch(items)
        for (rid, _, _), fit in zip(items, fits, strict=True):
            after = self.reqs.get(rid)
            if fit and after is not None and after.computed == self._num_tokens(rid) < self.cfg.max_model_len:
                self._sample_token(data, rid)
        if not all(fits) and self.running:
            self._preempt(self.running[-1], data)
