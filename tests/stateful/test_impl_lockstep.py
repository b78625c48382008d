"""Thin entry point: kvimpl in lockstep with the spec (kvref.stateful).

Every rule runs on both, compares outputs and views exactly, checks both
sides' invariants and that rejected operations change nothing; under every
semantics profile kvimpl follows.
"""

from __future__ import annotations

from kvref.adapters import load_factory
from kvref.adapters.impl import IMPL_PROFILES
from kvref.stateful import MachineSetup, default_failure_dir, make_lockstep_machine
from kvspec.profiles import PROFILES

TestImplVsSpec = make_lockstep_machine(
    MachineSetup(
        [load_factory("spec"), load_factory("impl")],
        failure_dir=default_failure_dir(),
        profile=PROFILES[sorted(IMPL_PROFILES)[-1]],
    )
).TestCase
