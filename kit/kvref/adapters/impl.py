"""The adapter around kvimpl, the optimized implementation."""

from __future__ import annotations

from kvimpl.kv_cache_manager import KVCacheManager
from kvspec.config import KVCacheConfig
from kvspec.errors import UnsupportedByProfileError
from kvspec.profiles import VLLM_0_25_1, features_used

IMPL_PROFILES = frozenset({VLLM_0_25_1.name})
"""The semantics profiles kvimpl follows today."""

IMPL_FEATURES: frozenset[str] = frozenset()
"""The state-adding features of :func:`kvspec.profiles.features_used` that kvimpl models today."""


class ImplAdapter(KVCacheManager):
    """kvimpl's ``KVCacheManager``; it already speaks the adapter protocol."""

    name = "impl"


def make_impl_adapter(config: KVCacheConfig) -> ImplAdapter:
    """Factory for ``--target impl``.

    Raises:
        UnsupportedByProfileError: For a profile kvimpl does not follow yet, or
            a configuration that needs a feature kvimpl does not model yet.
    """
    if config.profile.name not in IMPL_PROFILES:
        raise UnsupportedByProfileError(
            f"kvimpl does not follow {config.profile.name} yet (it follows {', '.join(sorted(IMPL_PROFILES))})"
        )
    missing = sorted(features_used(config) - IMPL_FEATURES)
    if missing:
        raise UnsupportedByProfileError(f"{config.profile.name}: kvimpl does not model {', '.join(missing)} yet")
    return ImplAdapter(config)
