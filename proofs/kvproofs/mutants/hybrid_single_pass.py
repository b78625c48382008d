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
HARNESSES = ("bounded:hybrid.hybrid_fixed_point", "bounded:contract:kv_cache_coordinator.hybrid_hit_search")


def hybrid_hit_search(
    coord: HybridCoordinator, block_hashes: Sequence[BlockHash], max_len: int
) -> tuple[int, list[list[BlockId]]]:
    """Mutant of the spec function (same contract).

    pre: max_len >= 0
    post: 0 <= __return__[0] <= max_len and __return__[0] % coord.hit_alignment == 0
    post: all(len(h) >= -(-__return__[0] // m.block_size) if isinstance(m.kind, FULL_TYPE_KINDS) else len(h) == (-(-__return__[0] // m.block_size) if prefix_cacheable(m.kind) else 0) for h, m in zip(__return__[1], coord.managers, strict=True))
    post: all(_accepts(coord, sg, block_hashes, __return__[0], max_len, eagle=False) for sg in coord.spec_groups)
    post: not any(all(_accepts(coord, sg, block_hashes, n, max_len) for sg in coord.spec_groups) for n in range(__return__[0] + coord.hit_alignment, max_len + 1, coord.hit_alignment))
    """  # noqa: E501 - a PEP 316 condition is one line
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
