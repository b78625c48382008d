"""kvimpl's device block tables (CPU tensors here; ``python -m kvtools check-cuda``
runs :func:`kvtools.device_exercise.exercise` on a GPU).

After random operations every live request's tensor rows equal its
``get_block_ids`` padded with 0, and ``slot_mapping`` equals a pure-Python
computation from the same tables, with the device tensor shared with the host
(``"cpu"``) and kept apart as on a GPU (``CPU_COPY``, whose copy is
asynchronous by emulation). Skipped when torch is not installed.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvimpl.device_tables import CPU_COPY, BlockTable
from kvimpl.kv_cache_manager import KVCacheManager
from kvimpl.native import NativeKVCacheManager, native_module
from kvspec.config import FullAttention, KVCacheConfig
from kvspec.errors import ConfigError, InvalidTokenCountError, UnknownRequestError, UnsupportedOperationError
from kvspec.invariants import InvariantViolation
from kvspec.request import RequestBlockHasher
from kvtools.device_exercise import MAX_LEN, SHAPES, check_tables, exercise, native_runs

pytest.importorskip("torch")


NATIVE = native_module() is not None
BUILDS = [False, True] if NATIVE else [False]
DEVICES = ["cpu", CPU_COPY] + (["cuda"] if __import__("torch").cuda.is_available() else [])
"""The devices of the exercises: the shared CPU tensor, the CPU copy kept apart, and CUDA where there is one."""


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("seed", range(6))
def test_rows_follow_tables(shape: str, seed: int, device: str) -> None:
    exercise(device, shape, seed)


@pytest.mark.skipif(not NATIVE, reason="the native extension is not built here")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", sorted(s for s in SHAPES if native_runs(s)))
@pytest.mark.parametrize("seed", range(6))
def test_native_rows_follow_tables(shape: str, seed: int, device: str) -> None:
    """The native core writes the host rows itself; they follow its tables too."""
    exercise(device, shape, seed, native=True)


@settings(max_examples=30, deadline=None)
@given(shape=st.sampled_from(sorted(SHAPES)), seed=st.integers(0, 2**32 - 1), native=st.sampled_from(BUILDS))
def test_rows_follow_tables_random(shape: str, seed: int, native: bool) -> None:
    if native and not native_runs(shape):
        return
    exercise(CPU_COPY, shape, seed, steps=25, native=native)


def _manager(native: bool, device: str, num_blocks: int = 64) -> tuple[object, RequestBlockHasher]:
    config = KVCacheConfig(num_blocks=num_blocks, groups=(FullAttention(4),), max_model_len=MAX_LEN)
    mgr = NativeKVCacheManager(config, device) if native else KVCacheManager(config, device=device)
    hasher = RequestBlockHasher(config.hash_function, config.hash_seed, config.resolved_hash_block_size())
    return mgr, hasher


@pytest.mark.parametrize("native", BUILDS)
def test_reading_rows_loses_no_change(native: bool) -> None:
    """A read of the host-side rows between a change and the commit must not
    hide the change from the copy (the native core once cleared its change flag
    when its rows were read, leaving the device rows stale)."""
    mgr, hasher = _manager(native, CPU_COPY)
    bt = mgr.device_tables  # type: ignore[attr-defined]
    req = hasher.new_request("a", [1, 2, 3, 4, 5])
    assert mgr.allocate_slots(req, 5) is not None  # type: ignore[attr-defined]
    assert bt.rows == {"a": 0} and bt.row_ids == ["a"] and bt.num_live == 1 and bt.mirrors[0][0]
    ids = list(mgr.get_block_ids("a")[0])  # type: ignore[attr-defined]
    assert mgr.block_table(0).tolist() == [ids + [0] * (len(mgr.block_table(0)[0]) - len(ids))]  # type: ignore[attr-defined]
    mgr.check_invariants()  # type: ignore[attr-defined]


@pytest.mark.parametrize("native", BUILDS)
def test_rows_condense_as_vllm_input_batch(native: bool) -> None:
    """Freed rows are holes until the commit; a new request takes the lowest
    hole; the commit moves the last rows into the remaining holes."""
    mgr, hasher = _manager(native, CPU_COPY)
    bt = mgr.device_tables  # type: ignore[attr-defined]
    for i in range(5):
        assert mgr.allocate_slots(hasher.new_request(f"r{i}", [i + 1] * 5), 5) is not None  # type: ignore[attr-defined]
    bt.sync()
    assert bt.row_ids == ["r0", "r1", "r2", "r3", "r4"]
    mgr.free("r3")  # type: ignore[attr-defined]
    mgr.free("r1")  # type: ignore[attr-defined]
    assert bt.row_ids == ["r0", None, "r2", None, "r4"]
    assert mgr.allocate_slots(hasher.new_request("r5", [9] * 5), 5) is not None  # type: ignore[attr-defined]
    assert bt.row_ids == ["r0", "r5", "r2", None, "r4"]
    bt.sync()
    assert bt.row_ids == ["r0", "r5", "r2", "r4"]
    mgr.free("r0")  # type: ignore[attr-defined]
    mgr.free("r4")  # type: ignore[attr-defined]
    bt.sync()
    assert bt.row_ids == ["r2", "r5"]
    mgr.check_invariants()  # type: ignore[attr-defined]


@pytest.mark.parametrize("native", BUILDS)
def test_write_racing_the_copy_fails(native: bool) -> None:
    """With the device copy kept apart, a host write after the commit that does
    not pass the fence is caught when the copy completes; the managers' own
    writes pass the fence."""
    mgr, hasher = _manager(native, CPU_COPY)
    bt = mgr.device_tables  # type: ignore[attr-defined]
    assert mgr.allocate_slots(hasher.new_request("a", [1, 2, 3, 4, 5]), 5) is not None  # type: ignore[attr-defined]
    bt.sync()
    assert mgr.allocate_slots(hasher.new_request("b", [6, 7, 8]), 3) is not None  # type: ignore[attr-defined]
    mgr.free("a")  # type: ignore[attr-defined]
    mgr.check_invariants()  # type: ignore[attr-defined]
    bt.block_table(0)
    assert mgr.allocate_slots(hasher.new_request("c", [9] * 9), 9) is not None  # type: ignore[attr-defined]
    bt.sync()
    bt.host[0, 0, 0] += 1  # a write behind the tables' back, without the fence
    with pytest.raises(InvariantViolation, match="in flight"):
        bt.block_table(0)


def test_devices_named_clearly() -> None:
    config = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=MAX_LEN)
    for bad in ("nonsense", 7, "meta"):
        with pytest.raises(ConfigError, match="cpu-copy"):
            KVCacheManager(config, device=bad)  # type: ignore[arg-type]
    import torch  # noqa: PLC0415 - the module is skipped without torch

    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            KVCacheManager(config, device="cuda")
    with pytest.raises(ConfigError, match="kernel block size 3"):
        BlockTable([4], [2], 1, "cpu", kernel_block_sizes=[3])
    with pytest.raises(ConfigError, match="rank 2"):
        BlockTable([8], [2], 1, "cpu", cp_world_sizes=[2], cp_rank=2)


def test_rows_grow_and_compact() -> None:
    config = KVCacheConfig(num_blocks=64, groups=(FullAttention(4),), max_model_len=MAX_LEN)
    mgr = KVCacheManager(config, device="cpu")
    assert mgr.device_tables is not None
    mgr.device_tables = type(mgr.device_tables)([4], [1], 1, "cpu")
    hasher = RequestBlockHasher(config.hash_function, config.hash_seed, config.resolved_hash_block_size())
    for i in range(3):
        req = hasher.new_request(f"r{i}", list(range(100 * i, 100 * i + 9)))
        assert mgr.allocate_slots(req, 9) is not None
    assert tuple(mgr.block_table().shape) == (3, 4)
    mgr.free("r0")
    assert mgr.device_tables.row_ids == [None, "r1", "r2"]
    mgr.device_tables.sync()
    assert mgr.device_tables.row_ids == ["r2", "r1"]
    check_tables(mgr, random.Random(0), None)


def test_errors() -> None:
    config = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=MAX_LEN)
    with pytest.raises(UnsupportedOperationError, match="device"):
        KVCacheManager(config).block_table()
    mgr = KVCacheManager(config, device="cpu")
    hasher = RequestBlockHasher(config.hash_function, config.hash_seed, config.resolved_hash_block_size())
    assert mgr.allocate_slots(hasher.new_request("a", [1, 2, 3, 4, 5]), 5) is not None
    with pytest.raises(UnknownRequestError):
        mgr.slot_mapping(["b"], [0])
    with pytest.raises(InvalidTokenCountError, match="outside its 2 blocks"):
        mgr.slot_mapping(["a"], [8])
    with pytest.raises(InvalidTokenCountError, match="one per token"):
        mgr.slot_mapping(["a"], [0, 1])
    assert mgr.slot_mapping(["a", "a"], [0, 7]).tolist() == [
        mgr.get_block_ids("a")[0][0] * 4,
        mgr.get_block_ids("a")[0][1] * 4 + 3,
    ]


def test_a_row_newly_in_use_is_copied_even_when_empty() -> None:
    """A request that takes a row but holds no block in any group (cross
    attention without encoder tokens) must still overwrite the device row a
    finished request left there (found by the impl-batch lockstep at seed 3)."""
    bt = BlockTable([2], [2], 1, CPU_COPY)
    bt.update("a", [[1]])
    bt.sync()
    bt.remove("a")
    bt.sync()
    bt.update("b", [[]])
    bt.sync()
    bt.check_invariants()
    assert bt.block_table(0).tolist() == [[0, 0]]


@pytest.mark.parametrize("native", BUILDS)
def test_rows_follow_tables_past_the_first_64_requests(native: bool) -> None:
    """Rows stay right while the native core's per-request arrays fill and grow (64
    requests, then 128): a write one entry past them is invisible to the Python side
    and shows only under a memory checker (``python -m kvtools cmutants`` runs this file
    under AddressSanitizer in its memcheck tier), which sees it only if a run reaches the
    last entry, as here."""
    mgr, hasher = _manager(native, CPU_COPY, num_blocks=2 * 140 + 1)
    bt = mgr.device_tables  # type: ignore[attr-defined]
    rng = random.Random(0)
    for i in range(140):
        assert mgr.allocate_slots(hasher.new_request(f"r{i}", [i + 1] * 5), 5) is not None  # type: ignore[attr-defined]
        if i in (62, 63, 64, 127, 128):
            check_tables(mgr, rng, None)
    for i in range(0, 140, 3):
        mgr.free(f"r{i}")  # type: ignore[attr-defined]
    bt.sync()
    check_tables(mgr, rng, None)
    mgr.check_invariants()  # type: ignore[attr-defined]
