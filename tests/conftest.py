"""The one ``target`` fixture of the test suite.

Tests that take ``target`` run once per adapter: ``KVREF_TARGETS``
(comma-separated; default ``spec,impl,vllm``) plus the adapter given to the
kvref pytest plugin with ``--kvref-target``. ``vllm`` is skipped when no
supported vLLM is installed.
"""

from __future__ import annotations

import os

import pytest

from kvref.adapters.vllm_adapter import vllm_available

TARGETS = [t for t in os.environ.get("KVREF_TARGETS", "spec,impl,vllm").split(",") if t]


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
    """One adapter target (see the module docstring)."""
    name = str(request.param)
    if name == "vllm" and not vllm_available():
        pytest.skip("vLLM is not installed (bash ci/setup.sh --with-vllm)")
    return name
