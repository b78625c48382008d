"""The event stream is a faithful log of the prefix cache.

:class:`kvref.lockstep.EventLog` is a consumer index built only from the
events ``take_events`` returned; after every ``take_events`` step it must
equal the adapter's cache map. These tests show that the check passes on the
spec and fails on adapters that lose or duplicate an event.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvref.adapters import AdapterFactory
from kvref.adapters.spec import SpecAdapter
from kvref.lockstep import EventLog, Lockstep, LockstepFailure, RunStats
from kvref.stateful import MachineSetup, make_lockstep_machine
from kvspec.config import FullAttention, KVCacheConfig
from kvspec.events import BlockRemoved, KVCacheEvent
from kvspec.profiles import VLLM_0_25_1, VLLM_0_34_0
from kvspec.request import RequestBlockHasher
from kvspec.view import KVView

CFG = KVCacheConfig(
    num_blocks=6, groups=(FullAttention(2),), max_model_len=16, enable_kv_cache_events=True, profile=VLLM_0_25_1
)


def factory(cls: type[SpecAdapter]) -> AdapterFactory:
    """A spec subclass as an adapter factory (its ids are ``BlockId``s, which
    mypy does not accept for the protocol's ``list[int]``)."""
    return cast(AdapterFactory, cls)


def view_with(cached: tuple[tuple[bytes, tuple[int, ...]], ...]) -> KVView:
    """A view whose only content is ``cached``."""
    return KVView(free_queue=(), ref_cnt=(), cached=cached, tables=(), usage=0.0)


KEY = bytes(range(32)) + (0).to_bytes(4, "big")
INT_HASH = int.from_bytes(bytes(range(24, 32)), "big")


def stored(*hashes: object) -> dict[str, object]:
    """A BlockStored event of group 0, as kvref.ops writes it."""
    return {"type": "BlockStored", "block_hashes": list(hashes), "group_idx": 0}


def removed(h: object) -> dict[str, object]:
    """A BlockRemoved event of group 0."""
    return {"type": "BlockRemoved", "block_hashes": [h], "group_idx": 0}


def test_event_log_tracks_stores_removes_and_clears() -> None:
    """Stored, removed, stored twice (two blocks), cleared: always equal."""
    log = EventLog(int_block_hashes=True)
    assert log.consume([stored(INT_HASH)]) == ""
    assert log.compare(view_with(((KEY, (3,)),))) == ""
    assert log.consume([stored(INT_HASH), removed(INT_HASH)]) == ""
    assert log.compare(view_with(((KEY, (4,)),))) == ""
    assert log.consume([stored(INT_HASH), {"type": "AllBlocksCleared"}]) == ""
    assert log.compare(view_with(())) == ""


def test_event_log_bytes_form() -> None:
    """With ``int_block_hashes`` off the digest travels as hex."""
    log = EventLog(int_block_hashes=False)
    assert log.consume([stored(bytes(range(32)).hex())]) == ""
    assert log.compare(view_with(((KEY, (3,)),))) == ""
    assert "events say 1, cache holds 0" in log.compare(view_with(()))


def test_event_log_detects_lost_duplicated_and_misordered_events() -> None:
    """Each corruption of the stream is reported."""
    lost = EventLog(True)
    assert "events say 0, cache holds 1" in lost.compare(view_with(((KEY, (3,)),)))
    duplicated = EventLog(True)
    duplicated.consume([stored(INT_HASH), stored(INT_HASH)])
    assert "events say 2, cache holds 1" in duplicated.compare(view_with(((KEY, (3,)),)))
    misordered = EventLog(True)
    assert "no earlier event stored" in misordered.consume([removed(INT_HASH), stored(INT_HASH)])


def test_event_log_leaves_announcements_out() -> None:
    """A report-mode "full" request's hit, announced again (vLLM 0.26.0 on), stores
    nothing: the lookup tells the log, which leaves the matching event out of its index
    once; a second announcement nobody predicted counts as a duplicate; a lookup whose
    announcement is undecided (a connector's, in a Mamba hybrid) makes the next
    comparison rebuild the index instead of judging it."""
    cfg = KVCacheConfig(
        num_blocks=6, groups=(FullAttention(2),), max_model_len=16, enable_kv_cache_events=True, profile=VLLM_0_34_0
    )
    request = RequestBlockHasher.for_config(cfg).new_request("b", [1, 2, 3], kv_cache_report_mode="full")
    h = int.from_bytes(request.block_hashes[0][-8:], "big")
    key = request.block_hashes[0] + (0).to_bytes(4, "big")
    log = EventLog(int_block_hashes=True)
    assert log.consume([stored(h)]) == ""
    log.expect_announcement(cfg, request, [[1]])
    again = {**stored(h), "parent_block_hash": None}
    assert log.consume([again]) == ""
    assert log.compare(view_with(((key, (1,)),))) == ""
    assert log.consume([again]) == ""
    assert "events say 2, cache holds 1" in log.compare(view_with(((key, (1,)),)))
    incremental = RequestBlockHasher.for_config(cfg).new_request("c", [1, 2, 3])
    log = EventLog(int_block_hashes=True)
    log.consume([stored(h)])
    log.expect_announcement(cfg, incremental, [[1]])
    assert "events say 2" in (log.consume([again]) or log.compare(view_with(((key, (1,)),))))
    log = EventLog(int_block_hashes=True)
    log.consume([stored(h)])
    log.expect_announcement(cfg, request, [[1]], sure=False)
    assert log.consume([again]) == ""
    assert log.compare(view_with(((key, (1,)),))) == ""
    assert log.resyncs == 1 and not log.unsure


def test_event_log_takes_the_last_matching_event_as_the_announcement() -> None:
    """A block stored from block 0 under the hashes a later lookup announces, then
    removed, then stored again: the announcement is the last matching event, so the
    removal finds its hash (taking the first would leave the removal nothing to remove)."""
    cfg = KVCacheConfig(
        num_blocks=6, groups=(FullAttention(2),), max_model_len=16, enable_kv_cache_events=True, profile=VLLM_0_34_0
    )
    request = RequestBlockHasher.for_config(cfg).new_request("b", [1, 2, 3], kv_cache_report_mode="full")
    h = int.from_bytes(request.block_hashes[0][-8:], "big")
    key = request.block_hashes[0] + (0).to_bytes(4, "big")
    store = {**stored(h), "parent_block_hash": None}
    log = EventLog(int_block_hashes=True)
    log.expect_announcement(cfg, request, [[1]])
    assert log.consume([store, removed(h), store, store]) == ""
    assert log.compare(view_with(((key, (1,)),))) == ""


def test_event_log_keeps_an_announcement_before_the_clear_that_follows_it() -> None:
    """A lookup announces a hit, the prefix cache is reset, and a new request stores the
    same blocks again from block 0 before the drain: the announcement is the event before
    the AllBlocksCleared, not the later store, which the index keeps (taking the last
    matching event regardless of the clear left the index one entry short)."""
    cfg = KVCacheConfig(
        num_blocks=6, groups=(FullAttention(2),), max_model_len=16, enable_kv_cache_events=True, profile=VLLM_0_34_0
    )
    request = RequestBlockHasher.for_config(cfg).new_request("b", [1, 2, 3], kv_cache_report_mode="full")
    h = int.from_bytes(request.block_hashes[0][-8:], "big")
    key = request.block_hashes[0] + (0).to_bytes(4, "big")
    store = {**stored(h), "parent_block_hash": None}
    log = EventLog(int_block_hashes=True)
    assert log.consume([store]) == ""
    log.expect_announcement(cfg, request, [[1]])
    log.cleared()
    assert log.consume([store, {"type": "AllBlocksCleared"}, store]) == ""
    assert log.compare(view_with(((key, (1,)),))) == ""
    # a lookup after the reset announces after the clear
    log.expect_announcement(cfg, request, [[1]])
    log.cleared()
    log.expect_announcement(cfg, request, [[1]])
    assert log.consume([store, {"type": "AllBlocksCleared"}, store, store]) == ""
    assert log.compare(view_with(((key, (1,)),))) == ""


def test_lockstep_counts_event_log_checks(tmp_path: Path) -> None:
    """A take_events step on an events-enabled adapter is one check."""
    stats = RunStats()
    lock = Lockstep(CFG, [factory(SpecAdapter)], stats, tmp_path)
    lock.request_op({"op": "add_request", "rid": "a", "prompt": [1, 2, 3, 4, 5]})
    assert lock.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 5}) == [[1, 2, 3]]
    events = lock.call({"op": "take_events"})
    assert [e["type"] for e in events] == ["BlockStored"]
    assert stats.event_log_checks == 1
    lock.call({"op": "free", "rid": "a"})
    lock.call({"op": "evict_blocks", "block_ids": [1]})
    assert [e["type"] for e in lock.call({"op": "take_events"})] == ["BlockRemoved"]
    assert stats.event_log_checks == 2


class DropsRemovals(SpecAdapter):
    """Loses every BlockRemoved event (a consumer that filters them out)."""

    name = "drops_removals"

    def take_events(self) -> list[KVCacheEvent]:
        """The spec's events, minus the removals."""
        return [ev for ev in super().take_events() if not isinstance(ev, BlockRemoved)]


class RepeatsStores(SpecAdapter):
    """Hands out every event twice (a consumer retry that re-delivers)."""

    name = "repeats"

    def take_events(self) -> list[KVCacheEvent]:
        """Each event of the spec, duplicated."""
        return [e for ev in super().take_events() for e in (ev, ev)]


def test_lockstep_fails_on_a_lost_event(tmp_path: Path) -> None:
    """The lost removal surfaces at the next take_events, even with one adapter."""
    lock = Lockstep(CFG, [factory(DropsRemovals)], RunStats(), tmp_path)
    lock.request_op({"op": "add_request", "rid": "a", "prompt": [1, 2, 3, 4, 5]})
    lock.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 5})
    lock.call({"op": "free", "rid": "a"})
    lock.call({"op": "evict_blocks", "block_ids": [1]})
    with pytest.raises(LockstepFailure, match=r"not a faithful log.*events say 1, cache holds 0"):
        lock.call({"op": "take_events"})


@pytest.mark.parametrize("adapter", [DropsRemovals, RepeatsStores])
def test_machine_finds_unfaithful_event_streams(adapter: type[SpecAdapter], tmp_path: Path) -> None:
    """The scheduler machine, with the adapter alone, finds the broken log."""
    machine = make_lockstep_machine(MachineSetup([factory(adapter)], failure_dir=tmp_path))
    with pytest.raises(LockstepFailure, match="not a faithful log"):
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=1500,
                stateful_step_count=60,
                database=None,
                deadline=None,
                derandomize=True,
                phases=[Phase.generate],
            ),
        )
