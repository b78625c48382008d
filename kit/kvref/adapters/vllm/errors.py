"""The errors of the vLLM adapter that are not caller errors of the protocol."""

from __future__ import annotations

import re

from kvref.capabilities import ALLOCATE_FEATURES
from kvref.capabilities import Unsupported as _Unsupported


class VllmUnavailable(RuntimeError):
    """No supported vLLM release (and torch) can be imported in this environment."""


class CannotRead(VllmUnavailable):
    """A vLLM internal the adapter reads is not what its API era expects.

    A release may reorganise an internal (the prefix-cache map of vLLM 0.34.0)
    without any change of behaviour; the adapter then stops with this one-line
    error naming what it cannot read, instead of a traceback, until an era
    (``kit/kvref/adapters/vllm/eras.py``) reads the new layout.
    """

    def __init__(self, release: str, what: str, detail: str) -> None:
        self.release = release
        self.what = what
        super().__init__(
            f"cannot read {what} on vLLM {release} ({detail}); the adapter's API era needs updating "
            "(kvref.adapters.vllm.eras)"
        )


class Unsupported(_Unsupported):
    """The installed vLLM release lacks a method or parameter the caller asked for.

    Raised before any state change. The adapter never emulates what a release
    does not have: a caller that needs the method must use a release that has it.
    It is a :class:`kvref.capabilities.Unsupported`: the lockstep and replay
    count it as a skip.

    Attributes:
        release: The installed vLLM version, e.g. ``"0.16.0"``.
        method: The vLLM method or parameter, e.g. ``"KVCacheManager.pop_blocks_for_free"``.
    """

    def __init__(self, release: str, method: str, detail: str = "") -> None:
        self.release = release
        self.method = method
        message = f"vLLM {release} has no {method}"
        super().__init__(f"{message}: {detail}" if detail else message, _feature(method))


def _feature(method: str) -> str:
    """The kvref feature a missing vLLM method or parameter stands for."""
    if method == "KVCacheGroupSpec.is_eagle_group":
        return "eagle"
    if method == "KVCacheManager.get_computed_blocks(max_cache_hit_length=...)":
        return "max_cache_hit_length"
    argument = re.fullmatch(r"KVCacheManager\.allocate_slots\((\w+)=\.\.\.\)", method)
    if argument is not None:
        return ALLOCATE_FEATURES.get(argument.group(1), "op:allocate_slots")
    operation = re.fullmatch(r"KVCacheManager\.(\w+)(\(.*\))?", method)
    if operation is not None:
        return f"op:{operation.group(1)}"
    config = re.fullmatch(r"KVCacheManager\((\w+)=\.\.\.\)", method)
    return "watermark" if config is not None and config.group(1) == "watermark" else "config"
