"""The adapter around kvimpl, the optimized implementation."""

from __future__ import annotations

from kvimpl.kv_cache_manager import KVCacheManager
from kvspec.config import KVCacheConfig
from kvspec.errors import UnsupportedByProfileError
from kvspec.profiles import VLLM_0_25_1

IMPL_PROFILES = frozenset({VLLM_0_25_1.name})
"""The semantics profiles kvimpl follows today."""


class ImplAdapter(KVCacheManager):
    """kvimpl's ``KVCacheManager``; it already speaks the adapter protocol."""

    name = "impl"


def make_impl_adapter(config: KVCacheConfig) -> ImplAdapter:
    """Factory for ``--target impl``.

    Raises:
        UnsupportedByProfileError: For a profile kvimpl does not follow yet.
    """
    if config.profile.name not in IMPL_PROFILES:
        raise UnsupportedByProfileError(
            f"kvimpl does not follow {config.profile.name} yet (it follows {', '.join(sorted(IMPL_PROFILES))})"
        )
    return ImplAdapter(config)
