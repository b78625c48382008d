"""The content oracle on cross-attention groups (kvref.content, kvref.safety; docs/safety.md).

A cross-attention group holds the KV of the encoder's output: the first step a
request runs after its blocks are handed out writes every encoder position,
and every step of the request reads all of them. The oracle checks each read
against the request's own encoder KV.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvref.adapters import load_factory
from kvref.lockstep import Lockstep, LockstepFailure, RunStats
from kvref.safety import safety_monitor
from kvspec.config import CrossAttention, FullAttention, KVCacheConfig

CFG = KVCacheConfig(num_blocks=16, groups=(FullAttention(2), CrossAttention(2)), max_model_len=32, enable_caching=False)


def _solo(tmp_path: Path) -> Lockstep:
    stats = RunStats()
    lock = Lockstep(CFG, [load_factory("spec")], stats, tmp_path)
    lock.monitor = safety_monitor(CFG, lock.book, stats.safety)
    return lock


def _admit(lock: Lockstep, rid: str, prompt: list[int], encoder: int) -> Any:
    lock.request_op({"op": "add_request", "rid": rid, "prompt": prompt})
    op = {"op": "allocate_slots", "rid": rid, "num_new_tokens": len(prompt), "num_encoder_tokens": encoder}
    out = lock.call(op)
    lock.request_op({"op": "set_request", "rid": rid, "num_computed_tokens": len(prompt), "status": "RUNNING"})
    return out


def _decode(lock: Lockstep, rid: str, token: int) -> None:
    done = lock.book.requests[rid].num_tokens
    lock.request_op({"op": "append_tokens", "rid": rid, "tokens": [token]})
    assert lock.call({"op": "allocate_slots", "rid": rid, "num_new_tokens": 1}) is not None
    lock.request_op({"op": "set_request", "rid": rid, "num_computed_tokens": done + 1})


def test_every_step_reads_the_encoder_kv_its_first_step_wrote(tmp_path: Path) -> None:
    lock = _solo(tmp_path)
    _admit(lock, "a", [1, 2, 3], encoder=5)
    _admit(lock, "b", [1, 2, 3], encoder=3)
    for token in (7, 8):
        _decode(lock, "a", token)
        _decode(lock, "b", token)
    # a: 3 steps of 5 encoder positions; b: 3 steps of 3
    assert lock.stats.safety["encoder slots compared"] == 3 * 5 + 3 * 3
    assert lock.stats.safety["groups not checked"] == 0 and lock.stats.unexplained == 0


def test_a_step_that_reads_encoder_kv_never_written_fails(tmp_path: Path) -> None:
    lock = _solo(tmp_path)
    _admit(lock, "a", [1, 2, 3], encoder=4)
    assert lock.monitor is not None
    for b in lock.monitor.last_tables["a"][1]:  # forget what a's first step wrote into its encoder blocks
        del lock.monitor.contents.slots[b]
    never = r"request a reads block \d+ \(group 1\) for encoder position 0, .*never written"
    with pytest.raises(LockstepFailure, match=never):
        _decode(lock, "a", 7)


def test_another_requests_encoder_kv_is_the_wrong_kv(tmp_path: Path) -> None:
    """b's first step writes its encoder KV into a block a still reads (planted
    by hand: a's table is made to name b's block), and a's next step sees it."""
    lock = _solo(tmp_path)
    _admit(lock, "a", [1, 2, 3], encoder=2)
    blocks = _admit(lock, "b", [1, 2, 3], encoder=2)
    monitor = lock.monitor
    assert monitor is not None
    theirs = blocks[1][0]
    mine = monitor.last_tables["a"][1][0]
    monitor.contents.slots[mine] = list(monitor.contents.slots[theirs])  # a's block now holds b's encoder KV
    theirs_kv = r"encoder position 0, but the block holds the encoder KV of another prefix \(written for request b's"
    with pytest.raises(LockstepFailure, match=theirs_kv):
        _decode(lock, "a", 7)
