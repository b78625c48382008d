"""Adapter around the REAL vLLM ``KVCacheManager`` (releases 0.16.0 to 0.33.x).

The adapter drives unmodified vLLM code (``vllm.v1.core``) and converts its
live objects into the plain values of :mod:`kvspec` (block ids per group,
:class:`kvspec.events` dataclasses, :class:`kvspec.view.KVView`). On vLLM
0.25.1, the release kvspec models, it is the ground truth the specification
and every implementation are checked against.

Layout:

* :mod:`.eras`: every vLLM internal the adapter touches (module paths,
  constructor keywords, private attributes, return shapes, environment
  variables), one class per API era. Supporting another release means adding
  an era there.
* :mod:`.adapter`: :class:`VllmAdapter` (facade, request mirroring,
  caller-error pre-validation, process globals).
* :mod:`.construct`: attention specs, the manager, the SinkFull shim.
* :mod:`.view`: views, events and statistics as kvspec values.

Importing this package never imports vLLM or torch; :func:`make_vllm_adapter`
and :func:`vllm_available` import them on first use.

NOTE: An adapter declares ``semantics`` ``vllm-<installed version>`` with
``upstream=True``: it behaves exactly like that release, defects included.
Where a release lacks a facade method or parameter, the call raises
:class:`Unsupported` naming the release and the method; nothing is emulated.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Final

from kvref.capabilities import OPT_IN_FEATURES, declare
from kvspec.config import KVCacheConfig

from .adapter import VllmAdapter
from .construct import SINKFULL_WORKAROUND
from .eras import ERAS, VllmApi, era_for, load_api, quiet_logs
from .errors import Unsupported, VllmUnavailable

__all__ = [
    "ERAS",
    "MODELLED_VLLM_VERSION",
    "REQUIRED_VLLM_VERSION",
    "SINKFULL_WORKAROUND",
    "Unsupported",
    "VllmAdapter",
    "VllmApi",
    "VllmUnavailable",
    "era_for",
    "installed_vllm_version",
    "loaded_api",
    "make_vllm_adapter",
    "vllm_available",
]

MODELLED_VLLM_VERSION: Final = "0.25.1"
"""The baseline release (CI's main venv; ``kvref install-vllm`` installs any supported one)."""

REQUIRED_VLLM_VERSION: Final = MODELLED_VLLM_VERSION
"""Former name of :data:`MODELLED_VLLM_VERSION`."""

_INSTALL_HINT: Final = (
    "no supported vLLM is installed; run `kvref install-vllm VERSION` (in a checkout: `bash ci/setup.sh --with-vllm`)"
)

_LOADED: VllmApi | None = None


def installed_vllm_version() -> str | None:
    """The version of the installed vLLM distribution, or None.

    Read from the package metadata: vLLM (and torch) are not imported.
    """
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def loaded_api() -> VllmApi:
    """Import the installed vLLM once per process and return its era object.

    Raises:
        VllmUnavailable: If vLLM (or torch) cannot be imported or its release
            is not one the adapter drives.
    """
    global _LOADED  # noqa: PLW0603 - import once per process
    if _LOADED is not None:
        return _LOADED
    quiet = quiet_logs(_logging_variable())
    try:
        vllm = importlib.import_module("vllm")
    except Exception as exc:  # ImportError, or anything torch/vLLM raise on import
        raise VllmUnavailable(f"{_INSTALL_HINT} (import vllm failed: {exc!r})") from exc
    quiet("vllm")
    version = str(getattr(vllm, "__version__", None))
    try:
        api = load_api(version)
    except VllmUnavailable as exc:
        raise VllmUnavailable(f"{_INSTALL_HINT} ({exc})") from exc
    _LOADED = api
    return api


def vllm_available() -> bool:
    """Whether a vLLM release the adapter drives can be imported (imports it on the first call)."""
    try:
        loaded_api()
    except VllmUnavailable:
        return False
    return True


def _logging_variable() -> str:
    """The log-level variable of the installed release's era (read before importing it)."""
    version = installed_vllm_version()
    try:
        era = era_for(version) if version is not None else VllmApi
    except VllmUnavailable:
        era = VllmApi
    return era.env.logging_level


@declare(features=OPT_IN_FEATURES)
def make_vllm_adapter(config: KVCacheConfig) -> VllmAdapter:
    """Factory: a :class:`VllmAdapter` around a fresh vLLM ``KVCacheManager``.

    Raises:
        VllmUnavailable: If no supported vLLM is installed.
        Unsupported: If ``config`` needs a parameter the installed release lacks.
    """
    return VllmAdapter(config, loaded_api())
