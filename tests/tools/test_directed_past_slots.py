"""The directed traces of ``kvtools.directed.past_slots`` (under vLLM 0.26.0,
0.29.0 and 0.33.0) are what their scripts record on kvspec now, and each one
takes the situation it was written for (CI replays the 0.33.0 ones against real
vLLM 0.33.0; the 0.26.0 and 0.29.0 ones were replayed by those releases)."""

from __future__ import annotations

import pytest

from kvref.traces import Trace
from kvtools.directed.past_slots import scenarios
from kvtools.directed.record import DIRECTED_DIR

RELEASE = "vllm-0.33.0"
RECORDED = ("vllm-0.26.0", "vllm-0.29.0", RELEASE)
"""The releases whose ``directed/`` folder holds the three traces."""


@pytest.mark.parametrize("release", RECORDED)
@pytest.mark.parametrize("index", [0, 1, 2])
def test_committed_trace_is_what_the_script_records(release: str, index: int) -> None:
    sc = scenarios(release)[index]
    folder = DIRECTED_DIR.parent.parent / release / "directed"
    assert (folder / f"{sc.name}.jsonl").read_text() == sc.record().dumps()


def _events(trace: Trace) -> list[list[tuple[str, int | None]]]:
    """(type, block size) of the events of each take_events, in order."""
    takes = [step["expect"] for step in trace.steps if step["op"] == "take_events"]
    return [[(e["type"], e.get("block_size")) for e in events] for events in takes]


def test_past_the_slots_the_tail_entry_waits_for_its_block() -> None:
    """The count of 15 caches block 0 of each group only (the tail entry's
    block is not in the table); the next allocation registers the entry at
    12 tokens (one hash unit of 4 tokens)."""
    events = _events(scenarios(RELEASE)[0].record())
    assert events[0] == [("BlockStored", 8), ("BlockStored", 8)]
    assert events[1] == [("BlockStored", 4)]


def test_an_evicted_held_block_is_keyed_again_by_its_tail() -> None:
    """Eviction removes the block's two keys; the next allocation stores the
    tail entry again, alone."""
    events = _events(scenarios(RELEASE)[1].record())
    assert events[1] == [("BlockRemoved", None), ("BlockRemoved", None), ("BlockStored", 4)]


def test_a_shared_block_keyed_again_keeps_the_later_tail() -> None:
    """y's block is evicted with its three keys (the full key, y's tail
    entry at 14, x's at 10); x keys it again at 10 (one hash unit of 2
    tokens), then y's entry at 14 stands for more tokens than the block's
    key, so that key is removed before y's is stored."""
    trace = scenarios(RELEASE)[2].record()
    last = [events for events in _events(trace) if events][-1]
    assert last == [("BlockRemoved", None)] * 3 + [("BlockStored", 2), ("BlockRemoved", None), ("BlockStored", 2)]
    stored = [step["expect"] for step in trace.steps if step["op"] == "take_events" and step["expect"]][-1]
    assert stored[3]["block_hashes"] == stored[4]["block_hashes"]  # the key x stored is the one removed
    assert stored[5]["token_ids"] == [12, 13]  # y's entry: the hash unit ending at 14
