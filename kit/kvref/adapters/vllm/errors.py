"""The two errors of the vLLM adapter that are not caller errors of the protocol."""

from __future__ import annotations

from kvspec.errors import KVCacheError


class VllmUnavailable(RuntimeError):
    """No supported vLLM release (and torch) can be imported in this environment."""


class Unsupported(KVCacheError):
    """The installed vLLM release lacks a method or parameter the caller asked for.

    Raised before any state change. The adapter never emulates what a release
    does not have: a caller that needs the method must use a release that has it.

    Attributes:
        release: The installed vLLM version, e.g. ``"0.16.0"``.
        method: The vLLM method or parameter, e.g. ``"KVCacheManager.pop_blocks_for_free"``.
    """

    def __init__(self, release: str, method: str, detail: str = "") -> None:
        self.release = release
        self.method = method
        message = f"vLLM {release} has no {method}"
        super().__init__(f"{message}: {detail}" if detail else message)
