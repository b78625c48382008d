"""reachable_block_mask marks exactly the blocks a sliding-window hit can use.

A hit of ``L`` blocks (``L`` aligned) looks up blocks ``[first, L + eagle)``
as returned by :func:`sliding_window_hit`. Every such hit is also the hit of
the all-cached prefix of ``L + eagle`` blocks, so the union over all-cached
prefixes is the set of blocks any lookup can ever need.

Window 1 is excluded: it needs ``cdiv(0, bs) = 0`` contiguous blocks, so the
mask keeps no block at all, yet the search (like vLLM's) still returns the
one cached block it stopped at. vLLM 0.25.1 has the same mismatch (its
``SlidingWindowManager.reachable_block_mask`` is the same formula), so a
window-1 layer never gets a hit in either; see proofs/README.md.
"""

from __future__ import annotations

from kvproofs.holds import unenforced
from kvspec.config import SlidingWindow
from kvspec.single_type_kv_cache_manager import contiguous_blocks_for_hit, reachable_block_mask, sliding_window_hit


def needed_blocks(window: int, block_size: int, per: int, use_eagle: bool, upto: int) -> set[int]:
    """Blocks ``< upto`` looked up by some sliding-window hit (all-cached prefixes)."""
    need = unenforced(contiguous_blocks_for_hit)(window, block_size, use_eagle)
    out: set[int] = set()
    for m in range(1, upto + need + 2):
        first, length = unenforced(sliding_window_hit)([True] * m, need, use_eagle, block_size, block_size * per)
        if length > 0:
            out.update(i for i in range(first, length + use_eagle) if i < upto)
    return out


def _needed_mask(window: int, block_size: int, per: int, use_eagle: bool, start: int, end: int) -> list[bool]:
    needed = needed_blocks(window, block_size, per, use_eagle, end)
    return [i in needed for i in range(start, end)]


def mask_exact(window: int, block_size: int, per: int, use_eagle: bool, start: int, end: int) -> list[bool] | None:
    """A mask marks exactly the needed blocks.

    pre: 2 <= window <= 6 and 1 <= block_size <= 2 and 1 <= per <= 3 and 0 <= start <= end <= 6
    post: __return__ is None or len(__return__) == end - start
    post: __return__ is None or __return__ == _needed_mask(window, block_size, per, use_eagle, start, end)
    """
    # crosshair: max_iterations=200
    return _mask(window, block_size, per, use_eagle, start, end)


def mask_none_means_all(window: int, block_size: int, per: int, use_eagle: bool, start: int, end: int) -> bool:
    """None ("cache every block") over-approximates by at most block 0 (under
    EAGLE, when the window needs exactly one alignment unit).

    pre: 2 <= window <= 6 and 1 <= block_size <= 2 and 1 <= per <= 3 and 0 <= start <= end <= 6
    post: not __return__ or all(_needed_mask(window, block_size, per, use_eagle, max(start, 1), end))
    """
    # crosshair: max_iterations=60
    return _mask(window, block_size, per, use_eagle, start, end) is None


def _mask(window: int, block_size: int, per: int, use_eagle: bool, start: int, end: int) -> list[bool] | None:
    kind = SlidingWindow(block_size, window)
    return unenforced(reachable_block_mask)(kind, start, end, block_size * per, use_eagle)
