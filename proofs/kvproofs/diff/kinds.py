"""``num_skipped_tokens`` and ``reachable_block_mask`` of kvspec and kvimpl.

Both take an ``AttentionKind``, which CrossHair 0.0.113 cannot build (the
``Mamba.mode`` Literal), so each side builds it from plain ints with
:func:`kvproofs.holds.arith.kind_of`. The guard is the spec's ``pre:``, bounded.
"""

from __future__ import annotations

from kvimpl.single_type_kv_cache_manager import num_skipped_tokens as impl_skipped
from kvimpl.single_type_kv_cache_manager import reachable_block_mask as impl_mask
from kvproofs.holds.arith import kind_of
from kvspec.single_type_kv_cache_manager import num_skipped_tokens as spec_skipped
from kvspec.single_type_kv_cache_manager import reachable_block_mask as spec_mask


def _kind_ok(tag: int, block_size: int, param: int) -> bool:
    return 0 <= tag <= 7 and 1 <= block_size <= 4 and 1 <= param <= 16


def spec_num_skipped_tokens(tag: int, block_size: int, param: int, n: int) -> int | None:
    """The spec's ``num_skipped_tokens``, None outside the guard."""
    ok = _kind_ok(tag, block_size, param) and 0 <= n <= 64
    return spec_skipped(kind_of(tag, block_size, param), n) if ok else None


def impl_num_skipped_tokens(tag: int, block_size: int, param: int, n: int) -> int | None:
    """kvimpl's ``num_skipped_tokens``, None outside the guard."""
    ok = _kind_ok(tag, block_size, param) and 0 <= n <= 64
    return impl_skipped(kind_of(tag, block_size, param), n) if ok else None


def _mask_ok(tag: int, block_size: int, param: int, start: int, end: int, per: int) -> bool:
    return _kind_ok(tag, block_size, param) and 0 <= start <= end <= 12 and 1 <= per <= 4


def spec_reachable_block_mask(
    tag: int, block_size: int, param: int, start: int, end: int, per: int, use_eagle: bool
) -> list[bool] | None:
    """The spec's ``reachable_block_mask`` (alignment ``per`` blocks), None outside the guard."""
    if not _mask_ok(tag, block_size, param, start, end, per):
        return None
    return spec_mask(kind_of(tag, block_size, param), start, end, block_size * per, use_eagle)


def impl_reachable_block_mask(
    tag: int, block_size: int, param: int, start: int, end: int, per: int, use_eagle: bool
) -> list[bool] | None:
    """kvimpl's ``reachable_block_mask``, None outside the guard."""
    if not _mask_ok(tag, block_size, param, start, end, per):
        return None
    return impl_mask(kind_of(tag, block_size, param), start, end, block_size * per, use_eagle)
