"""The content oracle on Mamba groups (kvref.content, kvref.safety; docs/safety.md).

A Mamba block holds one recurrent state, the state after a prefix of the
request's inputs. The oracle checks that a hit serves, and a step reads where
the ``mamba_cache_mode`` says, the state of the request's own prefix at that
length, and writes its states where the mode says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvref.adapters import load_factory
from kvref.content import UNWRITTEN
from kvref.content_states import (
    accepted_copy,
    checkpoint_write,
    draft_row_writes,
    mamba_checked,
    positional_checkpoint_write,
    stale_index,
    state_hit_index,
    state_read_index,
    state_writes,
)
from kvref.lockstep import Lockstep, LockstepFailure, RunStats
from kvref.safety import SafetyMonitor, safety_monitor, safety_replay
from kvref.traces import load
from kvspec.config import FullAttention, KVCacheConfig, Mamba, MambaMode
from kvspec.profiles import VLLM_0_25_1, profile_named


def _solo(cfg: KVCacheConfig, tmp_path: Path) -> tuple[Lockstep, SafetyMonitor]:
    stats = RunStats()
    lock = Lockstep(cfg, [load_factory("spec")], stats, tmp_path)
    lock.monitor = safety_monitor(cfg, lock.book, stats.safety)
    return lock, lock.monitor


def _admit(lock: Lockstep, rid: str, prompt: list[int], chunk: int | None = None) -> None:
    """Add ``rid`` and compute its prompt after its hit, in chunks of ``chunk`` tokens."""
    lock.request_op({"op": "add_request", "rid": rid, "prompt": prompt})
    found = lock.call({"op": "get_computed_blocks", "rid": rid})
    done = found["num_tokens"]
    op: dict[str, Any] = {"op": "allocate_slots", "rid": rid, "num_new_computed_tokens": done}
    if any(found["blocks"]):
        op["new_computed_blocks"] = found["blocks"]
    while done < len(prompt):
        n = min(chunk or len(prompt), len(prompt) - done)
        assert lock.call({**op, "num_new_tokens": n}) is not None
        done += n
        lock.call({"op": "cache_blocks", "rid": rid, "num_computed_tokens": done})
        lock.request_op({"op": "set_request", "rid": rid, "num_computed_tokens": done, "status": "RUNNING"})
        op = {"op": "allocate_slots", "rid": rid}


def _decode(lock: Lockstep, rid: str, tokens: list[int]) -> None:
    for token in tokens:
        done = lock.book.requests[rid].num_tokens
        lock.request_op({"op": "append_tokens", "rid": rid, "tokens": [token]})
        assert lock.call({"op": "allocate_slots", "rid": rid, "num_new_tokens": 1}) is not None
        lock.request_op({"op": "set_request", "rid": rid, "num_computed_tokens": done + 1})


def test_where_each_mode_reads_and_writes_its_states() -> None:
    none, every, align = Mamba(4, "none"), Mamba(4, "all"), Mamba(4, "align")
    assert state_read_index(every, 0) is None and state_read_index(align, 0) is None
    assert state_read_index(none, 9) == 0 and state_read_index(every, 8) == 1 and state_read_index(align, 9) == 2
    assert state_writes(none, 3, 9) == [(0, 9)]
    assert state_writes(every, 3, 13) == [(0, 4), (1, 8), (2, 12), (3, 13)]  # every boundary crossed, then the end
    assert state_writes(every, 4, 8) == [(1, 8)]
    assert state_writes(align, 3, 13) == [(3, 13)]  # the running state only
    assert state_hit_index(align, 8) == 1 and state_hit_index(align, 6) == 1
    assert stale_index(align, 6, 9) == 1 and stale_index(align, 4, 9) is None and stale_index(align, 5, 7) is None
    assert stale_index(every, 6, 9) is None


@pytest.mark.parametrize("mode", ["all", "align"])
def test_a_cached_mamba_state_is_served_to_its_own_prefix(mode: Any, tmp_path: Path) -> None:
    """A prompt computed in block-aligned chunks, decoded, then another request
    hits its states and continues: no alarm, and the states were compared."""
    cfg = KVCacheConfig(num_blocks=24, groups=(FullAttention(2), Mamba(2, mode)), max_model_len=32,
                        profile=VLLM_0_25_1)  # fmt: skip
    lock, monitor = _solo(cfg, tmp_path)
    _admit(lock, "a", [1, 2, 3, 4, 5, 6, 7], chunk=2)
    _decode(lock, "a", [8, 9])
    lock.call({"op": "new_step_starts"})  # a state cached in this step is not hit before the next
    _admit(lock, "b", [1, 2, 3, 4, 5, 6, 9, 9])
    assert lock.stats.unexplained == 0 and monitor.counts["states compared"] >= 4
    assert monitor.counts["groups not checked"] == 0


def test_a_hit_on_a_state_of_another_prefix_fails(tmp_path: Path) -> None:
    """The state block a hit serves holds another prefix's state (as a hash
    collision or a stale block would leave it): the hit fails, naming it."""
    cfg = KVCacheConfig(num_blocks=16, groups=(Mamba(2, "align"),), max_model_len=32)
    lock, monitor = _solo(cfg, tmp_path)
    _admit(lock, "a", [1, 2, 3, 4, 5], chunk=2)
    table = lock.adapters[0].get_block_ids("a")[0]
    monitor.contents.write(table[1], 0, 0, monitor.prefixes.of(lock.book.requests["a"], 3)[-1])  # the state at 3
    lock.request_op({"op": "add_request", "rid": "b", "prompt": [1, 2, 3, 4, 9]})
    with pytest.raises(LockstepFailure, match=r"request b hit block \d+ \(group 0\) for the state at 4 tokens, but the "
                                              r"block holds the state of another prefix"):  # fmt: skip
        lock.call({"op": "get_computed_blocks", "rid": "b"})


def test_a_step_that_reads_a_state_never_written_fails(tmp_path: Path) -> None:
    """A decode step reads the state at its computed length from the block of
    its last computed token; one the oracle never saw written fails."""
    cfg = KVCacheConfig(num_blocks=16, groups=(Mamba(2, "all"),), max_model_len=32, enable_caching=False)
    lock, monitor = _solo(cfg, tmp_path)
    _admit(lock, "a", [1, 2, 3, 4, 5])
    monitor.contents = type(monitor.contents)(cfg)  # forget what a's prefill wrote
    with pytest.raises(LockstepFailure, match=r"request a reads block \d+ \(group 0\) for the state at 5 tokens, but "
                                              r"the block holds never written"):  # fmt: skip
        _decode(lock, "a", [6])


def test_a_step_writes_the_states_its_mode_says(tmp_path: Path) -> None:
    """``all`` writes the state at every boundary a step crosses; ``align``
    only the state at the step's end, in the block of its last token."""
    modes: tuple[tuple[MambaMode, dict[int, int]], ...] = (("all", {0: 2, 1: 4, 2: 5}), ("align", {2: 5}))
    for mode, written in modes:
        cfg = KVCacheConfig(num_blocks=16, groups=(Mamba(2, mode),), max_model_len=32, enable_caching=False)
        lock, monitor = _solo(cfg, tmp_path / mode)
        _admit(lock, "a", [1, 2, 3, 4, 5])
        ids = monitor.prefixes.of(lock.book.requests["a"], 5)
        table = lock.adapters[0].get_block_ids("a")[0]
        got = {i: monitor.contents.value(b, 0, 0) for i, b in enumerate(table) if b}
        assert got == {i: ids[n - 1] for i, n in written.items()} | {
            i: UNWRITTEN for i, b in enumerate(table) if b and i not in written
        }, mode


@pytest.mark.parametrize("release", ["0.25.1", "0.34.0"])
def test_a_state_left_behind_a_boundary(release: str, tmp_path: Path) -> None:
    """An ``align`` step that starts inside a block and ends past it leaves that
    block holding the state at its start, remembered for the rule of
    ``mamba-align-midblock`` whatever the release (vLLM 0.26.0's scheduler
    never runs such a step, and neither does the kit's scheduler model for it;
    an engine of another policy can)."""
    cfg = KVCacheConfig(num_blocks=16, groups=(Mamba(2, "align"),), max_model_len=32, profile=profile_named(release))
    lock, monitor = _solo(cfg, tmp_path)
    _admit(lock, "a", [1, 2, 3, 4, 5, 6], chunk=3)
    table = lock.adapters[0].get_block_ids("a")[0]
    assert monitor.contents.value(table[1], 0, 0) == monitor.prefixes.of(lock.book.requests["a"], 3)[-1]
    assert monitor.behind[table[1]][:3] == ("a", 3, 6)
    assert lock.stats.unexplained == 0


def test_a_prefill_checkpoint_writes_the_state_at_the_last_boundary() -> None:
    """vLLM 0.29.0's block-aligned checkpoint: a step that ends inside a block and
    crosses a boundary writes the state at the last boundary it crosses into the
    slot before its running state; nothing without a count, another mode or form."""
    ckpt = Mamba(4, "align", num_prefill_checkpoint_blocks=1)
    assert checkpoint_write(ckpt, "block-aligned", 0, 10) == (1, 8)
    assert checkpoint_write(ckpt, "block-aligned", 4, 7) is None  # crosses no boundary
    assert checkpoint_write(ckpt, "block-aligned", 0, 8) is None  # ends on one: the running state is it
    assert checkpoint_write(ckpt, "block-aligned", 6, 13) == (2, 12)
    assert checkpoint_write(Mamba(4, "align"), "block-aligned", 0, 10) is None
    assert checkpoint_write(Mamba(4, "all", num_prefill_checkpoint_blocks=1), "block-aligned", 0, 10) is None
    assert checkpoint_write(ckpt, "none", 0, 10) is None


def _checkpointed(tmp_path: Path) -> tuple[Lockstep, SafetyMonitor]:
    """A 10-token prompt computed in one chunk with a checkpoint, then freed (vLLM 0.29.0)."""
    cfg = KVCacheConfig(num_blocks=24, groups=(FullAttention(4), Mamba(4, "align", num_prefill_checkpoint_blocks=1)),
                        max_model_len=32, profile=profile_named("vllm-0.29.0"))  # fmt: skip
    lock, monitor = _solo(cfg, tmp_path)
    _admit(lock, "a", list(range(10)))
    assert monitor.counts["checkpoint states written"] == 1
    lock.call({"op": "free", "rid": "a"})
    lock.call({"op": "new_step_starts"})
    return lock, monitor


def test_a_hit_on_a_prefill_checkpoint_serves_its_state(tmp_path: Path) -> None:
    """The checkpoint block holds the state at 8 tokens, which a longer prompt hits and continues from."""
    lock, monitor = _checkpointed(tmp_path)
    before = monitor.counts["states compared"]
    _admit(lock, "b", [*range(10), 7, 7])
    assert lock.book.requests["b"].num_computed_tokens == 12
    assert monitor.counts["states compared"] > before and lock.stats.unexplained == 0


def test_a_checkpoint_the_step_did_not_write_is_caught(tmp_path: Path) -> None:
    """Where the oracle's worker did not write the checkpoint (as under a release whose
    worker leaves it out), the block holds no state and the hit on it fails."""
    lock, monitor = _checkpointed(tmp_path)
    found = [b for b in range(1, 24) if monitor.contents.value(b, 1, 0) == monitor.prefixes.of(
        lock.book.requests["a"], 8)[-1]]  # fmt: skip
    assert len(found) == 1
    monitor.contents.write(found[0], 1, 0, UNWRITTEN)
    lock.request_op({"op": "add_request", "rid": "b", "prompt": [*range(10), 7, 7]})
    with pytest.raises(LockstepFailure, match=r"request b hit block \d+ \(group 1\) for the state at 8 tokens"):
        lock.call({"op": "get_computed_blocks", "rid": "b"})


def _positional(release: str, alignment: int | None = 1) -> KVCacheConfig:
    mamba = Mamba(4, "align", num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=alignment)
    return KVCacheConfig(num_blocks=24, groups=(FullAttention(4), mamba), max_model_len=32,
                         profile=profile_named(f"vllm-{release}"))  # fmt: skip


@pytest.mark.parametrize("release", ["0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"])
def test_a_positional_checkpoint_writes_the_state_at_its_position(release: str) -> None:
    """From vLLM 0.30.0 on the worker writes the state at the last hash boundary below a step's end
    into the slot before the running state, when the step can export it: also for an end on a
    block boundary, and only a multiple of the alignment past the step's start."""
    cfg = _positional(release)
    kind = cfg.groups[1]
    assert isinstance(kind, Mamba)
    assert positional_checkpoint_write(kind, cfg, 0, 10) == (1, 8)
    assert positional_checkpoint_write(kind, cfg, 0, 8) == (0, 4)  # on a boundary too (0.29.0: none)
    assert positional_checkpoint_write(kind, cfg, 4, 7) is None  # the slot is the start's own
    assert positional_checkpoint_write(kind, cfg, 2, 13) is None  # a start inside a hash block
    assert positional_checkpoint_write(kind, cfg, 4, 13) == (2, 12)
    for alignment in (3, None):  # 8 is no multiple of 3; None: no checkpoints
        other = _positional(release, alignment)
        group = other.groups[1]
        assert isinstance(group, Mamba) and positional_checkpoint_write(group, other, 0, 10) is None
    assert positional_checkpoint_write(Mamba(4, "align"), cfg, 0, 10) is None
    assert checkpoint_write(kind, cfg.profile.prefill_checkpoints, 0, 10) is None  # 0.29.0's rule is not theirs
    old = _positional("0.29.0", None)
    assert positional_checkpoint_write(kind, old, 0, 10) is None


@pytest.mark.parametrize("release", ["0.30.0", "0.34.0"])
def test_a_hit_on_a_positional_checkpoint_serves_its_state(release: str, tmp_path: Path) -> None:
    """An 8-token prompt in one chunk keeps its checkpoint, the state at 4 tokens in slot 0; a
    prompt sharing only the first 6 tokens hits it and continues from it, and the oracle compares
    that state."""
    lock, monitor = _solo(_positional(release), tmp_path)
    _admit(lock, "a", list(range(8)))
    lock.call({"op": "new_step_starts"})
    assert monitor.counts["checkpoint states written"] == 1
    before = monitor.counts["states compared"]
    _admit(lock, "b", [*range(6), 9, 9, 9])
    assert monitor.counts["states compared"] > before and lock.stats.unexplained == 0


def test_a_positional_checkpoint_the_step_did_not_write_is_caught(tmp_path: Path) -> None:
    """Where the oracle's worker did not write the checkpoint, the hit on it fails."""
    lock, monitor = _solo(_positional("0.34.0"), tmp_path)
    _admit(lock, "a", list(range(8)))
    found = [b for b in range(1, 24) if monitor.contents.value(b, 1, 0) == monitor.prefixes.of(
        lock.book.requests["a"], 4)[-1]]  # fmt: skip
    assert len(found) == 1
    monitor.contents.write(found[0], 1, 0, UNWRITTEN)
    lock.call({"op": "new_step_starts"})
    lock.request_op({"op": "add_request", "rid": "b", "prompt": [*range(6), 9, 9, 9]})
    with pytest.raises(LockstepFailure, match=r"request b hit block \d+ \(group 1\) for the state at 4 tokens"):
        lock.call({"op": "get_computed_blocks", "rid": "b"})


def test_which_mamba_groups_are_checked() -> None:
    """Every Mamba group without speculative blocks; with them, ``align`` groups only."""
    assert mamba_checked(Mamba(4, "none")) and mamba_checked(Mamba(4, "all")) and mamba_checked(Mamba(4, "align", 2))
    assert not mamba_checked(Mamba(4, "none", 1)) and not mamba_checked(Mamba(4, "all", 2))
    assert not mamba_checked(FullAttention(4))


def test_a_draft_row_writes_a_state_per_token_and_the_accepted_boundary_is_copied() -> None:
    """Block size 4, a row computing [6, 9) (its token and two drafts): the states at 7, 8 and 9
    go into the running block (the block of position 8, entry 2) and the next two. One draft
    accepted (8 tokens computed): the state at 8, in entry 3, is copied into entry 1 (the block
    ending at 8), and the next step reads entry 2 + 1. Both accepted: 9 is no boundary, the copy
    is the same. None accepted: no boundary reached, no copy."""
    kind = Mamba(4, "align", 2)
    assert draft_row_writes(kind, 6, 9) == [(2, 7), (3, 8), (4, 9)]
    assert accepted_copy(kind, 9, 2, 1) == ((3, 1), False)
    assert accepted_copy(kind, 9, 2, 2) == ((3, 1), False)
    assert accepted_copy(kind, 9, 2, 0) == (None, False)
    # a row [5, 8) whose drafts are all accepted ends on the running block's end: the state at 8 is
    # copied into the running block itself, and the next step reads it there
    assert accepted_copy(kind, 8, 2, 2) == ((3, 1), True)
    assert accepted_copy(kind, 8, 1, 1) == ((2, 1), True)  # [6, 8): the state at 8 is one block past it
    assert accepted_copy(kind, 8, 1, 0) == (None, False)  # its draft rejected: 7 reaches no boundary


def _drafting(tmp_path: Path) -> tuple[Lockstep, SafetyMonitor, tuple[int, ...]]:
    """A 6-token prompt, then a step of its next token and two drafts [6, 9) of which one is
    accepted, under the asynchronous pipeline (block size 4, two speculative blocks)."""
    cfg = KVCacheConfig(num_blocks=24, groups=(Mamba(4, "align", 2),), max_model_len=32, enable_caching=False,
                        use_eagle=True, profile=profile_named("vllm-0.34.0"))  # fmt: skip
    lock, monitor = _solo(cfg, tmp_path)
    monitor.pipelined = True
    lock.request_op({"op": "add_request", "rid": "a", "prompt": [1, 2, 3, 4, 5, 6]})
    lock.call({"op": "get_computed_blocks", "rid": "a"})
    assert lock.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 6}) is not None
    monitor.dispatch()
    monitor.processed()
    lock.request_op({"op": "set_request", "rid": "a", "num_computed_tokens": 6, "status": "RUNNING"})
    lock.request_op({"op": "append_tokens", "rid": "a", "tokens": [7]})
    assert lock.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 3}) is not None
    table = lock.adapters[0].get_block_ids("a")[0]
    monitor.dispatch({"a": [50, 51]})
    monitor.processed({"a": 1})
    lock.request_op({"op": "append_tokens", "rid": "a", "tokens": [50, 60]})
    lock.request_op({"op": "set_request", "rid": "a", "num_computed_tokens": 8})
    return lock, monitor, table


def test_the_next_step_reads_the_state_of_the_last_accepted_draft(tmp_path: Path) -> None:
    """After the draft row, the running block (entry 2) holds the state at 7, entry 3 the state at 8
    (copied into entry 1, the block ending at 8) and entry 4 the state after the rejected draft; the
    next step reads entry 3, where the state at 8 is, and the oracle compares it."""
    lock, monitor, table = _drafting(tmp_path)
    ids = monitor.prefixes.of(lock.book.requests["a"], 8)
    held = [monitor.contents.value(b, 0, 0) for b in table[1:5]]
    assert held[:3] == [ids[7], ids[6], ids[7]] and held[3] not in ids
    assert monitor.worker_rows == {("a", 0, 0): (2, 1)} and monitor.counts["accepted states copied"] == 1
    before = monitor.counts["states compared"]
    assert lock.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 1}) is not None
    monitor.dispatch()
    monitor.processed()
    assert monitor.counts["states compared"] == before + 1 and lock.stats.unexplained == 0


def test_a_step_that_read_the_running_block_after_drafts_would_fail(tmp_path: Path) -> None:
    """The same history with the worker's place forgotten (as a monitor that reads the running block
    after an accepted draft would): the next step reads the state at 7 for 8 and fails."""
    lock, monitor, _ = _drafting(tmp_path)
    monitor.worker_rows.clear()  # the read falls back to the block of the last computed token, entry 1...
    monitor.worker_rows["a", 0, 0] = (2, 0)  # ...or here, the running block: the state at 7
    assert lock.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 1}) is not None
    monitor.dispatch()
    with pytest.raises(Exception, match=r"for the state at 8 tokens, but the block holds the state of another"):
        monitor.processed()


def test_the_accepted_copy_moves_the_boundary_state_into_the_block_ending_there() -> None:
    """Exhaustively for small blocks and rows: a copy's source is the entry the row wrote the state
    at the last boundary its accepted tokens reach, its destination the block ending there, never
    past the source; the next read (the running block, or the last accepted token's entry) holds the
    state at the accepted tokens' end once the copy is made."""
    for bs in (1, 2, 3, 4):
        kind = Mamba(bs, "align", 3)
        for start in range(0, 9):
            for drafts in range(1, 4):
                end = start + 1 + drafts
                written = dict(draft_row_writes(kind, start, end))
                first = (end - 1) // bs
                for accepted in range(drafts + 1):
                    copy, reset = accepted_copy(kind, end, drafts, accepted)
                    held = dict(written)
                    if copy is not None:
                        source, dest = copy
                        assert (written[source], (dest + 1) * bs) == ((start + 1 + accepted) // bs * bs,) * 2
                        assert dest <= source
                        held[dest] = written[source]
                    read = first if reset else first + accepted
                    assert held[read] == start + 1 + accepted, (bs, start, drafts, accepted)


@pytest.mark.parametrize("engine", ["spec", "impl"])
def test_a_request_admitted_again_starts_its_worker_place_anew(engine: str) -> None:
    """A request with a speculative-block Mamba group is preempted while its step is in flight and
    admitted again (one connector token, so its first step reads the state at 1): the old table's step
    runs after the preemption, and the monitor must not carry its place of the state over to the new
    table (the worker forgets a preempted request's place). A monitor that kept it read the state at
    1 from the old place's entry and raised a false alarm."""
    trace = load(Path(__file__).with_name("safety_traces") / "spec-blocks-readmitted-under-a-step.jsonl")
    assert safety_replay(trace, load_factory(engine)(trace.config)) is None


@pytest.mark.parametrize("engine", ["spec", "impl"])
def test_a_step_of_the_old_table_keeps_the_old_place(engine: str) -> None:
    """Real vLLM 0.30.0 alone at the safety level (seed 0, 100,000 steps, shrunk): a request's step
    whose draft was accepted leaves its state in the speculative entry; its next step, in flight, runs
    after the request was preempted and admitted again. That step reads the state at 18 tokens from
    the old table's place (the entry of the accepted draft), not the new table's (none yet). A monitor
    that dropped the old place read the running entry, the state at 17, and raised a false alarm."""
    trace = load(Path(__file__).with_name("safety_traces") / "spec-blocks-old-step-after-readmission.jsonl")
    assert safety_replay(trace, load_factory(engine)(trace.config)) is None
