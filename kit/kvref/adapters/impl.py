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

Two builds (:mod:`kvimpl.native`): ``--target impl`` is the build a
scheduler gets from :func:`kvimpl.native.create_manager` (the native core
when it is built, ``KVREF_NATIVE`` is not ``0`` and it implements the
configuration; else the pure-Python manager); ``impl-native`` insists on the
native core (a configuration it does not implement is counted as
unsupported) and ``impl-python`` is always the pure-Python manager.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import fields
from typing import Any

from kvimpl import PROFILE_SWITCHES
from kvimpl.block_pool import BlockPool, requeue_unhashed_first
from kvimpl.config_rules import MODELLED_FEATURES
from kvimpl.kv_cache_manager import KVCacheManager
from kvimpl.native import NativeKVCacheManager, manager_class, native_unsupported, notice_if_missing
from kvimpl.request import RequestHasher
from kvref.capabilities import OPT_IN_FEATURES, declare
from kvref.layers.pool import pool_view
from kvspec.block_pool import BlockId
from kvspec.config import KVCacheConfig
from kvspec.errors import UnsupportedByProfileError
from kvspec.events import KVCacheEvent
from kvspec.hashing import BlockHash
from kvspec.profiles import FEATURE_SWITCHES, PROFILES, SemanticsProfile, features_used
from kvspec.request import Request
from kvspec.view import KVView

IMPL_FEATURES: frozenset[str] = MODELLED_FEATURES
"""The state-adding features of :func:`kvspec.profiles.features_used` that
kvimpl's pure-Python manager models today (the native core models none)."""

REFUSED_FEATURE_SWITCHES = frozenset(
    s for f, names in FEATURE_SWITCHES.items() if f not in IMPL_FEATURES for s in names
)
"""The switches read only by features kvimpl refuses (see the module docstring)."""


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
    """kvimpl's ``KVCacheManager``; it already speaks the adapter protocol."""

    name = "impl"


class NativeImplAdapter(NativeKVCacheManager):
    """kvimpl's native manager; it speaks the adapter protocol too."""

    name = "impl-native"


@declare(features=OPT_IN_FEATURES)
def make_impl_adapter(config: KVCacheConfig) -> Any:
    """Factory for ``--target impl``: the native core where kvimpl would use
    it (see the module docstring), else the pure-Python manager.

    Raises:
        UnsupportedByProfileError: For a profile kvimpl does not follow (see
            the module docstring).
    """
    return impl_adapter_class(config)(config)


def impl_adapter_class(config: KVCacheConfig) -> type[ImplAdapter] | type[NativeImplAdapter]:
    """The class ``--target impl`` builds for ``config`` (the native core where
    kvimpl would use it, else the pure-Python manager).

    Raises:
        UnsupportedByProfileError: As :func:`make_impl_adapter`.
    """
    _check_config(config)
    notice_if_missing()
    # kvimpl's own choice (the one create_manager makes), so the lockstep runs it
    if manager_class(config) is NativeKVCacheManager:
        return NativeImplAdapter
    return ImplAdapter


@declare(features=OPT_IN_FEATURES)
def make_impl_native_adapter(config: KVCacheConfig) -> Any:
    """Factory for ``--target impl-native``.

    Raises:
        UnsupportedByProfileError: For a profile kvimpl does not follow, or a
            configuration the native core does not implement (or no build).
    """
    _check_config(config)
    reason = native_unsupported(config)
    if reason is not None:
        raise UnsupportedByProfileError(f"kvimpl's native core: {reason}")
    return NativeImplAdapter(config)


@declare(features=OPT_IN_FEATURES)
def make_impl_python_adapter(config: KVCacheConfig) -> ImplAdapter:
    """Factory for ``--target impl-python`` (the pure-Python build).

    Raises:
        UnsupportedByProfileError: For a profile kvimpl does not follow, or a
            configuration that needs a feature kvimpl does not model yet (see
            the module docstring).
    """
    _check_config(config)
    return ImplAdapter(config)


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


def _check_config(config: KVCacheConfig) -> None:
    """Refuse a profile kvimpl does not follow, or a feature it does not model."""
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
        self.pool = BlockPool(
            config.num_blocks, config.enable_caching, config.groups[0].block_size,
            config.enable_kv_cache_events, config.int_block_hashes, requeue_unhashed_first(config),
            config.profile.event_annotations,
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
