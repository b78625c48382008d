"""The mutation kill test: kvimpl against kvspec, stopping at the first difference.

Run by ``kvref mutants`` (mutmut) once per generic mutant of kvimpl, and by
hand with ``pytest tests/mutation``; the default ``pytest`` run does not
collect this folder (``norecursedirs``). Deterministic: the golden traces are
fixed data and the lockstep runs use fixed Hypothesis seeds.

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
   shape: outputs, views, invariants, event logs, append-only tables.

When a test fails inside a mutmut worker (``MUTANT_UNDER_TEST`` set) and
``KVREF_MUTANT_RECORDS`` names a folder, it writes ``<mutant>.json`` there:
which test killed it, the stage, the message and the trace length (the replay
prefix up to the failing step, or the lockstep's failure trace).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import strategies as st

import kvref
from kvref import stateful
from kvref.adapters import KVCacheAdapter
from kvref.adapters.impl_adapter import ImplAdapter
from kvref.lockstep import LockstepFailure
from kvref.mutants import lockstep_kill
from kvref.ops import REQUEST_OPS, RequestBook, execute, ids_to_json
from kvref.stateful import SHAPES
from kvref.traces import Trace, load
from kvspec.config import KVCacheConfig, SinkFullAttention
from kvspec.errors import ConfigError, KVCacheError

Json = Any

ROOT = Path(kvref.__file__).resolve().parents[1]
"""The repository (found through the kit, so that mutmut's copy of this file finds it too)."""
GOLDEN_DIR = Path(os.environ.get("KVREF_GOLDEN", ROOT / "traces" / "golden"))
SHAPE_NAMES = [s.name for s in SHAPES]
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
    book = RequestBook(trace.config)
    for i, step in enumerate(trace.steps):
        op = {k: v for k, v in step.items() if k not in ("expect", "view")}
        if op["op"] in REQUEST_OPS:
            book.apply(op)
            continue
        try:
            got = execute_batched(impl, book, op) if batch and batchable(op) else execute(adapter, book, op)
            if got != step.get("expect"):
                return i, f"{op['op']}: kvspec returned {step.get('expect')!r}, kvimpl returned {got!r}"
            if "view" in step and adapter.to_view().digest() != step["view"]:
                return i, f"{op['op']}: view digest differs from kvspec's"
            impl.check_invariants()
            if device is not None:
                check_device_tables(impl)
        except Exception as exc:  # a crash or a broken invariant is a difference too
            return i, f"{op['op']}: {type(exc).__name__}: {exc}"
    return None


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
def test_device_replay(shape: str) -> None:
    """The first golden traces of ``shape`` on kvimpl with CPU device block tables (needs torch)."""
    pytest.importorskip("torch")
    for path in golden_traces(shape)[:DEVICE_TRACES]:
        failed = replay_checked(load(path), device="cpu")
        if failed is not None:
            step, message = failed
            _record(f"test_device_replay[{shape}]", "device", f"{path.name} step {step}: {message}", step + 1, None)
            pytest.fail(f"{path.name}: step {step} (device tables): {message}")


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
    return replace(cfg, groups=(sink, replace(sink, sink_len=2 * sink.sink_len)), use_eagle=False, eagle_groups=())


def _tight_pool(cfg: KVCacheConfig) -> KVCacheConfig:
    """``cfg`` with at most 10 blocks, so that capacity estimates decide admissions."""
    return replace(cfg, num_blocks=min(cfg.num_blocks, 10))


def _tiny_pool(cfg: KVCacheConfig) -> KVCacheConfig:
    """``cfg`` with a pool of 1, 2 or 3 blocks (the null block included)."""
    return replace(cfg, num_blocks=1 + cfg.num_blocks % 3)


MAMBA_SHAPES = ("mamba-align", "mamba-all", "full+mamba-align", "full+mamba-all", "full@2x+mamba-align")
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
    drawn = stateful.configs

    def configs(shapes: Sequence[stateful.Shape] = stateful.SHAPES) -> st.SearchStrategy[tuple[str, KVCacheConfig]]:
        chosen = [s for s in SHAPES if s.name in names]  # not ``shapes``: lockstep_kill passes names[0] only
        return drawn(chosen).map(lambda nc: (f"{nc[0]}/{edge}", rewrite(nc[1])))

    monkeypatch.setattr(stateful, "configs", configs)
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
