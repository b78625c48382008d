"""Thin entry points over the shipped lockstep machine (kvref.stateful).

* ``TestSpecInvariants``: the spec alone, under the newest profile; every
  rule checks the invariants and that rejected operations change nothing.
* ``TestSpecVsVllm``: the spec in lockstep with the installed real vLLM
  core, under that release's profile (skipped when no vLLM with a profile
  is installed).
"""

from __future__ import annotations

import pytest

from kvref.adapters import load_factory
from kvref.adapters.vllm import installed_vllm_version, vllm_available
from kvref.stateful import MachineSetup, default_failure_dir, make_lockstep_machine
from kvspec.profiles import NEWEST, PROFILES

TestSpecInvariants = make_lockstep_machine(
    MachineSetup([load_factory("spec")], failure_dir=default_failure_dir(), profile=NEWEST)
).TestCase

_INSTALLED = f"vllm-{installed_vllm_version()}" if vllm_available() else None

TestSpecVsVllm = pytest.mark.skipif(_INSTALLED not in PROFILES, reason="no vLLM with a semantics profile is installed")(
    make_lockstep_machine(
        MachineSetup(
            [load_factory("vllm"), load_factory("spec")],
            failure_dir=default_failure_dir(),
            profile=PROFILES.get(_INSTALLED or "", NEWEST),
        )
    ).TestCase
)
