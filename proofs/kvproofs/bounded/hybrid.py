"""The hybrid fixed point (:func:`kvspec.kv_cache_coordinator.hybrid_hit_search`)
on a real ``HybridCoordinator``.

For each configuration, every assignment of "cached or not" to each group's
block positions and every ``max_len`` is searched. The pool's cache map is
filled directly (block ``1 + g*n + i`` holds position ``i`` of group ``g``);
the search only reads it through ``BlockPool.get_cached_block``.

Termination: every one of these searches returned. In general, each round
either ends the loop or strictly lowers ``hit``, which never goes below 0.
"""

from __future__ import annotations

from itertools import product

from kvproofs.bounded import check, expect
from kvproofs.contracts import about
from kvspec import kv_cache_coordinator as coord_mod
from kvspec.block_pool import BlockId
from kvspec.config import FULL_TYPE_KINDS, AttentionKind, FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.hashing import BlockHash, coarse_block_hashes, make_key
from kvspec.kv_cache_coordinator import HybridCoordinator
from kvspec.profiles import VLLM_0_25_1
from kvspec.single_type_kv_cache_manager import find_longest_cache_hit

CONFIGS: tuple[tuple[tuple[AttentionKind, ...], int, bool], ...] = (
    ((FullAttention(2), SlidingWindow(2, 3), Mamba(2, "all")), 8, False),
    ((FullAttention(2), SlidingWindow(2, 3), Mamba(2, "all")), 6, True),
    ((SlidingWindow(2, 3), SlidingWindow(2, 5)), 10, False),
    ((SlidingWindow(2, 3), SlidingWindow(2, 5)), 8, True),
    ((FullAttention(2), SlidingWindow(4, 5)), 12, False),
    ((FullAttention(2), SlidingWindow(4, 5)), 12, True),
    ((FullAttention(2), Mamba(4, "all")), 12, False),
    ((FullAttention(2), SlidingWindow(2, 3)), 10, True),
    ((SlidingWindow(2, 5), Mamba(2, "all")), 10, False),
)
"""``(groups, tokens, use_eagle)``: the hash block size is 2 and the prompt
has ``tokens`` tokens."""


def _coordinator(groups: tuple[AttentionKind, ...], eagle: bool) -> HybridCoordinator:
    # vLLM 0.25.1's rules: later releases cache Mamba state only in align mode.
    config = KVCacheConfig(64, groups, 64, use_eagle=eagle, hash_block_size=2, profile=VLLM_0_25_1)
    coord = coord_mod.make_coordinator(config)
    assert isinstance(coord, HybridCoordinator)
    return coord


@check
@about(coord_mod.hybrid_hit_search, releases=(VLLM_0_25_1.release,))
def hybrid_fixed_point() -> int:
    """The hit is at most ``max_len``, a multiple of the scheduler block size,
    no longer than any spec group's own hit, and (without EAGLE) a length
    every spec group accepts: looked up with ``max_len = hit``, each group
    finds exactly ``hit`` tokens. Each group's list covers the hit."""
    cases = 0
    for groups, tokens, eagle in CONFIGS:
        hashes = [BlockHash(bytes([i + 1])) for i in range(tokens // 2)]
        per_group = [coarse_block_hashes(hashes, 2, k.block_size) for k in groups]
        slots = [(g, i) for g, h in enumerate(per_group) for i in range(len(h))]
        for cached in product((False, True), repeat=len(slots)):
            for max_len in range(tokens + 1):
                cases += 1
                case = (groups, eagle, [s for s, c in zip(slots, cached, strict=True) if c], max_len)
                coord = _coordinator(groups, eagle)
                for (g, i), c in zip(slots, cached, strict=True):
                    if c:
                        b, key = BlockId(1 + g * tokens + i), make_key(per_group[g][i], g)
                        coord.pool.cached[key], coord.pool.block_hash[b] = [b], key
                hit, hits = coord_mod.hybrid_hit_search(coord, hashes, max_len)
                sched = coord.scheduler_block_size
                expect(0 <= hit <= max_len and hit % sched == 0, "0 <= hit <= max_len, aligned", case)
                for sg in coord.spec_groups:
                    bs, ids = sg.kind.block_size, sg.group_ids
                    drop = sg.use_eagle and not isinstance(sg.kind, Mamba)
                    own = find_longest_cache_hit(sg.kind, per_group[ids[0]], max_len, ids, coord.pool, drop, sched)
                    expect(hit <= len(own[0]) * bs, "hit <= each spec group's own hit", case)
                    if not eagle:
                        again = find_longest_cache_hit(sg.kind, per_group[ids[0]], hit, ids, coord.pool, False, sched)
                        expect(len(again[0]) * bs == hit, "every spec group accepts the hit", case)
                    for gid in ids:
                        full = isinstance(sg.kind, FULL_TYPE_KINDS)
                        expect(
                            len(hits[gid]) * bs >= hit and (full or len(hits[gid]) * bs == hit), "lists cover hit", case
                        )
    return cases
