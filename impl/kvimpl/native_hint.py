"""The scheduler's prefix hint of the native core, computed again in Python.

The hybrid coordinator's ``num_uncached_common_prefix_tokens`` is the
longest length one spec group's lookup reached, minus the reconciled hit.
That longest length is always the *first* lookup's (the first spec group
searched up to ``num_tokens - 1``): every later lookup searches at most the
current candidate length, or one block further with the EAGLE drop, which
takes that block back. The C core records that first search's length in
each hybrid lookup (``Core._first_lookup_tokens``), and
:class:`kvimpl.native.NativeKVCacheManager` reads it. This module repeats
only that first lookup, with kvimpl's own
:func:`kvimpl.single_type_kv_cache_manager.find_longest_cache_hit`, over a
copy of the core's cache map, so that the tests can check the core's value
against kvimpl's Python rules.

NOTE: the copy of the map is one pass over the cached blocks (0.7 ms with
2,048 blocks): too slow for every lookup, which is why the core records the
value itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from kvimpl.kv_cache_coordinator import HybridCoordinator, eagle_search_limit
from kvimpl.single_type_kv_cache_manager import find_longest_cache_hit
from kvspec.block_pool import BlockId
from kvspec.config import KVCacheConfig, Mamba
from kvspec.hashing import BlockHash, make_key


class CachedMap:
    """The pool method a lookup reads, over a copy of the core's cache map."""

    def __init__(self, cached: dict[bytes, Sequence[int]]) -> None:
        """Wrap ``{cache key: block ids}`` (the core's ``_cached()``)."""
        self.cached = cached

    def get_cached_block(self, block_hash: BlockHash, group_ids: Sequence[int]) -> list[BlockId] | None:
        """The oldest cached block of ``block_hash`` in each group, or None."""
        found: list[BlockId] = []
        for gid in group_ids:
            ids = self.cached.get(make_key(block_hash, gid))
            if not ids:
                return None
            found.append(BlockId(ids[0]))
        return found


class NativeHint:
    """Longest first lookup of a hybrid configuration (see the module docstring)."""

    def __init__(self, config: KVCacheConfig) -> None:
        """Spec groups and switches as kvimpl's hybrid coordinator has them."""
        self.coord = HybridCoordinator(config, True)

    def longest(self, block_hashes: Sequence[BlockHash], max_len: int, cached: dict[bytes, Sequence[int]]) -> int:
        """The first spec group's hit length at ``max_len`` (vLLM's ``longest_hit_length``)."""
        coord = self.coord
        sg = coord.spec_groups[0]
        bs = sg.kind.block_size
        mamba = isinstance(sg.kind, Mamba)
        drop = sg.use_eagle and (coord.mamba_eagle_counts_verified or not mamba)
        hashed = len(block_hashes) * coord.hash_block_size
        limit = max_len
        if drop and not mamba:
            limit = eagle_search_limit(max_len, bs, max_len, hashed, coord.eagle_margin_hashed_cap)
        found = find_longest_cache_hit(
            sg.kind, coord._hashes_for(sg.kind, block_hashes), limit, sg.group_ids,
            cast(Any, CachedMap(cached)), drop, coord.scheduler_block_size,
        )  # fmt: skip
        return len(found[0]) * bs


def native_hint_for(config: KVCacheConfig) -> NativeHint | None:
    """A :class:`NativeHint` where the hint can be non-zero (a cached hybrid), else None."""
    if not config.enable_caching or len(config.groups) < 2:
        return None
    return NativeHint(config)


def cached_map(core: Any) -> dict[bytes, Sequence[int]]:
    """The core's cache map as a dict."""
    return dict(core._cached())
