"""Adapters: anything that behaves like vLLM 0.25.1's ``KVCacheManager``.

An adapter is built from a :class:`kvspec.config.KVCacheConfig` by a factory
and exposes the facade operations plus :meth:`to_view`. Operations that exist
only in some releases are optional methods, looked up by name when an
operation needs them (a missing one answers
:class:`kvspec.errors.UnsupportedOperationError`):
``record_prefix_cache_stats(request, num_hits)`` (vLLM 0.27.0 on),
``get_prefix_hint(request)`` (the scheduler's prefix hint),
``get_block_ids_for_computed_tokens(request_id, num_computed_tokens)``
(vLLM 0.25.1 on: the tables cut to the computed tokens, for a KV connector),
``estimate_cached_tokens(request)`` (vLLM 0.26.0 on: the prefix length the
request's cached blocks stand for),
``record_blocks_for_zeroing(request_id, start_token)`` (vLLM 0.26.0 on: list
the request's blocks from a block-aligned token on for zeroing again, after a
failed connector load),
``get_zeroing_block_ids_in_range(request_id, start_token, end_token)``
(vLLM 0.26.0 to 0.31.0: the request's block ids over a token range in the
groups that list fresh blocks, which the scheduler leaves out of the zeroing
while a connector load fills them) and
``take_kv_cache_block_copies() -> (copies, retained)`` (vLLM 0.26.0 on:
``(source, copy)`` block-id pairs and the retained ids, released by the
caller with ``free_blocks``). Two keyword arguments are optional the same
way (an adapter without them is sent none): ``get_computed_blocks``'
``max_cache_hit_length`` (vLLM 0.33.0 on) and ``allocate_slots``'
``skip_zeroing_group_ids`` (vLLM 0.32.0 on: groups whose blocks for external
tokens are not listed for zeroing). The conformance kit
drives several adapters with the same operations and compares every output
and view. A refusal (``UnsupportedOperationError``) of an operation the
release has is a skip, counted, unless the adapter sets
``runs_every_operation = True``: then it fails the check (kvimpl's adapters
set it). An adapter that declines some inputs call by call names them in
``declines_per_call`` (feature names, :mod:`kvref.capabilities`): the
scheduler machine then sends those inputs only in forms it runs (kvimpl's
native core: lookups of ``num_tokens - 1`` tokens only).

Protocol versions: version 1 passes request *ids* to ``free`` and
``pop_blocks_for_free``; version 2 passes the request value there, as vLLM's
own ``KVCacheManager.free(request)`` and ``pop_blocks_for_free(request)`` take
it (every other method is the same in both). An adapter declares
``protocol_version = 2``; without the attribute, a ``free`` whose first
parameter is named ``request`` counts as version 2 and anything else as
version 1 (:func:`protocol_version`). docs/writing-an-adapter.md says how to
migrate.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from kvref.divergences import Divergence
from kvref.exits import InputError
from kvref.targets import load_callable
from kvspec.config import KVCacheConfig
from kvspec.events import KVCacheEvent
from kvspec.profiles import NEWEST
from kvspec.request import Request
from kvspec.stats import PrefixCacheStats
from kvspec.view import BlockIds, KVView

__all__ = [
    "PROTOCOL_VERSION",
    "SPEC_SEMANTICS",
    "AdapterFactory",
    "DeclaredSemantics",
    "KVCacheAdapter",
    "load_callable",
    "load_factory",
    "protocol_version",
    "semantics_of",
]

PROTOCOL_VERSION = 2
"""The newest adapter protocol version (see the module docstring)."""


@dataclass(frozen=True)
class DeclaredSemantics:
    """What an adapter claims to implement.

    Attributes:
        profile: The semantics profile it follows, e.g. ``"vllm-0.25.1"``.
        upstream: True when it behaves like that vLLM release *including* the
            release's known defects (real vLLM, a fork of it); False when it
            follows kvspec, which deliberately does not copy them. The lockstep
            explains a difference by a registered divergence only between an
            upstream side and a kvspec-semantics side.
        known: Further known differences the adapter declares: ids of the
            divergence registry (``kit/kvref/divergences.toml``), or
            :class:`kvref.divergences.Divergence` values with their own
            matcher or class (docs/writing-an-adapter.md). They explain a
            difference between this adapter and any other side, whatever the
            release.
    """

    profile: str
    upstream: bool
    known: tuple[str | Divergence, ...] = ()


SPEC_SEMANTICS = DeclaredSemantics(NEWEST.name, upstream=False)
"""What an adapter that declares nothing implements: kvspec semantics, of
whichever profile its configuration names (the newest by default)."""


def semantics_of(adapter: object) -> DeclaredSemantics:
    """The adapter's ``semantics`` attribute, or :data:`SPEC_SEMANTICS`."""
    declared = getattr(adapter, "semantics", None)
    return declared if isinstance(declared, DeclaredSemantics) else SPEC_SEMANTICS


def protocol_version(adapter: object) -> int:
    """The protocol version ``adapter`` speaks: its ``protocol_version``
    attribute, else 2 when the first parameter of its ``free`` is named
    ``request``, else 1."""
    declared = getattr(adapter, "protocol_version", None)
    if isinstance(declared, int) and not isinstance(declared, bool):
        return declared
    return _signature_version(type(adapter))


_VERSIONS: dict[type, int] = {}


def _signature_version(cls: type) -> int:
    if cls not in _VERSIONS:
        free = getattr(cls, "free", None)
        try:
            params = list(inspect.signature(free).parameters) if free is not None else []
        except (TypeError, ValueError):
            params = []
        first = params[1] if params[:1] == ["self"] and len(params) > 1 else (params[0] if params else "")
        _VERSIONS[cls] = 2 if first == "request" else 1
    return _VERSIONS[cls]


@runtime_checkable
class KVCacheAdapter(Protocol):
    """The facade of vLLM 0.25.1's ``KVCacheManager`` over plain values.

    Block lists are block ids per group; requests are :class:`kvspec.request.Request`
    values that the caller advances. Caller errors raise the classes of
    :mod:`kvspec.errors` and leave the state unchanged.
    """

    name: str

    def get_computed_blocks(self, request: Request) -> tuple[BlockIds, int]:
        """Longest prefix-cache hit (no state change)."""
        ...

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: BlockIds | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
    ) -> BlockIds | None:
        """Blocks newly allocated per group, or None if they do not fit."""
        ...

    def free(self, request: Any, /) -> None:
        """Free every block of the request, each group's table reversed.

        ``request`` is the request id (protocol 1) or the request value
        (protocol 2, as vLLM's ``KVCacheManager.free(request)``).
        """
        ...

    def pop_blocks_for_free(self, request: Any, /) -> tuple[int, ...]:
        """Drop the request's bookkeeping; return its blocks, groups
        concatenated (``request``: as for :meth:`free`)."""
        ...

    def free_blocks(self, block_ids: Sequence[int]) -> None:
        """Deferred free of popped blocks (upstream: ``block_pool.free_blocks``)."""
        ...

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Free blocks no longer needed by attention (outside the window)."""
        ...

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the given blocks from the prefix cache, ascending id order."""
        ...

    def reset_prefix_cache(self) -> bool:
        """Clear the prefix cache if only the null block is in use."""
        ...

    def get_num_common_prefix_blocks(self, request_id: str) -> tuple[int, ...]:
        """Common-prefix block count per group."""
        ...

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the event queue (BlockStored annotated with kind and window)."""
        ...

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Hash the request's full blocks up to ``num_computed_tokens``."""
        ...

    def take_new_block_ids(self) -> list[int]:
        """Drain the ids of fresh full-attention blocks."""
        ...

    def new_step_starts(self) -> None:
        """A scheduler step begins."""
        ...

    def get_block_ids(self, request_id: str) -> BlockIds:
        """The request's tables (empty per group if unknown)."""
        ...

    @property
    def usage(self) -> float:
        """Fraction of non-null blocks in use."""
        ...

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Take the prefix-cache statistics (None unless ``log_stats``)."""
        ...

    def to_view(self) -> KVView:
        """The normalized observable state."""
        ...


AdapterFactory = Callable[[KVCacheConfig], KVCacheAdapter]


def load_factory(target: str) -> AdapterFactory:
    """Resolve ``spec``, ``impl`` (``impl-native``, ``impl-python``: one build; ``impl-batch``,
    ``impl-batch-native``: through the batch API and device tables, on the pure-Python manager or the
    native core; ``impl-mutable``: with kvimpl's own mutable requests; ``impl-array``: the native
    core's array API), ``vllm`` or ``module:factory``
    to a factory.

    A module is looked up on ``sys.path`` and then in the working folder (as
    ``python -m`` would), so ``--target mymod:make`` works without setting
    ``PYTHONPATH``.

    Raises:
        InputError: For a malformed target, one that cannot be imported, or a
            name that is not callable.
    """
    builtin = {
        "spec": "kvref.adapters.spec:make_spec_adapter",
        "vllm": "kvref.adapters.vllm:make_vllm_adapter",
        "impl": "kvref.adapters.impl:make_impl_adapter",
        "impl-native": "kvref.adapters.impl:make_impl_native_adapter",
        "impl-python": "kvref.adapters.impl:make_impl_python_adapter",
        "impl-batch": "kvref.adapters.impl_batch:make_impl_batch_adapter",
        "impl-batch-native": "kvref.adapters.impl_batch:make_impl_batch_native_adapter",
        "impl-mutable": "kvref.adapters.impl_mutable:make_impl_mutable_adapter",
        "impl-array": "kvref.adapters.impl_array:make_impl_array_adapter",
    }
    path = builtin.get(target, target)
    if ":" not in path:
        raise InputError(f"target {target!r} is not spec, impl, vllm or module:factory")
    result: AdapterFactory = load_callable(path, f"target {target!r}")
    return result
