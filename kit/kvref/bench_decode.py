"""Steady-state decode cost per request-step of every engine (``kvref bench --steady-decode R``).

``kvref bench`` times whole scheduler workloads (admissions, chunked prefill,
preemption). This isolates steady decode: ``R`` running requests, all past
their prompt, each scheduled one token per step, for ``S`` steps, through
the same engines and phase methods (:mod:`kvref.bench_engines`): per step
one ``run`` (the allocations: per request, one batch call, or one array
call) and one ``advance`` (computed tokens, the sampled token, its block
hash when a block fills), each timed as a whole. Every engine gets the same
prompts and tokens; the allocated block ids are compared per step. Engines
alternate, repeats take the best (lowest) run.

The array engine (``impl-native-array``) is driven as a scheduler holding
int32 buffers would drive it (:func:`run_array`): the running requests'
handles and the per-request token counts (all ones) are built once, before
the first step, and every step makes one ``allocate_slots_array`` call and
one ``advance_array`` call on them. Its timed allocation region holds that
call and the scheduler's check that every request got its slots (one
comparison of the call's ``first_unfitted`` position with -1); its timed
advance region holds the
``advance_array`` call alone, on the step's sampled tokens, which the model
runner hands over as an int32 buffer (built here outside the region).
"""

from __future__ import annotations

import gc
import os
import random
import time
from array import array
from collections.abc import Callable
from typing import Any

from kvref.bench import CLOCKS, Workload, available_engines, clock_overhead
from kvref.bench_engines import Advance, split_array

STEPS = 128
"""Decode steps per run."""


def workload(mix: str, running: int) -> Workload:
    """The decode workload: prompts of 100-300 tokens and a pool with room for all of them."""
    return Workload(num_blocks=max(8192, running * 64), mix=mix, prompt_len=(100, 300), max_running=running)


def start_decode(engine: Any, name: str, running: int, rng: random.Random) -> tuple[list[str], dict[str, int]]:
    """Add ``running`` requests (``r0``, ``r1``, ...) with prompts of 100-300
    random tokens, admit them all and advance each by its first decoded token:
    the request ids and each one's computed tokens. A pool too small for them
    all stops the benchmark with a message naming ``name``."""
    rids = [f"r{i}" for i in range(running)]
    prompts = {rid: [rng.randrange(32000) for _ in range(rng.randint(100, 300))] for rid in rids}
    for rid in rids:
        engine.add(rid, prompts[rid])
    engine.step()
    admitted = engine.admit(rids, lambda rid, hit: len(prompts[rid]) - hit)
    if len(admitted) < running or admitted[-1][2] is None:
        raise SystemExit(f"{name}: the pool is too small for {running} requests")
    computed = {rid: hit + n for rid, (hit, n, _) in zip(rids, admitted, strict=True)}
    first = [(rid, computed[rid], computed[rid], rng.randrange(32000)) for rid in rids]
    engine.prepare_advance(first)
    engine.advance(first)
    return rids, computed


def run_once(
    name: str, mix: str, running: int, steps: int, clock: Callable[[], float] = time.thread_time
) -> tuple[float, float, list[Any]]:
    """Seconds per request-step of one engine in the allocation and the
    advancing phase (each region's clock-pair overhead subtracted), and its
    per-step results."""
    w = workload(mix, running)
    engine: Any = available_engines(w.config())[name]()
    rng = random.Random(0)
    rids, computed = start_decode(engine, name, running, rng)
    overhead = clock_overhead(clock) * steps
    if getattr(engine, "api", None) == "array":
        return run_array(engine, rids, rng, steps, clock, overhead)
    ones = [1] * running
    results: list[Any] = []
    alloc = adv = -overhead
    gc.collect()
    gc.disable()
    try:
        for _ in range(steps):
            engine.step()
            t = clock()
            raw, done, fitted = engine.run(rids, ones)
            alloc += clock() - t
            if done != running or not fitted:
                raise SystemExit(f"{name}: a decode step did not fit")
            results.append(engine.run_ids(raw))
            items: list[Advance] = []
            for rid in rids:
                computed[rid] += 1
                items.append((rid, computed[rid], 1, rng.randrange(32000)))
            engine.prepare_advance(items)
            t = clock()
            engine.advance(items)
            adv += clock() - t
            engine.tables()
    finally:
        gc.enable()
    n = running * steps
    return alloc / n, adv / n, results


def run_array(
    engine: Any, rids: list[str], rng: random.Random, steps: int, clock: Callable[[], float], overhead: float
) -> tuple[float, float, list[Any]]:
    """:func:`run_once` for the array engine, on buffers held across steps (see the module docstring)."""
    mgr, groups = engine.manager, engine.groups
    handles = array("i", [engine.handle_of[rid] for rid in rids])
    ones = array("i", [1] * len(rids))
    allocate, advance = mgr.allocate_slots_array, mgr.advance_array
    results: list[Any] = []
    alloc = adv = -overhead
    gc.collect()
    gc.disable()
    try:
        for _ in range(steps):
            engine.step()
            t = clock()
            counts, ids, first_unfitted = allocate(handles, ones)
            fitted = first_unfitted < 0
            alloc += clock() - t
            if not fitted:
                raise SystemExit(f"{engine.name}: a decode step did not fit")
            results.append(split_array(counts, ids, len(rids), groups))
            tokens = array("i", [rng.randrange(32000) for _ in rids])
            t = clock()
            advance(handles, ones, tokens)
            adv += clock() - t
            engine.tables()
    finally:
        gc.enable()
    n = len(rids) * steps
    return alloc / n, adv / n, results


ENGINES = ("vllm", "impl-python", "impl-python-batched", "impl-native", "impl-native-batched", "impl-native-array")
"""The engines timed (kvspec is left out: its immutable requests are copied per step, by design)."""


def report(mix: str, running: int, steps: int, repeats: int, clock: str = "cpu") -> int:
    """Print µs per request-step (allocation, advancing, both) and the ratio to vLLM for each engine."""
    there = available_engines(workload(mix, running).config())
    names = [n for n in ENGINES if n in there]
    best: dict[str, tuple[float, float]] = {}
    reference: list[Any] | None = None
    load = os.getloadavg()
    for _ in range(repeats):
        for name in names:
            a, v, results = run_once(name, mix, running, steps, CLOCKS[clock])
            if reference is None:
                reference = results
            elif results != reference:
                raise SystemExit(f"{name} allocated different blocks than {names[0]}")
            if name not in best or a + v < sum(best[name]):
                best[name] = (a, v)
    base = best.get("vllm")
    print(
        f"steady decode, {mix}, {running} running requests x {steps} steps, best of {repeats}, {clock} clock; "
        "µs per request-step"
    )
    print(f"  {'engine':20s} {'allocate':>9s} {'x vLLM':>8s} {'advance':>9s} {'total':>9s} {'x vLLM':>8s}")
    for name in names:
        a, v = best[name]
        xa = f"{base[0] / a:7.1f}x" if base else "      -"
        xt = f"{sum(base) / (a + v):7.1f}x" if base else "      -"
        print(f"  {name:20s} {a * 1e6:9.3f} {xa:>8s} {v * 1e6:9.3f} {(a + v) * 1e6:9.3f} {xt:>8s}")
    after = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} before, {after[0]:.2f} {after[1]:.2f} "
          f"{after[2]:.2f} after, on {os.cpu_count()} CPUs")  # fmt: skip
    print("identical block ids on every engine")
    return 0
