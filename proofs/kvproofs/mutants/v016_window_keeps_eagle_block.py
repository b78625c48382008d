"""Mutant: 0.16.0's spec-group lookup never drops the EAGLE block (the
later releases' look-ahead without the look-ahead), so 0.16.0's hybrid hit
can exceed the later search's."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.block_pool import BlockId
from kvspec.config import SlidingWindow
from kvspec.errors import EagleAlignmentLookupError
from kvspec.hashing import BlockHash
from kvspec.kv_cache_coordinator import HybridCoordinator, SpecGroup
from kvspec.single_type_kv_cache_manager import eagle_window_hit_before_drop, find_longest_cache_hit

OWN_CONTRACT = False
HARNESSES = ("bounded:contract:kv_cache_coordinator.hybrid_hit_search_v016",)


def v016_spec_group_hit(
    coord: HybridCoordinator, sg: SpecGroup, block_hashes: Sequence[BlockHash], limit: int
) -> list[list[BlockId]]:
    """Mutant of the spec function (same contract).

    pre: len(sg.group_ids) >= 1
    raises: EagleAlignmentLookupError
    post: len(__return__) == len(sg.group_ids) and len({len(h) for h in __return__}) == 1
    post: len(__return__[0]) * sg.kind.block_size <= max(limit, 0)
    post: len(__return__[0]) * sg.kind.block_size % coord.scheduler_block_size == 0
    post: not (isinstance(sg.kind, SlidingWindow) and sg.use_eagle and sg.kind.block_size != coord.scheduler_block_size) or coord.config.profile.v016_swa_eagle_realign or not __return__[0]
    """  # noqa: E501 - a PEP 316 condition is one line
    kind, align = sg.kind, coord.scheduler_block_size
    hashes = coord._hashes_for(kind, block_hashes)
    realign = coord.config.profile.v016_swa_eagle_realign
    if isinstance(kind, SlidingWindow) and sg.use_eagle and kind.block_size != align and not realign:
        if eagle_window_hit_before_drop(kind, hashes, limit, sg.group_ids, coord.pool, align):
            raise EagleAlignmentLookupError(
                f"get_computed_blocks: sliding-window group {sg.group_ids[0]} (block size {kind.block_size}) "
                f"finds an EAGLE hit, but its block is not the scheduler block ({align}); "
                f"vLLM {coord.config.profile.release} fails an assertion here"
            )
        return [[] for _ in sg.group_ids]
    return find_longest_cache_hit(kind, hashes, limit, sg.group_ids, coord.pool, False, align)
