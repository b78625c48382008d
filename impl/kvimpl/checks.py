"""Type checks of the arguments at kvimpl's public entries.

kvimpl's own copies of the spec's value checks (``is_int``,
``check_request`` and ``check_request_id`` of :mod:`kvspec.kv_cache_manager`),
duplicated on purpose like every rule kvimpl shares with the spec: the facade
(:mod:`kvimpl.kv_cache_manager`) and the step API (:mod:`kvimpl.step_api`)
both call them, so they live in a module of their own. Each raises the
spec's error class for the same value, before anything changes.

NOTE: the running-step fast path of ``allocate_slots`` does not call these
(a call costs as much as a quiet step); it tests the exact types inline
(``type(x) is int``, which also refuses ``bool``) and sends anything else to
the ordinary path, whose checks are these.
"""

from __future__ import annotations

from typing import TypeGuard

from kvimpl.request import Request as MutableRequest
from kvspec.errors import InvalidRequestError
from kvspec.request import Request

REQUEST_TYPES: tuple[type, ...] = (Request, MutableRequest)
try:
    from kvimpl._kvnative import Request as NativeRequest
except ImportError:  # the native core is not built: only the two Python request classes
    pass
else:
    REQUEST_TYPES += (NativeRequest,)
"""What kvimpl takes as a request: kvspec's immutable value (what the kit
passes) and kvimpl's mutable requests (:mod:`kvimpl.request`, the Python
class and the C one when built), which a scheduler advances in place."""


def is_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an int and not a bool (``True`` is not a count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_request(request: object) -> None:
    """Raise InvalidRequestError unless ``request`` is a request (:data:`REQUEST_TYPES`) with a str id."""
    if not isinstance(request, REQUEST_TYPES) or not isinstance(getattr(request, "request_id", None), str):
        raise InvalidRequestError(f"expected a kvspec Request with a str request_id, got {request!r}")


def check_request_id(op: str, request_id: object) -> None:
    """Raise InvalidRequestError unless ``request_id`` is a str."""
    if not isinstance(request_id, str):
        raise InvalidRequestError(f"{op}: request_id must be a str, got {request_id!r}")
