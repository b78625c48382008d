"""Mutant: a cached hybrid caches every full block of every group in every
release (0.16.0's rule; profile switch ``hybrid_cache_reachable_only``: from
0.25.1 on only up to a scheduler-block boundary, an EAGLE group one block
further)."""

from __future__ import annotations

from kvspec.kv_cache_coordinator import HybridCoordinator, KVCacheCoordinator
from kvspec.request import Request

OWN_CONTRACT = False
TARGET = "kvspec.kv_cache_coordinator.HybridCoordinator.cache_blocks"
HARNESSES = ("bounded:releases.hybrid_caching",)


def cache_blocks(self: HybridCoordinator, request: Request, num_tokens: int) -> None:
    """Mutant of the spec method (no contract): the switch is never read."""
    KVCacheCoordinator.cache_blocks(self, request, num_tokens)
