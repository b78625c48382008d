"""Mutant: sliding_window_hit scans LEFT to right and returns the first run
that qualifies, instead of the rightmost one."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.single_type_kv_cache_manager import align_down

OWN_CONTRACT = True
HARNESSES = ("bounded:search.sliding_window_search", "contract:single_type_kv_cache_manager.sliding_window_hit")


def sliding_window_hit(
    present: Sequence[bool], contiguous: int, drop_eagle: bool, block_size: int, alignment: int
) -> tuple[int, int]:
    """Mutant of the spec function (same contract).

    pre: contiguous >= 0 and block_size >= 1 and alignment >= 1
    post: 0 <= __return__[1] <= len(present)
    post: all(present[__return__[0]:__return__[1]])
    post: block_size == alignment or __return__[1] * block_size % alignment == 0
    post: __return__[0] == 0 or __return__[1] + drop_eagle - __return__[0] >= contiguous
    """
    # crosshair: max_iterations=40
    run = 0
    for i in range(len(present)):
        if not present[i]:
            run = 0
            continue
        run += 1
        end = i if drop_eagle else i + 1
        if run >= contiguous and (block_size == alignment or end * block_size % alignment == 0):
            return i + 1 - run, align_down(end, block_size, alignment)
    lead = 0
    while lead < len(present) and present[lead]:
        lead += 1
    return 0, align_down(lead - (1 if drop_eagle and lead > 0 else 0), block_size, alignment)
