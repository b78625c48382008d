"""Shipped conformance tests: the lockstep machine as a pytest test case.

``pytest --kvref-target=module:factory`` collects this module (see
:mod:`kvref.pytest_plugin`); the targets chosen on the command line are read
from the plugin at import time. Without a target it checks the spec against
itself.
"""

from __future__ import annotations

from kvref import pytest_plugin
from kvref.adapters import load_factory
from kvref.stateful import MachineSetup, default_failure_dir, make_lockstep_machine

_setup = MachineSetup(
    [load_factory(pytest_plugin.CHOSEN["against"]), load_factory(pytest_plugin.CHOSEN["target"])],
    failure_dir=default_failure_dir(),
)

TestKvrefConformance = make_lockstep_machine(_setup).TestCase
