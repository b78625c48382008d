"""``--target impl-array``: the native core's array API under the lockstep.

A scheduler holding int32 buffers drives kvimpl's native core through its
array API (``kvimpl.native``): ``handle(request_id)`` once a request holds
blocks, ``allocate_slots_array(handles, num_new_tokens, num_lookahead_tokens)``
for a running step, returning per request and group the counts of new blocks
(-1 for a request that did not fit), the new block ids, and the position of
the first request that did not fit (``first_unfitted``, -1 when all did), and
``advance_array(handles, num_new_tokens, tokens)`` to advance the core's own
requests after the step. This adapter runs the lockstep through it, on the
native manager with kvimpl's mutable C requests (as ``--target impl-mutable``):

* every ``allocate_slots`` of a running request without hits, external or
  encoder tokens and with the default admission arguments, and every batch
  (the kit's ``allocate_slots_batch``, one array call per run of items with
  the same lookahead), goes through ``allocate_slots_array`` with int32
  buffers; the outputs are decoded from the counts and ids, and
  ``first_unfitted`` must name the first request that did not fit;
* every advance of a request the core holds by a handle (its computed
  tokens grow, at most one sampled token is appended) goes through
  ``advance_array``, and the request must then equal kvspec's value (tokens,
  counts, hashes: :mod:`kvref.adapters.impl_mutable`);
* everything else (admissions, hits, caller errors) goes to the per-request
  calls, unchanged.

The manager keeps device tables as a model runner on this API would: the
device tensor is the host's (``"cpu"``), the attention kernel's blocks half
the manager's where the block size is even, checked against the tables every
third check (:func:`kvref.adapters.impl_batch.check_device_tables`).

An :class:`AssertionError` is the array API disagreeing with the per-request
protocol: the lockstep reports it as an invariant failure of ``impl-array``.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

from kvref.adapters.impl import check_config, device_tables_for, native_built, request_hashers
from kvref.adapters.impl_batch import check_device_tables
from kvref.adapters.impl_mutable import MutableNativeImplAdapter, MutableRequests, _same_request
from kvref.capabilities import declare
from kvspec.config import KVCacheConfig
from kvspec.errors import KVCacheError, UnsupportedByProfileError
from kvspec.request import Request
from kvspec.view import BlockIds

_DEFAULTS = {
    "num_new_computed_tokens": 0,
    "new_computed_blocks": None,
    "num_external_computed_tokens": 0,
    "delay_cache_blocks": False,
    "num_encoder_tokens": 0,
    "full_sequence_must_fit": False,
    "reserved_blocks": 0,
    "has_scheduled_reqs": True,
    "skip_zeroing_group_ids": (),
}
"""The ``allocate_slots`` arguments the array API has no counterpart of, at the values it implies."""

_NAMES = tuple(_DEFAULTS)


_Mirroring: Any = MutableRequests
"""The base of :class:`ArrayCalls`: at run time the request mirroring, mixed in before the native
manager class, whose methods (``handle``, the array calls) the type checker is not told of."""


class ArrayCalls(_Mirroring):  # type: ignore[misc]  # a mixin of the native manager class (see _Mirroring)
    """Running steps through ``allocate_slots_array`` and ``advance_array`` (see the module docstring)."""

    name = "impl-array"
    _checks = 0
    array_calls = 0
    """Array calls made (allocations and advances): a run that made none checked nothing of the API."""

    def check_invariants(self) -> None:
        """The manager's invariants, then, every third time, its device tables (kernel blocks half the
        manager's) against its tables (:func:`kvref.adapters.impl_batch.check_device_tables`)."""
        super().check_invariants()
        self._checks += 1
        if self._checks % 3 == 0:
            check_device_tables(self)

    def _sync(self, request: Any) -> Any:
        """Advance the mirror of a held request through ``advance_array`` where the
        change is a step (computed tokens up, at most one token appended), then as
        :meth:`MutableRequests._sync` (which checks the whole request)."""
        if isinstance(request, Request):
            self._advance_by_array(request)
        return super()._sync(request)

    def allocate_slots(self, request: Any, num_new_tokens: Any, *args: Any, **kwargs: Any) -> BlockIds | None:
        """A running step through ``allocate_slots_array`` where the call is one; else the per-request call."""
        look = args[2] if len(args) > 2 else kwargs.get("num_lookahead_tokens", 0)
        others = dict(zip(_NAMES[:2], args[:2], strict=False)) | dict(zip(_NAMES[2:], args[3:], strict=False))
        others |= {k: v for k, v in kwargs.items() if k != "num_lookahead_tokens"}
        plain = all(_plain(others.get(k, v), v) for k, v in _DEFAULTS.items())
        if plain and type(look) is int and look >= 0 and self._arrayable(request, num_new_tokens):
            return self._array_step([request], [num_new_tokens], look)[0]
        out: BlockIds | None = super().allocate_slots(request, num_new_tokens, *args, **kwargs)
        return out

    def allocate_slots_batch(
        self, requests: Sequence[Any], num_new_tokens: Sequence[int], num_lookahead_tokens: Any = 0
    ) -> list[BlockIds | None]:
        """A batch as array calls, one per run of items with the same lookahead."""
        looks = list(num_lookahead_tokens) if isinstance(num_lookahead_tokens, Sequence) else [num_lookahead_tokens]
        looks = looks if len(looks) == len(requests) else looks * len(requests)
        if not all(self._arrayable(r, n) for r, n in zip(requests, num_new_tokens, strict=True)) or not all(
            type(k) is int and k >= 0 for k in looks
        ):
            items = zip(requests, num_new_tokens, looks, strict=True)
            return [self.allocate_slots(r, n, num_lookahead_tokens=k) for r, n, k in items]
        out: list[BlockIds | None] = []
        i = 0
        while i < len(requests):
            j = i
            while j < len(requests) and looks[j] == looks[i]:
                j += 1
            out += self._array_step(list(requests[i:j]), list(num_new_tokens[i:j]), looks[i])
            i = j
        return out

    def _arrayable(self, request: Any, n: Any) -> bool:
        """A valid running step of a request the core holds."""
        if not isinstance(request, Request) or type(n) is not int or n <= 0:
            return False
        if request.num_computed_tokens + n > self.config.max_model_len:
            return False  # the per-request call raises its own error class
        try:
            self.handle(request.request_id)
        except KVCacheError:
            return False
        return True

    def _array_step(self, requests: list[Any], counts: list[int], look: int) -> list[BlockIds | None]:
        """One ``allocate_slots_array`` call; checks ``first_unfitted``.

        Raises:
            AssertionError: ``first_unfitted`` is not the first request that did not fit.
        """
        for r in requests:
            self._sync(r)
        handles = array("i", [self.handle(r.request_id) for r in requests])
        got_counts, ids, first_unfitted = self.allocate_slots_array(handles, array("i", counts), look)
        self.array_calls += 1
        groups = len(self.config.groups)
        out: list[BlockIds | None] = []
        pos = 0
        for i in range(len(requests)):
            row = got_counts[i * groups : (i + 1) * groups]
            if row[0] < 0:
                out.append(None)
                continue
            per = []
            for k in row:
                per.append(tuple(ids[pos : pos + k]))
                pos += k
            out.append(tuple(per))
        want = next((i for i, o in enumerate(out) if o is None), -1)
        if first_unfitted != want:
            raise AssertionError(f"impl-array: first_unfitted {first_unfitted}, the first request without slots {want}")
        return out

    def _advance_by_array(self, request: Request) -> None:
        """``advance_array`` for a step of a request the core holds (see :meth:`_sync`).

        Raises:
            AssertionError: The advanced request's computed tokens or tokens differ from ``request``'s.
        """
        mirror = self._mirrors.get(request.request_id)
        if mirror is None or not _same_request(mirror, request) or mirror.tokens is request.all_token_ids:
            return
        mreq = mirror.request
        step = request.num_computed_tokens - mreq.num_computed_tokens
        new = request.all_token_ids[len(mirror.tokens) :]
        if step < 0 or len(new) > 1 or request.status != mreq.status or request.num_preemptions != mreq.num_preemptions:
            return
        try:
            handle = self.handle(request.request_id)
        except KVCacheError:
            return  # not held by the core: nothing to advance there
        self.advance_array(array("i", [handle]), array("i", [step]), array("i", [new[0] if new else -1]))
        self.array_calls += 1
        mirror.tokens = request.all_token_ids
        if mreq.num_computed_tokens != request.num_computed_tokens or tuple(mreq.all_token_ids) != tuple(
            request.all_token_ids
        ):
            raise AssertionError(
                f"impl-array: advance_array left request {request.request_id!r} at {mreq.num_computed_tokens} computed "
                f"of {mreq.num_tokens} tokens; kvspec has {request.num_computed_tokens} of {request.num_tokens}"
            )

def _plain(value: Any, default: Any) -> bool:
    """Whether an argument is exactly at its default (anything else, a caller error included, goes to the
    per-request call, which validates it)."""
    if default is None:
        return value is None
    return type(value) is type(default) and value == default


class ArrayNativeAdapter(ArrayCalls, MutableNativeImplAdapter):  # type: ignore[misc]  # a class built by _mirrored
    """The native manager with mutable C requests, its running steps through the array API."""

    name = "impl-array"


@declare(unsupported={"report_mode_full"})
def make_impl_array_adapter(config: KVCacheConfig) -> Any:
    """Factory for ``--target impl-array``: kvimpl's native manager driven through its array API.

    A request in report mode "full" is a Python request in kvimpl (the C request
    has no such field), which the array API does not advance: the target lacks
    the feature ``report_mode_full`` (the other native targets run it).

    Raises:
        UnsupportedByProfileError: As ``--target impl-native`` (the native manager
            refuses what the core does not implement), for a release whose
            requests do not fit the C request (vLLM 0.34.0), or the native
            build is missing.
    """
    check_config(config)
    if not native_built():
        raise UnsupportedByProfileError("impl-array: the native core is not built here")
    native = request_hashers(config)[1]
    if not native.c_requests_fit:
        raise UnsupportedByProfileError(
            f"impl-array: the array API advances C requests only, and under {config.profile.name} kvimpl's requests "
            "are Python ones (the C request holds no hit limit fixed at construction and checks no token-id limit)"
        )
    adapter: Any = ArrayNativeAdapter(config)
    adapter._hashers = (native, native)  # the array API advances C requests only
    # Tables as a model runner on this API keeps them: the device tensor is the host's ("cpu"), the
    # attention kernel's blocks half the size of the manager's where the physical size is even.
    kernel = [k.block_size // 2 if k.block_size % 2 == 0 else k.block_size for k in config.groups]
    adapter.device_tables = device_tables_for(config, "cpu", core=adapter, kernel_block_sizes=kernel)
    return adapter
