"""``mamba_hit`` of kvspec and kvimpl, compared inside the precondition and
with bounded sizes (unguarded, the nonlinear alignment test runs into
CrossHair's per-condition timeout; see ``align_down.py``)."""

from __future__ import annotations

from collections.abc import Sequence

from kvimpl.single_type_kv_cache_manager import mamba_hit as impl_mamba_hit
from kvspec.single_type_kv_cache_manager import mamba_hit as spec_mamba_hit


def _inside(present: Sequence[bool], block_size: int, alignment: int) -> bool:
    # The spec's pre: line, bounded.
    return len(present) <= 8 and 1 <= block_size <= 8 and 1 <= alignment <= 32


def guarded_spec(present: list[bool], block_size: int, alignment: int) -> tuple[int, int] | None:
    """The spec's ``mamba_hit``, None outside the guard."""
    return spec_mamba_hit(present, block_size, alignment) if _inside(present, block_size, alignment) else None


def guarded_impl(present: list[bool], block_size: int, alignment: int) -> tuple[int, int] | None:
    """kvimpl's ``mamba_hit``, None outside the guard."""
    return impl_mamba_hit(present, block_size, alignment) if _inside(present, block_size, alignment) else None
