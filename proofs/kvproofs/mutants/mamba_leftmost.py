"""Mutant: mamba_hit returns the LEFTMOST aligned cached state."""

from __future__ import annotations

from collections.abc import Sequence

OWN_CONTRACT = True
HARNESSES = ("bounded:search.mamba_search", "contract:single_type_kv_cache_manager.mamba_hit")


def mamba_hit(present: Sequence[bool], block_size: int, alignment: int) -> tuple[int, int]:
    """Mutant of the spec function (same contract).

    pre: block_size >= 1 and alignment >= 1
    post: __return__ == (0, 0) or present[__return__[0]]
    post: __return__ == (0, 0) or __return__[1] == __return__[0] + 1
    post: block_size == alignment or __return__[1] * block_size % alignment == 0
    """
    # crosshair: max_iterations=40
    for i in range(len(present)):
        if present[i] and (block_size == alignment or (i + 1) * block_size % alignment == 0):
            return i, i + 1
    return 0, 0
