"""Mutant: align_down rounds UP to the next aligned block count."""

from __future__ import annotations

OWN_CONTRACT = True
HARNESSES = ("arith.align_down_props", "arith.align_down_largest", "contract:single_type_kv_cache_manager.align_down")


def align_down(num_blocks: int, block_size: int, alignment: int) -> int:
    """Mutant of the spec function (same contract).

    pre: num_blocks >= 0 and block_size >= 1 and alignment >= 1
    post: 0 <= __return__ <= num_blocks
    post: block_size == alignment or (__return__ * block_size) % alignment == 0
    """
    # crosshair: max_iterations=40
    while block_size != alignment and num_blocks * block_size % alignment:
        num_blocks += 1
    return num_blocks
