"""Steady-state decode cost per request-step: kvimpl (per request and batched) vs vLLM 0.25.1.

``kvref bench`` times whole scheduler workloads (admissions, chunked prefill,
preemption). This script isolates steady decode:
``R`` running requests, all past their prompt, each scheduled one token per
step, for ``S`` steps. Every engine gets the same prompts and tokens; the
allocated block ids are compared per step. Timed: only the allocate calls
(one ``allocate_slots`` per request, or one ``allocate_slots_batch`` per
step); the request bookkeeping between steps is not. Engines alternate,
repeats take the best (lowest) run, and the ratios are from this one run.

Usage: ``kvref bench --steady-decode 256 [--mix full|full+swa] [--repeats 3]`` (128 steps).
"""

from __future__ import annotations

import gc
import random
import time
from typing import Any

from kvref.bench import Workload, available_engines


def run_once(name: str, mix: str, running: int, steps: int) -> tuple[float, list[Any]]:
    """Seconds per request-step of one engine, and its per-step results."""
    w = Workload(num_blocks=max(8192, running * 64), mix=mix, prompt_len=(100, 300))
    engine: Any = available_engines(w.config())[name]()
    rng = random.Random(0)
    rids = [f"r{i}" for i in range(running)]
    for rid in rids:
        engine.add(rid, [rng.randrange(32000) for _ in range(rng.randint(100, 300))])
    computed: dict[str, int] = {}
    for rid in rids:
        n = engine.reqs[rid].num_tokens
        if engine.allocate(rid, n, 0, None) is None:
            raise SystemExit(f"{name}: the pool is too small for {running} requests")
        computed[rid] = n
        engine.advance(rid, n, True, rng.randrange(32000))
    manager, reqs, ones = engine.manager, engine.reqs, [1] * running
    results: list[Any] = []
    seconds = 0.0
    gc.collect()
    gc.disable()
    try:
        for _ in range(steps):
            batch = [reqs[rid] for rid in rids]
            t = time.perf_counter()
            if name == "impl-batched":
                out = manager.allocate_slots_batch(batch, ones)
            elif name == "vllm":
                out = [manager.allocate_slots(r, 1, 0, None) for r in batch]
            else:
                out = [manager.allocate_slots(r, 1) for r in batch]
            seconds += time.perf_counter() - t
            if name == "vllm":
                out = [None if o is None else tuple(tuple(b.block_id for b in g) for g in o.blocks) for o in out]
            results.append(out)
            for rid in rids:
                computed[rid] += 1
                engine.advance(rid, computed[rid], True, rng.randrange(32000))
    finally:
        gc.enable()
    return seconds / (running * steps), results


def report(mix: str, running: int, steps: int, repeats: int) -> int:
    """Print µs per request-step and the ratio to vLLM for each engine."""
    names = [n for n in ("impl", "impl-batched", "vllm") if n in available_engines(Workload(mix=mix).config())]
    best: dict[str, float] = {}
    reference: list[Any] | None = None
    for _ in range(repeats):
        for name in names:
            sec, results = run_once(name, mix, running, steps)
            if reference is None:
                reference = results
            elif results != reference:
                raise SystemExit(f"{name} allocated different blocks than {names[0]}")
            best[name] = min(best.get(name, sec), sec)
    base = best.get("vllm")
    print(f"steady decode, {mix}, {running} running requests x {steps} steps, best of {repeats}")
    for name in names:
        ratio = f"{base / best[name]:.2f}x vLLM" if base else "(vLLM not installed)"
        print(f"  {name:13s} {best[name] * 1e6:7.3f} µs per request-step   {ratio}")
    print("identical block ids on every engine")
    return 0
