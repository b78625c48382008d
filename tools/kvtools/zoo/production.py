"""Zoo entries in kvimpl's production entry points: the array API, multi-request batches, mutable requests, a crash.

These faults are kvimpl's own, not re-planted from vLLM: each breaks a call a
scheduler on kvimpl makes that vLLM's facade does not have, where a fresh
fault set once went unseen (the kit drove none of them). Each factory builds
the adapter of the target that drives that entry point (``impl-array``,
``impl-mutable``) or kvimpl's own manager, whose batch method the machine's
``batched`` family calls, with one method replaced on the instance.
"""

from __future__ import annotations

import ctypes
from typing import Any

from kvref.adapters.impl import ImplAdapter, request_hashers
from kvref.adapters.impl_array import make_impl_array_adapter
from kvref.adapters.impl_mutable import make_impl_mutable_adapter
from kvspec.config import KVCacheConfig
from kvspec.errors import UnsupportedByProfileError
from kvtools.zoo.base import entry, mutant, patch


def _native_or_python(config: KVCacheConfig, name: str) -> Any:
    """The array adapter where the native core runs ``config``; elsewhere plain kvimpl (the fault has no place)."""
    try:
        adapter = make_impl_array_adapter(config)
    except UnsupportedByProfileError:
        adapter = mutant(config, name)
    adapter.name = name
    return adapter


@entry(
    "kvimpl: the array API",
    "allocate_slots_array reports the first request that did not fit one position late (first_unfitted + 1), "
    "so a scheduler checking the step's result preempts the wrong request or none",
    "impl-array's check of first_unfitted against the decoded counts, when a request of an array step does not fit",
)
def array_first_unfitted_late(config: KVCacheConfig) -> ImplAdapter:
    """``first_unfitted`` one position past the first request without slots."""
    m = _native_or_python(config, "array_first_unfitted_late")
    orig = getattr(m, "allocate_slots_array", None)
    if orig is not None:

        def allocate_slots_array(*args: Any) -> Any:
            counts, ids, first = orig(*args)
            return counts, ids, first + 1 if first >= 0 else first

        patch(m, "allocate_slots_array", allocate_slots_array)
    return m  # type: ignore[no-any-return]


@entry(
    "kvimpl: multi-request batches",
    "allocate_slots_batch applies the first request's lookahead count to every request of the batch",
    "allocate_slots_batch output or view when two requests of a batch ask for different lookahead slots (EAGLE)",
)
def batch_first_lookahead(config: KVCacheConfig) -> ImplAdapter:
    """Every item gets the first item's lookahead."""
    m = mutant(config, "batch_first_lookahead")
    orig = m.allocate_slots_batch

    def allocate_slots_batch(requests: Any, num_new_tokens: Any, num_lookahead_tokens: Any = 0) -> Any:
        if isinstance(num_lookahead_tokens, list | tuple) and num_lookahead_tokens:
            num_lookahead_tokens = [num_lookahead_tokens[0]] * len(num_lookahead_tokens)
        return orig(requests, num_new_tokens, num_lookahead_tokens)

    patch(m, "allocate_slots_batch", allocate_slots_batch)
    return m


@entry(
    "kvimpl: mutable requests",
    "a mutable request keeps serving the token tuple it cached before the last append (a stale cache): the "
    "managers read tokens only up to the last full block, so no output or view shows it",
    "impl-mutable's comparison of the whole request (all tokens) with kvspec's value after an append",
)
def stale_token_tuple(config: KVCacheConfig) -> Any:
    """Appends stop refreshing ``all_token_ids`` once a tuple was built."""
    adapter = make_impl_mutable_adapter(config)
    adapter.name = "stale_token_tuple"
    python, _ = request_hashers(config)

    class StaleRequest(type(python.new_request("probe", [1]))):  # type: ignore[misc]  # kvimpl's Python request
        __slots__ = ()

        def append_output_token_ids(self, token_ids: Any) -> None:
            cached = getattr(self, "_tokens_tuple", None)
            super().append_output_token_ids(token_ids)
            if cached is not None:
                setattr(self, "_tokens_tuple", cached)  # noqa: B010 - a slot of the base class the checker cannot see

    class StaleHasher:
        """kvimpl's Python hasher whose requests are :class:`StaleRequest`."""

        def __getattr__(self, name: str) -> Any:
            return getattr(python, name)

        def new_request(self, *args: Any, **kwargs: Any) -> Any:
            made = python.new_request(*args, **kwargs)
            made.__class__ = StaleRequest
            return made

    adapter._hashers = (StaleHasher(), StaleHasher())
    return adapter


@entry(
    "kvimpl: the native core's memory",
    "a native fault that corrupts memory kills the process at the second free of a request whose table spans "
    "three or more blocks (simulated with a read of address 0): in-process, the checker dies with it",
    "kvref check --isolate: the child process dies with SIGSEGV, a crash divergence with its shrunk trace",
)
def native_crash_on_free(config: KVCacheConfig) -> ImplAdapter:
    """A segmentation fault in ``free`` (hunted in a child process: :mod:`kvref.isolation`)."""
    m = mutant(config, "native_crash_on_free")
    orig = m.free
    freed = [0]

    def free(request_id: Any) -> None:
        try:
            tables = m.get_block_ids(request_id)
        except Exception:  # not a request it holds: the call below refuses it as kvimpl does
            tables = ()
        if tables and len(tables[0]) >= 3:
            freed[0] += 1
            if freed[0] == 2:
                ctypes.string_at(0)
        orig(request_id)

    patch(m, "free", free)
    return m


CRASHES = frozenset({"native_crash_on_free"})
"""Entries that kill the process they run in: the runner hunts them isolated."""

