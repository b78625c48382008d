"""Mutant: a manager's free hands its table over first entry first, so the
head of a request's prefix is evicted before its tail."""

from __future__ import annotations

from kvspec.config import SlidingWindow
from kvspec.single_type_kv_cache_manager import SingleTypeKVCacheManager

OWN_CONTRACT = False
TARGET = "kvspec.single_type_kv_cache_manager.SingleTypeKVCacheManager.free"
HARNESSES = ("bounded:pool.free_reverse",)


def free(self: SingleTypeKVCacheManager, request_id: str) -> None:
    """Mutant of the spec method (no contract)."""
    self.pool.free_blocks(self._forget(request_id), skipped=isinstance(self.kind, SlidingWindow))
