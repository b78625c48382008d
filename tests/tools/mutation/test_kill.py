"""The mutation kill test: kvimpl against kvspec, stopping at the first difference.

Run by ``python -m kvtools mutants`` (mutmut) once per generic mutant of
kvimpl, and by hand with ``pytest tests/tools/mutation``; the default
``pytest`` run does not collect this folder (``norecursedirs``).
Deterministic: the golden traces are fixed data and the lockstep runs use
fixed Hypothesis seeds.

Stages, cheapest first (``conftest.py`` orders them; mutmut stops at the
first failure):

1. ``test_golden_replay[shape]``: every golden trace of one configuration
   shape replayed on kvimpl; each facade output and the view digest must equal
   what kvspec recorded, and kvimpl's ``check_invariants()`` must hold after
   every step.
2. ``test_batch_replay[shape]``: the same traces through kvimpl's batched
   step API (``allocate_slots_batch``, ``free_batch``), which has no
   counterpart in kvspec and must reproduce its sequential results.
3. ``test_device_replay[shape]``: some of them with kvimpl's device block
   tables on the CPU (rows and slot mapping checked after every step).
4. ``test_lockstep_edge[edge]``: the same on configurations the machine never
   draws (every block size 1; two attention-sink groups; pools of 1 to 3
   blocks) or rarely (pools of
   at most 10 blocks, for Mamba shapes and for all, where every capacity
   estimate decides an admission).
5. ``test_lockstep[shape]``: a bounded, seeded run of the lockstep machine
   (:mod:`kvref.stateful`, kvspec first, kvimpl second) restricted to one
   shape: outputs, views, invariants, event logs, append-only tables. The
   stage itself is :func:`kvtools.killtest.lockstep_kill`, which the mutmut
   runner also calls to shrink a lockstep kill.

Every replay runs on the kit's one replay loop (:func:`kvref.traces.replay`)
with kvimpl's checks after each step, except the merged-batch replay, whose
batches span several recorded steps.

When a test fails inside a mutmut worker (``MUTANT_UNDER_TEST`` set) and
``KVREF_MUTANT_RECORDS`` names a folder, it writes ``<mutant>.json`` there:
which test killed it, the stage, the message and the trace length (the replay
prefix up to the failing step, or the lockstep's failure trace).
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import strategies as st

import kvref
from kvref.adapters import KVCacheAdapter, load_factory
from kvref.adapters.impl import ImplAdapter
from kvref.lockstep import LockstepFailure
from kvref.machine import configuration
from kvref.ops import REQUEST_OPS, RequestBook, event_to_json, execute, ids_to_json
from kvref.shapes import SHAPES, Shape, build_kind
from kvref.traces import Trace, load, replay, split_step
from kvspec.config import FullAttention, KVCacheConfig, SinkFullAttention, SlidingWindow
from kvspec.errors import ConfigError, InvalidTokenCountError, KVCacheError
from kvspec.profiles import VLLM_0_25_1, SemanticsProfile
from kvtools.killtest import lockstep_kill

Json = Any

ROOT = Path(kvref.__file__).resolve().parents[2]
"""The repository (found through the kit, so that mutmut's copy of this file finds it too)."""
GOLDEN_DIR = Path(os.environ.get("KVREF_GOLDEN", ROOT / "traces" / "vllm-0.25.1" / "golden"))
DIRECTED_DIR = ROOT / "traces" / "vllm-0.25.1" / "directed"
SHAPE_NAMES = [s.name for s in SHAPES if s.since is None and s.dcp * s.pcp == 1]
"""The shapes vLLM 0.25.1 has, and so its golden corpus (ring kinds come later; the
context-parallel shapes have their own corpus, ``golden-dcp``, which kvimpl refuses)."""
DEVICE_TRACES = 4
"""Golden traces per shape replayed with device block tables (they only mirror the tables)."""


def golden_traces(shape: str) -> list[Path]:
    """The golden traces recorded for ``shape`` (files are named ``<shape>-NNNN.jsonl``)."""
    return sorted(p for p in GOLDEN_DIR.glob(f"{shape}-*.jsonl") if p.stem.rsplit("-", 1)[0] == shape)


def _record(test: str, stage: str, message: str, trace_ops: int | None, trace_path: str | None) -> None:
    """Note who killed the mutant under test (no-op outside a mutmut worker)."""
    mutant = os.environ.get("MUTANT_UNDER_TEST", "")
    folder = os.environ.get("KVREF_MUTANT_RECORDS")
    if not folder or not mutant or mutant in ("stats", "fail", "mutant_generation"):
        return
    record = {"mutant": mutant, "test": test, "stage": stage, "message": message[:400], "trace_ops": trace_ops}
    if trace_path:
        record["trace"] = trace_path
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / f"{mutant}.json").write_text(json.dumps(record, sort_keys=True) + "\n")


def replay_checked(trace: Trace, batch: bool = False, device: str | None = None) -> tuple[int, str] | None:
    """Replay ``trace`` on kvimpl; (failing step index, message) or None if it conforms.

    With ``batch``, every ``allocate_slots`` that only passes ``num_new_tokens``
    and ``num_lookahead_tokens`` goes through ``allocate_slots_batch`` (a batch of
    one) and every ``free`` through ``free_batch``: kvimpl's batched step API
    must reproduce kvspec's sequential results exactly. With ``device``,
    kvimpl keeps device block tables there, and after every step each holder's
    row and a few slot-mapping entries must match its block ids.
    """
    try:
        impl = ImplAdapter(trace.config, device=device)
    except Exception as exc:  # kvspec built this configuration
        return 0, f"constructing kvimpl: {type(exc).__name__}: {exc}"
    adapter = cast(KVCacheAdapter, impl)  # ImplAdapter's list[BlockId] is a list[int] (list is invariant)
    facade_steps = iter(i for i, step in enumerate(trace.steps) if step["op"] not in REQUEST_OPS)
    current = [0]

    def execute_op(a: KVCacheAdapter, book: RequestBook, op: Json) -> Json:
        current[0] = next(facade_steps)
        return execute_batched(impl, book, op) if batch and batchable(op) else execute(a, book, op)

    def after_step(_: KVCacheAdapter) -> None:  # a broken invariant is a difference too
        impl.check_invariants()
        if device is not None:
            check_device_tables(impl)

    try:
        result = replay(trace, lambda _config: adapter, execute_op=execute_op, after_step=after_step)
    except Exception as exc:  # replay lets an exception of the view digest through: a difference too
        return current[0], f"{trace.steps[current[0]]['op']}: view: {type(exc).__name__}: {exc}"
    if result.ok:
        return None
    assert result.failed_step is not None, result  # a failed replay names its step
    return result.failed_step, result.message


def replay_merged(trace: Trace) -> tuple[int, str] | None:
    """Replay ``trace`` on kvimpl with runs of steps merged into batches.

    Consecutive running-request ``allocate_slots`` calls (as
    :func:`batchable`, for distinct requests, none of them a caller error)
    become one ``allocate_slots_batch`` call, consecutive ``free`` calls one
    ``free_batch``; request operations in between only update the caller's
    book (a batched request's value was read when it joined the batch). Each
    result must equal kvspec's recorded one, and after the batch the view
    digest must equal the one recorded after its last step. Returns (failing
    step index, message) or None.
    """
    try:
        impl = ImplAdapter(trace.config)
    except Exception as exc:  # kvspec built this configuration
        return 0, f"constructing kvimpl: {type(exc).__name__}: {exc}"
    book = RequestBook(trace.config)
    batch: list[tuple[int, Json, Any]] = []

    def flush() -> tuple[int, str] | None:
        if not batch:
            return None
        first, last = batch[0][0], batch[-1][0]
        kind = batch[0][1]["op"]
        try:
            if kind == "free":
                impl.free_batch([op["rid"] for _, op, _ in batch])
                got: list[Json] = [None] * len(batch)
            else:
                outs = impl.allocate_slots_batch(
                    [req for _, _, req in batch],
                    [op["num_new_tokens"] for _, op, _ in batch],
                    [op.get("num_lookahead_tokens", 0) for _, op, _ in batch],
                )
                got = [None if out is None else ids_to_json(out) for out in outs]
            for (i, _, _), out in zip(batch, got, strict=True):
                _, expect, _ = split_step(trace.steps[i])
                if out != expect:
                    return i, f"{kind} in a batch of {len(batch)}: kvspec {expect!r}, kvimpl {out!r}"
            _, _, view = split_step(trace.steps[last])
            if view is not None and impl.to_view().digest() != view:
                return last, f"view digest after a batch of {len(batch)} (steps {first}-{last}) differs from kvspec's"
            impl.check_invariants()
        except Exception as exc:  # a crash or a broken invariant is a difference too
            return first, f"{kind} batch of {len(batch)}: {type(exc).__name__}: {exc}"
        finally:
            batch.clear()
        return None

    for i, step in enumerate(trace.steps):
        op, expect, view = split_step(step)
        if op["op"] in REQUEST_OPS:
            book.apply(op)
            continue
        joins = batchable(op) and not isinstance(expect, dict) and all(op["rid"] != o["rid"] for _, o, _ in batch)
        if joins and batch and batch[0][1]["op"] != op["op"]:
            joins = False
        if joins:
            batch.append((i, op, book.requests.get(op["rid"])))
            continue
        failed = flush()
        if failed is not None:
            return failed
        if batchable(op) and not isinstance(expect, dict):
            batch.append((i, op, book.requests.get(op["rid"])))
            continue
        try:
            got = execute(cast(KVCacheAdapter, impl), book, op)
            if got != expect:
                return i, f"{op['op']}: kvspec returned {expect!r}, kvimpl returned {got!r}"
            if view is not None and impl.to_view().digest() != view:
                return i, f"{op['op']}: view digest differs from kvspec's"
            impl.check_invariants()
        except Exception as exc:  # a crash or a broken invariant is a difference too
            return i, f"{op['op']}: {type(exc).__name__}: {exc}"
    return flush()


def check_device_tables(impl: ImplAdapter) -> None:
    """Every holder's device row is its block ids padded with 0; slot mapping of
    the first, middle and last position of each table is ``id * block_size + offset``.

    Raises:
        AssertionError: On the first mismatch.
    """
    bt = impl.device_tables
    assert bt is not None
    holders = sorted({r for m in impl.coordinator.managers for r in m.req_to_blocks})
    assert sorted(bt.rows) == holders, f"device rows {sorted(bt.rows)} != holders {holders}"
    for g, kind in enumerate(impl.config.groups):
        host = impl.block_table(g).cpu().tolist()
        assert len(host) == len(holders), f"group {g}: {len(host)} device rows for {len(holders)} holders"
        rids, positions, want = [], [], []
        for rid in holders:
            table = list(impl.get_block_ids(rid)[g])
            row = host[bt.row_of(rid)]
            assert row == table + [0] * (len(row) - len(table)), f"group {g} {rid}: device row {row} vs {table}"
            n = len(table) * kind.block_size
            for pos in sorted({0, n // 2, n - 1}) if n else ():
                rids.append(rid)
                positions.append(pos)
                want.append(table[pos // kind.block_size] * kind.block_size + pos % kind.block_size)
        got = impl.slot_mapping(rids, positions, g).cpu().tolist()
        assert got == want, f"group {g}: slot mapping {got} != {want}"


BATCH_FREE_KEYS = {"op", "rid", "num_new_tokens", "num_lookahead_tokens"}


def batchable(op: Json) -> bool:
    """An ``allocate_slots`` that ``allocate_slots_batch`` stands for, or a ``free``."""
    if op["op"] == "free":
        return True
    defaults = {"new_computed_blocks": None, "has_scheduled_reqs": True}
    extra = {k: v for k, v in op.items() if k not in BATCH_FREE_KEYS and v != defaults.get(k, 0)}
    return op["op"] == "allocate_slots" and not extra


def execute_batched(impl: ImplAdapter, book: RequestBook, op: Json) -> Json:
    """``op`` through kvimpl's batched step API (a batch of one)."""
    try:
        if op["op"] == "free":
            impl.free_batch([op["rid"]])
            return None
        req = book.requests[op["rid"]]
        out = impl.allocate_slots_batch([req], [op["num_new_tokens"]], [op.get("num_lookahead_tokens", 0)])[0]
    except KVCacheError as exc:
        return {"error": type(exc).__name__}
    return None if out is None else ids_to_json(out)


def test_directed_replay() -> None:
    """Every directed trace (:mod:`kvtools.directed`) replays on kvimpl exactly as
    recorded from kvspec, sequentially, with merged batches and with CPU
    device block tables (when torch is there)."""
    paths = sorted(DIRECTED_DIR.glob("*.jsonl"))
    assert paths, f"no directed traces in {DIRECTED_DIR}"
    try:
        import torch  # noqa: F401, PLC0415 - optional: the device pass needs it
    except ImportError:
        devices: tuple[str | None, ...] = (None,)
    else:
        devices = (None, "cpu")
    for path in paths:
        trace = load(path)
        for how, failed in (
            *((f"device {d}" if d else "sequential", replay_checked(trace, device=d)) for d in devices),
            ("merged batches", replay_merged(trace)),
        ):
            if failed is not None:
                step, message = failed
                _record(
                    "test_directed_replay", "directed", f"{path.name} step {step} ({how}): {message}", step + 1, None
                )
                pytest.fail(f"{path.name}: step {step} ({how}): {message}")


def test_api_edges() -> None:
    """Batched-API and device-API details the traces cannot express: a batch
    of mismatched lengths is refused whole; an int look-ahead means one for
    all; the device accessors default to group 0."""
    cfg = KVCacheConfig(
        num_blocks=16, groups=(FullAttention(4), SlidingWindow(4, 8)), max_model_len=48, profile=VLLM_0_25_1
    )
    impl, spec = ImplAdapter(cfg, device=_device()), load_factory("spec")(cfg)
    book = RequestBook(cfg)
    for rid, prompt in (("a", [1, 2, 3, 4, 5]), ("b", [6, 7, 8])):
        book.apply({"op": "add_request", "rid": rid, "prompt": prompt})
        for side in (impl, spec):
            assert side.allocate_slots(book.requests[rid], len(prompt)) is not None
        book.apply({"op": "set_request", "rid": rid, "status": "RUNNING", "num_computed_tokens": len(prompt)})
        book.apply({"op": "append_tokens", "rid": rid, "tokens": [9]})
    a, b = book.requests["a"], book.requests["b"]
    before = impl.to_view().digest()
    for args in (([a, b], [1]), ([a], [1, 1]), ([a, b], [1, 1], [0])):
        with pytest.raises(InvalidTokenCountError):
            impl.allocate_slots_batch(*args)
        assert impl.to_view().digest() == before, f"a refused batch {args} changed the state"
    got = impl.allocate_slots_batch([b], [1])  # the look-ahead default: 0
    assert got == [spec.allocate_slots(b, 1)], f"batch with the default look-ahead: {got}"
    got = impl.allocate_slots_batch([a, b, a], [1, 1, 1], 2)
    want = [spec.allocate_slots(r, 1, num_lookahead_tokens=2) for r in (a, b, a)]
    assert got == want, f"batch with an int look-ahead and a repeated request: {got} != {want}"
    assert impl.to_view().digest() == spec.to_view().digest()
    impl.check_invariants()
    if impl.device_tables is not None:
        assert impl.block_table().cpu().tolist() == impl.block_table(0).cpu().tolist()
        assert impl.slot_mapping(["a"], [0]).cpu().tolist() == impl.slot_mapping(["a"], [0], 0).cpu().tolist()


def _device() -> str | None:
    try:
        import torch  # noqa: F401, PLC0415 - optional
    except ImportError:
        return None
    return "cpu"


@pytest.mark.parametrize("shape", SHAPE_NAMES)
def test_golden_replay(shape: str) -> None:
    """Every golden trace of ``shape`` replays on kvimpl exactly as recorded from kvspec."""
    paths = golden_traces(shape)
    assert paths, f"no golden traces for shape {shape!r} in {GOLDEN_DIR}"
    for path in paths:
        failed = replay_checked(load(path))
        if failed is not None:
            step, message = failed
            _record(f"test_golden_replay[{shape}]", "replay", f"{path.name} step {step}: {message}", step + 1, None)
            pytest.fail(f"{path.name}: step {step}: {message}")


@pytest.mark.parametrize("shape", SHAPE_NAMES)
def test_batch_replay(shape: str) -> None:
    """The golden traces of ``shape`` again, through kvimpl's batched step API."""
    for path in golden_traces(shape):
        failed = replay_checked(load(path), batch=True)
        if failed is not None:
            step, message = failed
            _record(f"test_batch_replay[{shape}]", "batch", f"{path.name} step {step}: {message}", step + 1, None)
            pytest.fail(f"{path.name}: step {step} (batched): {message}")


@pytest.mark.parametrize("shape", SHAPE_NAMES)
def test_merged_batch_replay(shape: str) -> None:
    """The golden traces of ``shape`` with runs of running-request steps and of
    frees merged into multi-request ``allocate_slots_batch`` / ``free_batch`` calls."""
    for path in golden_traces(shape):
        failed = replay_merged(load(path))
        if failed is not None:
            step, message = failed
            _record(
                f"test_merged_batch_replay[{shape}]", "batch", f"{path.name} step {step}: {message}", step + 1, None
            )
            pytest.fail(f"{path.name}: step {step} (merged batches): {message}")


@pytest.mark.parametrize("shape", SHAPE_NAMES)
def test_device_replay(shape: str) -> None:
    """The first golden traces of ``shape`` on kvimpl with CPU device block tables (needs torch)."""
    pytest.importorskip("torch")
    for path in golden_traces(shape)[:DEVICE_TRACES]:
        failed = replay_checked(load(path), device="cpu")
        if failed is not None:
            step, message = failed
            _record(f"test_device_replay[{shape}]", "device", f"{path.name} step {step}: {message}", step + 1, None)
            pytest.fail(f"{path.name}: step {step} (device tables): {message}")


BATCH_SEEDS = 6
"""Seeded scheduler runs per shape in :func:`test_batch_vs_spec`."""


def _batch_config(shape: Shape, rng: random.Random) -> KVCacheConfig:
    """A configuration of ``shape`` with a tight pool (so that some steps do not fit)."""
    bs = rng.choice([2, 4])
    eagle = shape.eagle_ok and rng.random() < 0.5
    spec_blocks = rng.randint(0, 1) if eagle else 0
    groups = tuple(build_kind(k, bs, rng.randint(1, 3 * bs), spec_blocks) for k in shape.kinds)
    caching = shape.caching if shape.caching is not None else rng.random() < 0.75
    return KVCacheConfig(
        profile=VLLM_0_25_1,
        num_blocks=rng.choice([8, 10, 12, 16, 24]),
        groups=groups,
        max_model_len=48,
        enable_caching=caching,
        use_eagle=eagle,
        enable_kv_cache_events=caching,
        log_stats=True,
    )


def batch_vs_spec(shape: Shape, seed: int) -> str | None:
    """A scheduler loop with several running requests per step: kvimpl runs
    each step as one ``allocate_slots_batch`` and frees finished requests with
    one ``free_batch``; kvspec makes the sequential calls. Results, views,
    events and new-block ids must agree after every step. Returns the first
    difference, or None."""
    rng = random.Random(f"{shape.name}/{seed}")
    cfg = _batch_config(shape, rng)
    spec, impl = load_factory("spec")(cfg), ImplAdapter(cfg)
    book = RequestBook(cfg)
    running: list[str] = []
    prefixes = [[rng.randint(0, 3) for _ in range(12)] for _ in range(2)]

    def same(what: str) -> str | None:
        impl.check_invariants()
        if spec.to_view().digest() != impl.to_view().digest():
            return f"{what}: views differ"
        ev_s = [event_to_json(e) for e in spec.take_events()]
        ev_i = [event_to_json(e) for e in impl.take_events()]
        if ev_s != ev_i:
            return f"{what}: events {ev_i} != kvspec {ev_s}"
        if list(spec.take_new_block_ids()) != list(impl.take_new_block_ids()):
            return f"{what}: new block ids differ"
        return None

    for step in range(14):
        spec.new_step_starts()
        impl.new_step_starts()
        # Admissions (sequential on both sides: the batch API has no prefix hits).
        for j in range(rng.randint(0, 2) if running else 3):
            rid = f"r{step}-{j}"
            prompt = prefixes[rng.randint(0, 1)][: rng.randint(0, 12)] + [
                rng.randint(4, 9) for _ in range(rng.randint(1, 6))
            ]
            book.apply({"op": "add_request", "rid": rid, "prompt": prompt})
            req = book.requests[rid]
            outs = []
            for side in (spec, impl):
                hits, n = side.get_computed_blocks(req)
                got = side.allocate_slots(req, req.num_tokens - n, n, hits if any(hits) else None)
                outs.append((hits, n, got))
            if outs[0] != outs[1]:
                return f"step {step} admit {rid}: kvimpl {outs[1]} != kvspec {outs[0]}"
            if outs[0][2] is not None:
                book.apply(
                    {"op": "set_request", "rid": rid, "status": "RUNNING", "num_computed_tokens": req.num_tokens}
                )
                book.apply({"op": "append_tokens", "rid": rid, "tokens": [step % 4]})
                running.append(rid)
            else:
                spec.free(rid)
                impl.free(rid)
            if (diff := same(f"step {step} admit {rid}")) is not None:
                return diff
        # One decode step for a shuffled subset of the running requests.
        chosen = [r for r in running if rng.random() < 0.85]
        rng.shuffle(chosen)
        reqs, ns, ks = [], [], []
        for rid in chosen:
            req = book.requests[rid]
            n = req.num_tokens - req.num_computed_tokens
            if req.num_computed_tokens + n + 2 > cfg.max_model_len:
                continue
            reqs.append(req)
            ns.append(n)
            ks.append(rng.randint(0, 2) if cfg.use_eagle else 0)
        got_i = impl.allocate_slots_batch(reqs, ns, ks)
        got_s = [spec.allocate_slots(r, n, num_lookahead_tokens=k) for r, n, k in zip(reqs, ns, ks, strict=True)]
        if [None if g is None else ids_to_json(g) for g in got_i] != [
            None if g is None else ids_to_json(g) for g in got_s
        ]:
            return f"step {step}: allocate_slots_batch {got_i} != kvspec's sequential calls {got_s}"
        if (diff := same(f"step {step} batch of {len(reqs)}")) is not None:
            return diff
        done: list[str] = []
        for req, g in zip(reqs, got_i, strict=True):
            rid = req.request_id
            if g is None:
                done.append(rid)  # preempted: freed and dropped
                continue
            book.apply({"op": "set_request", "rid": rid, "num_computed_tokens": req.num_tokens})
            book.apply({"op": "append_tokens", "rid": rid, "tokens": [rng.randint(0, 3)]})
        done += [r for r in running if r not in done and (rng.random() < 0.2 or book.requests[r].num_tokens > 40)]
        impl.free_batch(done)
        for rid in done:
            spec.free(rid)
            running.remove(rid)
        if (diff := same(f"step {step} free_batch {done}")) is not None:
            return diff
    return None


@pytest.mark.parametrize("shape", SHAPE_NAMES)
def test_batch_vs_spec(shape: str) -> None:
    """Multi-request scheduler steps through kvimpl's batched API agree with kvspec's sequential calls."""
    chosen = next(s for s in SHAPES if s.name == shape)
    for seed in range(BATCH_SEEDS):
        try:
            diff = batch_vs_spec(chosen, seed)
        except Exception as exc:  # a crash or a broken invariant is a difference too
            diff = f"{type(exc).__name__}: {exc}"
        if diff is not None:
            _record(f"test_batch_vs_spec[{shape}]", "batch", f"seed {seed}: {diff}", None, None)
            pytest.fail(f"seed {seed}: {diff}")


def _block_size_one(cfg: KVCacheConfig) -> KVCacheConfig:
    """``cfg`` with every group's block size 1 (``cfg`` itself if that is not a valid configuration)."""
    try:
        return replace(cfg, groups=tuple(replace(k, block_size=1) for k in cfg.groups), hash_block_size=None)
    except ConfigError:
        return cfg


def _two_sinks(cfg: KVCacheConfig) -> KVCacheConfig:
    """``cfg`` (a sink shape) with a second attention-sink group of twice the sink length."""
    sink = cfg.groups[0]
    assert isinstance(sink, SinkFullAttention)
    # Both groups' sink blocks are taken for good when the managers are built: the pool must hold them.
    room = 1 + 3 * sink.sink_len // sink.block_size
    return replace(
        cfg,
        groups=(sink, replace(sink, sink_len=2 * sink.sink_len)),
        use_eagle=False,
        eagle_groups=(),
        num_blocks=cfg.num_blocks + room,
    )


def _tight_pool(cfg: KVCacheConfig) -> KVCacheConfig:
    """``cfg`` with at most 10 blocks, so that capacity estimates decide admissions."""
    return replace(cfg, num_blocks=min(cfg.num_blocks, 10))


def _tiny_pool(cfg: KVCacheConfig) -> KVCacheConfig:
    """``cfg`` with a pool of 1, 2 or 3 blocks (the null block included)."""
    return replace(cfg, num_blocks=1 + cfg.num_blocks % 3)


MAMBA_SHAPES = ("mamba-align", "mamba-all", "full+mamba-align", "full+mamba-all", "full@2x+mamba-align@2x+swa")
EDGE_CONFIGS: dict[str, tuple[tuple[str, ...], Callable[[KVCacheConfig], KVCacheConfig]]] = {
    "block-size-1": (("full", "swa", "chunked", "mamba-align", "mamba-all", "full+swa"), _block_size_one),
    "two-sinks": (("sink",), _two_sinks),
    "tight-mamba": (MAMBA_SHAPES, _tight_pool),
    "tight-pool": (tuple(SHAPE_NAMES), _tight_pool),
    "tiny-pool": (("full", "swa", "mamba-align", "full+swa"), _tiny_pool),
}
"""Configurations the lockstep machine never draws: (shapes drawn, rewrite of the drawn configuration)."""
EDGE_EXAMPLES = 8


@pytest.mark.parametrize("edge", sorted(EDGE_CONFIGS))
def test_lockstep_edge(edge: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lockstep run on configurations outside the machine's draw: block size 1, two sink groups."""
    names, rewrite = EDGE_CONFIGS[edge]
    drawn = configuration.configs

    def configs(
        shapes: Sequence[Shape] = SHAPES,
        profile: SemanticsProfile = VLLM_0_25_1,
        excluded: frozenset[str] = frozenset(),
    ) -> st.SearchStrategy[tuple[str, KVCacheConfig | str]]:
        chosen = [s for s in SHAPES if s.name in names]  # not ``shapes``: lockstep_kill passes names[0] only
        return drawn(chosen, profile, excluded).map(
            lambda nc: (f"{nc[0]}/{edge}", nc[1] if isinstance(nc[1], str) else rewrite(nc[1]))
        )

    monkeypatch.setattr(configuration, "configs", configs)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            failure_dir = Path(os.environ.get("KVREF_MUTANT_TRACES", tmp))
            # With block size 1 every sink length is valid: the machine's broken-sink config is not broken.
            skip = ("_invalid_config",) if edge == "block-size-1" else ()
            lockstep_kill(names[0], failure_dir, seed_offset=len(SHAPE_NAMES), examples=EDGE_EXAMPLES, skip_rules=skip)
        except LockstepFailure as exc:
            _record_lockstep(f"test_lockstep_edge[{edge}]", exc)
            raise


@pytest.mark.parametrize("shape", SHAPE_NAMES)
def test_lockstep(shape: str) -> None:
    """A bounded seeded lockstep run (kvspec, kvimpl) over ``shape`` finds no difference."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            lockstep_kill(shape, Path(os.environ.get("KVREF_MUTANT_TRACES", tmp)))
        except LockstepFailure as exc:
            _record_lockstep(f"test_lockstep[{shape}]", exc)
            raise


def _record_lockstep(test: str, exc: LockstepFailure) -> None:
    """Record a lockstep kill, keeping its failure trace under the mutant's name."""
    path = exc.trace_path
    ops = len(path.read_text().splitlines()) - 1 if path and path.exists() else None
    kept = None
    if path is not None and path.exists() and "KVREF_MUTANT_TRACES" in os.environ:
        kept = str(path.rename(path.with_name(f"{os.environ.get('MUTANT_UNDER_TEST', 'lockstep')}.jsonl")))
    _record(test, "lockstep", str(exc).splitlines()[0], ops, kept)
