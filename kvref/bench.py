"""``kvref bench``: the same scheduler workload on several KV-cache managers.

A seeded workload (requests sharing a few system prompts, prompt and decode
lengths drawn from ranges) is driven by a small scheduler loop: every step
each running request gets its next chunk or decode token (preempting the
newest request when the pool is full), then waiting requests are admitted
(prefix lookup, then ``allocate_slots``) up to the batch size. Each engine
runs the identical loop in this one process; only the time spent inside the
manager's own calls is counted, and every allocation result must be the same
block ids on every engine (otherwise the run stops with an error).

Engines: real vLLM 0.25.1 driven through its own ``Request`` and
``KVCacheManager`` objects (no adapter in the timed path), kvspec, and
kvimpl when it exists.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from kvspec.config import AttentionKind, FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.request import Request, RequestBlockHasher, RequestId, RequestStatus

Ids = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Workload:
    """Scheduler workload parameters (defaults: a small version of the
    reference's anchor run)."""

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

    def groups(self) -> tuple[AttentionKind, ...]:
        """The group mix: full, full+swa or full+mamba."""
        bs = self.block_size
        if self.mix == "full":
            return (FullAttention(bs),)
        if self.mix == "full+swa":
            return (FullAttention(bs), SlidingWindow(bs, 128))
        if self.mix == "full+mamba":
            return (FullAttention(bs), Mamba(bs, "all"))
        raise ValueError(f"unknown mix {self.mix!r}; choose full, full+swa or full+mamba")

    def config(self) -> KVCacheConfig:
        """The manager configuration of this workload."""
        return KVCacheConfig(num_blocks=self.num_blocks, groups=self.groups(), max_model_len=4096)


class Engine(Protocol):
    """What the scheduler loop needs from a manager."""

    name: str
    seconds: float
    calls: int

    def add(self, rid: str, prompt: list[int]) -> None: ...
    def lookup(self, rid: str) -> tuple[Ids, int]: ...
    def allocate(self, rid: str, n_new: int, n_hit: int, hits: Ids | None) -> Ids | None: ...
    def advance(self, rid: str, computed: int, running: bool, token: int | None) -> None: ...
    def free(self, rid: str) -> None: ...
    def step(self) -> None: ...


@dataclass
class KvrefEngine:
    """kvspec or kvimpl behind their own facade (plain values)."""

    name: str
    manager: Any
    hasher: RequestBlockHasher
    seconds: float = 0.0
    calls: int = 0
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
        t = time.perf_counter()
        out: Ids | None = self.manager.allocate_slots(self.reqs[rid], n_new, n_hit, hits)
        self.seconds += time.perf_counter() - t
        self.calls += 1
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
        self.manager.new_step_starts()


class VllmEngine:
    """Real vLLM 0.25.1 through its own objects (no kvref adapter in the timed path)."""

    def __init__(self, config: KVCacheConfig) -> None:
        """Build vLLM's manager the way kvref's vLLM adapter does."""
        from kvref.adapters.vllm_adapter import make_vllm_adapter  # noqa: PLC0415 - imports vLLM

        self.adapter: Any = make_vllm_adapter(config)
        self.name = "vllm"
        self.seconds = 0.0
        self.calls = 0
        self.manager: Any = self.adapter.manager
        self._status = self.adapter._v.request.RequestStatus
        self.reqs: dict[str, Any] = {}
        self.hits: dict[str, Any] = {}

    def add(self, rid: str, prompt: list[int]) -> None:
        """A vLLM Request hashed by vLLM's own hasher (built as the adapter does)."""
        self.adapter._apply_globals()
        value = Request(RequestId(rid), tuple(prompt), len(prompt), ())
        self.reqs[rid] = self.adapter._new_vreq(value)

    def lookup(self, rid: str) -> tuple[Ids, int]:
        """Timed ``get_computed_blocks``; the KVCacheBlocks object is kept for allocation."""
        t = time.perf_counter()
        blocks, n = self.manager.get_computed_blocks(self.reqs[rid])
        self.seconds += time.perf_counter() - t
        self.hits[rid] = blocks
        return tuple(tuple(b.block_id for b in g) for g in blocks.blocks), n

    def allocate(self, rid: str, n_new: int, n_hit: int, hits: Ids | None) -> Ids | None:
        """Timed ``allocate_slots`` with vLLM's own hit object."""
        blocks = self.hits.pop(rid, None) if hits is not None else None
        t = time.perf_counter()
        out = self.manager.allocate_slots(self.reqs[rid], n_new, n_hit, blocks)
        self.seconds += time.perf_counter() - t
        self.calls += 1
        return None if out is None else tuple(tuple(b.block_id for b in g) for g in out.blocks)

    def advance(self, rid: str, computed: int, running: bool, token: int | None) -> None:
        """Scheduler bookkeeping (not timed)."""
        req = self.reqs[rid]
        if token is not None:
            req.append_output_token_ids(token)
        req.num_computed_tokens = computed
        req.status = self._status.RUNNING if running else self._status.PREEMPTED

    def free(self, rid: str) -> None:
        """Timed ``free``."""
        t = time.perf_counter()
        self.manager.free(self.reqs[rid])
        self.seconds += time.perf_counter() - t

    def step(self) -> None:
        """Timed ``new_step_starts``."""
        self.manager.new_step_starts()


@dataclass
class _Req:
    rid: str
    prompt: list[int]
    decode: int
    computed: int = 0
    generated: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + self.generated


def make_requests(w: Workload) -> list[_Req]:
    """The workload's requests: a shared system prompt plus a private suffix."""
    rng = random.Random(w.seed)
    prefixes = [[rng.randrange(32000) for _ in range(rng.randint(*w.prompt_len) // 2)] for _ in range(w.num_prefixes)]
    out = []
    for i in range(w.num_requests):
        prefix = rng.choice(prefixes)
        suffix = [rng.randrange(32000) for _ in range(max(1, rng.randint(*w.prompt_len) - len(prefix)))]
        out.append(_Req(f"r{i}", prefix + suffix, rng.randint(*w.decode_len)))
    return out


def run(engine: Engine, w: Workload) -> list[Ids | None]:
    """Drive one engine through the workload; return every allocation result."""
    reqs = make_requests(w)
    waiting: list[_Req] = list(reqs)
    running: list[_Req] = []
    results: list[Ids | None] = []
    tokens = random.Random(w.seed + 1)
    for r in reqs:
        engine.add(r.rid, r.prompt)

    def computed(r: _Req) -> None:
        """After a step: sample a token when the sequence is done, or finish."""
        token = None
        if r.computed == r.num_tokens:
            if r.generated == r.decode:
                running.remove(r)
                engine.free(r.rid)
                return
            r.generated += 1
            token = tokens.randrange(32000)
        engine.advance(r.rid, r.computed, True, token)

    while waiting or running:
        engine.step()
        for r in list(running):
            if r not in running:
                continue
            n_new = min(w.chunk, r.num_tokens - r.computed)
            out = engine.allocate(r.rid, n_new, 0, None)
            results.append(out)
            if out is None:
                victim = running.pop()
                engine.free(victim.rid)
                victim.computed = 0
                engine.advance(victim.rid, 0, False, None)
                waiting.insert(0, victim)
                continue
            r.computed += n_new
            computed(r)
        while waiting and len(running) < w.max_running:
            r = waiting[0]
            hits, n_hit = engine.lookup(r.rid)
            n_new = min(w.chunk, r.num_tokens - n_hit)
            out = engine.allocate(r.rid, n_new, n_hit, hits if any(hits) else None)
            results.append(out)
            if out is None:
                break
            waiting.pop(0)
            r.computed = n_hit + n_new
            running.append(r)
            computed(r)
    return results


def available_engines(config: KVCacheConfig) -> dict[str, Callable[[], Engine]]:
    """Engine builders for every implementation installed here."""
    from kvspec.kv_cache_manager import KVCacheManager as SpecManager  # noqa: PLC0415

    hasher = RequestBlockHasher(config.hash_function, config.hash_seed, config.resolved_hash_block_size())
    engines: dict[str, Callable[[], Engine]] = {"spec": lambda: KvrefEngine("spec", SpecManager(config), hasher)}
    try:
        from kvimpl.kv_cache_manager import KVCacheManager as ImplManager  # noqa: PLC0415

        engines["impl"] = lambda: KvrefEngine("impl", ImplManager(config), hasher)
    except ImportError:
        pass
    from kvref.adapters.vllm_adapter import vllm_available  # noqa: PLC0415

    if vllm_available():
        engines["vllm"] = lambda: VllmEngine(config)
    return engines


class BenchMismatch(RuntimeError):
    """Two engines allocated different blocks for the same workload."""


@dataclass
class BenchRow:
    """One engine's result."""

    engine: str
    calls: int
    us_per_call: float
    x_vs_vllm: float | None = None


def bench(w: Workload, repeats: int = 5, only: list[str] | None = None) -> list[BenchRow]:
    """Median µs per allocate call of each engine over ``repeats`` runs, after
    checking that all engines produced the same block ids."""
    builders = available_engines(w.config())
    names = [n for n in builders if only is None or n in only]
    per_call: dict[str, list[float]] = {n: [] for n in names}
    calls: dict[str, int] = {}
    reference: list[Ids | None] | None = None
    for _ in range(repeats):
        for name in names:  # round-robin, so machine noise hits every engine alike
            engine = builders[name]()
            results = run(engine, w)
            if reference is None:
                reference = results
            elif results != reference:
                raise BenchMismatch(f"{name} allocated different blocks than {names[0]} on the same workload")
            per_call[name].append(engine.seconds / max(engine.calls, 1) * 1e6)
            calls[name] = engine.calls
    rows = [BenchRow(n, calls[n], statistics.median(per_call[n])) for n in names]
    base = next((r.us_per_call for r in rows if r.engine == "vllm"), None)
    for r in rows:
        r.x_vs_vllm = None if base is None else base / r.us_per_call
    return rows
