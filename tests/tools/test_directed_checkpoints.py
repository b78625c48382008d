"""The directed traces of ``kvtools.directed.checkpoints`` (Mamba prefill
checkpoints, vLLM 0.29.0) are what their scripts record on kvspec now, kvimpl
replays them, and each takes the situation it was written for (real vLLM
0.29.0 replayed them: ``kvref replay traces/vllm-0.29.0/directed/checkpoint-*.jsonl
--target vllm``)."""

from __future__ import annotations

import pytest

from kvref.adapters import load_factory
from kvref.traces import Trace, replay
from kvtools.directed.checkpoints import scenarios
from kvtools.directed.record import DIRECTED_DIR

RELEASE = "vllm-0.29.0"


def _by_name() -> dict[str, Trace]:
    return {sc.name: sc.record() for sc in scenarios(RELEASE)}


def test_committed_traces_are_what_the_scripts_record() -> None:
    folder = DIRECTED_DIR.parent.parent / RELEASE / "directed"
    found = scenarios(RELEASE)
    assert len(found) == 4
    for sc in found:
        assert (folder / f"{sc.name}.jsonl").read_text() == sc.record().dumps(), sc.name


@pytest.mark.parametrize("name", sorted(_by_name()))
def test_kvimpl_replays_them(name: str) -> None:
    trace = _by_name()[name]
    result = replay(trace, load_factory("impl"), name)
    assert result.ok, result.message
    assert result.steps == len(trace.steps)


def test_the_native_core_declines_them() -> None:
    trace = _by_name()["checkpoint-one-chunk"]
    result = replay(trace, load_factory("impl-native"), "checkpoint-one-chunk")
    assert not result.ok and "prefill-checkpoints" in result.skipped, result


def _hits(trace: Trace) -> list[tuple[str, int, list[int]]]:
    """Each lookup: request, hit tokens, the Mamba group's hit list."""
    return [
        (step["rid"], step["expect"]["num_tokens"], step["expect"]["blocks"][1])
        for step in trace.steps
        if step["op"] == "get_computed_blocks"
    ]


def _mamba_tables(trace: Trace) -> list[list[int]]:
    return [step["expect"][1] for step in trace.steps if step["op"] == "allocate_slots" and step["expect"]]


def test_one_chunk_keeps_the_state_at_the_last_boundary() -> None:
    trace = _by_name()["checkpoint-one-chunk"]
    assert _mamba_tables(trace) == [[0, 0, 0, 6, 7]]  # slot 3 kept beside the running state
    assert _hits(trace)[1:] == [("b", 64, [0, 0, 0, 6]), ("c", 64, [0, 0, 0, 6])]


def test_interval_zero_keeps_the_checkpoint_a_replay_reads() -> None:
    trace = _by_name()["checkpoint-two-chunks-retention-zero"]
    assert _mamba_tables(trace) == [[0, 3], [0, 7, 8]]
    assert [n for _, n, _ in _hits(trace)] == [0, 64, 64]


def test_a_chunk_from_inside_a_block_has_no_checkpoint() -> None:
    trace = _by_name()["checkpoint-chunk-inside-a-block"]
    assert _mamba_tables(trace) == [[3, 4], [0, 0, 8]]  # 0-20 keeps the state at 16; 20-70 keeps nothing more
    assert [n for _, n, _ in _hits(trace)] == [0, 32, 32]


def test_fine_hashes_keep_the_block_boundary_and_the_tail() -> None:
    trace = _by_name()["checkpoint-fine-hash"]
    assert [n for _, n, _ in _hits(trace)] == [0, 68, 68]  # the Mamba tail entry at 68 (the checkpoint holds 64)


@pytest.mark.parametrize(("release", "hit", "mamba"), [
    ("vllm-0.30.0", 48, [0, 0, 5]), ("vllm-0.31.0", 48, [0, 0, 5]), ("vllm-0.32.0", 32, [0, 4]),
])  # fmt: skip
def test_a_scratch_block_below_the_checkpoint_is_hit(release: str, hit: int, mamba: list[int]) -> None:
    """0.30.0 and 0.31.0 key the first chunk's scratch block (5) as the state at 48 and
    serve it to a request sharing 48 tokens; 0.32.0 moves it into the checkpoint slot."""
    sc = scenarios(release)
    assert [s.name for s in sc] == ["checkpoint-scratch-block"]
    trace = sc[0].record()
    folder = DIRECTED_DIR.parent.parent / release / "directed"
    assert (folder / "checkpoint-scratch-block.jsonl").read_text() == trace.dumps()
    first = next(s["expect"][1] for s in trace.steps if s["op"] == "allocate_slots")
    assert first == [3, 4, 5]  # the checkpoint at 16, the running state, the scratch block
    assert _hits(trace)[-1] == ("b", hit, mamba)
