"""Mutant: common_prefix_length counts blocks until the first SHARED one,
instead of stopping at the first block that is not shared."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.block_pool import BlockId

OWN_CONTRACT = False  # Sequence[Sequence[BlockId]]: CrossHair cannot realize the NewType
HARNESSES = ("prefix.common_prefix_exact",)


def common_prefix_length(table: Sequence[BlockId], tables: Sequence[Sequence[BlockId]]) -> int:
    """Mutant of the spec function (same contract).

    post: 0 <= __return__ <= len(table)
    """
    # crosshair: max_iterations=40
    n = 0
    while n < len(table) and not all(table[n] in t for t in tables):
        n += 1
    return n
