"""Prefix-hit searches: stronger properties than the spec's own contracts.

Every harness takes plain ``list[bool]`` / small ints (CrossHair stays fast on
bounded inputs) and states its property as PEP 316 ``post:`` lines. ``per`` is
the alignment in blocks: the scheduler block size is the LCM of the group
block sizes, so ``alignment`` is always a multiple of ``block_size``.

``# crosshair: max_iterations=N`` caps the paths explored per condition, so a
run explores the same paths on any machine (see proofs/README.md).
"""

from __future__ import annotations

from kvproofs.holds import unenforced
from kvspec.single_type_kv_cache_manager import (
    chunked_local_hit,
    contiguous_blocks_for_hit,
    full_attention_hit,
    mamba_hit,
    sliding_window_hit,
)


def full_attention_downward_closed(present: list[bool], k: int, drop: bool, block_size: int, per: int) -> int:
    """If ``present[:k]`` are all cached, the hit reaches ``k`` (if ``k`` is
    aligned) or ``k - 1`` aligned down (under EAGLE).

    pre: len(present) <= 5 and 1 <= block_size <= 2 and 1 <= per <= 3
    pre: 0 <= k <= len(present) and all(present[:k])
    post: drop or k % per != 0 or __return__ >= k
    post: not drop or k == 0 or __return__ >= (k - 1) - (k - 1) % per
    """
    # crosshair: max_iterations=100
    return unenforced(full_attention_hit)(present, drop, block_size, block_size * per)


def full_attention_maximal(present: list[bool], drop: bool, block_size: int, per: int) -> int:
    """The hit is aligned, cached (plus the dropped EAGLE block) and no longer
    aligned hit exists.

    pre: len(present) <= 5 and 1 <= block_size <= 2 and 1 <= per <= 3
    post: __return__ % per == 0
    post: all(present[: __return__ + (1 if drop and __return__ > 0 else 0)])
    post: not (__return__ + per + drop <= len(present) and all(present[: __return__ + per + drop]))
    """
    # crosshair: max_iterations=300
    return unenforced(full_attention_hit)(present, drop, block_size, block_size * per)


def sliding_window_props(present: list[bool], window: int, drop: bool, block_size: int, per: int) -> tuple[int, int]:
    """The returned run is cached, aligned, long enough (or starts at block
    0) and includes the dropped EAGLE block.

    pre: len(present) <= 4 and 1 <= window <= 4 and 1 <= block_size <= 2 and 1 <= per <= 2
    post: 0 <= __return__[0] <= __return__[1] <= len(present)
    post: __return__[1] % per == 0
    post: all(present[__return__[0] : __return__[1] + (1 if drop and __return__[1] > 0 else 0)])
    post: __return__[0] == 0 or __return__[1] + drop - __return__[0] >= _need(window, block_size, drop)
    """
    # crosshair: max_iterations=300
    need = _need(window, block_size, drop)
    return unenforced(sliding_window_hit)(present, need, drop, block_size, block_size * per)


def sliding_window_rightmost(present: list[bool], window: int, drop: bool, block_size: int, per: int) -> int:
    """No aligned hit ends further right than the returned one (the search is
    right to left).

    pre: len(present) <= 4 and 1 <= window <= 4 and 1 <= block_size <= 2 and 1 <= per <= 2
    post: not _later_hit(present, window, drop, block_size, per, __return__)
    """
    # crosshair: max_iterations=150
    need = _need(window, block_size, drop)
    return unenforced(sliding_window_hit)(present, need, drop, block_size, block_size * per)[1]


def _need(window: int, block_size: int, drop: bool) -> int:
    return unenforced(contiguous_blocks_for_hit)(window, block_size, drop)


def _later_hit(present: list[bool], window: int, drop: bool, block_size: int, per: int, length: int) -> bool:
    """Whether a hit of an aligned length greater than ``length`` exists."""
    need = _need(window, block_size, drop)
    ends = range((length // per + 1) * per, len(present) + 1, per)
    return any(_swa_hit_ending_at(present, e, drop, need) for e in ends)


def _swa_hit_ending_at(present: list[bool], end: int, drop: bool, need: int) -> bool:
    """Whether a sliding-window hit of ``end`` blocks is possible: the ``need``
    blocks (at least one, as in vLLM) before ``end`` (+1 under EAGLE) are cached."""
    last = end + drop
    return last <= len(present) and all(present[max(0, last - max(need, 1)) : last])


def mamba_rightmost(present: list[bool], block_size: int, per: int) -> tuple[int, int]:
    """The RIGHTMOST cached state whose end is aligned, else ``(0, 0)``.

    pre: len(present) <= 6 and 1 <= block_size <= 2 and 1 <= per <= 3
    post: __return__ == (0, 0) or (__return__[1] == __return__[0] + 1 and present[__return__[0]])
    post: __return__ == (0, 0) or __return__[1] % per == 0
    post: not any(present[i] and (i + 1) % per == 0 for i in range(__return__[1], len(present)))
    """
    # crosshair: max_iterations=300
    return unenforced(mamba_hit)(present, block_size, block_size * per)


def chunked_local_props(present: list[bool], max_length: int, chunk_blocks: int, block_size: int) -> tuple[int, int]:
    """Blocks before the current chunk are skipped; within it, the cached
    prefix up to the first miss.

    pre: 1 <= block_size <= 2 and 1 <= chunk_blocks <= 3 and 0 <= max_length <= 12
    pre: len(present) == max_length // block_size
    post: __return__[0] * block_size == max_length // (chunk_blocks * block_size) * chunk_blocks * block_size
    post: all(present[__return__[0] : __return__[1]])
    post: __return__[1] == len(present) or not present[__return__[1]]
    """
    # crosshair: max_iterations=300
    return unenforced(chunked_local_hit)(present, max_length, chunk_blocks * block_size, block_size)
