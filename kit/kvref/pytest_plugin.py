"""pytest plugin: Hypothesis profiles and ``--kvref-target``.

* Loads the Hypothesis profile named by ``HYPOTHESIS_PROFILE`` (``dev``,
  ``ci``, ``nightly``, ``crosshair``; default ``dev``).
* ``pytest --kvref-target=module:factory [--kvref-against=spec|vllm]`` also
  collects :mod:`kvref.conformance`, which runs the shipped lockstep machine
  with your adapter against the reference.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvref.settings import load_profile

CHOSEN = {"target": "spec", "against": "spec"}
"""The adapters :mod:`kvref.conformance` runs (set from the command line)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register ``--kvref-target`` and ``--kvref-against``."""
    group = parser.getgroup("kvref")
    group.addoption("--kvref-target", default=None, help="adapter to check: spec, impl, vllm or module:factory")
    group.addoption("--kvref-against", default="spec", help="reference adapter: spec (default) or vllm")


def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    """Add the shipped conformance module when a target is given."""
    if any(a == "--kvref-target" or a.startswith("--kvref-target=") for a in args):
        args.append(str(Path(__file__).with_name("conformance.py")))


def pytest_configure(config: pytest.Config) -> None:
    """Load the Hypothesis profile; remember the chosen adapters."""
    load_profile()
    target = config.getoption("--kvref-target", default=None)
    if target:
        CHOSEN["target"] = target
        CHOSEN["against"] = config.getoption("--kvref-against")
