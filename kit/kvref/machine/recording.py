"""The end of a run: what is still pending is compared, and the run may become a trace.

NOTE: the place for checks that close a run (safety oracles that look at
the whole history, for example).
"""

from __future__ import annotations

from pathlib import Path

from kvref.capabilities import trace_features
from kvref.lockstep import Lockstep
from kvref.machine.base import MachineBase
from kvref.machine.configuration import MachineSetup
from kvref.traces import Trace


class RecordingRules(MachineBase):
    """Teardown: drain what is pending, record the run."""

    def teardown(self) -> None:
        """Drain and compare what is still pending, then record the run as a
        trace if asked to; adapters are garbage collected."""
        setup, lock = self.SETUP, self.lock
        self._drain()

        if setup.record_dir is not None and lock is not None and not lock.halted and lock.stats.steps:
            self._record(setup, setup.record_dir, lock)
        self.lock = None

    def _drain(self) -> None:
        """Nothing observable is left uncompared: every run ends by taking the
        events, the new block ids and the statistics that are still pending
        (on every side, compared like any other step; the events go through
        the consumer-side check). Not after a divergence: its trace ends where it showed."""
        if not self.live or self.lock is None or self.lock.failed:
            return
        for name in ("take_events", "take_new_block_ids", "make_prefix_cache_stats"):
            if self.live:
                self._call({"op": name})

    def _record(self, setup: MachineSetup, record_dir: Path, lock: Lockstep) -> None:
        """Write the run unless the limit is reached or it is too short, too
        poor in allocations or a duplicate."""
        if lock.stats.unexplained or (setup.record_limit is not None and setup.recorded >= setup.record_limit):
            return  # a failing run (or its shrinks) is never a golden trace
        facade_steps = sum(1 for op in lock.log if "expect" in op)
        allocations = sum(1 for op in lock.log if op["op"] == "allocate_slots" and isinstance(op.get("expect"), list))
        if facade_steps < 3 or allocations < setup.min_allocations:
            return
        log = lock.trace_log()
        meta = {"shape": self.shape, "features": trace_features(self.cfg, log)}
        trace = Trace(self.cfg, log, meta)
        text = trace.dumps()
        if text in setup.recorded_texts:
            return
        setup.recorded_texts.add(text)
        setup.recorded += 1
        trace.write_new(record_dir, self.shape, start=setup.recorded)
