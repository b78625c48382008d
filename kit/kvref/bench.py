"""``kvref bench``: the scheduler-facing cost of KV-cache managers on one workload.

A seeded workload (requests sharing a few system prompts, prompt and decode
lengths drawn from ranges) is driven by a small scheduler loop shaped like
vLLM's: each step first gives every running request its next chunk or decode
token, oldest first (when the pool is full, the newest running request is
preempted and the loop goes on with the next request), then admits waiting
requests (prefix lookup, then ``allocate_slots``) up to the batch size, and
only then, as vLLM's ``update_from_output`` does, advances the scheduled
requests, samples their tokens and frees the finished ones.

Each engine (:mod:`kvref.bench_engines`) runs the identical loop in this one
process through its own API, and every phase of a step is timed as a whole
(one clock pair per phase, not per call: for a fast engine a per-call clock
costs as much as the call): ``step`` (``new_step_starts``), ``running``
(the running requests' allocations, preemptions included), ``admit`` (lookups
and admissions), ``advance`` (request advancing: computed tokens, status,
the sampled token, its block hash when a block fills), ``free`` (finished
requests) and ``tables`` (device-table sync and reads). The scheduler's own
decisions (which requests, how many tokens) are taken outside the phases, the
same for every engine. Every allocation result must be the same block ids on
every engine, otherwise the run stops with :class:`BenchMismatch`.

Reported per engine: µs per *request-step* (a request-step is one request
advanced by one scheduler step, i.e. one successful allocation) in each
phase, the manager phases together and everything together, and the ratio to
vLLM (above 1: faster).
"""

from __future__ import annotations

import gc
import random
import statistics
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvref.adapters import AdapterFactory
from kvref.exits import InputError
from kvref.scheduler import ReqState
from kvref.scheduler_chunks import schedule_chunk
from kvref.shapes import BENCH_MIXES, build_kinds, shape_named
from kvspec.config import AttentionKind, KVCacheConfig, SlidingWindow
from kvspec.profiles import VLLM_0_25_1, SemanticsProfile

Ids = tuple[tuple[int, ...], ...]

MIXES = (*BENCH_MIXES, "full+swa+mamba-all", "mla+swa@2x")
"""The group mixes ``kvref bench`` takes: the kit's :data:`kvref.shapes.BENCH_MIXES`
(full, full+swa, full+mamba-all) and two hybrids of three and two kinds."""


class BenchMismatch(RuntimeError):
    """Two engines allocated different blocks for the same workload."""


SWA_WINDOW_CAP = 1024
"""The reference anchor's window (full attention + sliding window 1024)."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Workload:
    """Scheduler workload parameters (defaults: a small version of the
    anchor run measured on vLLM 0.25.1, which used 2,000 requests, 512-2,048-token
    prompts, 64-256 decode steps, 64 running and 8,192 blocks)."""

    num_requests: int = 300
    num_prefixes: int = 4
    prompt_len: tuple[int, int] = (128, 512)
    decode_len: tuple[int, int] = (16, 64)
    max_running: int = 64
    chunk: int = 256
    num_blocks: int = 2048
    block_size: int = 16
    mix: str = "full"
    seed: int = 0
    window: int | None = None
    """Sliding window of the full+swa mix; None: :meth:`swa_window`'s choice."""
    profile: SemanticsProfile = VLLM_0_25_1
    """The semantics every engine follows (kvimpl follows 0.25.1)."""

    def swa_window(self) -> int:
        """The window of the full+swa mix: the anchor's 1024 when prompts are
        long enough for it to matter (longest prompt ≥ 2048), else half the
        longest prompt (rounded down to whole blocks), so that the window
        still slides within a request."""
        if self.window is not None:
            return self.window
        half = self.prompt_len[1] // 2 // self.block_size * self.block_size
        return min(SWA_WINDOW_CAP, max(self.block_size, half))

    def groups(self) -> tuple[AttentionKind, ...]:
        """The group mix (one of :data:`kvref.shapes.BENCH_MIXES`)."""
        if self.mix not in MIXES:
            raise ValueError(f"unknown mix {self.mix!r}; choose one of {', '.join(MIXES)}")
        return build_kinds(shape_named(self.mix), self.block_size, self.swa_window())

    def max_model_len(self) -> int:
        """Room for the longest prompt plus the longest decode (at least 4096)."""
        return max(4096, _cdiv(self.prompt_len[1] + self.decode_len[1] + 1, self.block_size) * self.block_size)

    def config(self) -> KVCacheConfig:
        """The manager configuration of this workload."""
        return KVCacheConfig(
            num_blocks=self.num_blocks, groups=self.groups(), max_model_len=self.max_model_len(), profile=self.profile
        )

    def describe(self) -> str:
        """One line for table titles."""
        window = f" (window {self.swa_window()})" if "swa" in self.mix else ""
        return (
            f"{self.mix}{window}, {self.num_requests} requests, prompts {self.prompt_len[0]}-{self.prompt_len[1]}, "
            f"decode {self.decode_len[0]}-{self.decode_len[1]}, {self.num_prefixes} prefixes, "
            f"batch {self.max_running}, {self.num_blocks} blocks"
        )


@dataclass(eq=False)
class _Req:
    """A workload request: its tokens and its scheduler state."""

    rid: str
    prompt: list[int]
    decode: int
    generated: int = 0
    state: ReqState = field(init=False)

    def __post_init__(self) -> None:
        self.state = ReqState(self.rid)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + self.generated


def make_requests(w: Workload) -> list[_Req]:
    """The workload's requests: a shared system prompt plus a private suffix."""
    rng = random.Random(w.seed)
    prefixes = [[rng.randrange(32000) for _ in range(rng.randint(*w.prompt_len) // 2)] for _ in range(w.num_prefixes)]
    out = []
    for i in range(w.num_requests):
        prefix = rng.choice(prefixes) if prefixes else []
        suffix = [rng.randrange(32000) for _ in range(max(1, rng.randint(*w.prompt_len) - len(prefix)))]
        out.append(_Req(f"r{i}", prefix + suffix, rng.randint(*w.decode_len)))
    return out


CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.thread_time, "wall": time.perf_counter}
"""The clocks a benchmark can time with: ``cpu``, this thread's CPU time (the
default), or ``wall``, elapsed time.

NOTE: on a shared, loaded machine the wall clock times the other processes
too: at load 9 on 2 CPUs a phase's elapsed time was 3-8 times its CPU time,
varying from run to run by as much (the pure-Python ``free`` path of
``kvref bench --paths``: 20-21 µs CPU, 65-180 µs elapsed), and a short
phase (the native ``free``, under 1 ms per run in all) takes 1-2 µs per
request-step from one descheduling. CPU time leaves out the time the thread
waits; it includes system time, page faults and cache misses. Its clock
costs about 1.4 µs per read here (a system call), so every region's cost of
one clock pair is measured (:func:`clock_overhead`) and subtracted."""


def clock_overhead(clock: Callable[[], float], samples: int = 2001) -> float:
    """Seconds an empty timed region measures with ``clock`` (the median of ``samples``)."""
    out = []
    for _ in range(samples):
        t = clock()
        out.append(clock() - t)
    return statistics.median(out)


PHASES = ("step", "running", "admit", "advance", "free", "tables")
"""The timed phases of a scheduler step, in order."""
MANAGER_PHASES = ("step", "running", "admit", "free")
"""The phases spent inside the manager (the rest is request advancing and device tables)."""


@dataclass
class RunResult:
    """What one engine did on the workload (identical on every engine), and its time per phase."""

    results: list[Ids | None]
    """Every allocation result, in order."""
    request_steps: int = 0
    """Requests advanced by one scheduler step (successful allocations)."""
    steps: int = 0
    preemptions: int = 0
    running_allocs: int = 0
    """Allocations made in the running phase."""
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    regions: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PHASES, 0))
    """Timed regions per phase (each holds one clock pair's overhead)."""


def run(engine: Any, w: Workload, clock: Callable[[], float] = time.thread_time) -> RunResult:
    """Drive one engine (:mod:`kvref.bench_engines`) through the workload, timing each phase as a whole."""
    reqs = make_requests(w)
    by_id = {r.rid: r for r in reqs}
    config = w.config()
    waiting: list[_Req] = list(reqs)
    running: list[_Req] = []
    res = RunResult([])
    sec = res.seconds
    tokens = random.Random(w.seed + 1)
    for r in reqs:
        engine.add(r.rid, r.prompt)

    def chunk(rid: str, hit: int) -> int:
        return schedule_chunk(config, by_id[rid].num_tokens, hit, w.chunk)

    regions = res.regions
    while waiting or running:
        t = clock()
        engine.step()
        sec["step"] += clock() - t
        regions["step"] += 1
        res.steps += 1
        scheduled: list[tuple[_Req, int, int]] = []
        """(request, tokens scheduled, growth of its computed tokens: hits count for an admission)"""
        # Running phase: oldest first; a failure preempts the newest running request.
        todo = [(r, schedule_chunk(config, r.num_tokens, r.state.computed, w.chunk)) for r in running]
        while todo:
            rids, news = [r.rid for r, _ in todo], [n for _, n in todo]
            t = clock()
            raw, done, fitted = engine.run(rids, news)
            sec["running"] += clock() - t
            regions["running"] += 1
            res.results.extend(engine.run_ids(raw))
            res.running_allocs += done
            scheduled.extend((r, n, n) for r, n in (todo[:done] if fitted else todo[: done - 1]))
            if fitted:
                break
            victim = running.pop()
            t = clock()
            engine.preempt(victim.rid)
            sec["running"] += clock() - t
            regions["running"] += 1
            victim.state.preempted()
            waiting.insert(0, victim)
            res.preemptions += 1
            todo = [(r, n) for r, n in todo[done:] if r is not victim]
        # Waiting phase: admit up to the batch size, stop at the first that does not fit.
        room = w.max_running - len(running)
        if waiting and room > 0:
            cands = waiting[:room]
            t = clock()
            admitted = engine.admit([r.rid for r in cands], chunk)
            sec["admit"] += clock() - t
            regions["admit"] += 1
            for r, (hit, n_new, raw) in zip(cands, admitted, strict=False):
                out = engine.ids(raw)
                res.results.append(out)
                if out is None:
                    break
                waiting.remove(r)
                r.state.admitted(hit)
                running.append(r)
                scheduled.append((r, n_new, hit + n_new))
        # Update phase (vLLM's update_from_output): advance, sample, free the finished.
        res.request_steps += len(scheduled)
        finished: list[str] = []
        items: list[tuple[str, int, int, int | None]] = []
        for r, n, grown in scheduled:
            r.state.computed += n
            token = None
            if r.state.computed == r.num_tokens:
                if r.generated == r.decode:
                    finished.append(r.rid)
                    continue
                r.generated += 1
                token = tokens.randrange(32000)
            items.append((r.rid, r.state.computed, grown, token))
        engine.prepare_advance(items)
        t = clock()
        engine.advance(items)
        sec["advance"] += clock() - t
        regions["advance"] += 1
        if finished:
            done_ids = set(finished)
            running = [r for r in running if r.rid not in done_ids]
            t = clock()
            engine.free(finished)
            sec["free"] += clock() - t
            regions["free"] += 1
        t = clock()
        engine.tables()
        sec["tables"] += clock() - t
        regions["tables"] += 1
    return res


def check_workload(w: Workload) -> None:
    """Refuse a workload that cannot make progress.

    The loop admits the oldest waiting request when it fits; a request that
    can never fit (the pool holds fewer blocks than its longest sequence
    needs in every group) would stay at the head of the queue forever.

    Raises:
        InputError: Naming the pool size and the blocks one request needs.
    """
    if w.num_requests < 1 or w.max_running < 1 or w.chunk < 1:
        raise InputError("the workload needs at least one request, one running slot and a chunk of one token")
    longest = min(w.prompt_len[1] + w.decode_len[1], w.max_model_len())
    need = 0
    for kind in w.groups():
        tokens = longest
        if isinstance(kind, SlidingWindow):  # only the window (and the chunk being computed) is held
            tokens = min(longest, kind.window - 1 + w.chunk)
        need += -(-tokens // kind.block_size) + (1 if isinstance(kind, SlidingWindow) else 0)
    if w.num_blocks - 1 < need:
        raise InputError(
            f"--blocks {w.num_blocks}: the pool ({w.num_blocks - 1} usable blocks) cannot hold one request of "
            f"{longest} tokens, which needs up to {need} blocks in all groups; use --blocks {need + 1} or more"
        )


def available_engines(
    config: KVCacheConfig, extra: Mapping[str, AdapterFactory] | None = None
) -> dict[str, Callable[[], Any]]:
    """Engine builders for every implementation installed here
    (:func:`kvref.bench_engines.engine_builders`), plus an engine per adapter
    factory of ``extra`` (driven through its facade like kvspec, with kvspec
    request values)."""
    from kvref.bench_engines import SpecEngine, engine_builders  # noqa: PLC0415 - imports kvimpl and vLLM

    engines = engine_builders(config)
    for name, factory in (extra or {}).items():

        def build(f: AdapterFactory = factory, n: str = name) -> Any:
            engine = SpecEngine(config)
            engine.name, engine.manager = n, f(config)
            return engine

        engines[name] = build
    return engines


@dataclass
class BenchRow:
    """One engine's result (medians over the repeats)."""

    engine: str
    calls: int
    """Allocate calls (a batched call counts once)."""
    allocs: int
    """Allocations (one per request per call; the same on every engine)."""
    request_steps: int
    us: dict[str, float]
    """µs per request-step in each phase (:data:`PHASES`)."""
    us_per_running_alloc: float = 0.0
    """Running-phase time per running-phase allocation."""
    x_total_vs_vllm: float | None = None
    """vLLM's total µs per request-step / this engine's (above 1: faster)."""
    x_manager_vs_vllm: float | None = None
    """The same for the manager phases only (:data:`MANAGER_PHASES`)."""
    x_running_vs_vllm: float | None = None
    """The same for the running phase alone."""

    @property
    def total(self) -> float:
        """µs per request-step, every phase."""
        return sum(self.us.values())

    @property
    def manager(self) -> float:
        """µs per request-step inside the manager."""
        return sum(self.us[p] for p in MANAGER_PHASES)

    @property
    def us_per_request_step(self) -> float:
        """Same as :attr:`total`."""
        return self.total


def bench(
    w: Workload,
    repeats: int = 5,
    only: Sequence[str] | None = None,
    skip: Sequence[str] = (),
    extra: Mapping[str, AdapterFactory] | None = None,
    progress: Callable[[str], None] | None = None,
    clock: str = "cpu",
) -> list[BenchRow]:
    """Median µs per request-step of each engine in each phase over
    ``repeats`` runs (round-robin across engines, a full GC before each run,
    the collector off during it), after checking that all engines produced
    the same block ids. ``clock``: one of :data:`CLOCKS`; each region's clock
    overhead is subtracted.

    Raises:
        InputError: For an engine that is not available, or a workload that
            cannot make progress (:func:`check_workload`).
        BenchMismatch: If two engines allocated different blocks.
    """
    check_workload(w)
    builders = available_engines(w.config(), extra)
    unknown = sorted(set(only or ()) - set(builders))
    if unknown:
        raise InputError(f"engine(s) {', '.join(unknown)} not available here; available: {', '.join(builders)}")
    names = [n for n in builders if (only is None or n in only) and n not in skip]
    if not names:
        raise InputError(f"no engine to time: asked for {list(only or ())}, available {list(builders)}")
    per_phase: dict[str, dict[str, list[float]]] = {n: {p: [] for p in PHASES} for n in names}
    per_run: dict[str, list[float]] = {n: [] for n in names}
    counts: dict[str, tuple[int, int]] = {}
    reference: RunResult | None = None
    timer = CLOCKS[clock]
    for _ in range(repeats):
        for name in names:  # round-robin, so machine noise hits every engine alike
            if progress is not None:
                progress(name)
            engine = builders[name]()
            gc.collect()
            gc.disable()
            try:
                overhead = clock_overhead(timer)
                result = run(engine, w, timer)
            finally:
                gc.enable()
            if reference is None:
                reference = result
            elif result.results != reference.results or result.request_steps != reference.request_steps:
                raise BenchMismatch(f"{name} allocated different blocks than {names[0]} on the same workload")
            steps = max(result.request_steps, 1)
            net = {p: max(0.0, result.seconds[p] - result.regions[p] * overhead) for p in PHASES}
            for p in PHASES:
                per_phase[name][p].append(net[p] / steps * 1e6)
            per_run[name].append(net["running"] / max(result.running_allocs, 1) * 1e6)
            counts[name] = (engine.calls, engine.allocs)
    steps = 0 if reference is None else reference.request_steps
    rows = [
        BenchRow(
            n,
            counts[n][0],
            counts[n][1],
            steps,
            {p: statistics.median(per_phase[n][p]) for p in PHASES},
            statistics.median(per_run[n]),
        )
        for n in names
    ]
    base = next((r for r in rows if r.engine == "vllm"), None)
    if base is not None:
        for r in rows:
            r.x_total_vs_vllm = base.total / r.total if r.total else None
            r.x_manager_vs_vllm = base.manager / r.manager if r.manager else None
            running = r.us["running"]
            r.x_running_vs_vllm = base.us["running"] / running if running else None
    return rows


# --- sweeps ------------------------------------------------------------------

SWEEP_BATCHES = (32, 64, 128, 256, 512, 1024)
SWEEP_POOLS = (8192, 32768, 131072, 524288)
POOL_SWEEP_BATCH = 128
POOL_SWEEP_REQUESTS = 512
SWEEP_REPEATS = 3
SPEC_MAX_SWEEP_POOL = 32768
"""kvspec's free queue is a plain sequence (O(pool) per take/free, by design:
it is the executable specification), so pool sweeps leave it out above this
size unless asked for by name (``only``)."""


def batch_sweep_requests(batch: int) -> int:
    """Requests per batch-sweep point: twice the batch (at least 256), so
    large batches stay full for about half the run without taking long."""
    return max(256, 2 * batch)


def pool_for_batch(w: Workload, batch: int) -> int:
    """A pool that holds ``batch`` requests of the longest length in every
    group with a quarter to spare (no preemption), at least ``w.num_blocks``."""
    per_req = _cdiv(w.prompt_len[1] + w.decode_len[1] + 1, w.block_size) * len(w.groups())
    return max(w.num_blocks, _cdiv(batch * per_req * 5 // 4, 1024) * 1024)


def sweep_workloads(kind: str, base: Workload, points: Sequence[int] | None = None) -> list[tuple[int, Workload]]:
    """The workloads of a sweep over running-batch sizes (``batch``) or
    pool sizes in blocks (``pool``); mix, lengths, prefixes and seed come
    from ``base``."""
    if kind == "batch":
        xs = tuple(points) if points is not None else SWEEP_BATCHES
        return [
            (b, replace(base, max_running=b, num_requests=batch_sweep_requests(b), num_blocks=pool_for_batch(base, b)))
            for b in xs
        ]
    if kind == "pool":
        xs = tuple(points) if points is not None else SWEEP_POOLS
        return [
            (p, replace(base, max_running=POOL_SWEEP_BATCH, num_requests=POOL_SWEEP_REQUESTS, num_blocks=p)) for p in xs
        ]
    raise ValueError(f"unknown sweep {kind!r}; choose batch or pool")


@dataclass
class SweepPoint:
    """One point of a sweep."""

    x: int
    workload: Workload
    rows: list[BenchRow]


def sweep(
    kind: str,
    base: Workload,
    repeats: int = SWEEP_REPEATS,
    only: Sequence[str] | None = None,
    points: Sequence[int] | None = None,
    progress: Callable[[int, Workload], None] | None = None,
    extra: Mapping[str, AdapterFactory] | None = None,
    clock: str = "cpu",
) -> list[SweepPoint]:
    """:func:`bench` at every point of a sweep."""
    out = []
    for x, w in sweep_workloads(kind, base, points):
        if progress is not None:
            progress(x, w)
        skip = ("spec",) if only is None and w.num_blocks > SPEC_MAX_SWEEP_POOL else ()
        out.append(SweepPoint(x, w, bench(w, repeats=repeats, only=only, skip=skip, extra=extra, clock=clock)))
    return out


def sweep_engines(points: Sequence[SweepPoint]) -> list[str]:
    """Every engine measured at some point of the sweep, in first-seen order."""
    return list(dict.fromkeys(r.engine for p in points for r in p.rows))


def plot_sweep(kind: str, points: Sequence[SweepPoint], path: Path, title: str) -> bool:
    """µs per request-step per engine against the sweep's x (log-log) as a
    PNG; False (and nothing written) when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: PLC0415 - optional extra "plot"

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in sweep_engines(points):
        xy = [(p.x, r.us_per_request_step) for p in points for r in p.rows if r.engine == name]
        ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks([p.x for p in points], [str(p.x) for p in points])
    ax.set_yscale("log")
    ax.set_xlabel("running requests (batch)" if kind == "batch" else "pool size (blocks)")
    ax.set_ylabel("µs per request-step (median)")
    ax.set_title(textwrap.fill(title, 100), fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
