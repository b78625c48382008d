"""``kvref bench``: the same scheduler workload on several KV-cache managers.

A seeded workload (requests sharing a few system prompts, prompt and decode
lengths drawn from ranges) is driven by a small scheduler loop shaped like
vLLM's: each step first gives every running request its next chunk or decode
token, oldest first (when the pool is full, the newest running request is
preempted and the loop goes on with the next request), then admits waiting
requests (prefix lookup, then ``allocate_slots``) up to the batch size, and
only then, as vLLM's ``update_from_output`` does, advances the scheduled
requests, samples their tokens and frees the finished ones.

Each engine runs the identical loop in this one process. Only the time spent
inside the managers' own calls is counted (``new_step_starts``,
``get_computed_blocks``, ``allocate_slots``, ``free``); building and hashing
the requests is the caller's work and is not timed. Every allocation result
must be the same block ids on every engine, otherwise the run stops with
:class:`BenchMismatch`.

Two costs are reported per engine: µs per allocation (time inside the
allocate calls / allocations) and µs per *request-step* (all timed manager
time / request-steps, where a request-step is one request advanced by one
scheduler step, i.e. one successful allocation).

Engines: real vLLM 0.25.1 driven through its own ``Request`` and
``KVCacheManager`` objects (no adapter in the timed path), kvspec, kvimpl
when it exists, and ``impl-batched`` when kvimpl has
``allocate_slots_batch``: the running phase of a step is then one batched
call over all running requests instead of one call each (see
:meth:`BatchedImplEngine.allocate_running` for how preemption stays
identical to the sequential loop).
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
from typing import Any, Protocol

from kvref.adapters import AdapterFactory
from kvref.exits import InputError
from kvref.scheduler import ReqState, schedule_chunk
from kvref.shapes import BENCH_MIXES, build_kinds, shape_named
from kvspec.config import AttentionKind, KVCacheConfig, SlidingWindow
from kvspec.profiles import VLLM_0_25_1, SemanticsProfile
from kvspec.request import Request, RequestBlockHasher, RequestId, RequestStatus

Ids = tuple[tuple[int, ...], ...]

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
        if self.mix not in BENCH_MIXES:
            raise ValueError(f"unknown mix {self.mix!r}; choose one of {', '.join(BENCH_MIXES)}")
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
        window = f" (window {self.swa_window()})" if self.mix == "full+swa" else ""
        return (
            f"{self.mix}{window}, {self.num_requests} requests, prompts {self.prompt_len[0]}-{self.prompt_len[1]}, "
            f"decode {self.decode_len[0]}-{self.decode_len[1]}, {self.num_prefixes} prefixes, "
            f"batch {self.max_running}, {self.num_blocks} blocks"
        )


class Engine(Protocol):
    """What the scheduler loop needs from a manager."""

    name: str
    seconds: float
    """Time inside every manager call."""
    alloc_seconds: float
    """Time inside the allocate calls only."""
    calls: int
    """Allocate calls made (a batched call counts once)."""
    allocs: int
    """Requests allocated for (a batched call counts once per request)."""
    run_seconds: float
    """Time inside the running phase's allocate calls (``allocate_running``)."""
    run_allocs: int
    """Allocations made in the running phase."""

    def add(self, rid: str, prompt: list[int]) -> None: ...
    def lookup(self, rid: str) -> tuple[Ids, int]: ...
    def allocate(self, rid: str, n_new: int, n_hit: int, hits: Ids | None) -> Ids | None: ...
    def allocate_running(self, rids: Sequence[str], n_news: Sequence[int]) -> list[Ids | None]: ...
    def advance(self, rid: str, computed: int, running: bool, token: int | None) -> None: ...
    def free(self, rid: str) -> None: ...
    def free_many(self, rids: Sequence[str]) -> None: ...
    def step(self) -> None: ...


class _Sequential:
    """The running phase as one ``allocate_slots`` call per request."""

    alloc_seconds: float
    run_seconds: float = 0.0
    run_allocs: int = 0

    def allocate(self, rid: str, n_new: int, n_hit: int, hits: Ids | None) -> Ids | None:
        raise NotImplementedError

    def free(self, rid: str) -> None:
        raise NotImplementedError

    def allocate_running(self, rids: Sequence[str], n_news: Sequence[int]) -> list[Ids | None]:
        """Allocate for the running requests in order; stop right after the
        first None (the caller preempts, then calls again with the rest)."""
        out: list[Ids | None] = []
        before = self.alloc_seconds
        for rid, n in zip(rids, n_news, strict=True):
            ids = self.allocate(rid, n, 0, None)
            out.append(ids)
            if ids is None:
                break
        self.run_seconds += self.alloc_seconds - before
        self.run_allocs += len(out)
        return out

    def free_many(self, rids: Sequence[str]) -> None:
        """The finished requests of a step, in order."""
        for rid in rids:
            self.free(rid)


@dataclass
class KvrefEngine(_Sequential):
    """kvspec or kvimpl behind their own facade (plain values)."""

    name: str
    manager: Any
    hasher: RequestBlockHasher
    seconds: float = 0.0
    alloc_seconds: float = 0.0
    calls: int = 0
    allocs: int = 0
    run_seconds: float = 0.0
    run_allocs: int = 0
    reqs: dict[str, Any] = field(default_factory=dict)

    def add(self, rid: str, prompt: list[int]) -> None:
        """Build the request value (hashing is the caller's work, not timed)."""
        self.reqs[rid] = self.hasher.new_request(rid, prompt)

    def lookup(self, rid: str) -> tuple[Ids, int]:
        """Timed ``get_computed_blocks``."""
        t = time.perf_counter()
        out: tuple[Ids, int] = self.manager.get_computed_blocks(self.reqs[rid])
        self.seconds += time.perf_counter() - t
        return out

    def allocate(self, rid: str, n_new: int, n_hit: int, hits: Ids | None) -> Ids | None:
        """Timed ``allocate_slots``."""
        req = self.reqs[rid]
        t = time.perf_counter()
        out: Ids | None = self.manager.allocate_slots(req, n_new, n_hit, hits)
        dt = time.perf_counter() - t
        self.seconds += dt
        self.alloc_seconds += dt
        self.calls += 1
        self.allocs += 1
        return out

    def advance(self, rid: str, computed: int, running: bool, token: int | None) -> None:
        """Scheduler bookkeeping (not timed)."""
        req = self.reqs[rid]
        if token is not None:
            req = self.hasher.with_output_tokens(req, [token])
        status = RequestStatus.RUNNING if running else RequestStatus.PREEMPTED
        self.reqs[rid] = replace(req, num_computed_tokens=computed, status=status)

    def free(self, rid: str) -> None:
        """Timed ``free``."""
        t = time.perf_counter()
        self.manager.free(rid)
        self.seconds += time.perf_counter() - t

    def step(self) -> None:
        """Timed ``new_step_starts``."""
        t = time.perf_counter()
        self.manager.new_step_starts()
        self.seconds += time.perf_counter() - t


class BenchMismatch(RuntimeError):
    """Two engines allocated different blocks for the same workload."""


@dataclass
class BatchedImplEngine(KvrefEngine):
    """kvimpl with the running phase as ``allocate_slots_batch`` calls and
    the finished requests freed by one ``free_batch`` call."""

    groups: int = 1
    min_block_size: int = 16

    def allocate_running(self, rids: Sequence[str], n_news: Sequence[int]) -> list[Ids | None]:
        """The sequential loop's results, through as few batched calls as possible.

        The sequential loop preempts the newest running request as soon as
        one allocation fails and goes on with the next request, so the
        allocations after a failure see the victim's freed blocks. A batch
        that ran past a failure would already have allocated those requests
        without them, so every batch here is planned so that it cannot fail
        before its last request: before each batch the free-block count is
        read and a prefix is taken whose worst-case need fits. A running
        request without prefix hits needs at most ``ceil(n/bs)`` new blocks
        per group for ``n`` new tokens (its table already covers its computed
        tokens; SWA only needs fewer), and ``sum(n)//bs + count`` bounds the
        sum of those per group. When everything fits (the common case with
        a large enough pool) the whole running phase is ONE call; otherwise
        the fitting prefix is one call, the next request is a batch of one
        (which may fail: the caller then preempts and calls again with the
        rest), and planning resumes. A None anywhere but the last position of
        a batch would mean the bound was wrong: that raises BenchMismatch.
        The planning is inside the timed region.
        """
        reqs = [self.reqs[r] for r in rids]  # the scheduler holds these anyway: not timed
        mgr, g, bs = self.manager, self.groups, self.min_block_size
        out: list[Ids | None] = []
        t = time.perf_counter()
        i, n = 0, len(reqs)
        while i < n:
            free = mgr.block_pool.get_num_free_blocks()
            j = n
            if g * (sum(n_news[i:]) // bs + (n - i)) > free:
                need, j = 0, i
                while j < n and need + g * _cdiv(n_news[j], bs) <= free:
                    need += g * _cdiv(n_news[j], bs)
                    j += 1
                j = max(j, i + 1)  # a batch of one may fail, and that is fine
            got = mgr.allocate_slots_batch(reqs[i:j], n_news[i:j])
            self.calls += 1
            self.allocs += len(got)
            out.extend(got)
            if any(x is None for x in got[:-1]):
                raise BenchMismatch(f"{self.name}: a planned batch failed before its last request")
            if got[-1] is None:
                break
            i = j
        dt = time.perf_counter() - t
        self.seconds += dt
        self.alloc_seconds += dt
        self.run_seconds += dt
        self.run_allocs += len(out)
        return out

    def free_many(self, rids: Sequence[str]) -> None:
        """Timed ``free_batch``."""
        if not rids:
            return
        t = time.perf_counter()
        self.manager.free_batch(list(rids))
        self.seconds += time.perf_counter() - t


class VllmEngine(_Sequential):
    """Real vLLM through its own objects (no kvref adapter in the timed path).

    The adapter builds the manager and the requests (its public
    :meth:`~kvref.adapters.vllm.VllmAdapter.apply_globals`,
    :meth:`~kvref.adapters.vllm.VllmAdapter.new_vllm_request` and
    :meth:`~kvref.adapters.vllm.VllmAdapter.vllm_status`); the timed calls go to
    vLLM's ``KVCacheManager`` directly.
    """

    def __init__(self, config: KVCacheConfig) -> None:
        """Build vLLM's manager the way kvref's vLLM adapter does."""
        from kvref.adapters.vllm import VllmAdapter, make_vllm_adapter  # noqa: PLC0415 - imports vLLM

        self.adapter: VllmAdapter = make_vllm_adapter(config)
        self.name = "vllm"
        self.seconds = 0.0
        self.alloc_seconds = 0.0
        self.calls = 0
        self.allocs = 0
        self.run_seconds = 0.0
        self.run_allocs = 0
        self.manager: Any = self.adapter.manager
        self._running: Any = self.adapter.vllm_status("RUNNING")
        self._preempted: Any = self.adapter.vllm_status("PREEMPTED")
        self.reqs: dict[str, Any] = {}
        self.hits: dict[str, Any] = {}

    def add(self, rid: str, prompt: list[int]) -> None:
        """A vLLM Request hashed by vLLM's own hasher (built as the adapter does)."""
        self.adapter.apply_globals()
        value = Request(RequestId(rid), tuple(prompt), len(prompt), ())
        self.reqs[rid] = self.adapter.new_vllm_request(value)

    def lookup(self, rid: str) -> tuple[Ids, int]:
        """Timed ``get_computed_blocks``; the KVCacheBlocks object is kept for allocation."""
        req = self.reqs[rid]
        t = time.perf_counter()
        out = self.manager.get_computed_blocks(req)
        self.seconds += time.perf_counter() - t
        blocks, n = out[0], out[1]  # later releases append the shared-prefix boundary
        self.hits[rid] = blocks
        return tuple(tuple(b.block_id for b in g) for g in blocks.blocks), n

    def allocate(self, rid: str, n_new: int, n_hit: int, hits: Ids | None) -> Ids | None:
        """Timed ``allocate_slots`` with vLLM's own hit object."""
        blocks = self.hits.pop(rid, None) if hits is not None else None
        req = self.reqs[rid]
        t = time.perf_counter()
        out = self.manager.allocate_slots(req, n_new, n_hit, blocks)
        dt = time.perf_counter() - t
        self.seconds += dt
        self.alloc_seconds += dt
        self.calls += 1
        self.allocs += 1
        return None if out is None else tuple(tuple(b.block_id for b in g) for g in out.blocks)

    def advance(self, rid: str, computed: int, running: bool, token: int | None) -> None:
        """Scheduler bookkeeping (not timed)."""
        req = self.reqs[rid]
        if token is not None:
            req.append_output_token_ids(token)
        req.num_computed_tokens = computed
        req.status = self._running if running else self._preempted

    def free(self, rid: str) -> None:
        """Timed ``free``."""
        req = self.reqs[rid]
        t = time.perf_counter()
        self.manager.free(req)
        self.seconds += time.perf_counter() - t

    def step(self) -> None:
        """Timed ``new_step_starts``."""
        t = time.perf_counter()
        self.manager.new_step_starts()
        self.seconds += time.perf_counter() - t


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


@dataclass
class RunResult:
    """What one engine did on the workload (identical on every engine)."""

    results: list[Ids | None]
    """Every allocation result, in order."""
    request_steps: int = 0
    """Requests advanced by one scheduler step (successful allocations)."""
    steps: int = 0
    preemptions: int = 0


def run(engine: Engine, w: Workload) -> RunResult:
    """Drive one engine through the workload."""
    reqs = make_requests(w)
    config = w.config()
    waiting: list[_Req] = list(reqs)
    running: list[_Req] = []
    res = RunResult([])
    tokens = random.Random(w.seed + 1)
    for r in reqs:
        engine.add(r.rid, r.prompt)

    while waiting or running:
        engine.step()
        res.steps += 1
        scheduled: list[tuple[_Req, int]] = []
        # Running phase: oldest first; a failure preempts the newest running request.
        todo = [(r, schedule_chunk(config, r.num_tokens, r.state.computed, w.chunk)) for r in running]
        while todo:
            outs = engine.allocate_running([r.rid for r, _ in todo], [n for _, n in todo])
            res.results.extend(outs)
            scheduled.extend(todo[: len(outs)] if outs[-1] is not None else todo[: len(outs) - 1])
            if outs[-1] is not None:
                break
            victim = running.pop()
            engine.free(victim.rid)
            victim.state.preempted()
            engine.advance(victim.rid, 0, False, None)
            waiting.insert(0, victim)
            res.preemptions += 1
            todo = [(r, n) for r, n in todo[len(outs) :] if r is not victim]
        # Waiting phase: admit up to the batch size, stop at the first that does not fit.
        while waiting and len(running) < w.max_running:
            r = waiting[0]
            hits, n_hit = engine.lookup(r.rid)
            n_new = schedule_chunk(config, r.num_tokens, n_hit, w.chunk)
            out = engine.allocate(r.rid, n_new, n_hit, hits if any(hits) else None)
            res.results.append(out)
            if out is None:
                break
            waiting.pop(0)
            r.state.admitted(n_hit)
            running.append(r)
            scheduled.append((r, n_new))
        # Update phase (vLLM's update_from_output): advance, sample, free the finished.
        res.request_steps += len(scheduled)
        finished: list[str] = []
        for r, n in scheduled:
            r.state.computed += n
            token = None
            if r.state.computed == r.num_tokens:
                if r.generated == r.decode:
                    finished.append(r.rid)
                    continue
                r.generated += 1
                token = tokens.randrange(32000)
            engine.advance(r.rid, r.state.computed, True, token)
        if finished:
            done = set(finished)
            running = [r for r in running if r.rid not in done]
            engine.free_many(finished)
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
) -> dict[str, Callable[[], Engine]]:
    """Engine builders for every implementation installed here, plus an
    engine per adapter factory of ``extra`` (timed through its facade)."""
    from kvspec.kv_cache_manager import KVCacheManager as SpecManager  # noqa: PLC0415

    hasher = RequestBlockHasher.for_config(config)
    engines: dict[str, Callable[[], Engine]] = {"spec": lambda: KvrefEngine("spec", SpecManager(config), hasher)}
    try:
        from kvimpl.kv_cache_manager import KVCacheManager as ImplManager  # noqa: PLC0415
    except ImportError:
        pass
    else:
        engines["impl"] = lambda: KvrefEngine("impl", ImplManager(config), hasher)
        if hasattr(ImplManager, "allocate_slots_batch") and hasattr(ImplManager, "free_batch"):
            g, bs = len(config.groups), min(k.block_size for k in config.groups)
            engines["impl-batched"] = lambda: BatchedImplEngine(
                "impl-batched", ImplManager(config), hasher, groups=g, min_block_size=bs
            )
    from kvref.adapters.vllm import installed_vllm_version, vllm_available  # noqa: PLC0415

    if vllm_available() and installed_vllm_version() == config.profile.release:
        engines["vllm"] = lambda: VllmEngine(config)
    for name, factory in (extra or {}).items():
        engines[name] = lambda f=factory, n=name: KvrefEngine(n, f(config), hasher)  # type: ignore[misc]
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
    us_per_alloc: float
    """Time inside the allocate calls / allocations."""
    us_per_request_step: float
    """Time inside every manager call / request-steps."""
    us_per_running_step: float = 0.0
    """Time inside the running phase's allocate calls / its allocations: the
    per-request cost of a scheduler step's decode (and chunked-prefill) batch,
    admissions and frees excluded."""
    x_alloc_vs_vllm: float | None = None
    """vLLM's µs per allocation / this engine's (above 1: faster)."""
    x_step_vs_vllm: float | None = None
    """vLLM's µs per request-step / this engine's."""
    x_running_vs_vllm: float | None = None
    """vLLM's µs per running step / this engine's."""


def bench(
    w: Workload,
    repeats: int = 5,
    only: Sequence[str] | None = None,
    skip: Sequence[str] = (),
    extra: Mapping[str, AdapterFactory] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[BenchRow]:
    """Median µs per allocation and per request-step of each engine over
    ``repeats`` runs (round-robin across engines, a full GC before each run),
    after checking that all engines produced the same block ids.

    Raises:
        InputError: For an engine that is not available, or a workload that
            cannot make progress (:func:`check_workload`).
    """
    check_workload(w)
    builders = available_engines(w.config(), extra)
    unknown = sorted(set(only or ()) - set(builders))
    if unknown:
        raise InputError(f"engine(s) {', '.join(unknown)} not available here; available: {', '.join(builders)}")
    names = [n for n in builders if (only is None or n in only) and n not in skip]
    if not names:
        raise InputError(f"no engine to time: asked for {list(only or ())}, available {list(builders)}")
    per_alloc: dict[str, list[float]] = {n: [] for n in names}
    per_step: dict[str, list[float]] = {n: [] for n in names}
    per_run: dict[str, list[float]] = {n: [] for n in names}
    counts: dict[str, tuple[int, int]] = {}
    reference: RunResult | None = None
    for _ in range(repeats):
        for name in names:  # round-robin, so machine noise hits every engine alike
            if progress is not None:
                progress(name)
            engine = builders[name]()
            gc.collect()
            result = run(engine, w)
            if reference is None:
                reference = result
            elif result.results != reference.results or result.request_steps != reference.request_steps:
                raise BenchMismatch(f"{name} allocated different blocks than {names[0]} on the same workload")
            per_alloc[name].append(engine.alloc_seconds / max(engine.allocs, 1) * 1e6)
            per_step[name].append(engine.seconds / max(result.request_steps, 1) * 1e6)
            per_run[name].append(engine.run_seconds / max(engine.run_allocs, 1) * 1e6)
            counts[name] = (engine.calls, engine.allocs)
    steps = 0 if reference is None else reference.request_steps
    rows = [
        BenchRow(
            n,
            counts[n][0],
            counts[n][1],
            steps,
            statistics.median(per_alloc[n]),
            statistics.median(per_step[n]),
            statistics.median(per_run[n]),
        )
        for n in names
    ]
    base = next((r for r in rows if r.engine == "vllm"), None)
    for r in rows:
        if base is not None:
            r.x_alloc_vs_vllm = base.us_per_alloc / r.us_per_alloc if r.us_per_alloc else None
            r.x_step_vs_vllm = base.us_per_request_step / r.us_per_request_step if r.us_per_request_step else None
            r.x_running_vs_vllm = base.us_per_running_step / r.us_per_running_step if r.us_per_running_step else None
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
) -> list[SweepPoint]:
    """:func:`bench` at every point of a sweep."""
    out = []
    for x, w in sweep_workloads(kind, base, points):
        if progress is not None:
            progress(x, w)
        skip = ("spec",) if only is None and w.num_blocks > SPEC_MAX_SWEEP_POOL else ()
        out.append(SweepPoint(x, w, bench(w, repeats=repeats, only=only, skip=skip, extra=extra)))
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
