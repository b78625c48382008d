"""Mutant: requeue appends every released block to the tail, so an unhashed
block (which can never be hit) is reused only after every cached one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

OWN_CONTRACT = True
HARNESSES = ("contract:block_pool.requeue", "bounded:pool.free_order")


def requeue(
    free_queue: Sequence[T], released: Sequence[T], hashed: Sequence[bool], unhashed_first: bool = True
) -> list[T]:
    """Mutant of the spec function (same contract): it ignores ``unhashed_first``.

    pre: len(released) == len(hashed)
    post: len(__return__) == len(free_queue) + len(released)
    post: __return__[(len(released) - sum(hashed)) * unhashed_first :][: len(free_queue)] == list(free_queue)
    post: unhashed_first or __return__[len(free_queue) :] == list(released)
    post: not unhashed_first or __return__[: len(released) - sum(hashed)] == [b for b, h in zip(released, hashed) if not h]
    post: not unhashed_first or __return__[len(__return__) - sum(hashed) :] == [b for b, h in zip(released, hashed) if h]
    """  # noqa: E501 - a PEP 316 condition is one line
    # crosshair: max_iterations=40
    del unhashed_first
    return list(free_queue) + list(released)
