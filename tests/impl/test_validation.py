"""Type checks at kvimpl's public entries, against kvspec's.

Every entry of the facade and of the step API is called with values of the
wrong type (a float or a bool for a count, an int for a request id, an object
that only looks like a request, ...) on a kvimpl and a kvspec manager in the
same state: both raise the same :mod:`kvspec.errors` class, and neither
changes anything (views, events, new-block ids and statistics compared
before and after). The running request has quiet-step limits, so a bad step
of it must not slip through kvimpl's fast path. Values of a subclass (a
``Request`` subclass, an ``int`` subclass) are valid for the spec and must
give the same results on kvimpl, whose fast path tests exact types.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from dataclasses import fields as dataclass_fields
from typing import Any, cast

import pytest

from kvimpl.kv_cache_manager import KVCacheManager as ImplManager
from kvimpl.native import NativeKVCacheManager, native_module
from kvspec.config import FullAttention, KVCacheConfig, SlidingWindow
from kvspec.errors import (
    GroupCountError,
    InvalidBlockIdError,
    InvalidRequestError,
    InvalidTokenCountError,
    KVCacheError,
    UnknownRequestError,
    UnsupportedOperationError,
)
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.request import Request, RequestBlockHasher, RequestStatus

CONFIG = KVCacheConfig(
    num_blocks=24,
    groups=(FullAttention(4), SlidingWindow(4, 8)),
    max_model_len=64,
    enable_kv_cache_events=True,
    log_stats=True,
)
HASHER = RequestBlockHasher.for_config(CONFIG)
BUILDS = [
    pytest.param(ImplManager, id="python"),
    pytest.param(
        NativeKVCacheManager,
        id="native",
        marks=pytest.mark.skipif(native_module() is None, reason="the native extension is not built here"),
    ),
]
"""kvimpl's two managers: the step API's checks are the Python manager's and the native core's own."""


@dataclass(frozen=True)
class LookAlike:
    """Every field of a Request, but not a kvspec Request (say, an engine's own request object)."""

    request_id: str
    all_token_ids: tuple[int, ...]
    num_prompt_tokens: int
    block_hashes: tuple[bytes, ...]
    num_computed_tokens: int
    status: RequestStatus


class MyInt(int):
    """An int subclass: a valid count or block id for the spec's ``isinstance`` checks."""


@dataclass(frozen=True, slots=True)
class MyRequest(Request):
    """A Request subclass: valid for the spec's ``isinstance`` checks."""


class State:
    """A manager with a running request ``a`` (quiet-step limits set), a request
    ``b`` sharing its prefix, and popped blocks of ``c`` waiting for their free."""

    def __init__(self, make: Callable[[KVCacheConfig], Any]) -> None:
        self.m = make(CONFIG)
        a = self._admit(HASHER.new_request("a", [1, 2, 3, 4, 5, 6]))
        assert self.m.allocate_slots(a, 1) is not None
        self.a = HASHER.with_output_tokens(replace(a, num_computed_tokens=a.num_tokens), [8])
        assert self.m.allocate_slots(self.a, 1) == ((), ())  # a quiet step: kvimpl now has limits for "a"
        self.b = self._admit(HASHER.new_request("b", [1, 2, 3, 4, 9, 9, 9, 9, 9]))
        self._admit(HASHER.new_request("c", [5] * 9))
        self.popped = self.m.pop_blocks_for_free("c")
        self.setup = self.observe()  # drains events, new-block ids and statistics

    def _admit(self, req: Request) -> Request:
        hits, n = self.m.get_computed_blocks(req)
        assert self.m.allocate_slots(req, req.num_tokens - n, n, hits) is not None
        self.m.record_prefix_cache_stats(req, n)
        return HASHER.with_output_tokens(
            replace(req, num_computed_tokens=req.num_tokens, status=RequestStatus.RUNNING), [7]
        )

    def observe(self) -> object:
        """The view, and what was recorded since the last call (events, new-block ids, statistics)."""
        m = self.m
        return m.to_view(), m.take_events(), m.take_new_block_ids(), m.make_prefix_cache_stats(), m.usage


Call = Callable[[State], object]
BAD_COUNTS: list[Any] = [1.0, True, False, "1", None, -1]
BAD_IDS: list[Any] = [1, 1.0, None, b"a", ("a",)]
BAD_BLOCK_IDS: list[Any] = [1.0, True, "1", None, -1, CONFIG.num_blocks]


@dataclass(frozen=True)
class Of:
    """An argument read from the state when the call runs."""

    read: Callable[[State], Any]


def on(op: str, *args: Any, **kwargs: Any) -> Call:
    """The call ``state.m.<op>(*args, **kwargs)``, each :class:`Of` argument read first."""

    def call(s: State) -> object:
        def value(v: Any) -> Any:
            return v.read(s) if isinstance(v, Of) else v

        return getattr(s.m, op)(*map(value, args), **{k: value(v) for k, v in kwargs.items()})

    return call


A, B = Of(lambda s: s.a), Of(lambda s: s.b)
BATCH = "allocate_slots_batch"
BA = Of(lambda s: [s.b, s.a])
"""A batch whose first step (``b``, 4 tokens) takes a block, then ``a``."""


def a_computed(v: Any) -> Of:
    """``a`` with ``num_computed_tokens`` set to ``v``."""
    return Of(lambda s: replace(s.a, num_computed_tokens=v))


def popped_and(v: Any) -> Of:
    """The popped blocks of ``c`` followed by ``v``."""
    return Of(lambda s: [*s.popped, v])


def bad_request(i: int) -> Of:
    """The ``i``-th of: None, a str, an object, a look-alike of ``a``, ``a`` with an int id."""

    def read(s: State) -> Any:
        a = s.a
        fields = (a.request_id, a.all_token_ids, a.num_prompt_tokens, a.block_hashes, a.num_computed_tokens, a.status)
        return [None, "a", object(), LookAlike(*fields), replace(a, request_id=cast(Any, 5))][i]

    return Of(read)


def facade_cases() -> list[tuple[str, type[KVCacheError], Call]]:
    """(name, error class, call) for every facade entry and bad value."""
    cases: list[tuple[str, type[KVCacheError], Call]] = []
    for i in range(5):
        bad = bad_request(i)
        cases += [
            (f"get_computed_blocks(bad request {i})", InvalidRequestError, on("get_computed_blocks", bad)),
            (f"allocate_slots(bad request {i})", InvalidRequestError, on("allocate_slots", bad, 1)),
            (
                f"record_prefix_cache_stats(bad request {i})",
                InvalidRequestError,
                on("record_prefix_cache_stats", bad, 0),
            ),
            (f"cache_blocks(bad request {i})", InvalidRequestError, on("cache_blocks", bad, 4)),
        ]
    for v in BAD_COUNTS:
        for name in (
            "num_new_computed_tokens", "num_lookahead_tokens", "num_external_computed_tokens",
            "num_encoder_tokens", "reserved_blocks",
        ):  # fmt: skip
            cases.append(
                (f"allocate_slots({name}={v!r})", InvalidTokenCountError, on("allocate_slots", A, 1, **{name: v}))
            )
        computed = a_computed(v)
        cases += [
            (f"allocate_slots(num_new_tokens={v!r})", InvalidTokenCountError, on("allocate_slots", A, v)),
            (f"allocate_slots(num_computed_tokens={v!r})", InvalidTokenCountError, on("allocate_slots", computed, 1)),
            (
                f"record_prefix_cache_stats(num_hits={v!r})",
                InvalidTokenCountError,
                on("record_prefix_cache_stats", B, v),
            ),
            (f"remove_skipped_blocks(total={v!r})", InvalidTokenCountError, on("remove_skipped_blocks", "a", v)),
            (f"cache_blocks(num_computed_tokens={v!r})", InvalidTokenCountError, on("cache_blocks", A, v)),
        ]
    for v in BAD_IDS:
        common = ("get_num_common_prefix_blocks",) if CONFIG.profile.common_prefix != "absent" else ()
        for op in ("free", "pop_blocks_for_free", "get_blocks", "get_block_ids", *common):
            cases.append((f"{op}({v!r})", InvalidRequestError, on(op, v)))
        cases.append((f"remove_skipped_blocks({v!r})", InvalidRequestError, on("remove_skipped_blocks", v, 4)))
    for v in BAD_BLOCK_IDS:
        cases += [
            (f"free_blocks([.., {v!r}])", InvalidBlockIdError, on("free_blocks", popped_and(v))),
            (f"evict_blocks([1, {v!r}])", InvalidBlockIdError, on("evict_blocks", [1, v])),
        ]
    return cases


FACADE = facade_cases()


@pytest.mark.parametrize(("name", "error", "call"), FACADE, ids=[c[0] for c in FACADE])
def test_bad_arguments_raise_the_spec_error_and_change_nothing(
    name: str, error: type[KVCacheError], call: Call
) -> None:
    for make in (SpecManager, ImplManager):
        state = State(make)
        before = state.observe()
        with pytest.raises(error):
            call(state)
        assert state.observe() == before, f"{name} changed the state of {make.__module__}"


def test_the_two_managers_start_alike() -> None:
    """The cases above compare each side with itself; here the sides with each other."""
    spec, impl = State(SpecManager), State(ImplManager)
    assert impl.setup == spec.setup
    assert impl.popped == spec.popped


FIELDS = tuple(f.name for f in dataclass_fields(Request))
SUBCLASS_CASES: list[tuple[str, Call]] = [
    ("Request subclass", on("allocate_slots", Of(lambda s: MyRequest(**{f: getattr(s.a, f) for f in FIELDS})), 1)),
    ("int subclass new tokens", on("allocate_slots", A, MyInt(1))),
    ("int subclass computed", on("allocate_slots", a_computed(MyInt(7)), 1)),
    ("int subclass lookahead", on("allocate_slots", A, 1, num_lookahead_tokens=MyInt(1))),
    ("int subclass unused count", on("allocate_slots", A, 1, num_encoder_tokens=MyInt(0))),
    ("int subclass block ids", on("free_blocks", Of(lambda s: [MyInt(b) for b in s.popped]))),
    ("int subclass total", on("remove_skipped_blocks", "a", MyInt(4))),
]


@pytest.mark.parametrize(("name", "call"), SUBCLASS_CASES, ids=[c[0] for c in SUBCLASS_CASES])
def test_subclass_values_are_valid_and_agree(name: str, call: Call) -> None:
    spec, impl = State(SpecManager), State(ImplManager)
    assert call(impl) == call(spec)
    impl.m.check_invariants()
    assert impl.observe() == spec.observe()


# -- the step API -------------------------------------------------------------------------


def test_subclass_values_in_a_batch_agree_with_the_sequential_spec() -> None:
    spec, impl = State(SpecManager), State(ImplManager)
    got = impl.m.allocate_slots_batch([impl.b, impl.a], [MyInt(4), 1], MyInt(0))
    assert got == [spec.m.allocate_slots(spec.b, MyInt(4)), spec.m.allocate_slots(spec.a, 1)]
    impl.m.check_invariants()
    assert impl.observe() == spec.observe()


BATCH_CASES: list[tuple[str, type[KVCacheError], Call]] = [
    ("a bad request in the batch", InvalidRequestError, on(BATCH, Of(lambda s: [s.b, s.a, None]), [4, 1, 1])),
    ("a look-alike in the batch", InvalidRequestError, on(BATCH, Of(lambda s: [s.b, bad_request(3).read(s)]), [4, 1])),
    ("a float count in the batch", InvalidTokenCountError, on(BATCH, BA, [4, 1.0])),
    ("a bool count in the batch", InvalidTokenCountError, on(BATCH, BA, [4, True])),
    ("a bool lookahead for all", InvalidTokenCountError, on(BATCH, BA, [4, 1], True)),
    ("a float lookahead for all", InvalidTokenCountError, on(BATCH, BA, [4, 1], 1.0)),
    ("a float lookahead for one", InvalidTokenCountError, on(BATCH, BA, [4, 1], [0, 1.0])),
    ("a float computed count", InvalidTokenCountError, on(BATCH, Of(lambda s: [s.b, a_computed(7.0).read(s)]), [4, 1])),
    ("a bad id in free_batch", InvalidRequestError, on("free_batch", ["a", "b", 5])),
]


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize(("name", "error", "call"), BATCH_CASES, ids=[c[0] for c in BATCH_CASES])
def test_bad_batch_arguments_change_no_request(
    name: str, error: type[KVCacheError], call: Call, build: Callable[[KVCacheConfig], Any]
) -> None:
    """The batch is checked before anything changes, also where the sequential
    calls would have changed the requests before the bad one (``b``'s step of
    4 tokens takes a block)."""
    state = State(build)
    before = state.observe()
    with pytest.raises(error):
        call(state)
    assert state.observe() == before, name


@pytest.mark.parametrize("build", BUILDS)
def test_the_first_step_of_the_bad_batches_changes_the_state(build: Callable[[KVCacheConfig], Any]) -> None:
    """So the batches above would show a change if they were not checked first."""
    state = State(build)
    before = state.observe()
    assert state.m.allocate_slots(state.b, 4) is not None
    assert state.observe() != before


@pytest.mark.parametrize("build", BUILDS)
def test_device_table_arguments(build: Callable[..., Any]) -> None:
    """The same typed errors from both builds (the native manager used to index its tables with
    any group, -1 giving the last one, and took a float or bool position)."""
    pytest.importorskip("torch")
    m: Any = build(CONFIG, device="cpu")  # Any: the calls pass values of the wrong types
    assert m.allocate_slots(HASHER.new_request("a", [1, 2, 3, 4, 5]), 5) is not None
    for group in (2, -1, 1.0, True):
        with pytest.raises(GroupCountError):
            m.block_table(group)
        with pytest.raises(GroupCountError):
            m.slot_mapping(["a"], [0], group)
    with pytest.raises(InvalidRequestError):
        m.slot_mapping([1], [0])
    for pos in (1.0, True, None):
        with pytest.raises(InvalidTokenCountError):
            m.slot_mapping(["a"], [pos])
    assert m.slot_mapping(["a"], [4], 1).tolist() == [m.get_block_ids("a")[1][1] * 4]
    before = m.to_view()
    with pytest.raises(UnknownRequestError):
        m.slot_mapping(["b"], [0])
    assert m.to_view() == before


@pytest.mark.parametrize("build", BUILDS)
def test_device_table_calls_without_device_tables(build: Callable[..., Any]) -> None:
    """A manager built without a ``device`` refuses them with a typed error (it raised RuntimeError)."""
    m: Any = build(CONFIG)
    with pytest.raises(UnsupportedOperationError, match="device"):
        m.block_table()
    with pytest.raises(UnsupportedOperationError, match="device"):
        m.slot_mapping([], [])
