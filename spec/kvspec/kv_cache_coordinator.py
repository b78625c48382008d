"""Coordinators: make the managers of several groups agree.

* :class:`NoPrefixCacheCoordinator` — caching off, any number of groups.
* :class:`UnitaryCoordinator` — one group.
* :class:`HybridCoordinator` — several groups; groups with equal kinds are
  looked up jointly, and the hit length is a fixed point every kind accepts,
  a multiple of the scheduler block size (the LCM of the block sizes).

Upstream: ``vllm/v1/core/kv_cache_coordinator.py`` (``KVCacheCoordinator``
and subclasses).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvspec.block_pool import BlockId, BlockPool
from kvspec.config import (
    FULL_TYPE_KINDS,
    AttentionKind,
    CrossAttention,
    KVCacheConfig,
    Mamba,
    SlidingWindow,
    admission_cap,
    num_reprefillable_tokens,
    prefix_cacheable,
)
from kvspec.errors import EagleAlignmentLookupError
from kvspec.hashing import BlockHash, coarse_block_hashes
from kvspec.partial_hits import (
    eagle_margin,
    fine_full_attention_hit,
    fine_grained,
    fine_mamba_hit,
    partial_hash_hits_enabled,
)
from kvspec.prefill_checkpoints import checkpoint_granularity, checkpoint_prefill_end, positional_checkpoints
from kvspec.request import Request
from kvspec.retention import retention_applies
from kvspec.single_type_kv_cache_manager import (
    MambaManager,
    caches_eagle_peek,
    eagle_window_hit_before_drop,
    find_longest_cache_hit,
    make_manager,
)

GroupBlocks = tuple[list[BlockId], ...]


class KVCacheCoordinator:
    """Fans operations out to one manager per group, in group order."""

    num_uncached_common_prefix_tokens: int = 0
    """Tokens of the last lookup's longest single-spec-group hit beyond the
    reconciled hit: a shared prefix a sparse group (Mamba, sliding window)
    has not cached yet. Only the hybrid coordinator sets it (vLLM 0.25.1's
    scheduler reads it with ``getattr(..., 0)``; from 0.26.0 on the lookup
    returns it); it keeps its value across lookups that skip the search."""

    def __init__(self, config: KVCacheConfig, enable_caching: bool) -> None:
        """Build the pool and the managers (SinkFull takes its blocks here)."""
        self.config = config
        self.scheduler_block_size = config.scheduler_block_size
        self.hash_block_size = config.resolved_hash_block_size()
        self.pool = BlockPool(
            config.num_blocks,
            enable_caching,
            self.hash_block_size,
            config.enable_kv_cache_events,
            config.int_block_hashes,
            config.profile,
            config.num_hash_lookahead_tokens,
        )
        self.eagle_group_ids = config.eagle_group_ids()
        self.num_reprefillable_tokens = num_reprefillable_tokens(config)
        """Trailing computed tokens whose KV is not final (multi-module MTP)."""
        mnbt, mml = config.batched_tokens(), config.max_model_len
        # NOTE: the admission cap counts in the engine's unscaled block size
        # while the manager counts its table in the context-parallel one, as
        # in every vLLM release (the cap is about dcp x pcp times too loose).
        self.managers = tuple(
            make_manager(kind, self.pool, enable_caching, gid, self.scheduler_block_size,
                         admission_cap(engine_kind, mnbt, mml), config.profile, config.has_mamba())
            for gid, (kind, engine_kind) in enumerate(zip(config.manager_groups(), config.groups, strict=True))
        )  # fmt: skip
        self.partial_hash_hits = partial_hash_hits_enabled(config)
        """Hits may end on any hash boundary (:mod:`kvspec.partial_hits`)."""
        self.hit_alignment = self.hash_block_size if self.partial_hash_hits else self.scheduler_block_size
        """Every hit length is a multiple of this (upstream ``_cache_hit_alignment_tokens``)."""
        self.shared_prefix_boundary: dict[str, int] = {}
        """Non-zero ``shared_prefix_boundary`` of each request's latest lookup
        (vLLM keeps it on the request; the retention masks read it)."""
        retention, replay_eagle = config.prefix_cache_retention_interval, bool(config.eagle_group_ids())
        for m, engine_kind in zip(self.managers, config.groups, strict=True):
            m.cache_mask_alignment = self.cache_mask_alignment()
            m.junctions = self.shared_prefix_boundary
            m.replay_eagle = replay_eagle
            if retention_applies(engine_kind, config.profile):
                m.retention = retention
            if isinstance(m, MambaManager):
                m.drop_eagle_checkpoint = config.use_eagle
                m.checkpoint_granularity = checkpoint_granularity(
                    config.profile, self.hash_block_size, self.hit_alignment
                )
            if config.profile.cp_swa_mask_unscaled:
                m.mask_kind = engine_kind

    def cache_mask_alignment(self) -> int | None:
        """The alignment sliding-window caching masks assume: the scheduler
        block, from vLLM 0.29.0 on the hit alignment (profile switch
        ``cache_mask_hit_alignment``); None, no mask, in vLLM 0.16.0
        (``hybrid_cache_reachable_only`` off)."""
        if not self.config.profile.hybrid_cache_reachable_only:
            return None
        return self.hit_alignment if self.config.profile.cache_mask_hit_alignment else self.scheduler_block_size

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[GroupBlocks, int]:
        """Hit blocks per group and the hit length in tokens."""
        raise NotImplementedError

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[Sequence[BlockId]],
        num_encoder_tokens: int,
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        num_external: int = 0,
        num_local: int = 0,
        request: Request | None = None,
    ) -> int:
        """Sum over groups; cross attention is sized by the encoder tokens.
        ``num_local`` (computed plus hit tokens) tells a partial hit. From
        vLLM 0.31.0 on the Mamba groups also weigh their prefill checkpoints
        against the ``request``'s prefill end
        (:func:`kvspec.prefill_checkpoints.checkpoint_prefill_end`)."""
        total = 0
        retention = self.config.prefix_cache_retention_interval
        prefill_end = 0
        mambas = [m for m in self.managers if isinstance(m, MambaManager)]
        checkpointed = any(positional_checkpoints(m.mamba, m.profile) for m in mambas)
        if request is not None and checkpointed:
            prefill_end = checkpoint_prefill_end(
                self.config.profile, retention, request.num_prompt_tokens, request.num_tokens
            )
        for m, hits in zip(self.managers, new_computed_blocks, strict=True):
            if isinstance(m.kind, CrossAttention):
                total += m.get_num_blocks_to_allocate(
                    request_id, num_encoder_tokens, (), 0, num_encoder_tokens, apply_admission_cap
                )
            elif isinstance(m, MambaManager):
                total += m.get_num_blocks_to_allocate(
                    request_id, num_tokens, hits, total_computed_tokens, num_tokens_main_model, apply_admission_cap,
                    num_external, num_local, prefill_end,
                )  # fmt: skip
            else:
                total += m.get_num_blocks_to_allocate(
                    request_id, num_tokens, hits, total_computed_tokens, num_tokens_main_model, apply_admission_cap,
                    num_external, num_local,
                )  # fmt: skip
        return total

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[Sequence[BlockId]],
        num_local: int,
        num_external: int,
        skip_zeroing: frozenset[int] = frozenset(),
    ) -> None:
        """Add hits (all groups touched first), then external-token blocks
        (not listed for zeroing in the groups of ``skip_zeroing``).

        Touching every group's hits before any group takes fresh blocks keeps
        one group's allocation from evicting another group's hit (vLLM issue
        #33775). A request some manager already tracks is left alone.
        """
        if any(request_id in m.num_cached_block for m in self.managers):
            return
        for m, hits in zip(self.managers, new_computed_blocks, strict=True):
            m.add_local_computed_blocks(request_id, hits, num_local, num_external)
        if num_external > 0:
            for g, m in enumerate(self.managers):
                m.allocate_external_computed_blocks(request_id, num_local, num_external, g not in skip_zeroing)

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int, num_encoder_tokens: int
    ) -> GroupBlocks:
        """New blocks per group (cross attention: for the encoder tokens)."""
        return tuple(
            m.allocate_new_blocks(
                request_id, num_encoder_tokens if isinstance(m.kind, CrossAttention) else num_tokens,
                num_tokens_main_model,
            )
            for m in self.managers
        )  # fmt: skip

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Every group caches its full blocks up to ``num_tokens``, less the
        tokens a multi-module MTP drafter may prefill again (their KV is not
        final; :func:`kvspec.config.num_reprefillable_tokens`)."""
        for m in self.managers:
            m.cache_blocks(request, max(0, num_tokens - self.num_reprefillable_tokens))

    def free(self, request_id: str) -> None:
        """Each group frees its table, last entry first, in group order."""
        for m in self.managers:
            m.free(request_id)

    def emit_cached_block_events(self, request: Request, hit: Sequence[Sequence[BlockId]]) -> None:
        """Announce a lookup's hit again, group by group, for a request in
        report mode "full": one BlockStored per group whose hit list is not
        empty, as many blocks as the list has entries, at the group's block
        size as configured (unscaled by context parallelism, while the list
        counts the manager's blocks)."""
        for gid, blocks in enumerate(hit):
            if blocks:
                self.pool.emit_cached_block_events(request, len(blocks), self.config.groups[gid].block_size, gid)

    def pop_blocks_for_free(self, request_id: str) -> list[BlockId]:
        """Every group's table, concatenated in group order."""
        return [b for m in self.managers for b in m.pop_blocks_for_free(request_id)]

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """Each group frees what its attention no longer reads."""
        for m in self.managers:
            m.remove_skipped_blocks(request_id, total_computed_tokens)

    def get_num_common_prefix_blocks(self, request_id: str) -> list[int]:
        """Common-prefix length per group."""
        return [m.get_num_common_prefix_blocks(request_id) for m in self.managers]

    def get_blocks(self, request_id: str) -> GroupBlocks:
        """The request's table per group ([] where it has none)."""
        return tuple(list(m.req_to_blocks.get(request_id, [])) for m in self.managers)

    def new_step_starts(self) -> None:
        """Tell every manager a scheduler step begins."""
        for m in self.managers:
            m.new_step_starts()

    def _hashes_for(self, kind: AttentionKind, block_hashes: Sequence[BlockHash]) -> Sequence[BlockHash]:
        if kind.block_size == self.hash_block_size:
            return block_hashes
        return coarse_block_hashes(
            block_hashes, self.hash_block_size, kind.block_size, self.config.profile.coarse_hash_last_fine
        )


class NoPrefixCacheCoordinator(KVCacheCoordinator):
    """Prefix caching off: no hits, no common prefix."""

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[GroupBlocks, int]:
        """Always no hit."""
        return tuple([] for _ in self.managers), 0

    def get_num_common_prefix_blocks(self, request_id: str) -> list[int]:
        """Always 0 per group."""
        return [0] * len(self.managers)


class UnitaryCoordinator(KVCacheCoordinator):
    """Exactly one group."""

    def __init__(self, config: KVCacheConfig, enable_caching: bool) -> None:
        """One manager; it drops the EAGLE block if its group is an EAGLE group."""
        super().__init__(config, enable_caching)
        self.managers[0].use_eagle = 0 in self.eagle_group_ids

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[GroupBlocks, int]:
        """The manager's own hit; null entries count towards the length."""
        kind = self.managers[0].kind
        blocks = find_longest_cache_hit(
            kind, block_hashes, max_cache_hit_length, [0], self.pool, 0 in self.eagle_group_ids, kind.block_size
        )
        return (blocks[0],), len(blocks[0]) * kind.block_size


@dataclass(frozen=True, slots=True)
class SpecGroup:
    """Groups with one kind, looked up together (upstream: ``SpecGroup``)."""

    kind: AttentionKind
    group_ids: tuple[int, ...]
    use_eagle: bool


class HybridCoordinator(KVCacheCoordinator):
    """Several groups with at least two distinct kinds."""

    def __init__(self, config: KVCacheConfig, enable_caching: bool) -> None:
        """Merge equal kinds into spec groups, full-attention kinds first.
        Groups that are not prefix-cacheable (rings) join no spec group: their
        hit stays empty and they never drop an EAGLE block."""
        super().__init__(config, enable_caching)
        merged: dict[AttentionKind, list[int]] = {}
        for gid, kind in enumerate(config.groups):
            if prefix_cacheable(kind):
                merged.setdefault(kind, []).append(gid)
        groups = [SpecGroup(k, tuple(ids), any(i in self.eagle_group_ids for i in ids)) for k, ids in merged.items()]
        self.spec_groups = sorted(groups, key=lambda g: not isinstance(g.kind, FULL_TYPE_KINDS))
        for sg in self.spec_groups:
            for gid in sg.group_ids:
                self.managers[gid].use_eagle = sg.use_eagle

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[GroupBlocks, int]:
        """Shrink a candidate length until every spec group accepts it.

        Full-attention groups are looked up once and only trimmed afterwards
        (their hits are downward closed). An EAGLE spec group looks one block
        further and drops it, once per candidate length. With fine-grained
        hits (:mod:`kvspec.partial_hits`) lengths are multiples of the hash
        block, and a full-attention list keeps ``cdiv(hit, bs)`` blocks.

        Without ``hybrid_eagle_lookahead`` (vLLM 0.16.0) the search is
        :func:`hybrid_hit_search_v016`, which sets no uncached common prefix.

        NOTE: two deliberate departures from vLLM 0.25.1 (docs/divergences.md):
        Mamba groups never take the EAGLE look-ahead ("eagle-mamba-hit"; from
        vLLM 0.26.0 on vLLM agrees, and an EAGLE Mamba group counts its drop
        as made), and every full-attention spec group, not only the first, is
        trimmed to the final length ("second-full-group"; vLLM agrees from
        0.29.0 on).
        """
        if self.config.profile.hybrid_eagle_lookahead:
            hit, hits, longest = hybrid_hit_search_longest(self, block_hashes, max_cache_hit_length)
            self.num_uncached_common_prefix_tokens = longest - hit
        else:
            hit, hits = hybrid_hit_search_v016(self, block_hashes, max_cache_hit_length)
        for sg in self.spec_groups:
            if isinstance(sg.kind, FULL_TYPE_KINDS):
                for gid in sg.group_ids:
                    del hits[gid][-(-hit // sg.kind.block_size) :]
        return tuple(hits), hit

    @property
    def full_attention_group_id(self) -> int | None:
        """The group a connector's lookup reports (vLLM 0.27.0 on): the first
        group of the first spec group where that spec group is of a
        full-attention type (they sort first), else None."""
        first = self.spec_groups[0] if self.spec_groups else None
        return first.group_ids[0] if first is not None and isinstance(first.kind, FULL_TYPE_KINDS) else None

    def find_longest_cache_hit_per_group(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[GroupBlocks, tuple[int, ...]]:
        """Each spec group's own hit of at most ``max_cache_hit_length``
        tokens, with no agreement between them (a connector's lookup): the
        lists and the hit length per group. No fixed point and no trimming:
        a full-attention list keeps its own length. An EAGLE group drops its
        last block (Mamba never does); from vLLM 0.32.0 on a non-Mamba EAGLE
        group first looks one margin further, at most the hashed tokens
        (switch ``per_group_eagle_margin``). A group in no spec group (a ring
        or cross-attention group) has an empty list and a hit of 0.

        pre: max_cache_hit_length >= 0
        post: len(__return__[0]) == len(__return__[1]) == len(self.managers)
        post: all(n <= max_cache_hit_length for n in __return__[1]) or self.config.profile.per_group_eagle_margin
        """
        hits: list[list[BlockId]] = [[] for _ in self.managers]
        lengths = [0] * len(self.managers)
        hashed = len(block_hashes) * self.hash_block_size
        for sg in self.spec_groups:
            limit = max_cache_hit_length
            if sg.use_eagle and not isinstance(sg.kind, Mamba) and self.config.profile.per_group_eagle_margin:
                margin = eagle_margin(sg.kind, self.hash_block_size, self.partial_hash_hits)
                limit = min(max_cache_hit_length + margin, hashed)
            found, n = spec_group_hit(self, sg, block_hashes, limit, sg.use_eagle)
            for gid, blocks in zip(sg.group_ids, found, strict=True):
                hits[gid], lengths[gid] = blocks, n
        return tuple(hits), tuple(lengths)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache only up to a scheduler-block boundary (hits always end on one;
        with fine-grained hits every token counts); EAGLE groups one block
        further, the block their look-ahead needs (from vLLM 0.23.0:
        :func:`kvspec.single_type_kv_cache_manager.caches_eagle_peek`), counted
        from the tokens whose KV is final (the reprefillable tail of
        multi-module MTP left out; the other groups keep the aligned length,
        as in vLLM 0.28.0 on). Before 0.22.0 (profile switch
        ``hybrid_cache_reachable_only`` off) every full block is cached."""
        if not self.config.profile.hybrid_cache_reachable_only:
            super().cache_blocks(request, num_tokens)
            return
        sched = self.scheduler_block_size
        aligned = num_tokens if self.partial_hash_hits else num_tokens // sched * sched
        final = max(0, num_tokens - self.num_reprefillable_tokens)
        final_aligned = final if self.partial_hash_hits else final // sched * sched
        for m in self.managers:
            n = aligned
            if caches_eagle_peek(m) and aligned > 0:
                n = min(final, final_aligned + m.block_size)
            m.cache_blocks(request, n)


def hybrid_hit_search(
    coord: HybridCoordinator, block_hashes: Sequence[BlockHash], max_len: int
) -> tuple[int, list[list[BlockId]]]:
    """The fixed-point loop of :meth:`HybridCoordinator.find_longest_cache_hit`;
    returns the hit length and untrimmed hit lists per group.

    The hit is at most ``max_len``, a multiple of the hit alignment, and
    every group's list covers it (a full-attention list may be longer: the
    caller trims it; a ring group's list is empty). Every spec group holds
    the hit (:func:`_accepts` without EAGLE: the blocks its attention reads
    are cached), and no longer aligned length up to ``max_len`` is accepted
    by every spec group as its own lookup decides (EAGLE look-ahead
    included).

    NOTE: the hit need not be one every EAGLE group accepts with its
    look-ahead. A group's verified drop is forgotten only when a lookup
    without a drop shortens the hit (vLLM 0.25.1's
    ``HybridKVCacheCoordinator`` alike), so when another EAGLE group's own
    first lookup, with its drop, shortens it, a window group verified at the
    longer length keeps that verification although its look-ahead block at
    the final length may not be cached.

    pre: max_len >= 0
    post: 0 <= __return__[0] <= max_len and __return__[0] % coord.hit_alignment == 0
    post: all(len(h) >= -(-__return__[0] // m.block_size) if isinstance(m.kind, FULL_TYPE_KINDS) else len(h) == (-(-__return__[0] // m.block_size) if prefix_cacheable(m.kind) else 0) for h, m in zip(__return__[1], coord.managers, strict=True))
    post: all(_accepts(coord, sg, block_hashes, __return__[0], max_len, eagle=False) for sg in coord.spec_groups)
    post: not any(all(_accepts(coord, sg, block_hashes, n, max_len) for sg in coord.spec_groups) for n in range(__return__[0] + coord.hit_alignment, max_len + 1, coord.hit_alignment))
    """  # noqa: E501 - a PEP 316 condition is one line
    hit, hits, _ = hybrid_hit_search_longest(coord, block_hashes, max_len)
    return hit, hits


def hybrid_hit_search_longest(
    coord: HybridCoordinator, block_hashes: Sequence[BlockHash], max_len: int
) -> tuple[int, list[list[BlockId]], int]:
    """:func:`hybrid_hit_search`, also returning the longest length any one
    spec-group lookup reached (vLLM's ``longest_hit_length``), at least the hit.

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
            drop = sg.use_eagle and idx not in verified and (profile.mamba_eagle_counts_verified or not mamba)
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


def hybrid_hit_search_v016(
    coord: HybridCoordinator, block_hashes: Sequence[BlockHash], max_len: int
) -> tuple[int, list[list[BlockId]]]:
    """vLLM 0.16.0's fixed point (profile switch ``hybrid_eagle_lookahead``
    off): the hit length and untrimmed hit lists per group.

    Each pass asks every spec group in turn for its hit within the current
    length; a full-attention group is looked up once and afterwards only cut
    to the length. Under EAGLE every lookup drops its last block, with no
    look-ahead, so a sliding-window group loses a block on every pass until a
    pass changes nothing (often at 0); a "simple" hybrid, two spec groups with
    full attention first, stops after one pass. A sliding-window EAGLE hit in
    a group whose block is not the scheduler block raises (:func:`v016_spec_group_hit`).

    Without EAGLE (and without fine-grained hits, which 0.16.0 does not
    have) it finds what the later releases' search finds; with EAGLE never
    more (every lookup drops a block).

    pre: max_len >= 0
    raises: EagleAlignmentLookupError
    post: 0 <= __return__[0] <= max_len and __return__[0] % coord.scheduler_block_size == 0
    post: all(len(h) >= -(-__return__[0] // m.block_size) if isinstance(m.kind, FULL_TYPE_KINDS) else len(h) == (-(-__return__[0] // m.block_size) if prefix_cacheable(m.kind) else 0) for h, m in zip(__return__[1], coord.managers, strict=True))
    post: coord.partial_hash_hits or any(sg.use_eagle for sg in coord.spec_groups) or __return__ == hybrid_hit_search(coord, block_hashes, max_len)
    post: __return__[0] <= hybrid_hit_search(coord, block_hashes, max_len)[0]
    """  # noqa: E501 - a PEP 316 condition is one line
    hits: list[list[BlockId]] = [[] for _ in coord.managers]
    searched: set[int] = set()
    simple = len(coord.spec_groups) == 2 and isinstance(coord.spec_groups[0].kind, FULL_TYPE_KINDS)
    hit = max_len
    while True:
        cur = hit
        for idx, sg in enumerate(coord.spec_groups):
            if isinstance(sg.kind, FULL_TYPE_KINDS) and idx in searched:
                cur = cur // sg.kind.block_size * sg.kind.block_size
                continue
            found = v016_spec_group_hit(coord, sg, block_hashes, cur)
            searched.add(idx)
            cur = len(found[0]) * sg.kind.block_size
            for gid, blocks in zip(sg.group_ids, found, strict=True):
                hits[gid] = blocks
        if cur >= hit or simple:
            return cur, hits
        hit = cur


def v016_spec_group_hit(
    coord: HybridCoordinator, sg: SpecGroup, block_hashes: Sequence[BlockHash], limit: int
) -> list[list[BlockId]]:
    """One spec group's hit of at most ``limit`` tokens in vLLM 0.16.0's
    search: aligned to the scheduler block, its EAGLE block dropped. A
    sliding-window EAGLE group whose block is not the scheduler block fails
    an assertion when it finds a hit, up to vLLM 0.19.0; 0.19.1 drops and
    aligns again instead (profile switch ``v016_swa_eagle_realign``), where
    kvspec keeps the longest aligned hit after the drop (the shorter hit
    vLLM can return is the divergence ``swa-eagle-fallback``).

    Raises:
        EagleAlignmentLookupError: Where 0.16.0 to 0.19.0 assert.

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
    return find_longest_cache_hit(kind, hashes, limit, sg.group_ids, coord.pool, sg.use_eagle, align)


def spec_group_hit(
    coord: HybridCoordinator, sg: SpecGroup, block_hashes: Sequence[BlockHash], limit: int, drop: bool
) -> tuple[list[list[BlockId]], int]:
    """One spec group's hit of at most ``limit`` tokens: its lists per group
    and its length, found at hash granularity where the group does
    fine-grained lookups (:mod:`kvspec.partial_hits`).

    pre: len(sg.group_ids) >= 1
    post: len(__return__[0]) == len(sg.group_ids) and all(len(h) == -(-__return__[1] // sg.kind.block_size) for h in __return__[0])
    post: 0 <= __return__[1] <= max(limit, 0)
    post: __return__[1] % coord.hit_alignment == 0 or isinstance(sg.kind, ChunkedLocal)
    post: fine_grained(sg.kind, coord.hit_alignment) or __return__[1] % sg.kind.block_size == 0
    """  # noqa: E501 - a PEP 316 condition is one line
    kind, align = sg.kind, coord.hit_alignment
    if fine_grained(kind, align):
        if isinstance(kind, Mamba):
            return fine_mamba_hit(kind, block_hashes, limit, sg.group_ids, coord.pool, align)
        return fine_full_attention_hit(kind, block_hashes, limit, sg.group_ids, coord.pool, drop, align)
    hashes = coord._hashes_for(kind, block_hashes)
    found = find_longest_cache_hit(kind, hashes, limit, sg.group_ids, coord.pool, drop, align)
    return found, len(found[0]) * kind.block_size


def eagle_search_limit(cur: int, margin: int, max_len: int, hashed: int, hashed_cap: bool) -> int:
    """How far an EAGLE group searches when its drop is not yet verified at
    candidate length ``cur``: ``margin`` further (one block, or one hash unit
    with fine-grained hits), at most ``max_len`` (``num_tokens - 1``), or,
    from vLLM 0.32.0 on, at most the request's hashed tokens (profile switch
    ``eagle_margin_hashed_cap``), which lets the hit reach a block that ends
    exactly at the request's last token.

    pre: cur >= 0 and margin >= 1 and max_len >= 0 and hashed >= 0
    post: __return__ >= 0
    post: __return__ == min(cur + margin, hashed if hashed_cap else max_len)
    post: __return__ >= eagle_search_limit(cur, margin, max_len, hashed, False) or hashed < max_len
    """
    return min(cur + margin, hashed if hashed_cap else max_len)


def make_coordinator(config: KVCacheConfig) -> KVCacheCoordinator:
    """The coordinator vLLM would pick for ``config``.

    post: isinstance(__return__, NoPrefixCacheCoordinator) == (not config.enable_caching)
    post: isinstance(__return__, UnitaryCoordinator) == (config.enable_caching and len(config.groups) == 1)
    post: isinstance(__return__, HybridCoordinator) == (config.enable_caching and len(config.groups) > 1)
    post: len(__return__.managers) == len(config.groups) and __return__.config is config
    """
    if not config.enable_caching:
        return NoPrefixCacheCoordinator(config, False)
    if len(config.groups) == 1:
        return UnitaryCoordinator(config, True)
    return HybridCoordinator(config, True)


def _accepts(
    coord: HybridCoordinator, sg: SpecGroup, block_hashes: Sequence[BlockHash], n: int, max_len: int, eagle: bool = True
) -> bool:
    """Whether spec group ``sg`` accepts a hit of ``n`` tokens as its own
    lookup decides (a predicate of the contracts above). With ``eagle``, an
    EAGLE group other than Mamba looks one margin further and drops it; a
    full-attention kind is looked up once from ``max_len`` and accepts when
    its hit reaches ``n`` (its hits are downward closed: a shorter hit may
    end inside a block it found whole); any other kind accepts when its hit
    within ``n`` is ``n``."""
    drop = eagle and sg.use_eagle and not isinstance(sg.kind, Mamba)
    full = isinstance(sg.kind, FULL_TYPE_KINDS)
    limit = max_len if full else n
    if drop:
        margin = eagle_margin(sg.kind, coord.hash_block_size, coord.partial_hash_hits)
        hashed = len(block_hashes) * coord.hash_block_size
        limit = eagle_search_limit(limit, margin, max_len, hashed, coord.config.profile.eagle_margin_hashed_cap)
    found = spec_group_hit(coord, sg, block_hashes, limit, drop)[1]
    return found >= n if full else found == n
