"""Mutant: reachable_block_mask forgets the one-block EAGLE shift."""

from __future__ import annotations

from kvspec.config import AttentionKind, SlidingWindow
from kvspec.single_type_kv_cache_manager import contiguous_blocks_for_hit

OWN_CONTRACT = False  # AttentionKind includes Mamba's Literal mode: CrossHair cannot build it
HARNESSES = ("bounded:search.reachable_mask", "contract:single_type_kv_cache_manager.reachable_block_mask")


def reachable_block_mask(
    kind: AttentionKind, start: int, end: int, alignment: int, use_eagle: bool
) -> list[bool] | None:
    """Mutant of the spec function (same contract).

    pre: 0 <= start <= end and alignment >= 1
    pre: not isinstance(kind, SlidingWindow) or (kind.window >= 1 and kind.block_size >= 1)
    post: __return__ is None or len(__return__) == end - start
    post: isinstance(kind, SlidingWindow) or __return__ is None
    post: __return__ is None or not use_eagle or start > 0 or not __return__[:1] or not __return__[0]
    """
    # crosshair: max_iterations=40
    if not isinstance(kind, SlidingWindow):
        return None
    need = contiguous_blocks_for_hit(kind.window, kind.block_size, use_eagle)
    per = alignment // kind.block_size
    if need >= per:
        return None
    return [i % per >= per - need for i in range(start, end)]
