"""Mutant: freed unhashed blocks go to the front of the free queue even
with caching off in 0.27.x (profile switch ``free_unhashed_needs_caching``)."""

from __future__ import annotations

from kvspec.block_pool import BlockPool

OWN_CONTRACT = False
HARNESSES = ("bounded:contract:block_pool.requeue_unhashed_first",)


def requeue_unhashed_first(pool: BlockPool, skipped: bool = False) -> bool:
    """Mutant of the spec function (same contract).

    post: pool.profile.free_unhashed_first or (skipped and pool.profile.skipped_unhashed_first) or not __return__
    post: not pool.enable_caching or __return__ == (pool.profile.free_unhashed_first or (skipped and pool.profile.skipped_unhashed_first))
    post: pool.enable_caching or __return__ == ((pool.profile.free_unhashed_first or (skipped and pool.profile.skipped_unhashed_first)) and not pool.profile.free_unhashed_needs_caching)
    post: skipped or __return__ == (pool.profile.free_unhashed_first and (pool.enable_caching or not pool.profile.free_unhashed_needs_caching))
    """  # noqa: E501 - a PEP 316 condition is one line
    p = pool.profile
    return p.free_unhashed_first or (skipped and p.skipped_unhashed_first)
