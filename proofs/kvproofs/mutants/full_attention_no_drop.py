"""Mutant: full_attention_hit ignores ``drop_eagle`` (keeps the EAGLE block)."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.single_type_kv_cache_manager import align_down

OWN_CONTRACT = True
HARNESSES = ("bounded:search.full_attention_search", "contract:single_type_kv_cache_manager.full_attention_hit")


def full_attention_hit(present: Sequence[bool], drop_eagle: bool, block_size: int, alignment: int) -> int:
    """Mutant of the spec function (same contract).

    pre: block_size >= 1 and alignment >= 1
    post: 0 <= __return__ <= len(present)
    post: all(present[:__return__])
    post: block_size == alignment or __return__ * block_size % alignment == 0
    post: not drop_eagle or __return__ == 0 or present[__return__]
    """
    # crosshair: max_iterations=40
    n = 0
    while n < len(present) and present[n]:
        n += 1
    return align_down(n, block_size, alignment)
