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

from collections.abc import Iterable
from typing import TypeGuard

from kvimpl.request import Request as MutableRequest
from kvspec.config import KVCacheConfig
from kvspec.errors import (
    ConfigError,
    GroupCountError,
    InvalidRequestError,
    InvalidTokenCountError,
    UnsupportedOperationError,
)
from kvspec.profiles import SemanticsProfile
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


MAX_NUM_BLOCKS = 2**31 - 1
"""The most blocks a kvimpl manager holds: the native core and the device
tables keep block ids and counts in 32-bit integers."""


def check_manager_arguments(config: object, native: object = None) -> None:
    """Raise ConfigError, naming what to pass, for a constructor argument
    kvimpl cannot build a manager from: a ``config`` that is no
    :class:`kvspec.config.KVCacheConfig`, a ``native`` that is no bool (or
    None), more blocks than :data:`MAX_NUM_BLOCKS`."""
    if not isinstance(config, KVCacheConfig):
        raise ConfigError(
            f"config must be a kvspec.config.KVCacheConfig, got {type(config).__name__} {config!r:.60}: build one "
            "with KVCacheConfig(num_blocks=..., groups=(FullAttention(block_size),), max_model_len=...)"
        )
    if native is not None and not isinstance(native, bool):
        raise ConfigError(
            f"native must be True (the C core), False (the pure-Python manager) or None (as KVREF_NATIVE "
            f"says), got {native!r}"
        )
    if config.num_blocks > MAX_NUM_BLOCKS:
        raise ConfigError(
            f"num_blocks {config.num_blocks} is more than kvimpl holds ({MAX_NUM_BLOCKS}: block ids are 32-bit "
            "in the native core and the device tables); pass a smaller num_blocks"
        )


def out_of_memory(config: KVCacheConfig) -> ConfigError:
    """The error for a pool whose bookkeeping did not fit in memory (instead of an empty MemoryError)."""
    return ConfigError(
        f"num_blocks {config.num_blocks}: the bookkeeping of that many blocks does not fit in this machine's "
        "memory; pass a smaller num_blocks"
    )


def check_request_id(op: str, request_id: object) -> None:
    """Raise InvalidRequestError unless ``request_id`` is a str."""
    if not isinstance(request_id, str):
        raise InvalidRequestError(f"{op}: request_id must be a str, got {request_id!r}")


def check_zeroing_start(start_token: object, groups: Iterable[tuple[int, int]]) -> int:
    """``start_token`` of ``record_blocks_for_zeroing``, checked: an int >= 0
    and a multiple of the block size of each ``(group, block size)`` that lists
    fresh blocks.

    Raises:
        InvalidTokenCountError: Naming the first condition it breaks.
    """
    if not is_int(start_token) or start_token < 0:
        raise InvalidTokenCountError(f"record_blocks_for_zeroing: start_token {start_token!r} is not an int >= 0")
    for group, block_size in groups:
        if start_token % block_size:
            raise InvalidTokenCountError(
                f"record_blocks_for_zeroing: start_token {start_token} is not a multiple of group "
                f"{group}'s block size {block_size}"
            )
    return start_token


def check_zeroing_range(start_token: object, end_token: object) -> tuple[int, int]:
    """``start_token`` and ``end_token`` of ``get_zeroing_block_ids_in_range``,
    checked: ints with ``0 <= start_token <= end_token``.

    Raises:
        InvalidTokenCountError: Naming the first condition it breaks.
    """
    op = "get_zeroing_block_ids_in_range"
    if not is_int(start_token) or start_token < 0:
        raise InvalidTokenCountError(f"{op}: start_token {start_token!r} is not an int >= 0")
    if not is_int(end_token) or end_token < start_token:
        raise InvalidTokenCountError(f"{op}: end_token {end_token!r} is not an int >= start_token {start_token}")
    return start_token, end_token


def check_skip_zeroing(profile: SemanticsProfile, num_groups: int, group_ids: object) -> frozenset[int]:
    """``skip_zeroing_group_ids`` of ``allocate_slots``, checked: the group ids
    as a set; before vLLM 0.32.0 (``skip_zeroing_arg``) only an empty one.

    Raises:
        GroupCountError: Not a collection, or an entry that is no group id.
        UnsupportedOperationError: A non-empty one before vLLM 0.32.0.
    """
    if isinstance(group_ids, str | bytes) or not isinstance(group_ids, Iterable):
        raise GroupCountError(f"allocate_slots: skip_zeroing_group_ids {group_ids!r} is not a collection of group ids")
    ids = list(group_ids)
    if ids and not profile.skip_zeroing_arg:
        raise UnsupportedOperationError(f"allocate_slots: {profile.name} has no skip_zeroing_group_ids")
    for g in ids:
        if not is_int(g) or not 0 <= g < num_groups:
            raise GroupCountError(
                f"allocate_slots: skip_zeroing_group_ids names {g!r}, not a group of this model (0 to {num_groups - 1})"
            )
    return frozenset(ids)
