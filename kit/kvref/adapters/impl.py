"""The adapter around kvimpl, the optimized implementation.

kvimpl follows every semantics profile kvspec models: :data:`IMPL_PROFILES` is
derived from :data:`kvspec.profiles.PROFILES` and the switches kvimpl reads
(:data:`kvimpl.PROFILE_SWITCHES`), not listed by hand. The configuration's
profile is read when the manager is built. A profile kvimpl does not know is
refused with :class:`kvspec.errors.UnsupportedByProfileError`, which the
lockstep counts as an unsupported configuration instead of checking it: one
that sets a switch kvimpl does not read (a release added to the spec with a
new switch before kvimpl learnt it), or one that is not among kvspec's
profiles. So is a configuration that uses a state-adding feature kvspec
models and kvimpl does not yet (:func:`kvspec.profiles.features_used` minus
:data:`IMPL_FEATURES`); the switches only such a feature reads
(:data:`kvspec.profiles.FEATURE_SWITCHES`) need not be read by kvimpl.

Two builds (:mod:`kvimpl.native`): ``--target impl`` is the manager a
scheduler gets from :func:`kvimpl.native.create_manager` (the native core
when it is built, ``KVREF_NATIVE`` is not ``0`` and it implements the
configuration; else the pure-Python manager), checked against
:func:`kvimpl.native.manager_class` and the build line CI prints
(:func:`kvimpl.native.build_description`); ``impl-native`` is
:class:`kvimpl.native.NativeKVCacheManager` itself (a configuration its
constructor refuses is counted as unsupported) and ``impl-python`` is always
the pure-Python manager.

Both adapter classes also make, once per manager, the caller errors the
machine never sends (:mod:`kvref.adapters.impl_probes`), and the native one
checks the prefix hint's longest lookup, which the core records, against
kvimpl's Python search (:mod:`kvimpl.native_hint`) after every hybrid lookup.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import fields
from typing import Any

from kvimpl import PROFILE_SWITCHES
from kvimpl.block_pool import BlockPool, requeue_unhashed_first
from kvimpl.config_rules import MODELLED_FEATURES
from kvimpl.device_tables import CPU_COPY, BlockTable
from kvimpl.kv_cache_manager import KVCacheManager, lookup_length
from kvimpl.native import (
    NativeKVCacheManager,
    build_description,
    create_manager,
    manager_class,
    native_enabled,
    native_module,
    native_unsupported,
)
from kvimpl.native_hint import NativeHint, cached_map, native_hint_for
from kvimpl.request import RequestHasher
from kvref.adapters.impl_probes import probe_caller_errors, probe_request
from kvref.capabilities import OPT_IN_FEATURES, declare
from kvref.layers.pool import pool_view
from kvspec.block_pool import BlockId
from kvspec.config import KVCacheConfig
from kvspec.errors import UnsupportedByProfileError
from kvspec.events import KVCacheEvent
from kvspec.hashing import BlockHash
from kvspec.profiles import FEATURE_SWITCHES, PROFILES, SemanticsProfile, features_used
from kvspec.request import Request, RequestBlockHasher
from kvspec.view import BlockIds, KVView

IMPL_FEATURES: frozenset[str] = MODELLED_FEATURES
"""The state-adding features of :func:`kvspec.profiles.features_used` that
kvimpl's pure-Python manager models today (the native core models none)."""

REFUSED_FEATURE_SWITCHES = frozenset(
    s for f, names in FEATURE_SWITCHES.items() if f not in IMPL_FEATURES for s in names
)
"""The switches read only by features kvimpl refuses (see the module docstring)."""

TABLES_DEVICE = CPU_COPY
"""The device of the kit's device-table checks: CPU tensors with the device
copy kept apart from the host copy, as on a GPU (``kvimpl.device_tables``)."""


def unread_switches(profile: SemanticsProfile) -> tuple[str, ...]:
    """The switches ``profile`` sets away from their defaults that kvimpl does
    not read (a switch of a feature kvimpl refuses does not count)."""
    known = ("name", "release", *PROFILE_SWITCHES, *REFUSED_FEATURE_SWITCHES)
    return tuple(
        f.name for f in fields(SemanticsProfile) if f.name not in known and getattr(profile, f.name) != f.default
    )


IMPL_PROFILES = frozenset(name for name, p in PROFILES.items() if not unread_switches(p))
"""The names of the semantics profiles kvimpl follows: every profile of kvspec."""


class ImplAdapter(KVCacheManager):
    """kvimpl's ``KVCacheManager``; it already speaks the adapter protocol, and
    makes the caller-error probes once (:mod:`kvref.adapters.impl_probes`)."""

    name = "impl"
    fallback: str | None = None
    """Why ``--target impl`` runs this configuration on the pure-Python manager
    where the native core is wanted (counted per step by the lockstep)."""
    runs_every_operation = True
    """kvimpl claims every operation of every release it accepts a configuration of:
    a refusal of one is a failure of the lockstep, not a skip."""
    _probed = 0
    """How far :func:`probe_once` got: 0 none, 1 with a request of its own, 2 with a held one."""

    def check_invariants(self) -> None:
        """kvimpl's invariants; then the probes (:func:`probe_once`)."""
        super().check_invariants()
        if self._probed < 2:
            probe_once(self, self.requests.values())


class NativeImplAdapter(NativeKVCacheManager):
    """kvimpl's native manager; it speaks the adapter protocol too, makes the
    probes of :class:`ImplAdapter` and checks the prefix hint's longest lookup."""

    name = "impl-native"
    runs_every_operation = True
    """As :attr:`ImplAdapter.runs_every_operation`."""
    _probed = 0
    """As :attr:`ImplAdapter._probed`."""
    _hint: tuple[NativeHint | None] | None = None
    """``(native_hint_for(config),)`` once the first lookup asked for it."""

    def get_computed_blocks(self, request: Any, max_cache_hit_length: int | None = None) -> tuple[BlockIds, int]:
        """The core's lookup; in a cached hybrid, the longest first search the
        core recorded (``_first_lookup_tokens``, the prefix hint's base) must
        equal kvimpl's Python search over the core's cache map.

        Raises:
            AssertionError: If they differ.
        """
        out: tuple[BlockIds, int] = super().get_computed_blocks(request, max_cache_hit_length)
        if self._hint is None:
            self._hint = (native_hint_for(self.config),)
        hint = self._hint[0]
        if hint is not None and self._reads(request):
            length = lookup_length(self.config.profile, request, max_cache_hit_length)
            want = hint.longest(request.block_hashes, length, cached_map(self))
            if self._first_lookup_tokens != want:
                raise AssertionError(
                    f"impl-native: lookup of {request.request_id!r}: the core recorded a first search of "
                    f"{self._first_lookup_tokens} tokens, kvimpl's Python search finds {want}"
                )
        return out

    def check_invariants(self) -> None:
        """The core's invariants; then the probes (:func:`probe_once`)."""
        super().check_invariants()
        if self._probed < 2:
            probe_once(self, (req for _, req, _ in self._tables()))


def probe_once(adapter: Any, held: Iterable[Any]) -> None:
    """The caller-error probes (:mod:`kvref.adapters.impl_probes`): at the
    first invariant check with a request of the adapter's own (so that they
    also run where no allocation ever succeeds), and once more, with the
    state it has then, as soon as a request holds blocks."""
    request = probe_request(held)
    if request is not None:
        adapter._probed = 2
    elif adapter._probed == 0:
        adapter._probed = 1
        request = RequestBlockHasher.for_config(adapter.config).new_request(PROBE_REQUEST_ID, [1, 2, 3, 4, 5])
    if request is not None:
        probe_caller_errors(adapter, kvimpl_class(adapter), request)


PROBE_REQUEST_ID = "kvref-probe"
"""The id of the probes' own request (the machine names its requests otherwise)."""


def adopt(manager: Any, python_class: type, native_class: type) -> Any:
    """``manager``, built by kvimpl (:func:`kvimpl.native.create_manager`), as
    the adapter class of its build.

    NOTE: the adapter classes derive from kvimpl's two manager classes and add
    no state that needs their ``__init__`` (only the adapter's name, probes and
    checks, set up lazily), so the object kvimpl built becomes an instance of
    the adapter class by assignment to ``__class__``: the lockstep runs the
    very manager kvimpl's selection made, constructed by kvimpl.
    """
    cls = native_class if isinstance(manager, NativeKVCacheManager) else python_class
    if not issubclass(cls, type(manager)):
        raise TypeError(f"adopt: {cls.__name__} does not derive from {type(manager).__name__}")
    manager.__class__ = cls
    return manager


def built_adapter(
    config: KVCacheConfig,
    python_class: type,
    native_class: type,
    device: str | None = None,
    native: bool | None = None,
) -> Any:
    """``create_manager(config, device, native)`` (kvimpl's own selection) as
    the adapter class of its build (:func:`adopt`)."""
    return adopt(create_manager(config, device, native), python_class, native_class)


def kvimpl_class(manager: Any) -> type:
    """The kvimpl class of ``manager``: the native manager or the pure-Python one."""
    return NativeKVCacheManager if isinstance(manager, NativeKVCacheManager) else KVCacheManager


@declare(features=OPT_IN_FEATURES)
def make_impl_adapter(config: KVCacheConfig) -> Any:
    """Factory for ``--target impl``: the manager kvimpl's ``create_manager``
    builds (see the module docstring).

    Raises:
        UnsupportedByProfileError: For a profile kvimpl does not follow (see
            the module docstring).
        AssertionError: If ``manager_class`` or the build line disagrees with
            the manager ``create_manager`` built.
    """
    check_config(config)
    manager = create_manager(config)
    check_build(config, manager)
    adapter = adopt(manager, ImplAdapter, NativeImplAdapter)
    if isinstance(adapter, ImplAdapter) and native_enabled():
        adapter.fallback = f"pure-Python manager ({native_unsupported(config)})"
    return adapter


def check_build(config: KVCacheConfig, manager: Any) -> None:
    """``manager`` (what ``create_manager(config)`` built) is the class
    ``manager_class(config)`` names, and the build line CI prints says the
    native core exactly when it is selected (:func:`kvimpl.native.native_enabled`),
    and pure Python where it is not.

    Raises:
        AssertionError: On a disagreement.
    """
    if type(manager) is not manager_class(config):
        raise AssertionError(f"create_manager built a {type(manager).__name__}, manager_class names another")
    line = build_description()
    if line.startswith("native core") != native_enabled() or line.startswith("pure Python") == native_enabled():
        raise AssertionError(f"kvimpl's build line {line!r} disagrees with its selection (native: {native_enabled()})")


@declare(features=OPT_IN_FEATURES)
def make_impl_native_adapter(config: KVCacheConfig) -> Any:
    """Factory for ``--target impl-native``: ``NativeKVCacheManager`` itself.

    Raises:
        UnsupportedByProfileError: For a profile kvimpl does not follow, or
            (the native manager's own refusal) a configuration the native core
            does not implement, or no build.
    """
    check_config(config)
    return NativeImplAdapter(config)


@declare(features=OPT_IN_FEATURES)
def make_impl_python_adapter(config: KVCacheConfig) -> ImplAdapter:
    """Factory for ``--target impl-python`` (the pure-Python build).

    Raises:
        UnsupportedByProfileError: For a profile kvimpl does not follow, or a
            configuration that needs a feature kvimpl does not model yet (see
            the module docstring).
    """
    check_config(config)
    adapter: ImplAdapter = built_adapter(config, ImplAdapter, NativeImplAdapter, native=False)
    return adapter


def device_tables_for(config: KVCacheConfig, device: str, core: Any = None, **layout: Any) -> BlockTable:
    """kvimpl's device tables for ``config`` (``BlockTable.for_config``; ``layout``:
    kernel block sizes, context-parallel rank and interleave)."""
    return BlockTable.for_config(config, device, core=core, **layout)


def native_built() -> bool:
    """Whether kvimpl's native core is built here (and selected: ``KVREF_NATIVE`` is not ``0``)."""
    return native_module() is not None and native_enabled()


def request_hashers(config: KVCacheConfig) -> tuple[RequestHasher, RequestHasher]:
    """kvimpl's request hashers for ``config`` (:mod:`kvref.adapters.impl_mutable`): one making
    pure-Python mutable requests, one making C requests (pure-Python ones without the build)."""
    return RequestHasher.for_config(config, native=False), RequestHasher.for_config(config, native=True)


def _check_profile(p: SemanticsProfile) -> None:
    """Refuse a profile kvimpl does not follow (see the module docstring)."""
    unread = unread_switches(p)
    if unread:
        raise UnsupportedByProfileError(f"kvimpl does not follow {p.name}: it does not read {', '.join(unread)}")
    if p.name not in IMPL_PROFILES or PROFILES[p.name] != p:
        raise UnsupportedByProfileError(
            f"kvimpl does not follow {p.name}: it is not one of kvspec's profiles "
            f"(kvimpl follows {', '.join(sorted(IMPL_PROFILES))})"
        )


def check_config(config: KVCacheConfig) -> None:
    """Refuse a profile kvimpl does not follow, or a feature it does not model.

    Raises:
        UnsupportedByProfileError: See the module docstring.
    """
    p = config.profile
    _check_profile(p)
    missing = sorted(features_used(config) - IMPL_FEATURES)
    if missing:
        raise UnsupportedByProfileError(f"{p.name}: kvimpl does not model {', '.join(missing)} yet")


class ImplPoolAdapter:
    """kvimpl's ``BlockPool`` for the pool layer (:mod:`kvref.layers.pool`)."""

    name = "impl"

    def __init__(self, config: KVCacheConfig) -> None:
        """A pool of ``config.num_blocks`` hashing at its one group's block size."""
        p = config.profile
        self.pool = BlockPool(
            config.num_blocks, config.enable_caching, config.groups[0].block_size,
            config.enable_kv_cache_events, config.int_block_hashes, requeue_unhashed_first(config)[0],
            p.event_group_idx, p.coarse_hash_last_fine, requeue_unhashed_first(config)[1], p.event_extra_keys,
            (p.mm_key_with_offset, p.prompt_embeds_digest),
        )  # fmt: skip

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        return list(self.pool.get_new_blocks(num_blocks))

    def free_blocks(self, block_ids: Sequence[int]) -> None:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        self.pool.free_blocks(BlockId(b) for b in block_ids)

    def touch(self, block_ids: Sequence[int]) -> None:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        self.pool.touch([BlockId(b) for b in block_ids])

    def cache_full_blocks(
        self,
        request: Request,
        block_ids: Sequence[int],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int,
    ) -> None:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        ids = [BlockId(b) for b in block_ids]
        self.pool.cache_full_blocks(request, ids, num_cached_blocks, num_full_blocks, block_size, group_id)

    def get_cached_block(self, block_hash: bytes, group_ids: Sequence[int]) -> list[int] | None:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        found = self.pool.get_cached_block(BlockHash(block_hash), group_ids)
        return None if found is None else list(found)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        self.pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        return self.pool.reset_prefix_cache()

    def get_num_free_blocks(self) -> int:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        return self.pool.get_num_free_blocks()

    def get_usage(self) -> float:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        return self.pool.get_usage()

    def take_events(self) -> list[KVCacheEvent]:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        return self.pool.take_events()

    def check_invariants(self) -> None:
        """kvimpl's pool invariants."""
        self.pool.check_invariants()

    def to_view(self) -> KVView:
        """See :class:`kvref.layers.pool.BlockPoolAdapter`."""
        p = self.pool
        return pool_view(p.free_order(), p.ref_cnt, p.cached, p.get_usage())


def make_impl_pool(config: KVCacheConfig) -> ImplPoolAdapter:
    """Factory for ``--layer pool --target impl``.

    Raises:
        UnsupportedByProfileError: For a profile kvimpl does not follow (see
            the module docstring).
    """
    _check_profile(config.profile)
    return ImplPoolAdapter(config)
