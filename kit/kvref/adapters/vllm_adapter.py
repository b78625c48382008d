"""Former home of the vLLM adapter; kept so that old imports keep working.

Import from :mod:`kvref.adapters.vllm` instead.
"""

from __future__ import annotations

from kvref.adapters.vllm import (
    REQUIRED_VLLM_VERSION,
    SINKFULL_WORKAROUND,
    Unsupported,
    VllmAdapter,
    VllmUnavailable,
    installed_vllm_version,
    make_vllm_adapter,
    vllm_available,
)

__all__ = [
    "REQUIRED_VLLM_VERSION",
    "SINKFULL_WORKAROUND",
    "Unsupported",
    "VllmAdapter",
    "VllmUnavailable",
    "installed_vllm_version",
    "make_vllm_adapter",
    "vllm_available",
]
