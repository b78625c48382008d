"""The kit under decode/prefill context parallelism: the shapes, the trace
form of the world sizes, the recorded golden traces (checked against real
vLLM 0.25.1 and 0.33.0 when they were recorded) and the vLLM adapter."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvref.adapters import load_factory
from kvref.adapters.impl import native_built
from kvref.adapters.vllm import make_vllm_adapter, vllm_available
from kvref.ops import config_from_json, config_to_json
from kvref.shapes import CP_SHAPES, SHAPES, build_kinds, shape_named
from kvref.traces import load, replay
from kvspec.config import FullAttention, KVCacheConfig, SlidingWindow
from kvspec.errors import ContextParallelLookupError
from kvspec.profiles import VLLM_0_25_1, VLLM_0_33_0
from kvspec.request import RequestBlockHasher

ROOT = Path(__file__).resolve().parents[2]
CP_GOLDEN = sorted((ROOT / "traces").glob("vllm-*/golden-dcp/*.jsonl"))


def test_cp_shapes_are_appended_and_named_by_world_size() -> None:
    names = [s.name for s in CP_SHAPES]
    assert names == [
        "full@dcp2", "full@dcp4", "mla@dcp2-pcp2", "swa@dcp2", "chunked@dcp2-pcp2", "sink@dcp2",
        "full+swa+mamba-all@dcp2", "mamba-align@dcp2-pcp2",
    ]  # fmt: skip
    assert SHAPES[-len(CP_SHAPES) :] == CP_SHAPES
    assert shape_named("mla@dcp2-pcp2").pcp == 2
    assert shape_named("full+swa+mamba-all@dcp2").kinds == ("full", "swa", "mamba-all")
    for shape in CP_SHAPES:
        caching = shape.caching if shape.caching is not None else True
        # several groups under context parallelism are modelled up to vLLM 0.25.1
        profile = VLLM_0_25_1 if len(shape.kinds) > 1 else VLLM_0_33_0
        cfg = KVCacheConfig(num_blocks=16, groups=build_kinds(shape, 4, 5), max_model_len=64, profile=profile,
                            enable_caching=caching, dcp_world_size=shape.dcp, pcp_world_size=shape.pcp)  # fmt: skip
        if shape.kinds == ("mamba-align",):  # vLLM 0.33.0 scales no Mamba state block by either world size
            assert cfg.scheduler_block_size == 4
        else:
            assert cfg.scheduler_block_size == 4 * shape.dcp * (1 if cfg.profile is VLLM_0_33_0 else shape.pcp)


def test_traces_carry_world_sizes_only_when_set() -> None:
    plain = KVCacheConfig(num_blocks=8, groups=(FullAttention(4),), max_model_len=32)
    assert "dcp_world_size" not in config_to_json(plain)
    cp = KVCacheConfig(num_blocks=8, groups=(FullAttention(4),), max_model_len=32, dcp_world_size=2, pcp_world_size=2)
    data = config_to_json(cp)
    assert (data["dcp_world_size"], data["pcp_world_size"]) == (2, 2)
    assert config_from_json(data, cp.profile) == cp


def test_golden_cp_traces_exist_for_both_corpora() -> None:
    assert {p.parent.parent.name for p in CP_GOLDEN} == {"vllm-0.25.1", "vllm-0.33.0"}


@pytest.mark.parametrize("engine", ["spec", "impl"])
@pytest.mark.parametrize("path", CP_GOLDEN, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_golden_cp_trace_replays(path: Path, engine: str) -> None:
    """kvspec and kvimpl (its pure-Python manager) replay every golden trace."""
    trace = load(path)
    assert trace.config.dcp_world_size * trace.config.pcp_world_size > 1
    result = replay(trace, load_factory(engine), str(path))
    assert result.ok, result.skipped or result.message
    assert result.steps == len(trace.steps)


def test_impl_runs_context_parallelism_on_both_builds() -> None:
    """Both builds run a group under context parallelism at its scaled block size (the native core
    since it takes the managers' block sizes; it declined context parallelism before)."""
    cfg = KVCacheConfig(num_blocks=8, groups=(FullAttention(4),), max_model_len=32, dcp_world_size=2)
    targets = ["impl-python"] + (["impl-native"] if native_built() else [])
    for target in targets:
        adapter = load_factory(target)(cfg)
        req = RequestBlockHasher(cfg.hash_function, cfg.hash_seed, 8).new_request("a", list(range(9)))
        assert adapter.allocate_slots(req, 9) == ((1, 2),)  # two blocks of the scaled size 8


@pytest.mark.skipif(not vllm_available(), reason="no supported vLLM is installed")
def test_vllm_lookup_assertion_becomes_the_typed_error() -> None:
    """vLLM asserts on entry to the sliding-window lookup under DCP; the
    adapter raises ContextParallelLookupError and nothing has changed."""
    cfg = KVCacheConfig(num_blocks=16, groups=(SlidingWindow(4, 5),), max_model_len=64, dcp_world_size=2,
                        profile=VLLM_0_25_1)  # fmt: skip
    adapter = make_vllm_adapter(cfg)
    if adapter.semantics.profile != "vllm-0.25.1":
        pytest.skip("expects vLLM 0.25.1")
    hasher = RequestBlockHasher(cfg.hash_function, cfg.hash_seed, cfg.resolved_hash_block_size())
    first = hasher.new_request("a", list(range(33)))
    assert adapter.allocate_slots(first, 33, 0, ((),)) == ((1, 2, 3, 4, 5),)
    before = adapter.to_view()
    with pytest.raises(ContextParallelLookupError, match="DCP not support sliding window attn now"):
        adapter.get_computed_blocks(hasher.new_request("b", list(range(33))))
    assert adapter.to_view() == before
    # The 0.25.1 mask quirk, as kvspec models it: only blocks 2 and 4 are cached.
    assert sorted(b for _, ids in before.cached for b in ids) == [2, 4]
