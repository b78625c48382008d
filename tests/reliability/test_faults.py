"""Faults from collaborators.

* An event consumer that raises. ``take_events`` is a hand-over: it returns
  the queued events and empties the queue in one step, so the manager never
  loses or repeats an event, but once a batch is handed out, keeping it until
  it is consumed is the caller's job (vLLM's scheduler publishes the batch it
  took; a publisher that raises drops that batch). Events of a drain that
  never happened (the caller failed before calling ``take_events``) stay
  queued, in order, until the next one.
* A hash function that raises while a request is being built. The manager
  never hashes: requests are built and hashed by the caller
  (:class:`kvspec.request.RequestBlockHasher`), so the failure cannot reach
  the manager. The caller's request book is unchanged too, and the manager
  behaves afterwards exactly like one that never saw the failure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import kvspec.request
from kvref.adapters import KVCacheAdapter, load_factory
from kvref.lockstep import EventLog
from kvref.ops import RequestBook, execute
from kvspec.config import FullAttention, KVCacheConfig, SlidingWindow
from kvspec.hashing import HashFunction, get_hash_fn_by_name
from kvspec.profiles import VLLM_0_25_1

Json = Any
CFG = KVCacheConfig(
    num_blocks=12,
    groups=(FullAttention(2), SlidingWindow(2, 3)),
    max_model_len=32,
    enable_kv_cache_events=True,
    profile=VLLM_0_25_1,  # every target follows it (kvimpl follows 0.25.1)
)


class ConsumerDown(RuntimeError):
    """The event consumer (publisher, router index) failed."""


class HashBackendDown(RuntimeError):
    """The hash function failed."""


def run(adapter: KVCacheAdapter, book: RequestBook, op: Json) -> Json:
    """Apply a request operation to the book or run a facade operation."""
    if op["op"] in ("add_request", "append_tokens", "set_request"):
        book.apply(op)
        return None
    return execute(adapter, book, op)


def fill(adapter: KVCacheAdapter, book: RequestBook, rid: str, prompt: list[int]) -> None:
    """Admit ``rid`` and compute its whole prompt (full blocks get cached)."""
    run(adapter, book, {"op": "add_request", "rid": rid, "prompt": prompt})
    assert run(adapter, book, {"op": "allocate_slots", "rid": rid, "num_new_tokens": len(prompt)}) is not None


def consume(events: list[Json], log: EventLog, fail_at: int) -> None:
    """Feed events one by one to ``log``; the consumer dies at ``fail_at``."""
    for i, ev in enumerate(events):
        if i == fail_at:
            raise ConsumerDown(f"consumer failed at event {i}")
        assert log.consume([ev]) == ""


def test_consumer_that_raises_loses_nothing_the_manager_queued(target: str) -> None:
    """A consumer failing mid-batch, then a retry of the kept batch."""
    adapter, book = load_factory(target)(CFG), RequestBook(CFG)
    fill(adapter, book, "a", [1, 2, 3, 4, 5, 6, 7])
    batch = run(adapter, book, {"op": "take_events"})
    assert len(batch) == 2, batch  # one BlockStored per group
    view = adapter.to_view()
    with pytest.raises(ConsumerDown):
        consume(batch, EventLog(CFG.int_block_hashes), fail_at=1)
    assert adapter.to_view() == view, "a consumer failure changed the manager"
    assert run(adapter, book, {"op": "take_events"}) == [], "a handed-out batch was delivered again"
    retry = EventLog(CFG.int_block_hashes)
    consume(batch, retry, fail_at=len(batch))
    assert retry.compare(adapter.to_view()) == "", "the kept batch is not the whole story"


def test_events_stay_queued_until_the_next_drain(target: str) -> None:
    """Drains skipped because the consumer was down lose nothing: the next
    drain returns every event in order, and the log matches the cache."""
    adapter, book = load_factory(target)(CFG), RequestBook(CFG)
    log = EventLog(CFG.int_block_hashes)
    fill(adapter, book, "a", [1, 2, 3, 4, 5, 6, 7])
    run(adapter, book, {"op": "free", "rid": "a"})
    run(adapter, book, {"op": "evict_blocks", "block_ids": list(range(1, CFG.num_blocks))})
    fill(adapter, book, "b", [1, 2, 3, 4, 9])
    events = run(adapter, book, {"op": "take_events"})
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["BlockStored", "BlockStored"] and "BlockRemoved" in kinds, kinds
    assert kinds[-2:] == ["BlockStored", "BlockStored"], kinds
    assert log.consume(events) == ""
    assert log.compare(adapter.to_view()) == ""


def failing_after(calls: int) -> Callable[[str], HashFunction]:
    """A ``get_hash_fn_by_name`` whose function raises on call ``calls + 1``."""
    real = get_hash_fn_by_name
    count = [0]

    def get(name: str) -> HashFunction:
        fn = real(name)

        def flaky(obj: Any) -> bytes:
            count[0] += 1
            if count[0] > calls:
                raise HashBackendDown("hash backend failed")
            return fn(obj)

        return flaky

    return get


@pytest.mark.parametrize("calls", [0, 2])
def test_hash_failure_while_building_a_request_touches_nothing(
    target: str, calls: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failing request operations change neither book nor manager; the
    manager then behaves exactly like a control that never saw them."""
    factory = load_factory(target)
    adapter, book = factory(CFG), RequestBook(CFG)
    control, control_book = factory(CFG), RequestBook(CFG)
    for a, b in ((adapter, book), (control, control_book)):
        fill(a, b, "a", [1, 2, 3, 4, 5])
    view, requests = adapter.to_view(), dict(book.requests)
    with monkeypatch.context() as patch:
        patch.setattr(kvspec.request, "get_hash_fn_by_name", failing_after(calls))
        with pytest.raises(HashBackendDown):
            book.apply({"op": "add_request", "rid": "b", "prompt": [1, 2, 3, 4, 5, 6, 7, 8]})
    with monkeypatch.context() as patch:
        patch.setattr(kvspec.request, "get_hash_fn_by_name", failing_after(calls))
        with pytest.raises(HashBackendDown):
            book.apply({"op": "append_tokens", "rid": "a", "tokens": [6, 7, 8]})
    assert book.requests == requests, "a failed request operation changed the book"
    assert adapter.to_view() == view, "a failed request operation changed the manager"
    tail: list[Json] = [
        {"op": "add_request", "rid": "b", "prompt": [1, 2, 3, 4, 5, 6, 7, 8]},
        {"op": "get_computed_blocks", "rid": "b"},
        {"op": "append_tokens", "rid": "a", "tokens": [6]},
        {"op": "allocate_slots", "rid": "a", "num_new_tokens": 1},
        {"op": "allocate_slots", "rid": "b", "num_new_tokens": 8},
        {"op": "take_events"},
        {"op": "free", "rid": "a"},
        {"op": "take_new_block_ids"},
    ]
    for op in tail:
        assert run(adapter, book, op) == run(control, control_book, op), op
        assert adapter.to_view() == control.to_view(), op
