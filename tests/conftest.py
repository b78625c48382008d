"""The one ``target`` fixture of the test suite.

Tests that take ``target`` run once per adapter: ``KVREF_TARGETS``
(comma-separated; default ``spec,impl,vllm``) plus the adapter given to the
kvref pytest plugin with ``--kvref-target``. ``vllm`` is skipped when no
supported vLLM is installed.
"""

from __future__ import annotations

import os

import pytest

from kvref.adapters.vllm import installed_vllm_version, vllm_available
from kvref.settings import load_profile

TARGETS = [t for t in os.environ.get("KVREF_TARGETS", "spec,impl,vllm").split(",") if t]


def pytest_configure(config: pytest.Config) -> None:
    """This project's tests run under kvref's Hypothesis profile
    (``HYPOTHESIS_PROFILE``, default ``dev``; the shipped kit reads only ``KVREF_PROFILE``)."""
    load_profile(os.environ.get("HYPOTHESIS_PROFILE") or None)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``target`` with the default targets and ``--kvref-target``."""
    if "target" not in metafunc.fixturenames:
        return
    targets = list(TARGETS)
    extra = metafunc.config.getoption("--kvref-target", default=None)
    if extra and extra not in targets:
        targets.append(extra)
    metafunc.parametrize("target", targets, indirect=True)


@pytest.fixture
def target(request: pytest.FixtureRequest) -> str:
    """One adapter target (see the module docstring). A test marked
    ``semantics(profile)`` runs on real vLLM only when that release is installed."""
    name = str(request.param)
    if name == "vllm":
        if not vllm_available():
            pytest.skip("vLLM is not installed (bash ci/setup.sh --with-vllm)")
        marker = request.node.get_closest_marker("semantics")
        installed = f"vllm-{installed_vllm_version()}"
        if marker is not None and marker.args[0] != installed:
            pytest.skip(f"pins {marker.args[0]}; the installed vLLM is {installed}")
    return name
