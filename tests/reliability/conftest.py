"""Targets of the reliability tests.

``KVREF_RELIABILITY_TARGETS`` (comma-separated; default ``spec,vllm``) names
the adapters the target-parametrised tests run on; add ``impl`` (or any
``module:factory``) to check another implementation. ``vllm`` is skipped when
vLLM 0.25.1 is not installed.
"""

from __future__ import annotations

import os

import pytest

from kvref.adapters.vllm_adapter import vllm_available

TARGETS = [t for t in os.environ.get("KVREF_RELIABILITY_TARGETS", "spec,impl,vllm").split(",") if t]


@pytest.fixture(params=TARGETS)
def target(request: pytest.FixtureRequest) -> str:
    """One adapter target (see the module docstring)."""
    name = str(request.param)
    if name == "vllm" and not vllm_available():
        pytest.skip("vLLM 0.25.1 is not installed")
    return name
