"""Thin entry point: kvimpl in lockstep with the spec (kvref.stateful).

Every rule runs on both, compares outputs and views exactly, checks both
sides' invariants and that rejected operations change nothing.
"""

from __future__ import annotations

from kvref.adapters import load_factory
from kvref.stateful import MachineSetup, default_failure_dir, make_lockstep_machine

TestImplVsSpec = make_lockstep_machine(
    MachineSetup([load_factory("spec"), load_factory("impl")], failure_dir=default_failure_dir())
).TestCase
