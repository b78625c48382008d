"""pytest plugin: ``--kvref-target`` runs kvref's lockstep machine on your adapter.

Installed with kvref; it changes nothing unless asked. With
``pytest --kvref-target=module:factory [--kvref-against=spec|vllm]
[--kvref-semantics=vllm-0.33.0]`` it also collects :mod:`kvref.conformance`
(the shipped lockstep machine with your adapter against the reference), next
to the tests pytest collects anyway. The machine runs under kvref's own
Hypothesis settings (``HYPOTHESIS_PROFILE``: ``dev``, ``ci``, ``nightly``;
default ``dev``), applied to that test only: your own Hypothesis tests keep
their settings and profile. The ``kvref_target`` fixture names the chosen
target (None without ``--kvref-target``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

CHOSEN = {"target": "spec", "against": "spec", "semantics": ""}
"""The adapters and profile :mod:`kvref.conformance` runs (set from the command line)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register ``--kvref-target``, ``--kvref-against`` and ``--kvref-semantics``."""
    group = parser.getgroup("kvref")
    group.addoption("--kvref-target", default=None, help="adapter to check: spec, impl, vllm or module:factory")
    group.addoption("--kvref-against", default="spec", help="reference adapter: spec (default) or vllm")
    group.addoption(
        "--kvref-semantics", default="", help="semantics profile, e.g. vllm-0.33.0 (default: the newest)"
    )


def pytest_configure(config: pytest.Config) -> None:
    """With ``--kvref-target``: remember the adapters and collect the
    conformance module too (the tests pytest would collect anyway stay)."""
    target = config.getoption("--kvref-target", default=None)
    if not target:
        return
    CHOSEN["target"] = target
    CHOSEN["against"] = config.getoption("--kvref-against")
    CHOSEN["semantics"] = config.getoption("--kvref-semantics")
    config.args.append(str(Path(__file__).with_name("conformance.py")))


@pytest.fixture
def kvref_target(request: pytest.FixtureRequest) -> str | None:
    """The adapter given with ``--kvref-target`` (None without it)."""
    value = request.config.getoption("--kvref-target", default=None)
    return None if value is None else str(value)
