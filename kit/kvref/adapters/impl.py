"""The adapter around kvimpl, the optimized implementation."""

from __future__ import annotations

from kvimpl.kv_cache_manager import KVCacheManager
from kvspec.config import KVCacheConfig


class ImplAdapter(KVCacheManager):
    """kvimpl's ``KVCacheManager``; it already speaks the adapter protocol."""

    name = "impl"


def make_impl_adapter(config: KVCacheConfig) -> ImplAdapter:
    """Factory for ``--target impl``."""
    return ImplAdapter(config)
