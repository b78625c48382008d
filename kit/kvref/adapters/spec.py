"""The adapter around the executable specification itself."""

from __future__ import annotations

from kvref.capabilities import OPT_IN_FEATURES, declare
from kvspec.config import KVCacheConfig
from kvspec.kv_cache_manager import KVCacheManager


class SpecAdapter(KVCacheManager):
    """kvspec's ``KVCacheManager``; it already speaks the adapter protocol."""

    name = "spec"


@declare(features=OPT_IN_FEATURES)
def make_spec_adapter(config: KVCacheConfig) -> SpecAdapter:
    """Factory for ``--target spec``."""
    return SpecAdapter(config)
