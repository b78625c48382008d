"""Prefix-cache statistics (upstream: ``vllm.v1.metrics.stats.PrefixCacheStats``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class PrefixCacheStats:
    """Token counts of prefix lookups since the last ``make_prefix_cache_stats``.

    Lookups of requests that were preempted before are counted separately.
    """

    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        """Add one lookup of ``num_tokens`` tokens that hit ``num_hits``."""
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits
