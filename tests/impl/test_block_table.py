"""kvimpl's device block tables (CPU tensors here; ``python -m kvtools check-cuda``
runs :func:`kvtools.device_exercise.exercise` on a GPU).

After random operations every live request's tensor rows equal its
``get_block_ids`` padded with 0, and ``slot_mapping`` equals a pure-Python
computation from the same tables. Skipped when torch is not installed.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvimpl.kv_cache_manager import KVCacheManager
from kvimpl.native import native_module
from kvspec.config import FullAttention, KVCacheConfig
from kvspec.errors import InvalidTokenCountError, UnknownRequestError, UnsupportedOperationError
from kvspec.request import RequestBlockHasher
from kvtools.device_exercise import MAX_LEN, SHAPES, check_tables, exercise, native_runs

pytest.importorskip("torch")


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("seed", range(6))
def test_rows_follow_tables(shape: str, seed: int) -> None:
    exercise("cpu", shape, seed)


@pytest.mark.skipif(native_module() is None, reason="the native extension is not built here")
@pytest.mark.parametrize("shape", sorted(s for s in SHAPES if native_runs(s)))
@pytest.mark.parametrize("seed", range(6))
def test_native_rows_follow_tables(shape: str, seed: int) -> None:
    """The native core writes the host rows itself; they follow its tables too."""
    exercise("cpu", shape, seed, native=True)


@settings(max_examples=30, deadline=None)
@given(shape=st.sampled_from(sorted(SHAPES)), seed=st.integers(0, 2**32 - 1))
def test_rows_follow_tables_random(shape: str, seed: int) -> None:
    exercise("cpu", shape, seed, steps=25)


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
