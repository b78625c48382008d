"""Soak test: a long, seeded, scripted scheduler run on one target adapter.

Unlike the Hypothesis machines, the soak keeps the same managers alive for
the whole run (by default 10^6 facade operations) to find what only shows
over time: leaked blocks or references, tables that are never dropped,
queues that only grow, memory that creeps. Several *lanes* (one manager per
configuration: plain and hybrid kinds, EAGLE, sinks, caching off) are driven
round-robin by a small scripted scheduler that admits requests with prefix
hits, prefills in chunks, decodes, preempts on allocation failure, finishes
with ``free`` or with ``pop_blocks_for_free`` and a later deferred free,
evicts blocks, drains events and now and then idles a lane and resets its
prefix cache.

At the end every lane is drained and must be back to its starting state:
every non-null, non-sink block free, no table, no reference, nothing
pending. The resident set size at the end must be within ``--rss-tolerance``
of the size at 10% of the run (after warm-up).

Usage::

    kvref soak --ops 1000000 --target spec

NOTE: randomness comes from one ``random.Random(seed)``, never from
Hypothesis, so a failing soak is reproduced by its seed and operation count.
"""

from __future__ import annotations

import random
import resource
import time
from dataclasses import dataclass, field
from typing import Any

from kvref.adapters import KVCacheAdapter, load_factory
from kvref.capabilities import absent_features, unprobed_absent
from kvref.exits import InputError
from kvref.ops import RequestBook, execute
from kvref.scheduler import Scheduler
from kvref.shapes import SOAK_LANES, build_kinds, shape_named
from kvspec.config import KVCacheConfig
from kvspec.errors import ConfigError, UnsupportedByProfileError
from kvspec.profiles import NEWEST, SemanticsProfile

Json = Any
VOCAB = 4
MAX_LIVE = 8


class SoakFailure(AssertionError):
    """The soak found a leak, an unexpected error or memory growth."""


@dataclass(frozen=True)
class SoakResult:
    """Figures of one soak run."""

    ops: int
    seconds: float
    errors: int
    preemptions: int
    resets: int
    leaked_blocks: int
    rss_at_10pct_kib: int
    rss_end_kib: int
    peak_rss_kib: int
    lanes: int = 0
    refused: tuple[str, ...] = ()

    @property
    def ops_per_second(self) -> float:
        """Facade operations per wall-clock second."""
        return self.ops / max(self.seconds, 1e-9)


def soak_configs(profile: SemanticsProfile = NEWEST) -> list[tuple[str, KVCacheConfig | str]]:
    """The lanes' configurations (:data:`kvref.shapes.SOAK_LANES`): single
    kinds, hybrids, EAGLE, sinks, no caching; under ``profile``, the reason
    instead of a configuration for a lane the profile refuses."""
    out: list[tuple[str, KVCacheConfig | str]] = []
    for lane, shape, bs, window, fields in SOAK_LANES:
        kw: dict[str, Any] = {"num_blocks": 64, "max_model_len": 64, **fields}
        try:
            out.append((lane, KVCacheConfig(groups=build_kinds(shape_named(shape), bs, window), profile=profile, **kw)))
        except ConfigError as exc:
            out.append((lane, f"{type(exc).__name__}: {exc}"))
    return out


@dataclass
class Lane:
    """One manager under soak, its scheduler model and its counters."""

    name: str
    cfg: KVCacheConfig
    adapter: KVCacheAdapter
    book: RequestBook
    rng: random.Random
    initial_free: tuple[int, ...]
    prefixes: list[list[int]]
    sched: Scheduler = field(init=False)
    counter: int = 0
    ops: int = 0
    errors: int = 0
    preemptions: int = 0
    resets: int = 0
    last_error: str = ""

    def __post_init__(self) -> None:
        self.sched = Scheduler(self.cfg, self.book, self.call, self.book.apply)

    @property
    def running(self) -> list[str]:
        """Running request ids, oldest first."""
        return self.sched.running

    def call(self, op: Json) -> Json:
        """One facade operation; caller errors are counted (a correct
        scheduler makes none)."""
        self.ops += 1
        out = execute(self.adapter, self.book, op)
        if isinstance(out, dict) and "error" in out:
            self.errors += 1
            self.last_error = f"{self.name}: {op} -> {out}"
        return out

    def total(self, rid: str) -> int:
        """Tokens of ``rid`` so far (prompt and output)."""
        return self.sched.num_tokens(rid)


def new_lane(name: str, cfg: KVCacheConfig, adapter: KVCacheAdapter, rng: random.Random) -> Lane:
    """A lane with a universe of three shared prefixes."""
    bs = cfg.scheduler_block_size
    prefixes = [[rng.randrange(VOCAB) for _ in range(rng.randrange(4) * bs + rng.randrange(bs))] for _ in range(3)]
    free = adapter.to_view().free_queue
    return Lane(name, cfg, adapter, RequestBook(cfg), rng, free, prefixes)


def step(lane: Lane) -> None:
    """One scheduler action, chosen at random."""
    r, sched = lane.rng.random(), lane.sched
    if r < 0.12 and len(sched.reqs) < MAX_LIVE:
        add_request(lane)
    elif r < 0.30 and sched.waiting:
        admit(lane)
    elif r < 0.60 and sched.running:
        schedule_running(lane)
    elif r < 0.66 and sched.reqs:
        finish(lane, lane.rng.choice(sorted(sched.reqs)))
    elif r < 0.72 and sched.pending:
        deferred_free(lane)
    elif r < 0.99:
        housekeeping(lane)
    elif r < 0.9996:
        lane.call({"op": "evict_blocks", "block_ids": lane.rng.sample(range(lane.cfg.num_blocks), 2)})
    else:
        idle_and_reset(lane)


def add_request(lane: Lane) -> None:
    """A new waiting request whose prompt starts with a shared prefix."""
    lane.counter += 1
    rid = f"{lane.name}-{lane.counter}"
    suffix = [lane.rng.randrange(VOCAB) for _ in range(1 + lane.rng.randrange(12))]
    prompt = (lane.rng.choice(lane.prefixes) + suffix)[: lane.cfg.max_model_len - 2]
    extra: Json = {"cache_salt": "s"} if lane.rng.random() < 0.1 else {}
    lane.sched.add({"op": "add_request", "rid": rid, "prompt": prompt, "extra": extra})


def chunk(lane: Lane, rid: str, start: int) -> int:
    """Tokens to schedule from ``start`` (:func:`kvref.scheduler_chunks.schedule_chunk`)."""
    n = 1 + lane.rng.randrange(lane.sched.chunk_bound(rid, start))
    return lane.sched.chunk(rid, start, n)


def admit(lane: Lane) -> None:
    """Prefix lookup and allocation for the first waiting request; a request
    that cannot be admitted while nothing runs is aborted (it never fits)."""
    sched = lane.sched
    rid = sched.waiting[0]
    op: Json = {"op": "allocate_slots", "rid": rid, "has_scheduled_reqs": bool(sched.running)}
    found = sched.lookup(rid)
    hit = found["num_tokens"]
    if any(found["blocks"]):
        op["new_computed_blocks"] = found["blocks"]
    op["num_new_computed_tokens"] = hit
    op["num_new_tokens"] = chunk(lane, rid, hit)
    op["num_lookahead_tokens"] = lane.rng.randrange(3) if lane.cfg.use_eagle else 0
    if not sched.admit(op, hit):
        if not sched.running:
            finish(lane, rid)
        return
    if sched.reqs[rid].computed == lane.total(rid):
        sample_token(lane, rid)


def schedule_running(lane: Lane) -> None:
    """Advance a running request; on failure preempt the newest one."""
    sched = lane.sched
    rid = lane.rng.choice(sched.running)
    total = lane.total(rid)
    st = sched.reqs[rid]
    if st.computed >= total:
        finish(lane, rid)
        return
    new = chunk(lane, rid, st.computed)
    look = lane.rng.randrange(3) if lane.cfg.use_eagle else 0
    if not sched.advance(rid, new, look):
        preempt(lane, sched.running[-1])
        return
    if st.computed == total and total < lane.cfg.max_model_len:
        sample_token(lane, rid)


def sample_token(lane: Lane, rid: str) -> None:
    """The model produced one token."""
    lane.sched.sample(rid, lane.rng.randrange(VOCAB))


def preempt(lane: Lane, rid: str) -> None:
    """Free (or pop) a running request and put it back at the head of the queue."""
    lane.preemptions += 1
    lane.sched.preempt(rid, pop=lane.rng.random() >= 0.5)


def finish(lane: Lane, rid: str) -> None:
    """A request finishes or is aborted; the book forgets it."""
    sched = lane.sched
    if rid in sched.running and lane.rng.random() < 0.3:
        total = sched.reqs[rid].computed
        lane.call({"op": "remove_skipped_blocks", "rid": rid, "total_computed_tokens": total})
    sched.finish(rid, pop=lane.rng.random() >= 0.5)
    del lane.book.requests[rid]


def deferred_free(lane: Lane) -> None:
    """Free one popped block list, reversed (as the scheduler does)."""
    lane.sched.deferred_free(lane.rng.randrange(len(lane.sched.pending)))


HOUSEKEEPING = ("new_step_starts", "take_events", "take_new_block_ids", "usage", "make_prefix_cache_stats")


def housekeeping(lane: Lane) -> None:
    """Step boundaries, event and id drains, statistics, table reads."""
    which = lane.rng.randrange(len(HOUSEKEEPING) + 2)
    if which < len(HOUSEKEEPING):
        lane.call({"op": HOUSEKEEPING[which]})
    elif lane.running:
        name = "get_block_ids"
        if which == len(HOUSEKEEPING):  # the release's read of what running requests share
            absent = absent_features(lane.cfg.profile) | unprobed_absent(lane.cfg.profile)
            name = "get_num_common_prefix_blocks"
            if f"op:{name}" in absent:  # gone in vLLM 0.34.0, which reads a request's cached tokens instead
                name = "get_num_cached_tokens"
            if f"op:{name}" in absent:
                name = "get_block_ids"
        lane.call({"op": name, "rid": lane.rng.choice(lane.running)})


def idle_and_reset(lane: Lane) -> None:
    """Finish everything, then reset the prefix cache, which must succeed
    unless sink blocks are held (they count as used, as in vLLM)."""
    drain(lane)
    lane.resets += 1
    expected = len(lane.initial_free) == lane.cfg.num_blocks - 1
    if lane.call({"op": "reset_prefix_cache"}) is not expected:
        raise SoakFailure(f"{lane.name}: reset_prefix_cache on an idle manager did not return {expected}")


def drain(lane: Lane) -> None:
    """Finish every request and free every pending block list."""
    for rid in sorted(lane.sched.reqs):
        finish(lane, rid)
    while lane.sched.pending:
        deferred_free(lane)
    lane.call({"op": "take_events"})
    lane.call({"op": "take_new_block_ids"})


def leaked_blocks(lane: Lane) -> tuple[int, list[str]]:
    """Blocks not back in the free queue after a drain, and what is wrong."""
    view = lane.adapter.to_view()
    problems = []
    leaked = len(set(lane.initial_free) - set(view.free_queue))
    if leaked or len(view.free_queue) != len(lane.initial_free):
        problems.append(f"{leaked} block(s) not free; free queue {len(view.free_queue)}/{len(lane.initial_free)}")
    if view.ref_cnt:
        problems.append(f"references left: {view.ref_cnt[:8]!r}")
    if view.tables:
        problems.append(f"tables left for {[rid for rid, _ in view.tables][:8]!r}")
    pending = getattr(lane.adapter, "pending", None)
    if pending:
        problems.append(f"pending blocks left: {sorted(pending)[:8]!r}")
    return leaked, [f"{lane.name}: {p}" for p in problems]


def rss_kib() -> int:
    """Current resident set size (VmRSS), falling back to the peak."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return peak_rss_kib()


def peak_rss_kib() -> int:
    """Peak resident set size (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def run_soak(
    target: str = "spec",
    ops: int = 1_000_000,
    seed: int = 0,
    check_every: int = 50_000,
    rss_tolerance: float = 0.10,
    profile: SemanticsProfile = NEWEST,
) -> SoakResult:
    """Drive every lane round-robin until ``ops`` facade operations ran.

    Lanes the profile (or the target) refuses are left out and named in the
    result; a soak with no lane left is refused.

    Raises:
        SoakFailure: On a caller error, a broken invariant, a leak at the end or
            RSS growth beyond ``rss_tolerance`` after the first 10% of the run.
        InputError: When no lane can run under ``profile``.
    """
    factory = load_factory(target)
    rng = random.Random(seed)
    lanes: list[Lane] = []
    refused: list[str] = []
    for name, cfg in soak_configs(profile):
        lane_rng = random.Random(rng.random())
        if isinstance(cfg, str):
            refused.append(f"{name}: {cfg}")
            continue
        try:
            lanes.append(new_lane(name, cfg, factory(cfg), lane_rng))
        except UnsupportedByProfileError as exc:
            refused.append(f"{name}: {exc}")
    if not lanes:
        raise InputError(f"no soak lane runs under {profile.name} on {target}: " + "; ".join(refused))
    started, rss_10 = time.monotonic(), 0
    done, next_check = 0, check_every
    while done < ops:
        for lane in lanes:
            step(lane)
        done = sum(lane.ops for lane in lanes)
        if not rss_10 and done >= ops // 10:
            rss_10 = rss_kib()
        if done >= next_check:
            next_check += check_every
            _check(lanes)
    for lane in lanes:
        drain(lane)
    seconds = time.monotonic() - started
    _check(lanes)
    leaked, problems = 0, list[str]()
    for lane in lanes:
        n, p = leaked_blocks(lane)
        leaked, problems = leaked + n, problems + p
    result = SoakResult(
        ops=sum(lane.ops for lane in lanes),
        seconds=seconds,
        errors=sum(lane.errors for lane in lanes),
        preemptions=sum(lane.preemptions for lane in lanes),
        resets=sum(lane.resets for lane in lanes),
        leaked_blocks=leaked,
        rss_at_10pct_kib=rss_10,
        rss_end_kib=rss_kib(),
        peak_rss_kib=max(peak_rss_kib(), rss_kib()),
        lanes=len(lanes),
        refused=tuple(refused),
    )
    if problems:
        raise SoakFailure("leak after draining every lane: " + "; ".join(problems))
    if result.rss_end_kib > rss_10 * (1 + rss_tolerance):
        raise SoakFailure(f"RSS grew from {rss_10} KiB at 10% of the run to {result.rss_end_kib} KiB at the end")
    return result


def _check(lanes: list[Lane]) -> None:
    for lane in lanes:
        if lane.errors:
            raise SoakFailure(f"{lane.errors} caller error(s) from a well-formed scheduler; last: {lane.last_error}")
        check = getattr(lane.adapter, "check_invariants", None)
        if check is not None:
            check()
