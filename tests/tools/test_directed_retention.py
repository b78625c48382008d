"""The directed traces of ``kvtools.directed.retention`` are what their scripts
record on kvspec now, and each takes the situation it was written for (CI
replays the 0.25.1 and 0.34.0 ones against those real releases; the 0.29.0 and
0.33.0 ones were replayed by theirs)."""

from __future__ import annotations

import pytest

from kvref.traces import Trace
from kvtools.directed.record import DIRECTED_DIR
from kvtools.directed.retention import scenarios

RECORDED = ("vllm-0.25.1", "vllm-0.29.0", "vllm-0.33.0", "vllm-0.34.0")


@pytest.mark.parametrize("release", RECORDED)
def test_committed_traces_are_what_the_scripts_record(release: str) -> None:
    folder = DIRECTED_DIR.parent.parent / release / "directed"
    found = scenarios(release)
    assert len(found) == 4
    for sc in found:
        assert (folder / f"{sc.name}.jsonl").read_text() == sc.record().dumps(), sc.name


def _lookups(trace: Trace) -> list[tuple[str, int]]:
    return [(step["rid"], step["expect"]["num_tokens"]) for step in trace.steps if step["op"] == "get_computed_blocks"]


def _by_name(release: str) -> dict[str, Trace]:
    return {sc.name: sc.record() for sc in scenarios(release)}


def test_interval_zero_keeps_the_replay_and_from_0_26_the_junction() -> None:
    """A replay hits 64; a sibling sharing 40 tokens hits nothing; from 0.26.0 on
    its own caching keeps its shared-prefix boundary (32) reachable for the next."""
    assert _lookups(_by_name("vllm-0.25.1")["retention-window-zero"]) == [("a", 0), ("b", 64), ("c", 0), ("d", 0)]
    assert _lookups(_by_name("vllm-0.34.0")["retention-window-zero"]) == [("a", 0), ("b", 64), ("c", 0), ("d", 32)]


def test_segments_keep_a_hit_at_each_multiple() -> None:
    assert _lookups(_by_name("vllm-0.25.1")["retention-window-segments"])[2] == ("c", 32)


def test_eagle_replay_positions_from_0_30() -> None:
    """Under EAGLE the window keeps the blocks ending at 64 up to 0.29.0 (which a
    hit, dropping its last block, never reads) and at 48 from 0.30.0 on."""
    assert _lookups(_by_name("vllm-0.29.0")["retention-window-eagle"]) == [("a", 0), ("b", 0), ("c", 0)]
    assert _lookups(_by_name("vllm-0.34.0")["retention-window-eagle"]) == [("a", 0), ("b", 48), ("c", 48)]


def test_mamba_keeps_the_states_at_multiples_and_the_last_boundary() -> None:
    assert _lookups(_by_name("vllm-0.34.0")["retention-mamba"]) == [("a", 0), ("b", 8), ("c", 16)]
