"""Caller errors the lockstep machine never sends, checked by kvimpl's adapters against kvspec.

The machine sends a facade operation only where the profile's release has it,
and a request with a str id: so kvimpl's refusals of an operation the release
lacks (``require_operation`` and the native core's copies of it), of an
admission argument before vLLM 0.25.1 (``check_admission_args``) and of a
request whose id is not a str on ``allocate_slots``' fast path would otherwise
never run in a lockstep. :func:`probe_caller_errors` makes those calls (the
impl adapters call it from ``check_invariants``: once with a request of their
own, and once more with a request the manager holds, so that the state is
not empty; :func:`kvref.adapters.impl.probe_once`), each on kvimpl and on a
fresh kvspec manager of the same configuration, and requires the same error
class from both, the one the kit expects from the profile's switches (read
here, as the machine reads them to choose what to send), and kvimpl's view
unchanged. Which calls are made follows from the profile alone, so kvspec's
refusals are checked as much as kvimpl's: a side that accepts the call, or
raises another class, fails the probe.

A manager built without a ``device`` is also asked for ``block_table`` and
``slot_mapping``, kvimpl's device-table calls (kvspec has none): both must
raise :class:`kvspec.errors.UnsupportedOperationError` and change nothing.

kvimpl is reached through ``base`` (the kvimpl class the adapter derives
from), not through the adapter's own overrides, so a probe never goes through
an adapter's routing (the batch forms of :mod:`kvref.adapters.impl_batch`,
the mirrored requests of :mod:`kvref.adapters.impl_mutable`).

A failed probe is an :class:`AssertionError`, which the lockstep reports as
an invariant failure of the adapter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kvspec.config import KVCacheConfig
from kvspec.errors import InvalidRequestError, KVCacheError, UnsupportedOperationError
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.request import Request

Call = Callable[[Any, Request], object]
"""One probe: the call made on a manager (kvimpl's or kvspec's) with a request it holds."""

OPERATION_SWITCHES: tuple[tuple[str, str, Call], ...] = (
    ("deferred_free", "pop_blocks_for_free", lambda m, r: m.pop_blocks_for_free(r.request_id)),
    ("new_block_ids_list", "take_new_block_ids", lambda m, r: m.take_new_block_ids()),
    ("mamba_step_guard", "new_step_starts", lambda m, r: m.new_step_starts()),
    ("computed_block_ids_op", "get_block_ids_for_computed_tokens",
     lambda m, r: m.get_block_ids_for_computed_tokens(r.request_id, 0)),
    ("estimate_cached_tokens_op", "estimate_cached_tokens", lambda m, r: m.estimate_cached_tokens(r)),
    ("prefix_hint_op", "get_prefix_hint", lambda m, r: m.get_prefix_hint(r)),
    ("partial_hash_hits", "take_kv_cache_block_copies", lambda m, r: m.take_kv_cache_block_copies()),
    ("num_cached_tokens_op", "get_num_cached_tokens", lambda m, r: m.get_num_cached_tokens(r)),
    ("record_zeroing_op", "record_blocks_for_zeroing", lambda m, r: m.record_blocks_for_zeroing(r.request_id, 0)),
    ("zeroing_range_op", "get_zeroing_block_ids_in_range",
     lambda m, r: m.get_zeroing_block_ids_in_range(r.request_id, 0, 1)),
    ("connector_lookup_op", "get_computed_blocks_for_connector", lambda m, r: m.get_computed_blocks_for_connector(r)),
    ("connector_lookup_op", "truncate_computed_blocks",
     lambda m, r: m.truncate_computed_blocks(tuple(() for _ in m.config.groups), 0)),
)  # fmt: skip
"""Per facade operation that only some releases have: the profile switch that
says whether it exists, its name, and the call (vLLM 0.16.0 lacks them all,
0.25.1 ``estimate_cached_tokens`` and ``take_kv_cache_block_copies``)."""

ADMISSION_ARGUMENTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("full_sequence_arg", {"full_sequence_must_fit": True}),
    ("reserved_blocks_arg", {"reserved_blocks": 1}),
    ("admission_controls", {"has_scheduled_reqs": False}),
    ("skip_zeroing_arg", {"skip_zeroing_group_ids": (0,)}),
)
"""The non-default admission arguments of ``allocate_slots``, each with the
profile switch of the releases that have it (0.21.0, 0.23.0, 0.24.0 and 0.32.0 on)."""


class Unrouted:
    """A manager's methods as its kvimpl class defines them, past any adapter's overrides."""

    def __init__(self, manager: Any, base: type) -> None:
        """Wrap ``manager``, an instance of (a subclass of) ``base``."""
        self._manager = manager
        self._base = base

    def __getattr__(self, name: str) -> Any:
        """``base``'s method ``name`` bound to the manager (a plain attribute where it is none)."""
        found = getattr(self._base, name, None)
        if found is None or not hasattr(found, "__get__") or isinstance(found, property):
            return getattr(self._manager, name)
        return found.__get__(self._manager, type(self._manager))


def probe_request(requests: Any) -> Request | None:
    """The first of ``requests`` (latest values of requests holding blocks)
    that a probe can use: a kvspec request with a str id, as the machine sends."""
    for r in requests:
        if type(r) is Request and type(r.request_id) is str:
            return r
    return None


def caller_error_calls(config: KVCacheConfig, request: Request) -> list[tuple[str, type[KVCacheError], Call]]:
    """The probes for ``config``'s profile: what each calls and the error class it must raise."""
    p = config.profile
    calls: list[tuple[str, type[KVCacheError], Call]] = [
        (op, UnsupportedOperationError, call) for switch, op, call in OPERATION_SWITCHES if not getattr(p, switch)
    ]
    if p.stats_at_lookup:  # lookups record the statistics: the release has no record_prefix_cache_stats
        calls.append(
            ("record_prefix_cache_stats", UnsupportedOperationError, lambda m, r: m.record_prefix_cache_stats(r, 0))
        )
    for switch, kw in ADMISSION_ARGUMENTS:
        if not getattr(p, switch):
            calls.append((f"allocate_slots {kw}", UnsupportedOperationError, _admission_call(kw)))
    # Exact int counts with no computed tokens, so that kvimpl's fast-path test passes up to the id.
    unnamed = replace(request, request_id=len(request.request_id), num_computed_tokens=0)  # type: ignore[arg-type]  # an int id on purpose
    calls.append(("allocate_slots with a request id that is not a str", InvalidRequestError,
                  lambda m, r: m.allocate_slots(unnamed, 1)))  # fmt: skip
    return calls


def _admission_call(kw: dict[str, Any]) -> Call:
    return lambda m, r: m.allocate_slots(r, 1, **kw)


def probe_caller_errors(manager: Any, base: type, request: Request) -> None:
    """Make every probe of :func:`caller_error_calls` (and the device-table
    calls of a manager without device tables) on kvimpl and on a fresh kvspec
    manager; see the module docstring.

    Raises:
        AssertionError: A side accepted a probe, or raised another class, or
            kvimpl's view changed.
    """
    impl = Unrouted(manager, base)
    spec = SpecManager(manager.config)
    before = manager.to_view()
    name = manager.config.profile.name
    for what, error, call in caller_error_calls(manager.config, request):
        want, got = _answer(call, spec, request), _answer(call, impl, request)
        if type(want) is not error or type(got) is not error:
            raise AssertionError(
                f"{what} under {name}: expected {error.__name__} from both, kvspec raised {_shown(want)} "
                f"and kvimpl {_shown(got)}"
            )
    if getattr(manager, "device_tables", None) is None:
        device_calls: dict[str, Callable[[], object]] = {
            "block_table": lambda: impl.block_table(0),
            "slot_mapping": lambda: impl.slot_mapping([], []),
        }
        for what, device_call in device_calls.items():
            got = raised(device_call)
            if type(got) is not UnsupportedOperationError:
                raise AssertionError(f"{what} without device tables: kvimpl raised {_shown(got)}")
    if manager.to_view() != before:
        raise AssertionError(f"a refused probe under {name} changed kvimpl's state")


def _answer(call: Call, manager: Any, request: Request) -> BaseException | None:
    """What ``call`` on ``manager`` raised (None if it returned)."""
    return raised(lambda: call(manager, request))


def raised(call: Callable[[], object]) -> BaseException | None:
    """The exception ``call`` raised (None if it returned)."""
    try:
        call()
    except Exception as exc:  # any class is an answer the probe compares
        return exc
    return None


def _shown(exc: BaseException | None) -> str:
    return "nothing" if exc is None else f"{type(exc).__name__} ({exc})"
