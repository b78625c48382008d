"""kvimpl's device block tables under random scheduler traffic.

:func:`exercise` drives a kvimpl manager (the Python build, or the native core
with ``native=True``) with device tables through steps of one to three random
operations (admissions, decodes single and batched, skipped-block removals,
frees and pops), reading the host-side rows between them as a scheduler
might, and compares every device row with the manager's tables after each
step. ``tests/impl/test_block_table.py`` runs it on the CPU, with the device
copy kept apart (``kvimpl.device_tables.CPU_COPY``) as well as shared;
``python -m kvtools check-cuda`` runs it on a CUDA device.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from kvimpl.kv_cache_manager import KVCacheManager
from kvimpl.native import NativeKVCacheManager, native_unsupported
from kvref.shapes import build_kinds, shape_named
from kvspec.config import AttentionKind, KVCacheConfig
from kvspec.profiles import VLLM_0_25_1
from kvspec.request import Request, RequestBlockHasher, RequestStatus

SHAPES: dict[str, tuple[AttentionKind, ...]] = {
    name: build_kinds(shape_named(name), 4, window, spec_blocks)
    for name, window, spec_blocks in (
        ("full", 1, 0),
        ("full+swa", 8, 0),
        ("full+mamba-align", 1, 1),
        ("mla+swa@2x", 6, 0),
        ("sink+chunked", 1, 0),
        ("full+cross", 1, 0),
    )
}
MAX_LEN = 40


def native_runs(shape: str) -> bool:
    """Whether the native core implements ``shape`` (cross attention runs on Python)."""
    config = KVCacheConfig(num_blocks=16, groups=SHAPES[shape], max_model_len=MAX_LEN, enable_caching=False)
    return native_unsupported(config) is None


def exercise(device: str, shape: str, seed: int, steps: int = 40, native: bool = False) -> None:
    """Random admissions, decodes (single and batched), skipped-block removals,
    frees and pops on a manager with device tables; check the tensors after each.

    Raises:
        UnsupportedByProfileError: With ``native``, if the native core cannot run the shape (:func:`native_runs`).
    """
    import torch  # noqa: PLC0415 - the test module is skipped without torch

    rng = random.Random(seed)
    groups = SHAPES[shape]
    caching = "cross" not in shape and rng.random() < 0.7
    config = KVCacheConfig(
        num_blocks=rng.randint(10, 40),
        groups=groups,
        max_model_len=MAX_LEN,
        enable_caching=caching,
        profile=VLLM_0_25_1,
    )
    mgr: Any = NativeKVCacheManager(config, device) if native else KVCacheManager(config, device=device)
    hasher = RequestBlockHasher(config.hash_function, config.hash_seed, config.resolved_hash_block_size())
    running: dict[str, Request] = {}
    for step in range(steps):
        for i in range(rng.randint(1, 3)):
            _operate(mgr, hasher, rng, running, shape, f"{step}.{i}")
            # Host-side reads in the middle of a step change nothing (they once lost a change).
            bt = mgr.device_tables
            _ = (bt.rows, bt.row_ids, bt.num_live, bt.num_rows, bt.mirrors)
        check_tables(mgr, rng, torch)


def _operate(
    mgr: Any, hasher: RequestBlockHasher, rng: random.Random, running: dict[str, Request], shape: str, tag: str
) -> None:
    """One random scheduler operation on ``mgr``; ``running`` follows it."""
    op = rng.choice(["admit", "admit", "decode", "decode", "batch", "skip", "free", "free_batch", "pop"])
    if op == "admit" or not running:
        prompt = [1, 2, 3, 4, 5, 6][: rng.randint(0, 6)] + [rng.randint(7, 9) for _ in range(rng.randint(1, 12))]
        req = hasher.new_request(f"r{tag}", prompt)
        hits, n = mgr.get_computed_blocks(req)
        enc = rng.randint(1, 9) if "cross" in shape else 0
        if mgr.allocate_slots(req, req.num_tokens - n, n, hits, num_encoder_tokens=enc) is not None:
            done = replace(req, num_computed_tokens=req.num_tokens, status=RequestStatus.RUNNING)
            running[req.request_id] = hasher.with_output_tokens(done, [len(running) % 5])
    elif op in ("decode", "batch"):
        reqs = [r for r in rng.sample(sorted(running.values(), key=lambda r: r.request_id), len(running))]
        reqs = [r for r in reqs if r.num_tokens <= MAX_LEN][: rng.randint(1, 4)]
        if op == "batch":
            got = mgr.allocate_slots_batch(reqs, [1] * len(reqs))
        else:
            got = [mgr.allocate_slots(r, 1) for r in reqs]
        for r, g in zip(reqs, got, strict=True):
            if g is not None:
                running[r.request_id] = hasher.with_output_tokens(replace(r, num_computed_tokens=r.num_tokens), [1])
    elif op == "skip":
        r = rng.choice(sorted(running.values(), key=lambda r: r.request_id))
        mgr.remove_skipped_blocks(r.request_id, r.num_computed_tokens)
    elif op == "pop":
        rid = rng.choice(sorted(running))
        mgr.free_blocks(list(reversed(mgr.pop_blocks_for_free(rid))))
        running.pop(rid)
    else:
        rids = rng.sample(sorted(running), rng.randint(1, len(running)))
        if op == "free":
            mgr.free(rids[0])
            rids = rids[:1]
        else:
            mgr.free_batch(rids)
        for rid in rids:
            running.pop(rid)


def check_tables(mgr: Any, rng: random.Random, torch: object) -> None:
    """Rows equal the padded tables; slot mapping equals the Python formula."""
    bt = mgr.device_tables
    assert bt is not None
    mgr.check_invariants()
    if isinstance(mgr, KVCacheManager):
        holders = {r for m in mgr.coordinator.managers for r in m.req_to_blocks}
    else:
        holders = {rid for rid, *_ in mgr._tables()}
    assert set(bt.rows) == holders, f"rows {sorted(bt.rows)} != holders {sorted(holders)}"
    for g, kind in enumerate(mgr.config.groups):
        host = mgr.block_table(g).cpu().tolist()
        assert len(host) == len(holders)
        rids, positions, want = [], [], []
        for rid in sorted(holders):
            table = list(mgr.get_block_ids(rid)[g])
            row = host[bt.row_of(rid)]
            assert row == table + [0] * (len(row) - len(table)), f"group {g} {rid}: {row} vs {table}"
            for pos in rng.sample(range(len(table) * kind.block_size), min(3, len(table) * kind.block_size)):
                rids.append(rid)
                positions.append(pos)
                want.append(table[pos // kind.block_size] * kind.block_size + pos % kind.block_size)
        got = mgr.slot_mapping(rids, positions, g)
        assert got.cpu().tolist() == want, f"group {g}: slots {got.tolist()} != {want}"
