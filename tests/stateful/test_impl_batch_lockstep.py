"""Thin entry point: kvimpl's batch API and device tables in lockstep with the spec.

The machine's per-request calls reach kvimpl through ``allocate_slots_batch``
and ``free_batch`` in their degenerate and invalid forms too, and the device
tables are checked against the block ids after every change
(:mod:`kvref.adapters.impl_batch`). Needs torch (the tables live in tensors).
"""

from __future__ import annotations

import pytest

from kvref.adapters import load_factory
from kvref.stateful import MachineSetup, default_failure_dir, make_lockstep_machine

pytest.importorskip("torch")

TestImplBatchVsSpec = make_lockstep_machine(
    MachineSetup([load_factory("spec"), load_factory("impl-batch")], failure_dir=default_failure_dir())
).TestCase
