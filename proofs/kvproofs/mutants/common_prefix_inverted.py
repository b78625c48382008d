"""Mutant: common_prefix_length counts blocks until the first SHARED one,
instead of stopping at the first block that is not shared."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.block_pool import BlockId

OWN_CONTRACT = False  # Sequence[Sequence[BlockId]]: CrossHair cannot realize the NewType
HARNESSES = ("contract:single_type_kv_cache_manager.common_prefix_length",)


def common_prefix_length(table: Sequence[BlockId], tables: Sequence[Sequence[BlockId]]) -> int:
    """Mutant of the spec function (same contract).

    post: 0 <= __return__ <= len(table)
    post: all(all(b in t for t in tables) for b in table[:__return__])
    post: __return__ == len(table) or any(table[__return__] not in t for t in tables)
    """
    # crosshair: max_iterations=40
    n = 0
    while n < len(table) and not all(table[n] in t for t in tables):
        n += 1
    return n
