"""The Triton slot-mapping kernel (``kvimpl.device_kernels``) computes the
slots the tables' vectorized path computes.

On a GPU it runs the compiled kernel on CUDA tables; elsewhere under Triton's
interpreter on the CPU (``TRITON_INTERPRET=1``, set before Triton is
imported), so the kernel's arithmetic is checked on machines without a GPU.
Skipped where Triton is not installed (it is not a kvref dependency: kvimpl
uses the kernel only on CUDA, where Triton comes with torch).
"""

from __future__ import annotations

import os
import random

import pytest

torch = pytest.importorskip("torch")
CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")
DEVICE = "cuda" if CUDA else "cpu"

from kvimpl import device_kernels  # noqa: E402 - after the interpreter is chosen
from kvimpl.device_tables import BlockTable  # noqa: E402


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(("block", "world", "interleave"), [(4, 1, 1), (16, 1, 1), (8, 2, 1), (8, 2, 2), (16, 4, 2)])
def test_kernel_equals_vectorized(seed: int, block: int, world: int, interleave: int) -> None:
    rng = random.Random(seed)
    rows, cols = rng.randint(1, 6), rng.randint(1, 5)
    rank = rng.randrange(world)
    bt = BlockTable([block], [cols], rows, DEVICE, cp_world_sizes=[world], cp_rank=rank, cp_interleave=interleave)
    for r in range(rows):
        bt.update(f"r{r}", [[rng.randint(0, 50) for _ in range(rng.randint(1, cols))]])
    bt.sync()
    step = rng.sample(range(rows), rng.randint(1, rows))
    starts, counts = [], []
    for r in step:
        held = len(bt.mirrors[r][0]) * block
        start = rng.randrange(held)
        starts.append(start)
        counts.append(rng.randint(1, held - start))
    row_t = torch.tensor(step, dtype=torch.int64, device=DEVICE)
    start_t = torch.tensor(starts, dtype=torch.int64, device=DEVICE)
    qsl = torch.tensor([0, *[sum(counts[: i + 1]) for i in range(len(counts))]], dtype=torch.int64, device=DEVICE)
    # The vectorized tensor path (tensor inputs take it on every device but CUDA with Triton).
    req = torch.repeat_interleave(torch.arange(len(step), device=DEVICE), qsl[1:] - qsl[:-1])
    pos = start_t[req] + (torch.arange(sum(counts), device=DEVICE) - qsl[:-1][req])
    want = bt._slots(row_t[req], pos, 0).tolist()
    got = device_kernels.step_slots(bt, row_t, start_t, qsl, None, sum(counts), 0).tolist()
    assert got == want
    positions = torch.tensor(
        [s + k for s, c in zip(starts, counts, strict=True) for k in range(c)], dtype=torch.int64, device=DEVICE
    )
    got_v = device_kernels.step_slots(bt, row_t, None, qsl, positions, sum(counts), 0).tolist()
    assert got_v == want
