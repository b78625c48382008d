"""Mutant: an EAGLE Mamba group counts as having made its drop in every
release (profile switch ``mamba_eagle_counts_verified``: from 0.26.0 on; in
0.25.1 a Mamba shrink makes the other EAGLE groups verify again)."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.block_pool import BlockId
from kvspec.config import FULL_TYPE_KINDS, Mamba
from kvspec.hashing import BlockHash
from kvspec.kv_cache_coordinator import HybridCoordinator, eagle_search_limit, spec_group_hit
from kvspec.partial_hits import eagle_margin

OWN_CONTRACT = False
HARNESSES = ("bounded:releases.hybrid_switch_relations",)


def hybrid_hit_search_longest(
    coord: HybridCoordinator, block_hashes: Sequence[BlockHash], max_len: int
) -> tuple[int, list[list[BlockId]], int]:
    """Mutant of the spec function (same contract).

    pre: max_len >= 0
    post: __return__[:2] == hybrid_hit_search(coord, block_hashes, max_len)
    post: __return__[0] <= __return__[2]
    """
    longest = 0
    hits: list[list[BlockId]] = [[] for _ in coord.managers]
    lengths: dict[int, int] = {}
    verified: set[int] = set()
    simple = len(coord.spec_groups) == 2 and isinstance(coord.spec_groups[0].kind, FULL_TYPE_KINDS)
    profile = coord.config.profile
    hashed = len(block_hashes) * coord.hash_block_size
    hit = max_len
    while True:
        cur = hit
        for idx, sg in enumerate(coord.spec_groups):
            if isinstance(sg.kind, FULL_TYPE_KINDS) and idx in lengths:
                cur = min(cur, lengths[idx])
                continue
            mamba = isinstance(sg.kind, Mamba)
            drop = sg.use_eagle and idx not in verified
            margin = eagle_margin(sg.kind, coord.hash_block_size, coord.partial_hash_hits)
            limit = eagle_search_limit(cur, margin, max_len, hashed, profile.eagle_margin_hashed_cap) if drop else cur
            if mamba:
                limit = cur
            found, new = spec_group_hit(coord, sg, block_hashes, limit, drop)
            if drop:
                verified.add(idx)
            elif new < cur:
                verified.clear()
            cur = lengths[idx] = new
            longest = max(longest, cur)
            for gid, blocks in zip(sg.group_ids, found, strict=True):
                hits[gid] = blocks
        if cur >= hit:
            return hit, hits, longest
        hit = cur
        if simple:
            return hit, hits, longest
