"""Device tables in steady decode: the manager, kvimpl's tables and a vLLM-worker-style path, side by side.

``kvref bench --steady-decode R --device D``: ``R`` running requests past
their prompt, one token each per step, for ``S`` steps, on each kvimpl
engine that keeps device tables on ``D`` (``cpu``, ``cpu-copy``, ``cuda``).
Per request-step, three regions, each timed with the wall clock and, on a
GPU, closed by a device synchronisation (so that what a region launched is
counted in it):

* **manager**: the step's allocations and the advance (the engine's
  ``run`` and ``advance``; with device tables the manager also writes the
  changed host rows, and the first write of a step waits for the previous
  copy to the device to have read them);
* **tables**: kvimpl's commit (condense, one copy of the rows in use to the
  device) and the slot mapping of every group for the step's tokens
  (``BlockTable.slot_mappings_for_step``: the step's rows, first positions
  and counts copied once, one fused operation per group: a Triton kernel on
  CUDA, vectorized tensor operations elsewhere);
* **vLLM worker**: what vLLM's model runner does for the same step with its
  own ``MultiGroupBlockTable`` (``vllm/v1/worker/block_table.py``, the
  installed release): ``append_row`` of each request's new blocks, the step's
  positions and query start locations built in numpy and copied to the
  device, ``commit_block_table``, and ``compute_slot_mapping`` of every group
  (vLLM's Triton kernel where it runs; on a machine without Triton the same
  arithmetic as a few tensor operations, which the column header says).
  Without vLLM the column is left out.

Both sides' slots are compared on every 16th step outside the timed regions
(the benchmark measures the same work on both). The engines alternate and
each keeps the best (lowest total) of ``repeats`` runs.
"""

from __future__ import annotations

import gc
import os
import random
import time
from array import array
from collections.abc import Callable
from typing import Any

from kvref.bench import Workload
from kvref.bench_decode import start_decode, workload
from kvref.bench_engines import ImplEngine

ENGINES: tuple[tuple[str, bool, str], ...] = (
    ("impl-native-array", True, "array"),
    ("impl-native", True, "object"),
    ("impl-python-batched", False, "batch"),
)
"""(name, native, api) of the engines timed with device tables."""

CHECK_EVERY = 16
"""Steps between two comparisons of kvimpl's slots with the worker-style path's."""


class WorkerTables:
    """vLLM's ``MultiGroupBlockTable`` driven as its model runner drives it in steady decode."""

    def __init__(self, w: Workload, device: Any, running: int) -> None:
        import inspect  # noqa: PLC0415

        import torch  # noqa: PLC0415
        from vllm.v1.worker import block_table as vbt  # noqa: PLC0415 - vLLM is optional

        config = w.config()
        self.torch = torch
        self.device = device
        sizes = [k.block_size for k in config.groups]
        blocks = [-(config.max_model_len // -b) for b in sizes]
        kwargs: dict[str, Any] = {
            "max_num_reqs": running,
            "max_num_batched_tokens": max(running, 1024),
            "pin_memory": device.type == "cuda",
            "device": device,
            "block_sizes": sizes,
            "max_num_blocks": blocks,
        }
        params = inspect.signature(vbt.MultiGroupBlockTable.__init__).parameters
        if "max_model_len" in params:
            kwargs["max_model_len"] = config.max_model_len
        if "kernel_block_sizes" in params:
            kwargs["kernel_block_sizes"] = sizes
        self.tables: Any = vbt.MultiGroupBlockTable(**kwargs)
        self.groups = len(sizes)
        self.sizes = sizes
        self.kernel = _vllm_kernel_runs(vbt, device)
        self.pin = device.type == "cuda"

    def add(self, row: int, tables: list[list[int]]) -> None:
        self.tables.add_row(tuple(tables), row)

    def step(self, new_ids: list[Any], positions: Any) -> list[Any]:
        """The step's table updates, the commit and the slots of every group."""
        torch = self.torch
        for row, ids in enumerate(new_ids):
            if ids is not None and any(ids):
                self.tables.append_row(tuple(list(g) for g in ids), row)
        n = len(new_ids)
        qsl = torch.arange(n + 1, dtype=torch.int32)
        pos = torch.from_numpy(positions)
        if self.pin:
            qsl, pos = qsl.pin_memory(), pos.pin_memory()
        qsl_d = qsl.to(self.device, non_blocking=True)
        pos_d = pos.to(self.device, non_blocking=True)
        self.tables.commit_block_table(n)
        out = []
        for g in range(self.groups):
            table = self.tables[g]
            if self.kernel:
                table.compute_slot_mapping(n, qsl_d, pos_d)
                out.append(table.slot_mapping.gpu[: len(pos_d)])
            else:
                dev = table.block_table.gpu
                bs = self.sizes[g]
                rows = torch.repeat_interleave(torch.arange(n, device=self.device), qsl_d[1:] - qsl_d[:-1])
                ids = dev[rows, pos_d // bs].to(torch.int64)
                out.append(ids * bs + pos_d % bs)
        return out


def _vllm_kernel_runs(vbt: Any, device: Any) -> bool:
    """Whether vLLM's own slot-mapping kernel runs on ``device`` (CUDA with Triton)."""
    if device.type != "cuda":
        return False
    try:
        import triton  # noqa: F401, PLC0415 - optional
    except ImportError:
        return False
    return True


def run_once(
    name: str, native: bool, api: str, mix: str, running: int, steps: int, device: str, with_worker: bool
) -> tuple[float, float, float | None]:
    """Seconds per request-step of the manager, kvimpl's tables and the worker-style path."""
    import numpy as np  # noqa: PLC0415 - vLLM and torch bring it

    w = workload(mix, running)
    config = w.config()
    engine = ImplEngine(name, config, native, api, tables=device)
    mgr, bt = engine.manager, engine.manager.device_tables
    torch = bt._torch
    sync: Callable[[], None] = torch.cuda.synchronize if bt.device.type == "cuda" else (lambda: None)
    rng = random.Random(0)
    rids, computed = start_decode(engine, name, running, rng)
    worker = WorkerTables(w, bt.device, running) if with_worker else None
    bt.sync()
    if worker is not None:
        rows = bt.rows
        by_row = sorted(rids, key=rows.__getitem__)
        for rid in by_row:
            worker.add(rows[rid], [list(g) for g in mgr.get_block_ids(rid)])
    else:
        by_row = rids
    handles = array("i", [engine.handle_of[rid] for rid in rids]) if api == "array" else None
    ones_list = [1] * running
    ones = array("i", ones_list)
    manager_s = tables_s = worker_s = 0.0
    gc.collect()
    gc.disable()
    try:
        for step in range(steps):
            t0 = time.perf_counter()
            engine.step()
            raw, done, fitted = engine.run(rids, ones_list)
            manager_s += time.perf_counter() - t0
            if done != running or not fitted:
                raise SystemExit(f"{name}: a decode step did not fit")
            items = [(rid, computed[rid] + 1, 1, rng.randrange(32000)) for rid in rids]
            engine.prepare_advance(items)  # untimed, as in the steady-decode benchmark
            t1 = time.perf_counter()
            engine.advance(items)
            sync()
            manager_s += time.perf_counter() - t1
            # kvimpl: the rows of the step's requests, their first positions, one token each.
            t3 = time.perf_counter()
            if handles is not None:
                rows_now = mgr.host_rows_of(handles)
            else:
                row_of = bt.rows
                rows_now = [row_of[r] for r in rids]
            starts = array("i", [computed[r] for r in rids])
            slots = bt.slot_mappings_for_step(rows_now, starts, ones)
            sync()
            t4 = time.perf_counter()
            tables_s += t4 - t3
            if worker is not None:
                new_by_row = _new_ids_by_row(engine, raw, rids, by_row)
                positions = np.fromiter((computed[r] for r in by_row), dtype=np.int64, count=running)
                t5 = time.perf_counter()
                theirs = worker.step(new_by_row, positions)
                sync()
                worker_s += time.perf_counter() - t5
                if step % CHECK_EVERY == 0:
                    _same_slots(name, rids, by_row, slots, theirs)
            for rid in rids:
                computed[rid] += 1
    finally:
        gc.enable()
    n = running * steps
    return manager_s / n, tables_s / n, (worker_s / n if worker is not None else None)


def _new_ids_by_row(engine: Any, raw: Any, rids: list[str], by_row: list[str]) -> list[Any]:
    """The step's new block ids of each request, in the worker's row order."""
    per_request = dict(zip(rids, engine.run_ids(raw), strict=True))
    return [per_request[rid] for rid in by_row]


def _same_slots(name: str, rids: list[str], by_row: list[str], ours: list[Any], theirs: list[Any]) -> None:
    """kvimpl's slots (in request order) equal the worker-style path's (in its row order).

    Raises:
        SystemExit: They differ: the two columns would not time the same work.
    """
    at = {rid: i for i, rid in enumerate(by_row)}
    for g, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        worker = b.tolist()
        if a.tolist() != [worker[at[rid]] for rid in rids]:
            raise SystemExit(f"{name}: group {g}: kvimpl's slots differ from the vLLM-worker-style path's")


def report(mix: str, running: int, steps: int, repeats: int, device: str) -> int:
    """Print µs per request-step of each region and the ratio of kvimpl's tables to the worker-style path."""
    from kvimpl.native import native_module, native_unsupported  # noqa: PLC0415
    from kvref.adapters.vllm import vllm_available  # noqa: PLC0415

    config = workload(mix, running).config()
    engines = [
        e for e in ENGINES if not e[1] or (native_module() is not None and native_unsupported(config) is None)
    ]
    with_worker = vllm_available()
    import torch  # noqa: PLC0415 - the tables need it

    threads_before = torch.get_num_threads()
    threads = ""
    if not device.startswith("cuda"):
        # A step's tensors are tiny: starting the intra-op thread pool costs more than the work
        # (milliseconds per operation on a loaded machine), on both paths alike.
        torch.set_num_threads(1)
        threads = "; torch intra-op threads: 1"
    best: dict[str, tuple[float, float, float | None]] = {}
    load = os.getloadavg()
    try:
        for _ in range(repeats):
            for name, native, api in engines:
                got = run_once(name, native, api, mix, running, steps, device, with_worker)
                if name not in best or got[0] + got[1] < best[name][0] + best[name][1]:
                    best[name] = got
    finally:
        torch.set_num_threads(threads_before)
    kernel = "vLLM's Triton kernel" if device.startswith("cuda") and _triton() else "its formula as tensor operations"
    print(f"device tables in steady decode, {mix}, {running} running x {steps} steps on {device}, best of {repeats}; "
          f"µs per request-step (wall clock, synchronised{threads})")  # fmt: skip
    if with_worker:
        print(f"  vLLM worker: its MultiGroupBlockTable's row updates, input copy and commit; slots by {kernel}")
    else:
        print("  vLLM worker: left out (vLLM is not installed)")
    print(f"  {'engine':22s} {'manager':>9s} {'tables':>9s} {'both':>9s} {'vLLM worker':>12s} {'tables/worker':>14s}")
    for name, *_ in engines:
        m, t, v = best[name]
        ratio = f"{t / v:13.2f}x" if v else "             -"
        worker = f"{v * 1e6:12.3f}" if v is not None else "           -"
        print(f"  {name:22s} {m * 1e6:9.3f} {t * 1e6:9.3f} {(m + t) * 1e6:9.3f} {worker} {ratio}")
    after = os.getloadavg()
    checked = "; slots equal on both paths (checked every 16th step)" if with_worker else ""
    print(f"load average {load[0]:.2f} before, {after[0]:.2f} after, on {os.cpu_count()} CPUs{checked}")
    return 0


def _triton() -> bool:
    try:
        import triton  # noqa: F401, PLC0415 - optional
    except ImportError:
        return False
    return True
