"""Shipped conformance tests: the lockstep machine as a pytest test case.

``pytest --kvref-target=module:factory`` collects this module (see
:mod:`kvref.pytest_plugin`); the targets chosen on the command line are read
from the plugin at import time. The test case runs under kvref's Hypothesis
settings (``HYPOTHESIS_PROFILE``), set on this test case only.
"""

from __future__ import annotations

from kvref import pytest_plugin
from kvref.adapters import load_factory
from kvref.settings import profile_settings
from kvref.stateful import MachineSetup, default_failure_dir, make_lockstep_machine
from kvspec.profiles import NEWEST, profile_named

_semantics = pytest_plugin.CHOSEN["semantics"]
_setup = MachineSetup(
    [load_factory(pytest_plugin.CHOSEN["against"]), load_factory(pytest_plugin.CHOSEN["target"])],
    failure_dir=default_failure_dir(),
    profile=profile_named(_semantics) if _semantics else NEWEST,
)

TestKvrefConformance = make_lockstep_machine(_setup).TestCase
TestKvrefConformance.settings = profile_settings()
