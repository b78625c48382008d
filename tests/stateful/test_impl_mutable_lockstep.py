"""Thin entry point: kvimpl driven with its own mutable requests, in lockstep with the spec.

The adapter keeps one kvimpl request per request id and advances it in place
as a scheduler would, alternating the pure-Python and the C request class,
and checks its incrementally extended block hashes against kvspec's
(:mod:`kvref.adapters.impl_mutable`).
"""

from __future__ import annotations

from kvref.adapters import load_factory
from kvref.stateful import MachineSetup, default_failure_dir, make_lockstep_machine

TestImplMutableVsSpec = make_lockstep_machine(
    MachineSetup([load_factory("spec"), load_factory("impl-mutable")], failure_dir=default_failure_dir())
).TestCase
