"""Per-path cost of each block-moving operation (``kvref bench --paths``).

``kvref bench`` times whole scheduler phases, which mix several paths of the
manager in one figure. This times each block-moving path on its own, through
the engines' own phase methods (:mod:`kvref.bench_engines`, the object API:
one call per request), on ``R`` requests at a time, one clock pair around the
whole batch of ``R`` operations of one path:

* ``admit-miss``: ``get_computed_blocks`` (no hit) and ``allocate_slots`` of
  a new request's first 256-token prefill chunk (16 blocks taken per group,
  16 cached);
* ``chunk``: the same requests' second 256-token chunk (16 taken, 16 cached);
* ``admit-hits``: ``get_computed_blocks`` and ``allocate_slots`` of a new
  191-token request whose first 128 tokens are cached (8 hit blocks
  touched, 4 taken, 3 cached);
* ``fill``: a decode token that completes a block (nothing taken, one block
  cached);
* ``take``: the next decode token, which needs a fresh block (one taken,
  nothing cached);
* ``free``: ``free`` of every request (13 and 32 blocks per group).

Each timed region holds the engine's loop over the ``R`` requests and its
calls, nothing else; the request advancing between the paths (computed
tokens, the sampled token) is not timed. The scheduler callback of the two
admissions (how many tokens to schedule) runs inside their regions, the same
for every engine. Every engine must return the same block ids
(:class:`kvref.bench.BenchMismatch`). Reported: µs per operation, the median
over the repeats (engines round-robin, a full collection before each run,
the collector off during it), and the ratio to vLLM; by default on this
thread's CPU time (:data:`kvref.bench.CLOCKS`).
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvref.bench import CLOCKS, BenchMismatch, Workload, available_engines, clock_overhead

PATHS = ("admit-miss", "chunk", "admit-hits", "fill", "take", "free")
"""The timed paths, in the order they run."""
ENGINES = ("vllm", "impl-native", "impl-python")
"""The engines timed by default."""
REQUESTS = 128
"""Requests per path and run."""
PREFIX, HIT_PROMPT, CHUNK, LONG_PROMPT = 128, 191, 256, 512
BLOCK_SIZE = 16


def workload(mix: str) -> Workload:
    """The configuration the paths run on: 16-token blocks, room for every request at once."""
    return Workload(mix=mix, num_blocks=16384, prompt_len=(HIT_PROMPT, LONG_PROMPT), block_size=BLOCK_SIZE)


@dataclass
class PathRow:
    """One engine's median µs per operation on each path."""

    engine: str
    us: dict[str, float]
    x_vs_vllm: dict[str, float | None]


def run_once(
    engine: Any, requests: int = REQUESTS, seed: int = 0, clock: Callable[[], float] = time.thread_time
) -> tuple[dict[str, float], list[Any]]:
    """Seconds per operation of one engine on each path, and every result
    (block ids); each path's clock-pair overhead is subtracted."""
    overhead = clock_overhead(clock)
    rng = random.Random(seed)
    prefix = [rng.randrange(32000) for _ in range(PREFIX)]
    longs = [f"c{i}" for i in range(requests)]
    hits = [f"h{i}" for i in range(requests)]
    prompts = {rid: [rng.randrange(32000) for _ in range(LONG_PROMPT)] for rid in longs}
    prompts |= {rid: prefix + [rng.randrange(32000) for _ in range(HIT_PROMPT - PREFIX)] for rid in hits}
    prompts["warm"] = [*prefix, rng.randrange(32000)]
    for rid, prompt in prompts.items():
        engine.add(rid, prompt)
    results: list[Any] = []
    sec: dict[str, float] = {}
    computed: dict[str, int] = {}

    def admit(path: str, rids: Sequence[str], first: int | None) -> None:
        def chunk(rid: str, hit: int) -> int:
            return (first or len(prompts[rid])) - hit

        t = clock()
        got = engine.admit(rids, chunk)
        sec[path] = clock() - t
        if len(got) != len(rids) or got[-1][2] is None:
            raise BenchMismatch(f"{engine.name}: {path}: the pool is too small")
        for rid, (hit, n, raw) in zip(rids, got, strict=True):
            results.append(engine.ids(raw))
            computed[rid] = hit + n
        advance(rids, sample=first is None)

    def run(path: str, rids: Sequence[str], news: Sequence[int]) -> None:
        t = clock()
        raw, done, fitted = engine.run(rids, news)
        sec[path] = clock() - t
        if done != len(rids) or not fitted:
            raise BenchMismatch(f"{engine.name}: {path}: the pool is too small")
        results.extend(engine.run_ids(raw))
        for rid, n in zip(rids, news, strict=True):
            computed[rid] += n
        advance(rids, sample=True)

    def advance(rids: Sequence[str], sample: bool) -> None:
        items = []
        for rid in rids:
            done = computed[rid] >= len(prompts[rid])
            token = rng.randrange(32000) if sample and done else None
            if token is not None:
                prompts[rid] = [*prompts[rid], token]
            items.append((rid, computed[rid], 0, token))
        engine.prepare_advance(items)
        engine.advance(items)

    engine.step()
    admit("warm", ["warm"], None)  # caches the shared prefix
    engine.step()
    admit("admit-miss", longs, CHUNK)
    engine.step()
    run("chunk", longs, [CHUNK] * requests)
    engine.step()
    admit("admit-hits", hits, None)
    engine.step()
    run("fill", hits, [1] * requests)
    engine.step()
    run("take", hits, [1] * requests)
    t = clock()
    engine.free([*hits, *longs])
    sec["free"] = (clock() - t - overhead) / 2 + overhead  # per request: 2 * requests were freed
    return {p: max(0.0, sec[p] - overhead) / requests for p in PATHS}, results


def bench_paths(
    mix: str, repeats: int, only: Sequence[str] | None = None, requests: int = REQUESTS, clock: str = "cpu"
) -> list[PathRow]:
    """Median µs per operation of each engine on each path (see the module docstring).

    Raises:
        BenchMismatch: If two engines allocated different blocks.
    """
    builders = available_engines(workload(mix).config())
    names = [n for n in (only or ENGINES) if n in builders]
    per: dict[str, dict[str, list[float]]] = {n: {p: [] for p in PATHS} for n in names}
    reference: list[Any] | None = None
    for _ in range(repeats):
        for name in names:
            engine = builders[name]()
            gc.collect()
            gc.disable()
            try:
                sec, results = run_once(engine, requests, clock=CLOCKS[clock])
            finally:
                gc.enable()
            if reference is None:
                reference = results
            elif results != reference:
                raise BenchMismatch(f"{name} allocated different blocks than {names[0]} on the same paths")
            for p in PATHS:
                per[name][p].append(sec[p] * 1e6)
    med = {n: {p: statistics.median(per[n][p]) for p in PATHS} for n in names}
    base = med.get("vllm")
    return [
        PathRow(n, med[n], {p: (base[p] / med[n][p] if base and med[n][p] else None) for p in PATHS}) for n in names
    ]
