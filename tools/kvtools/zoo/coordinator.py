"""Zoo entries in the coordinator: the hybrid fixed-point hit search, EAGLE and hit touching."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvimpl.block_pool import BlockId
from kvimpl.kv_cache_coordinator import HybridCoordinator, UnitaryCoordinator, hybrid_hit_search
from kvimpl.single_type_kv_cache_manager import (
    find_longest_cache_hit,
)
from kvref.adapters.impl import ImplAdapter
from kvspec.config import FULL_TYPE_KINDS, KVCacheConfig, Mamba, SlidingWindow
from kvspec.hashing import (
    BlockHash,
)
from kvtools.zoo.base import entry, mutant, patch


@entry(
    "vllm#33270 (closed PR; the bug it describes)",
    "the hybrid fixed-point hit search drops the EAGLE look-ahead block on every pass, not once per candidate "
    "length, so hits shrink by a block per iteration",
    "get_computed_blocks output; needs a hybrid hit search that comes back to an EAGLE sliding-window group after "
    "another non-full group shortened the hit (only full+swa+swa-wide has two): the machine draws shapes with two "
    "non-full kinds six times as often since this entry (seed 0 kills it at step 21k, seed 2 at 66k, seed 1 not "
    "within 60 s); the directed trace eagle-repass kills it in one replay",
)
def eagle_drop_every_pass(config: KVCacheConfig) -> ImplAdapter:
    """EAGLE groups drop their extra block on every fixed-point iteration."""
    m = mutant(config, "eagle_drop_every_pass")
    coord = m.coordinator
    if isinstance(coord, HybridCoordinator):
        patch(coord, "find_longest_cache_hit", _eagle_every_pass(coord))
    return m


def _eagle_every_pass(coord: HybridCoordinator) -> Callable[..., Any]:
    def find(block_hashes: Sequence[BlockHash], max_len: int) -> tuple[Any, int]:
        hits: list[list[BlockId]] = [[] for _ in coord.managers]
        looked_up: set[int] = set()
        simple = len(coord.spec_groups) == 2 and isinstance(coord.spec_groups[0].kind, FULL_TYPE_KINDS)
        hit = max_len
        while True:
            cur = hit
            for idx, sg in enumerate(coord.spec_groups):
                bs = sg.kind.block_size
                if isinstance(sg.kind, FULL_TYPE_KINDS) and idx in looked_up:
                    cur = cur // bs * bs
                    continue
                drop = sg.use_eagle and not isinstance(sg.kind, Mamba)  # no "verified" memo (the bug)
                limit = min(cur + bs, max_len) if drop else cur
                found = find_longest_cache_hit(
                    sg.kind, coord._hashes_for(sg.kind, block_hashes), limit, sg.group_ids,
                    coord.pool, drop, coord.scheduler_block_size,
                )  # fmt: skip
                cur = len(found[0]) * bs
                looked_up.add(idx)
                for gid, blocks in zip(sg.group_ids, found, strict=True):
                    hits[gid] = blocks
            if cur >= hit or simple:
                hit = min(hit, cur)
                break
            hit = cur
        for sg in coord.spec_groups:
            if isinstance(sg.kind, FULL_TYPE_KINDS):
                for gid in sg.group_ids:
                    del hits[gid][hit // sg.kind.block_size :]
        return tuple(hits), hit

    return find


@entry(
    "vllm#26296 (unconfirmed; analogue, DCP out of scope)",
    "hashes looked up at the unscaled block size: groups whose block size is a multiple of the hash block "
    "size are searched with the fine hashes instead of their coarse ones",
    "get_computed_blocks output on a shape with a 2x block-size group",
)
def unscaled_hash_block_size(config: KVCacheConfig) -> ImplAdapter:
    """Coarse-hash conversion skipped for lookups."""
    m = mutant(config, "unscaled_hash_block_size")
    patch(m.coordinator, "_hashes_for", lambda kind, block_hashes: block_hashes)
    return m


@entry(
    "vllm#44409 (supersedes #33775)",
    "a hybrid request's prefix hits are touched group by group, interleaved with each group's allocation for "
    "connector tokens, so one group's fresh blocks can evict another group's still-free hit",
    "view diff when one group's connector-token allocation pops another group's still-free hit block. It needs a "
    "pool with no never-used block left, the hit request's blocks at the head of the free queue (freed before "
    "other requests), and a request that extends it with connector tokens: the machine's drain rule (every running "
    "request finishes in one step, oldest first) sets this up; a hand-built 9-step trace in tests/tools/"
    "test_zoo.py kills it too",
)
def hits_touched_per_group(config: KVCacheConfig) -> ImplAdapter:
    """Touch and external allocation interleaved per group."""
    m = mutant(config, "hits_touched_per_group")
    coord = m.coordinator

    def allocate_new_computed_blocks(
        request_id: str,
        new_computed_blocks: Sequence[Sequence[BlockId]],
        num_local: int,
        num_external: int,
        skip_zeroing: frozenset[int] = frozenset(),
    ) -> None:
        if any(request_id in mgr.num_cached_block for mgr in coord.managers):
            return
        for g, (mgr, hits) in enumerate(zip(coord.managers, new_computed_blocks, strict=True)):
            mgr.add_local_computed_blocks(request_id, hits, num_local, num_external)
            if num_external > 0:
                mgr.allocate_external_computed_blocks(request_id, num_local, num_external, g not in skip_zeroing)

    patch(coord, "allocate_new_computed_blocks", allocate_new_computed_blocks)
    return m


@entry(
    "unconfirmed (a vLLM 0.25.1 fault found by kvref: docs/divergences.md 1.4, second-full-group)",
    "the hybrid hit search trims only the first full-attention spec group to the final hit length, so a second "
    "full-attention kind (MLA next to full attention) keeps a longer list than the hit",
    "get_computed_blocks output on full+mla+swa once the sliding-window group shortens the hit",
)
def second_full_group_untrimmed(config: KVCacheConfig) -> ImplAdapter:
    """Only spec group 0 is trimmed after the fixed point."""
    m = mutant(config, "second_full_group_untrimmed")
    coord = m.coordinator
    if isinstance(coord, HybridCoordinator):

        def find(block_hashes: Sequence[BlockHash], max_len: int) -> tuple[Any, int]:
            hit, hits = hybrid_hit_search(coord, block_hashes, max_len)
            first = coord.spec_groups[0]
            if isinstance(first.kind, FULL_TYPE_KINDS):
                for gid in first.group_ids:
                    del hits[gid][hit // first.kind.block_size :]
            return tuple(hits), hit

        patch(coord, "find_longest_cache_hit", find)
    return m


@entry(
    "vllm#17398",
    "with EAGLE, a sliding-window lookup drops the last matched block afterwards, as full attention does, "
    "instead of asking for one more contiguous block, so the hit no longer covers the window",
    "get_computed_blocks output on a sliding-window shape with EAGLE and a hit",
)
def eagle_window_drops_last(config: KVCacheConfig) -> ImplAdapter:
    """Sliding window + EAGLE: plain window lookup, then the last block popped."""
    m = mutant(config, "eagle_window_drops_last")
    coord = m.coordinator
    kind = coord.managers[0].kind
    if isinstance(coord, UnitaryCoordinator) and isinstance(kind, SlidingWindow) and 0 in coord.eagle_group_ids:

        def find(block_hashes: Sequence[BlockHash], max_len: int) -> tuple[Any, int]:
            found = find_longest_cache_hit(kind, block_hashes, max_len, [0], coord.pool, False, kind.block_size)[0]
            found = found[:-1]
            return (found,), len(found) * kind.block_size

        patch(coord, "find_longest_cache_hit", find)
    return m
