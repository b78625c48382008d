"""Former home of the vLLM adapter; kept so that old imports keep working.

Import from :mod:`kvref.adapters.vllm` instead. Everything here is that
package's, except :func:`vllm_available`, which keeps its former meaning.
"""

from __future__ import annotations

from kvref.adapters.vllm import (
    MODELLED_VLLM_VERSION,
    REQUIRED_VLLM_VERSION,
    SINKFULL_WORKAROUND,
    Unsupported,
    VllmAdapter,
    VllmUnavailable,
    installed_vllm_version,
    loaded_api,
    make_vllm_adapter,
)
from kvref.adapters.vllm import vllm_available as any_vllm_available

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


def vllm_available() -> bool:
    """Whether vLLM 0.25.1, the release kvspec models, can be imported.

    The former meaning, on which the suite's exact-behaviour gates rely; for
    "any release the adapter drives" use :func:`kvref.adapters.vllm.vllm_available`.
    """
    return any_vllm_available() and loaded_api().version == MODELLED_VLLM_VERSION
