"""Thin entry points over the shipped lockstep machine (kvref.stateful).

* ``TestSpecInvariants``: the spec alone; every rule checks the invariants
  and that rejected operations change nothing.
* ``TestSpecVsVllm``: the spec in lockstep with the real vLLM 0.25.1 core
  (skipped when vLLM is not installed).
"""

from __future__ import annotations

import pytest

from kvref.adapters import load_factory
from kvref.adapters.vllm_adapter import vllm_available
from kvref.stateful import MachineSetup, default_failure_dir, make_lockstep_machine

TestSpecInvariants = make_lockstep_machine(
    MachineSetup([load_factory("spec")], failure_dir=default_failure_dir())
).TestCase

TestSpecVsVllm = pytest.mark.skipif(not vllm_available(), reason="vLLM 0.25.1 is not installed")(
    make_lockstep_machine(
        MachineSetup([load_factory("vllm"), load_factory("spec")], failure_dir=default_failure_dir())
    ).TestCase
)
