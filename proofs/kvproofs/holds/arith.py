"""Arithmetic helpers and per-kind rules: cdiv, align_down, the window's
block count, skipped tokens and the admission cap.

``num_skipped_tokens`` and ``admission_cap`` take an ``AttentionKind``, a union
that includes ``Mamba`` whose ``mode`` is a ``Literal``; CrossHair 0.0.113
cannot build such values (``get_type_hints`` rejects the alias), so these
harnesses build the kind from plain ints with :func:`kind_of`.
"""

from __future__ import annotations

from kvproofs.contracts import about
from kvproofs.holds import unenforced
from kvspec.config import (
    MLA,
    AttentionKind,
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    Mamba,
    SinkFullAttention,
    SlidingWindow,
    admission_cap,
)
from kvspec.single_type_kv_cache_manager import align_down, cdiv, contiguous_blocks_for_hit, num_skipped_tokens

SWA, CHUNKED, MAMBA = 3, 4, 5
"""Tags of :func:`kind_of` whose ``param`` matters (window, chunk, speculative blocks)."""


def kind_of(tag: int, block_size: int, param: int) -> AttentionKind:
    """A valid kind from plain ints: 0 full, 1 MLA, 2 sink-full, 3 sliding window
    (``param`` = window), 4 chunked local (``param`` = chunk), 5 Mamba ``all``,
    6 Mamba ``align``, 7 cross attention."""
    if tag == 0:
        return FullAttention(block_size)
    if tag == 1:
        return MLA(block_size)
    if tag == 2:
        return SinkFullAttention(block_size, block_size)
    if tag == SWA:
        return SlidingWindow(block_size, param)
    if tag == CHUNKED:
        return ChunkedLocal(block_size, param)
    if tag == MAMBA:
        return Mamba(block_size, "all")
    if tag == 6:
        return Mamba(block_size, "align")
    return CrossAttention(block_size)


@about(cdiv)
def cdiv_props(a: int, b: int, d: int) -> int:
    """Ceiling division: exact on multiples, monotone, and the usual
    ``(a + b - 1) // b`` for non-negative ``a``.

    pre: 1 <= b <= 8 and -20 <= a <= 20 and 0 <= d <= 20
    post: unenforced(cdiv)(a * b, b) == a
    post: __return__ <= unenforced(cdiv)(a + d, b)
    post: a < 0 or __return__ == (a + b - 1) // b
    """
    # crosshair: max_iterations=1000
    return unenforced(cdiv)(a, b)


@about(align_down)
def align_down_props(num_blocks: int, block_size: int, per: int) -> int:
    """With ``alignment`` a multiple of ``block_size`` (the scheduler block
    size is the LCM of group sizes), align_down rounds down to a multiple of
    ``per`` blocks.

    pre: 0 <= num_blocks <= 16 and 1 <= block_size <= 4 and 1 <= per <= 4
    post: __return__ == num_blocks - num_blocks % per
    """
    # crosshair: max_iterations=1000
    return unenforced(align_down)(num_blocks, block_size, block_size * per)


@about(align_down)
def align_down_largest(num_blocks: int, block_size: int, alignment: int) -> int:
    """For any alignment: the LARGEST block count ``<= num_blocks`` whose tokens
    are aligned (or ``num_blocks`` when ``block_size == alignment``).

    pre: 0 <= num_blocks <= 12 and 1 <= block_size <= 4 and 1 <= alignment <= 8
    post: 0 <= __return__ <= num_blocks
    post: block_size == alignment or __return__ * block_size % alignment == 0
    post: not any(m * block_size % alignment == 0 for m in range(__return__ + 1, num_blocks + 1))
    """
    # crosshair: max_iterations=1000
    return unenforced(align_down)(num_blocks, block_size, alignment)


@about(contiguous_blocks_for_hit)
def contiguous_props(window: int, block_size: int, use_eagle: bool) -> int:
    """The fewest blocks that hold the ``window - 1`` earlier tokens a
    sliding-window hit needs, plus the EAGLE block.

    pre: 1 <= window <= 64 and 1 <= block_size <= 16
    post: (__return__ - use_eagle) * block_size >= window - 1
    post: __return__ - use_eagle == 0 or (__return__ - use_eagle - 1) * block_size < window - 1
    """
    # crosshair: max_iterations=1000
    return unenforced(contiguous_blocks_for_hit)(window, block_size, use_eagle)


@about(num_skipped_tokens)
def skipped_props(tag: int, block_size: int, param: int, n: int) -> int:
    """Skipped tokens per kind: the window keeps ``min(n, w - 1)`` tokens, the
    chunk keeps ``n mod c``, Mamba only the last state, others everything;
    never more than ``n``.

    pre: 0 <= tag <= 7 and 1 <= block_size <= 4 and 1 <= param <= 16 and 0 <= n <= 64
    post: __return__ <= n
    post: tag != SWA or n - __return__ == min(n, param - 1)
    post: tag != CHUNKED or (__return__ % param == 0 and 0 <= n - __return__ < param)
    post: tag not in (MAMBA, MAMBA + 1) or __return__ == n - 1
    post: tag in (SWA, CHUNKED, MAMBA, MAMBA + 1) or __return__ == 0
    """
    # crosshair: max_iterations=1000
    return _skipped(tag, block_size, param, n)


def _skipped(tag: int, block_size: int, param: int, n: int) -> int:
    return unenforced(num_skipped_tokens)(kind_of(tag, block_size, param), n)


@about(num_skipped_tokens)
def skipped_monotone(tag: int, block_size: int, param: int, n: int, d: int) -> int:
    """More computed tokens never un-skip a token.

    pre: 0 <= tag <= 7 and 1 <= block_size <= 4 and 1 <= param <= 16 and 0 <= n <= 64 and 0 <= d <= 64
    post: __return__ <= _skipped(tag, block_size, param, n + d)
    """
    # crosshair: max_iterations=1000
    return _skipped(tag, block_size, param, n)


@about(admission_cap)
def admission_cap_props(tag: int, block_size: int, param: int, batched: int, model_len: int, more: int) -> int | None:
    """The cap exists only for sliding window and chunked local, is at least
    one block, covers the tokens a step can touch, and grows with the budget.

    pre: 0 <= tag <= 7 and 1 <= block_size <= 4 and 1 <= param <= 16
    pre: 1 <= batched <= 64 and 1 <= model_len <= 64 and 0 <= more <= 16
    post: (__return__ is None) == (tag not in (SWA, CHUNKED))
    post: __return__ is None or __return__ >= 1
    post: tag != SWA or (__return__ - 1) * block_size >= min(param - 1 + batched, model_len)
    post: tag != CHUNKED or __return__ * block_size >= min(param + batched, model_len)
    post: __return__ is None or __return__ <= (_cap(tag, block_size, param, batched + more, model_len) or 0)
    """
    # crosshair: max_iterations=1000
    return _cap(tag, block_size, param, batched, model_len)


def _cap(tag: int, block_size: int, param: int, batched: int, model_len: int) -> int | None:
    return unenforced(admission_cap)(kind_of(tag, block_size, param), batched, model_len)
