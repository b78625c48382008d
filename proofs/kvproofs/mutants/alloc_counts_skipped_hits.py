"""Mutant: blocks_to_allocate also counts free hits at skipped positions,
which become null and are never touched (so they never leave the queue)."""

from __future__ import annotations

from collections.abc import Sequence

OWN_CONTRACT = True
HARNESSES = (
    "alloc.alloc_new_request",
    "bounded:alloc.estimate_is_exact",
    "contract:single_type_kv_cache_manager.blocks_to_allocate",
)


def blocks_to_allocate(
    required: int, cap: int | None, have: int, skipped: int, hit_free: Sequence[bool], tracked: bool
) -> int:
    """Mutant of the spec function (same contract).

    pre: required >= 0 and have >= 0 and (cap is None or cap >= 1)
    post: __return__ >= 0
    post: not tracked or __return__ == max(min(required, cap or required) - have, 0)
    post: cap is None or __return__ <= blocks_to_allocate(required, None, have, skipped, hit_free, tracked)
    post: tracked or __return__ >= sum(hit_free[max(0, skipped - have) :])
    """
    # crosshair: max_iterations=40
    if cap is not None:
        required = min(required, cap)
    if tracked:
        return max(required - have, 0)
    new = max(required - max(skipped, len(hit_free) + have), 0)
    return new + sum(hit_free)
