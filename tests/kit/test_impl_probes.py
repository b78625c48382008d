"""The impl adapters' own checks: caller-error probes, build selection, the batch forms, the hint.

Each check runs inside a lockstep (:mod:`kvref.adapters.impl_probes`,
:mod:`kvref.adapters.impl_batch`); here each is shown to pass on kvimpl as it
is and to fail on a kvimpl with the checked behaviour broken.
"""

from __future__ import annotations

from typing import Any

import pytest

import kvimpl.kv_cache_manager as kvimpl_manager
import kvimpl.request as kvimpl_request
from kvimpl.native import create_manager, native_module
from kvimpl.native_hint import NativeHint
from kvref.adapters import impl as impl_adapters
from kvref.adapters.impl import (
    ImplAdapter,
    NativeImplAdapter,
    make_impl_adapter,
    make_impl_native_adapter,
    make_impl_python_adapter,
)
from kvref.adapters.impl_batch import MALFORMED, BatchImplAdapter, make_impl_batch_adapter
from kvref.adapters.impl_mutable import _probe_hash_function
from kvref.adapters.impl_probes import caller_error_calls, probe_caller_errors
from kvspec.config import FullAttention, KVCacheConfig, SlidingWindow
from kvspec.errors import InvalidRequestError, InvalidTokenCountError, UnsupportedOperationError
from kvspec.hashing import get_hash_fn_by_name
from kvspec.profiles import NEWEST, PROFILES, VLLM_0_25_1
from kvspec.request import Request, RequestBlockHasher

BUILT = native_module() is not None
needs_build = pytest.mark.skipif(not BUILT, reason="the native extension is not built here")
V016 = PROFILES["vllm-0.16.0"]


def config(profile: Any = NEWEST, groups: tuple[Any, ...] = (FullAttention(4),)) -> KVCacheConfig:
    return KVCacheConfig(num_blocks=32, groups=groups, max_model_len=64, profile=profile)


def admitted(adapter: Any) -> Request:
    """A request holding blocks in ``adapter``."""
    request = RequestBlockHasher.for_config(adapter.config).new_request("a", [1, 2, 3, 4, 5, 6])
    assert adapter.allocate_slots(request, 6) is not None
    return request


@pytest.mark.parametrize(
    ("make", "profile"),
    [
        (make_impl_python_adapter, V016),
        (make_impl_python_adapter, VLLM_0_25_1),
        (make_impl_adapter, NEWEST),
        pytest.param(make_impl_adapter, VLLM_0_25_1, marks=needs_build),
        pytest.param(make_impl_native_adapter, PROFILES["vllm-0.26.0"], marks=needs_build),
    ],
)
def test_the_probes_pass_on_kvimpl(make: Any, profile: Any) -> None:
    """Run from check_invariants: with a request of their own at the first check, and again
    as soon as a request holds blocks."""
    adapter = make(config(profile))
    adapter.check_invariants()
    assert adapter._probed == 1  # nothing holds blocks yet
    admitted(adapter)
    adapter.check_invariants()
    assert adapter._probed == 2


def test_the_probes_follow_the_profile() -> None:
    request = RequestBlockHasher.for_config(config()).new_request("a", [1, 2, 3])
    old = {what for what, _, _ in caller_error_calls(config(V016), request)}
    assert {"pop_blocks_for_free", "get_prefix_hint", "record_prefix_cache_stats"} <= old
    assert any(w.startswith("allocate_slots {'full_sequence_must_fit'") for w in old)
    new = [(what, error) for what, error, _ in caller_error_calls(config(NEWEST), request)]
    assert new == [
        ("get_zeroing_block_ids_in_range", UnsupportedOperationError),  # vLLM 0.26.0 to 0.31.0 only
        ("allocate_slots with a request id that is not a str", InvalidRequestError),
    ]


@pytest.mark.parametrize(
    ("name", "profile", "broken"),
    [
        ("require_operation", V016, lambda *args: None),
        ("check_admission_args", V016, lambda *args: None),
        ("check_request", NEWEST, lambda request: None),
    ],
)
def test_the_probes_catch_a_refusal_kvimpl_lost(
    monkeypatch: pytest.MonkeyPatch, name: str, profile: Any, broken: Any
) -> None:
    adapter = make_impl_python_adapter(config(profile))
    request = admitted(adapter)
    monkeypatch.setattr(kvimpl_manager, name, broken)
    with pytest.raises(AssertionError, match="expected"):
        probe_caller_errors(adapter, kvimpl_manager.KVCacheManager, request)


def test_a_device_table_call_without_tables_must_be_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = make_impl_python_adapter(config())
    request = admitted(adapter)
    monkeypatch.setattr(kvimpl_manager.KVCacheManager, "block_table", lambda self, group=0: None)
    with pytest.raises(AssertionError, match="block_table"):
        probe_caller_errors(adapter, kvimpl_manager.KVCacheManager, request)


@needs_build
def test_the_build_line_must_name_the_selected_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVREF_NATIVE", raising=False)
    assert type(make_impl_adapter(config())) is NativeImplAdapter
    monkeypatch.setattr(impl_adapters, "build_description", lambda: "pure Python (KVREF_NATIVE=0)")
    with pytest.raises(AssertionError, match="build line"):
        make_impl_adapter(config())


def test_the_adapters_run_the_manager_kvimpl_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """``impl`` and ``impl-batch`` are the objects ``create_manager`` returned, as adapter classes."""
    built: list[Any] = []
    create = create_manager

    def spy(*args: Any, **kwargs: Any) -> Any:
        built.append(create(*args, **kwargs))
        return built[-1]

    monkeypatch.setenv("KVREF_NATIVE", "0")
    monkeypatch.setattr(impl_adapters, "create_manager", spy)
    adapter = make_impl_adapter(config())
    assert adapter is built[-1] and type(adapter) is ImplAdapter
    pytest.importorskip("torch")
    batch = make_impl_batch_adapter(config())
    assert batch is built[-1] and type(batch) is BatchImplAdapter
    assert batch.device_tables is not None


def test_a_malformed_batch_must_raise_what_kvspec_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every malformed kind passes on kvimpl; a batch that refuses a bad request
    with another class than kvspec's per-request call fails the check."""
    pytest.importorskip("torch")
    adapter = make_impl_batch_adapter(config())
    admitted(adapter)
    hasher = RequestBlockHasher.for_config(adapter.config)
    # The kind turns with the item's token count: one request of each length covers them all.
    items = [hasher.new_request(f"r{t}", list(range(t))) for t in range(1, 1 + len(MALFORMED))]
    for item in items:
        adapter._malformed(item, 2, 0)

    def wrong_class(request: object) -> None:
        if not isinstance(request, Request) or not isinstance(request.request_id, str):
            raise InvalidTokenCountError("the wrong class for a bad request")

    monkeypatch.setattr(kvimpl_manager, "check_request", wrong_class)
    with pytest.raises(AssertionError, match="expected InvalidRequestError"):
        for item in items:
            adapter._malformed(item, 2, 0)


@needs_build
def test_the_native_hint_check_catches_a_wrong_first_search(monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = make_impl_native_adapter(config(groups=(FullAttention(4), SlidingWindow(4, 8))))
    hasher = RequestBlockHasher.for_config(adapter.config)
    first = hasher.new_request("a", list(range(12)))
    adapter.get_computed_blocks(first)  # agrees with kvimpl's search
    assert adapter.allocate_slots(first, 12) is not None
    longest = NativeHint.longest
    monkeypatch.setattr(NativeHint, "longest", lambda self, *args: longest(self, *args) + 4)
    with pytest.raises(AssertionError, match="first search"):
        adapter.get_computed_blocks(hasher.new_request("b", list(range(12))))


def test_the_hash_function_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    hasher = kvimpl_request.RequestHasher.for_config(config(), native=False)
    _probe_hash_function(hasher, "a", [1, 2, 3], NEWEST)  # both refuse md5
    monkeypatch.setattr(
        kvimpl_request, "hash_function", lambda name: get_hash_fn_by_name("sha256" if name == "md5" else name)
    )
    with pytest.raises(AssertionError, match="UnknownHashFunctionError"):
        _probe_hash_function(hasher, "a", [1, 2, 3], NEWEST)


def test_an_unsupported_operation_error_is_what_both_raise() -> None:
    """The class the probes expect for an operation a release lacks is kvspec's."""
    request = RequestBlockHasher.for_config(config()).new_request("a", [1, 2, 3])
    errors = {error for _, error, _ in caller_error_calls(config(V016), request)}
    assert errors == {UnsupportedOperationError, InvalidRequestError}
