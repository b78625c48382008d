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
    checkpoint_write,
    positional_checkpoint_write,
    stale_index,
    state_hit_index,
    state_read_index,
    state_writes,
)
from kvref.lockstep import Lockstep, LockstepFailure, RunStats
from kvref.safety import SafetyMonitor, safety_monitor
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
