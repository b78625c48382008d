"""Mutant: hybrid_hit_search stops after one pass over the spec groups, as
the two-group shortcut does, even when a later group shortened the hit so
that an earlier group no longer accepts it."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.block_pool import BlockId
from kvspec.config import Mamba
from kvspec.hashing import BlockHash
from kvspec.kv_cache_coordinator import HybridCoordinator
from kvspec.single_type_kv_cache_manager import find_longest_cache_hit

OWN_CONTRACT = False
HARNESSES = ("bounded:hybrid.hybrid_fixed_point",)


def hybrid_hit_search(
    coord: HybridCoordinator, block_hashes: Sequence[BlockHash], max_len: int
) -> tuple[int, list[list[BlockId]]]:
    """Mutant of the spec function (no contract)."""
    hits: list[list[BlockId]] = [[] for _ in coord.managers]
    cur = max_len
    for sg in coord.spec_groups:
        bs = sg.kind.block_size
        drop = sg.use_eagle and not isinstance(sg.kind, Mamba)
        limit = min(cur + bs, max_len) if drop else cur
        found = find_longest_cache_hit(
            sg.kind, coord._hashes_for(sg.kind, block_hashes), limit, sg.group_ids,
            coord.pool, drop, coord.scheduler_block_size,
        )  # fmt: skip
        cur = len(found[0]) * bs
        for gid, blocks in zip(sg.group_ids, found, strict=True):
            hits[gid] = blocks
    return cur, hits
