"""Mutant: requeue appends every released block to the tail, so an unhashed
block (which can never be hit) is reused only after every cached one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

OWN_CONTRACT = True
HARNESSES = ("freeq.requeue_order", "freeq.requeue_eviction", "bounded:pool.free_order")


def requeue(
    free_queue: Sequence[T], released: Sequence[T], hashed: Sequence[bool], unhashed_first: bool = True
) -> list[T]:
    """Mutant of the spec function (same contract): it ignores ``unhashed_first``.

    pre: len(released) == len(hashed)
    post: len(__return__) == len(free_queue) + len(released)
    """
    # crosshair: max_iterations=40
    del unhashed_first
    return list(free_queue) + list(released)
