"""``align_down`` of kvspec and kvimpl, compared inside the precondition and
with bounded sizes.

Unguarded, the comparison runs into CrossHair's per-condition timeout (60 s
CPU, then "no difference" after ~80 paths): the loop's nonlinear
``num_blocks * block_size % alignment`` keeps z3 busy. So the guard copies the
spec's ``pre:`` with bounds, and the two sizes are realized (CrossHair takes
each concrete value in turn, as a branch) while ``num_blocks`` stays
symbolic; the test becomes linear and the run takes about 2 s.
"""

from __future__ import annotations

from crosshair.core import realize

from kvimpl.single_type_kv_cache_manager import align_down as impl_align_down
from kvspec.single_type_kv_cache_manager import align_down as spec_align_down


def _inside(num_blocks: int, block_size: int, alignment: int) -> bool:
    # The spec's pre: line, bounded.
    return 0 <= num_blocks <= 32 and 1 <= block_size <= 8 and 1 <= alignment <= 32


def guarded_spec(num_blocks: int, block_size: int, alignment: int) -> int | None:
    """The spec's ``align_down``, None outside the guard."""
    if not _inside(num_blocks, block_size, alignment):
        return None
    return spec_align_down(num_blocks, realize(block_size), realize(alignment))


def guarded_impl(num_blocks: int, block_size: int, alignment: int) -> int | None:
    """kvimpl's ``align_down``, None outside the guard."""
    if not _inside(num_blocks, block_size, alignment):
        return None
    return impl_align_down(num_blocks, realize(block_size), realize(alignment))
