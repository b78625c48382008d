"""The directed traces of ``kvtools.directed.lookahead_hashes`` (under vLLM
0.33.0 and 0.34.0) are what their scripts record on kvspec now, and each takes
the situation it was written for (CI replays the 0.34.0 ones against real vLLM
0.34.0; the 0.33.0 ones were replayed by that release)."""

from __future__ import annotations

import pytest

from kvref.traces import Trace
from kvtools.directed.lookahead_hashes import scenarios
from kvtools.directed.record import DIRECTED_DIR

RECORDED = ("vllm-0.33.0", "vllm-0.34.0")


@pytest.mark.parametrize("release", RECORDED)
@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_committed_trace_is_what_the_script_records(release: str, index: int) -> None:
    sc = scenarios(release)[index]
    folder = DIRECTED_DIR.parent.parent / release / "directed"
    assert (folder / f"{sc.name}.jsonl").read_text() == sc.record().dumps()


def _lookups(trace: Trace) -> list[tuple[str, int]]:
    return [(step["rid"], step["expect"]["num_tokens"]) for step in trace.steps if step["op"] == "get_computed_blocks"]


def _stored(trace: Trace) -> list[tuple[list[int], list[list[int]]]]:
    """(token ids, look-ahead token ids) of each BlockStored of group 0, in order."""
    takes = [step["expect"] for step in trace.steps if step["op"] == "take_events"]
    return [
        (e["token_ids"], e["lookahead_token_ids"])
        for events in takes
        for e in events
        if e["type"] == "BlockStored" and e["group_idx"] == 0
    ]


def test_one_token_of_look_ahead_delays_the_last_block() -> None:
    trace = scenarios("vllm-0.34.0")[0].record()
    stored = _stored(trace)
    assert stored[0] == (list(range(100, 112)), [[104], [108], [112]])  # 16 tokens: 3 hashes
    assert stored[1] == (list(range(112, 116)), [[7]])  # the sampled token hashes block 3
    assert _lookups(trace) == [("a", 0), ("b", 12), ("c", 16), ("c", 16)]


def test_three_tokens_of_look_ahead_move_the_mamba_tail() -> None:
    trace = scenarios("vllm-0.34.0")[1].record()
    assert _lookups(trace)[-1] == ("b", 12)  # the state at the tail, 18 - 3 rounded down to a block


def test_an_item_in_the_look_ahead_window_keys_the_block() -> None:
    trace = scenarios("vllm-0.34.0")[2].record()
    assert _lookups(trace) == [("a", 0), ("b", 0), ("c", 12)]
    takes = [step["expect"] for step in trace.steps if step["op"] == "take_events" and step["expect"]]
    assert takes[0][0]["extra_keys"] == [["l1", ["img", 5], "salt"], ["l1", ["img", 1]], ["l1"]]


def test_the_partial_tail_stays_within_the_hashed_tokens() -> None:
    """9 prompt tokens, hash units of 2, look-ahead 3: 3 hashes (6 tokens) when the
    prompt is cached, so full attention keys its tail at 6, not at the boundary 8."""
    trace = scenarios("vllm-0.34.0")[3].record()
    takes = [step["expect"] for step in trace.steps if step["op"] == "take_events"]
    tails = [e["token_ids"] for e in takes[0] if e["type"] == "BlockStored" and e["block_size"] == 2]
    assert tails == [[104, 105]]
