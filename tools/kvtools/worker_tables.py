"""kvimpl's device tables against vLLM's own worker tables, step by step.

A scheduler drives a kvimpl manager (with device tables, ``cpu-copy``)
through steps of finishes, preemptions, decodes, prefill chunks, admissions
and resumptions. Each step also yields what vLLM's ``SchedulerOutput``
carries for the worker's tables (finished ids, the requests not scheduled,
new and resumed requests with their whole tables, running requests with
their new block ids, the tokens scheduled), which is applied to vLLM's own
worker objects in the order its model runner applies them
(``vllm/v1/worker/gpu_model_runner.py``, ``_update_states``: remove the
finished, remove the unscheduled, update and append the running, add the new
then the resumed, condense): ``InputBatch`` (``gpu_input_batch.py``) and the
``MultiGroupBlockTable`` it holds, on the CPU build with ``device="cpu"``.
After every step both sides must agree on:

* the rows: which request is in which row;
* each row's blocks (vLLM's live prefix, ``num_blocks_per_row``; kernel
  blocks where the kernel block size is smaller), except where kvimpl holds
  the null block for a block the manager has since freed (a sliding-window,
  chunked-local or Mamba block that left the window): vLLM's worker is told
  only of new blocks and keeps the freed block's id there, which no kernel
  reads (:data:`STALE_KINDS`); such entries are counted;
* the slots of every token the step computes, per group: kvimpl's
  ``compute_slot_mapping`` against vLLM's kernel applied to vLLM's table.
  vLLM's Triton kernel cannot run on a machine without a GPU, so its
  formula is applied in plain Python here (:func:`vllm_slot`, written from
  the kernel of the installed release: 0.25.1 spreads a block over the
  decode times prefill context-parallel ranks, 0.33.0 over the decode ranks
  only and computes no slots for Mamba groups).

The scheduler admits a step's new requests before its resumed ones, as
vLLM's model runner adds them; kvimpl's tables give rows in the order the
manager first allocates for a request (``docs/architecture.md``, "Device tables").

Requires vLLM (``kvref install-vllm``); ``tests/conformance/test_worker_tables.py``
runs it over the shape catalog.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from kvimpl.config_rules import manager_kinds
from kvimpl.device_tables import CPU_COPY
from kvimpl.native import create_manager
from kvref.adapters.vllm import installed_vllm_version
from kvref.shapes import SHAPES, Shape, build_kinds, shape_allowed
from kvspec.config import ChunkedLocal, CrossAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.errors import ConfigError, ContextParallelLookupError
from kvspec.profiles import PROFILES, SemanticsProfile
from kvspec.request import Request, RequestBlockHasher, RequestStatus

STALE_KINDS = (SlidingWindow, ChunkedLocal, Mamba)
"""Kinds whose managers null table entries after handing them out."""

Tables = tuple[list[int], ...]


@dataclass
class StepOutput:
    """What one step's ``SchedulerOutput`` tells the worker's tables."""

    finished: list[str] = field(default_factory=list)
    unscheduled: list[str] = field(default_factory=list)
    new: list[tuple[str, Tables, int]] = field(default_factory=list)
    """New requests: id, whole tables, tokens computed before the step."""
    resumed: list[tuple[str, Tables, int]] = field(default_factory=list)
    running: list[tuple[str, Tables | None, int]] = field(default_factory=list)
    """Running requests: id, new block ids (None: none), tokens computed before the step."""
    scheduled: dict[str, int] = field(default_factory=dict)
    """Tokens each scheduled request computes in the step."""


@dataclass
class Report:
    """What a run compared."""

    steps: int = 0
    rows: int = 0
    entries: int = 0
    stale: int = 0
    slots: int = 0
    skipped_groups: int = 0


def has_v1_worker() -> bool:
    """Whether the installed vLLM has the worker tables this module compares with: the v1
    ``InputBatch`` and its ``MultiGroupBlockTable`` (vLLM 0.25.1 to 0.33.0; 0.34.0's model runner
    keeps ``BlockTables`` of another layout, which nothing here models yet)."""
    try:
        return importlib.util.find_spec("vllm.v1.worker.gpu_input_batch") is not None
    except ModuleNotFoundError:
        return False


class VllmWorker:
    """vLLM's ``InputBatch`` (with its ``MultiGroupBlockTable``) on the CPU."""

    def __init__(self, config: KVCacheConfig, kernel_block_sizes: list[int], cp_rank: tuple[int, int]) -> None:
        import torch  # noqa: PLC0415 - vLLM needs torch
        from vllm.v1.worker import gpu_input_batch  # noqa: PLC0415 - vLLM is optional

        # vLLM decides pinning once, from its platform (CUDA for the wheel from the package index), and
        # its modules keep copies of the flag; a machine without a GPU cannot pin, and the tables'
        # contents do not depend on it.
        for name, module in list(sys.modules.items()):
            if name.startswith("vllm") and isinstance(getattr(module, "PIN_MEMORY", None), bool):
                setattr(module, "PIN_MEMORY", False)  # noqa: B010 - a module attribute the checker cannot see
        InputBatch = gpu_input_batch.InputBatch

        self.config = config
        physical = [k.block_size for k in config.groups]
        # Wide enough for every table the managers build (their block sizes, context parallelism included).
        blocks = [-(config.max_model_len // -k.block_size) + 4 for k in manager_kinds(config)]
        args: dict[str, Any] = {
            "max_num_reqs": 64,
            "max_model_len": config.max_model_len,
            "max_num_batched_tokens": 4096,
            "device": torch.device("cpu"),
            "vocab_size": 1000,
            "block_sizes": physical,
            "max_num_blocks_per_req": blocks,
        }
        params = inspect.signature(InputBatch.__init__).parameters
        self.has_kernel_blocks = "kernel_block_sizes" in params
        if self.has_kernel_blocks:
            args["kernel_block_sizes"] = kernel_block_sizes
        if "slot_mapping_modes" in params:
            modes: Any = importlib.import_module("vllm.v1.worker.block_table").SlotMappingMode  # 0.33.0 on
            args["slot_mapping_modes"] = [
                modes.NONE if isinstance(k, Mamba) else modes.TOKEN_TO_KV_SLOT
                for k in config.groups
            ]
        self.batch: Any = InputBatch(**args)
        dcp_rank, pcp_rank = cp_rank
        for table in self.batch.block_table.block_tables:
            table.dcp_world_size, table.dcp_rank = config.dcp_world_size, dcp_rank
            table.pcp_world_size, table.pcp_rank = config.pcp_world_size, pcp_rank
        self.state: dict[str, Any] = {}

    def apply(self, out: StepOutput) -> None:
        """The step's table updates, in the model runner's order."""
        from vllm.sampling_params import SamplingParams  # noqa: PLC0415
        from vllm.v1.worker.gpu_input_batch import CachedRequestState  # noqa: PLC0415

        batch = self.batch
        for rid in out.finished:
            self.state.pop(rid, None)
            batch.remove_request(rid)
        scheduled = set(out.scheduled)
        for rid in [r for r in batch.req_id_to_index if r not in scheduled]:
            batch.remove_request(rid)
        to_add = []
        for rid, tables, computed in out.new:
            state = CachedRequestState(
                req_id=rid, prompt_token_ids=[1], mm_features=[], sampling_params=SamplingParams(),
                generator=None, block_ids=tuple(list(t) for t in tables), num_computed_tokens=computed,
                output_token_ids=[],
            )  # fmt: skip
            self.state[rid] = state
            to_add.append(state)
        for rid, new_ids, computed in out.running:
            state = self.state[rid]
            state.num_computed_tokens = computed
            if new_ids is not None:
                for ids, more in zip(state.block_ids, new_ids, strict=True):
                    ids.extend(more)
            index = batch.req_id_to_index.get(rid)
            if index is None:
                to_add.append(state)
            elif new_ids is not None:
                batch.block_table.append_row(new_ids, index)
        for rid, tables, computed in out.resumed:
            state = self.state[rid]
            state.block_ids = tuple(list(t) for t in tables)
            state.num_computed_tokens = computed
            to_add.append(state)
        for state in to_add:
            batch.add_request(state)
        batch.condense()
        batch.refresh_metadata()
        batch.block_table.commit_block_table(batch.num_reqs)

    def rows(self) -> list[str]:
        return list(self.batch.req_ids[: self.batch.num_reqs])

    def row(self, group: int, row: int) -> list[int]:
        table = self.batch.block_table[group]
        return [int(x) for x in table.block_table.np[row, : table.num_blocks_per_row[row]]]

    def computes_slots(self, group: int) -> bool:
        """Whether token slots of ``group`` mean anything: not for Mamba, whose
        layers read the table as state indices (0.33.0's worker computes none for
        it), nor for cross attention, whose slots are the encoder's (vLLM's model
        runner maps them apart)."""
        return not isinstance(self.config.groups[group], Mamba | CrossAttention)

    def slots(self, group: int, positions: list[list[int]]) -> list[int]:
        """vLLM's kernel on its own table: ``positions[i]`` are batch row ``i``'s tokens."""
        table = self.batch.block_table[group]
        if self.has_kernel_blocks:  # 0.25.1: decode times prefill ranks
            world = table.pcp_world_size * table.dcp_world_size
            rank = table.pcp_rank * table.dcp_world_size + table.dcp_rank
        else:  # 0.33.0: decode ranks only
            world, rank = table.dcp_world_size, table.dcp_rank
        np_table = table.block_table.np
        return [
            vllm_slot(np_table[r], p, table.block_size, world, rank, table.cp_kv_cache_interleave_size)
            for r, row_positions in enumerate(positions)
            for p in row_positions
        ]


def vllm_slot(row: Any, pos: int, block_size: int, world: int, rank: int, interleave: int) -> int:
    """vLLM's ``_compute_slot_mapping_kernel`` for one token (``vllm/v1/worker/block_table.py``):
    the block of the position's virtual block (``block_size * world`` tokens) and
    its offset on ``rank``, or -1 where another rank holds the position."""
    virtual = block_size * world
    index, off = pos // virtual, pos % virtual
    if (off // interleave) % world != rank:
        return -1
    return int(row[index]) * block_size + off // (world * interleave) * interleave + off % interleave


def drive(
    config: KVCacheConfig, seed: int, steps: int, native: bool | None = None, **tables: Any
) -> Iterator[tuple[Any, StepOutput]]:
    """A kvimpl manager (``create_manager``'s ``native``) with device tables
    (``BlockTable.for_config`` keywords ``tables``) under random scheduler
    steps, and each step's output."""
    rng = random.Random(seed)
    mgr: Any = create_manager(config, device=CPU_COPY, native=native)
    core = mgr.device_tables._core  # the native core writes its own rows (None: the Python manager)
    mgr.device_tables = type(mgr.device_tables).for_config(config, CPU_COPY, core=core, **tables)
    hasher = RequestBlockHasher(config.hash_function, config.hash_seed, config.resolved_hash_block_size())
    running: dict[str, Request] = {}
    preempted: dict[str, Request] = {}
    to_finish: list[str] = []
    count = 0
    for _ in range(steps):
        out = StepOutput(finished=to_finish)
        for rid in to_finish:
            mgr.free(rid)
        to_finish = []
        for rid in sorted(running):
            req = running[rid]
            n = _chunk(rng, req)
            before = req.num_computed_tokens
            got = mgr.allocate_slots(req, n)
            if got is None:  # preempt it: all its blocks go, it waits to be resumed
                mgr.free(rid)
                preempted[rid] = replace(running.pop(rid), num_computed_tokens=0, status=RequestStatus.PREEMPTED)
                out.unscheduled.append(rid)
                continue
            out.running.append((rid, tuple(list(g) for g in got) if any(got) else None, before))
            out.scheduled[rid] = n
            running[rid] = _advance(hasher, req, n)
        # As vLLM's scheduler: nothing waiting is admitted in a step that preempted.
        for _ in range(0 if out.unscheduled else rng.randint(0, 2)):
            count += 1
            prompt = [1, 2, 3, 4][: rng.randint(0, 4)] + [rng.randint(5, 9) for _ in range(rng.randint(1, 24))]
            _admit(mgr, hasher, hasher.new_request(f"r{seed}-{count}", prompt), rng, running, out, out.new)
        for rid in sorted(preempted)[: 0 if out.unscheduled else rng.randint(0, 1)]:
            if _admit(mgr, hasher, preempted[rid], rng, running, out, out.resumed):
                del preempted[rid]
        for rid in sorted(running):
            if rng.random() < 0.15 or running[rid].num_tokens >= config.max_model_len - 2:
                to_finish.append(rid)
                running.pop(rid)
        yield mgr, out


def _admit(
    mgr: Any,
    hasher: RequestBlockHasher,
    req: Request,
    rng: random.Random,
    running: dict[str, Request],
    out: StepOutput,
    into: list[Any],
) -> bool:
    """Look the request up and allocate its first chunk; whether it fits."""
    try:
        hits, hit = mgr.get_computed_blocks(req)
    except ContextParallelLookupError:  # the release refuses lookups of this kind under context parallelism
        hits, hit = None, 0
    n = min(req.num_tokens - hit, rng.choice([4, 8, 64]))
    encoder = 8 if any(isinstance(k, CrossAttention) for k in mgr.config.groups) else 0
    if n <= 0 or mgr.allocate_slots(req, n, hit, hits, num_encoder_tokens=encoder) is None:
        return False
    into.append((req.request_id, tuple(list(g) for g in mgr.get_block_ids(req.request_id)), hit))
    out.scheduled[req.request_id] = n
    running[req.request_id] = _advance(hasher, replace(req, num_computed_tokens=hit, status=RequestStatus.RUNNING), n)
    return True


def _chunk(rng: random.Random, req: Request) -> int:
    left = req.num_tokens - req.num_computed_tokens
    return min(left, rng.choice([1, 4, 16])) if left > 0 else 1


def _advance(hasher: RequestBlockHasher, req: Request, n: int) -> Request:
    done = replace(req, num_computed_tokens=req.num_computed_tokens + n)
    if done.num_computed_tokens < req.num_tokens:
        return done
    return hasher.with_output_tokens(done, [req.num_tokens % 7 + 1])


def compare(mgr: Any, worker: VllmWorker, out: StepOutput, report: Report, kernel_factors: list[int]) -> None:
    """Rows, row contents and the step's slots of kvimpl's tables against vLLM's worker's.

    Raises:
        AssertionError: On the first difference, naming it.
    """
    bt = mgr.device_tables
    bt.sync()
    rows = worker.rows()
    assert bt.row_ids == rows, f"rows: kvimpl {bt.row_ids} != vLLM {rows}"
    report.rows += len(rows)
    for g, kind in enumerate(mgr.config.groups):
        expanded = bt.block_table(g).tolist()
        for r, rid in enumerate(rows):
            ours = expanded[r][: len(mgr.get_block_ids(rid)[g]) * kernel_factors[g]]
            theirs = worker.row(g, r)
            assert len(ours) == len(theirs), f"group {g} row {r} ({rid}): {len(ours)} entries != vLLM's {len(theirs)}"
            for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
                if a == b:
                    continue
                assert isinstance(kind, STALE_KINDS) and a // kernel_factors[g] == 0, (
                    f"group {g} row {r} ({rid}) entry {i}: kvimpl {a} != vLLM {b}"
                )
                report.stale += 1
            report.entries += len(ours)
        if not rows:
            continue
        if not worker.computes_slots(g):
            report.skipped_groups += 1
            continue
        positions = [_step_positions(out, rid) for rid in rows]
        qsl = [0]
        for p in positions:
            qsl.append(qsl[-1] + len(p))
        flat = [p for ps in positions for p in ps]
        ours_slots = bt.compute_slot_mapping(qsl, flat, g).tolist()
        theirs_slots = worker.slots(g, positions)
        assert ours_slots == theirs_slots, f"group {g} slots: kvimpl {ours_slots} != vLLM {theirs_slots}"
        report.slots += len(flat)


def _step_positions(out: StepOutput, rid: str) -> list[int]:
    before = next(
        (c for r, _, c in (*out.new, *out.resumed, *out.running) if r == rid),
        0,
    )
    return list(range(before, before + out.scheduled.get(rid, 0)))


def shape_config(shape: Shape, profile: SemanticsProfile, seed: int) -> KVCacheConfig | None:
    """A configuration of ``shape`` under ``profile`` (None: refused by kvspec or kvimpl)."""
    rng = random.Random(seed)
    kinds = build_kinds(shape, 4, window=8, spec_blocks=rng.choice([0, 1]))
    caching = shape.caching if shape.caching is not None else rng.random() < 0.6
    try:
        return KVCacheConfig(
            num_blocks=rng.randint(24, 80),
            groups=kinds,
            max_model_len=64,
            enable_caching=caching,
            dcp_world_size=shape.dcp,
            pcp_world_size=shape.pcp,
            profile=profile,
        )
    except ConfigError:
        return None


def check_shape(
    shape: Shape, profile: SemanticsProfile, seed: int, steps: int = 40, native: bool | None = None
) -> Report | None:
    """Drive a configuration of ``shape`` and compare every step (None: not
    constructible under ``profile``).

    Raises:
        AssertionError: The first difference from vLLM's worker tables.
    """
    config = shape_config(shape, profile, seed)
    if config is None:
        return None
    rng = random.Random(seed)
    physical = [k.block_size for k in config.groups]
    kernel = [b // 2 if b % 2 == 0 and rng.random() < 0.5 else b for b in physical]
    world = config.dcp_world_size * config.pcp_world_size
    dcp_rank, pcp_rank = rng.randrange(config.dcp_world_size), rng.randrange(config.pcp_world_size)
    worker = VllmWorker(config, kernel, (dcp_rank, pcp_rank))
    if not worker.has_kernel_blocks:
        kernel = physical
    # kvimpl's rank within each context-parallel group's world (its manager block size over the kind's).
    rank = (pcp_rank * config.dcp_world_size + dcp_rank if worker.has_kernel_blocks else dcp_rank) if world > 1 else 0
    report = Report()
    tables = {"kernel_block_sizes": kernel, "cp_rank": rank}
    factors = [p // k for p, k in zip(physical, kernel, strict=True)]
    try:
        for mgr, out in drive(config, seed, steps, native, **tables):
            worker.apply(out)
            compare(mgr, worker, out, report, factors)
            report.steps += 1
    except ConfigError:
        return None
    return report


def release_profile() -> SemanticsProfile:
    """The profile of the installed vLLM release."""
    import vllm  # noqa: PLC0415 - vLLM is optional

    return PROFILES[f"vllm-{vllm.__version__}"]


def catalog() -> list[Shape]:
    """The catalog shapes to check under the installed release."""
    profile = release_profile()
    return [s for s in SHAPES if shape_allowed(s, profile)]



def main(argv: list[str] | None = None) -> int:
    """``python -m kvtools worker-tables [--seeds N] [--steps N]``: every catalog
    shape under the installed release, both builds; one line per shape, exit 1
    on a difference."""
    parser = argparse.ArgumentParser(prog="python -m kvtools worker-tables", description=main.__doc__)
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)
    from kvimpl.native import native_module  # noqa: PLC0415

    if not has_v1_worker():
        print(
            f"vLLM {installed_vllm_version()} has no v1 worker InputBatch (vllm.v1.worker.gpu_input_batch; its "
            "model runner keeps BlockTables of another layout): nothing compared"
        )
        return 3
    profile = release_profile()
    builds = [False, True] if native_module() is not None else [False]
    failed = 0
    for shape in catalog():
        for native in builds:
            totals = Report()
            runs = 0
            for seed in range(args.seeds):
                try:
                    report = check_shape(shape, profile, seed, args.steps, native)
                except AssertionError as exc:
                    print(f"{shape.name} ({'native' if native else 'python'}) seed {seed}: DIFFERS: {exc}")
                    failed += 1
                    continue
                if report is not None:
                    runs += 1
                    for name in ("steps", "rows", "entries", "stale", "slots"):
                        setattr(totals, name, getattr(totals, name) + getattr(report, name))
            build = "native" if native else "python"
            if runs:
                print(
                    f"{shape.name} ({build}): {runs} runs, {totals.steps} steps, {totals.rows} rows, "
                    f"{totals.entries} entries ({totals.stale} stale in vLLM), {totals.slots} slots: equal"
                )
            else:
                print(f"{shape.name} ({build}): no configuration constructs under {profile.name}")
    print(f"vLLM {profile.release} worker tables: {'all equal' if not failed else f'{failed} runs differ'}")
    return 1 if failed else 0
