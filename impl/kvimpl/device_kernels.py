"""The step's slot mapping as one Triton kernel per group (CUDA only).

Imported by :mod:`kvimpl.device_tables` only when its device is CUDA and
Triton imports; everywhere else the tables use their vectorized tensor path,
which computes the same slots (``tests/impl/test_device_kernels.py`` runs this
kernel under Triton's interpreter against it where Triton is installed).

One program per request of the step: request ``i`` (table row ``rows[i]``)
computes the tokens ``qsl[i] .. qsl[i + 1]`` of the output, at positions
``starts[i] + k`` or, in vLLM's form, ``positions[qsl[i] + k]``. The slot of a
position is its block's id times the physical block size plus its offset on
this rank (:data:`kvimpl.device_tables.PAD_SLOT_ID` where another
context-parallel rank holds it), as ``vllm/v1/worker/block_table.py``'s
``_compute_slot_mapping_kernel`` computes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

_BLOCK = 256

_jit: Callable[[Callable[..., None]], Any] = triton.jit
"""``triton.jit``, typed for the checker (Triton ships no stubs)."""


@_jit
def _slots_kernel(  # type: ignore[no-untyped-def]  # Triton reads parameter annotations as kernel types
    rows_ptr,
    starts_ptr,
    qsl_ptr,
    positions_ptr,
    table_ptr,
    table_stride,
    out_ptr,
    rank,
    VBS: tl.constexpr,
    PBS: tl.constexpr,
    WORLD: tl.constexpr,
    INTER: tl.constexpr,
    HAS_POSITIONS: tl.constexpr,
    BLOCK: tl.constexpr,
) -> None:
    req = tl.program_id(0)
    row = tl.load(rows_ptr + req).to(tl.int64)
    first = tl.load(qsl_ptr + req).to(tl.int64)
    end = tl.load(qsl_ptr + req + 1).to(tl.int64)
    if not HAS_POSITIONS:
        start = tl.load(starts_ptr + req).to(tl.int64)
    for i in range(first, end, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        mask = offs < end
        if HAS_POSITIONS:
            pos = tl.load(positions_ptr + offs, mask=mask, other=0).to(tl.int64)
        else:
            pos = start + (offs - first)
        idx = pos // VBS
        off = pos - idx * VBS
        block = tl.load(table_ptr + row * table_stride + idx, mask=mask, other=0).to(tl.int64)
        if WORLD == 1:
            slot = block * PBS + off
        else:
            local = (off // (WORLD * INTER)) * INTER + off % INTER
            mine = ((off // INTER) % WORLD) == rank
            slot = tl.where(mine, block * PBS + local, -1)
        tl.store(out_ptr + offs, slot, mask=mask)


def step_slots(bt: Any, rows: Any, starts: Any, qsl: Any, positions: Any, total: int, group: int) -> Any:
    """The slots of a step in ``group`` of the tables ``bt`` (a
    :class:`kvimpl.device_tables.BlockTable` on CUDA): one kernel launch."""
    out = torch.empty(total, dtype=torch.int64, device=bt.device)
    n = len(rows)
    if n == 0 or total == 0:
        return out
    table = bt.dev[group]
    has_positions = positions is not None
    _slots_kernel[(n,)](
        rows,
        starts if not has_positions else rows,
        qsl,
        positions if has_positions else rows,
        table,
        table.stride(0),
        out,
        bt.cp_rank,
        VBS=bt.block_sizes[group],
        PBS=bt.physical_block_sizes[group],
        WORLD=bt.cp_world_sizes[group],
        INTER=bt.cp_interleave,
        HAS_POSITIONS=has_positions,
        BLOCK=_BLOCK,
    )
    return out
