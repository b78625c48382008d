"""Coordinators: make the managers of several groups agree.

* :class:`NoPrefixCacheCoordinator` — caching off, any number of groups.
* :class:`UnitaryCoordinator` — one group.
* :class:`HybridCoordinator` — several groups; groups with equal kinds are
  looked up jointly, and the hit length is a fixed point every kind accepts,
  a multiple of the scheduler block size (the LCM of the block sizes).

kvimpl's copy of :mod:`kvspec.kv_cache_coordinator` (duplicated on purpose);
the structures it drives live in :mod:`kvimpl.block_pool`.

Upstream: ``vllm/v1/core/kv_cache_coordinator.py`` (``KVCacheCoordinator``
and subclasses).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvimpl.block_pool import BlockPool, TailBlockPool, requeue_unhashed_first
from kvimpl.config_rules import (
    FULL_TYPE_KINDS,
    admission_cap,
    batched_tokens,
    eagle_group_ids,
    hash_block_size,
    manager_kinds,
    prefix_cacheable,
    scheduler_block_size,
)
from kvimpl.mamba_tail import registers_mamba_tail
from kvimpl.partial_hits import (
    eagle_margin,
    fine_full_attention_hit,
    fine_grained,
    fine_mamba_hit,
    partial_hash_hits_enabled,
)
from kvimpl.partial_tail import registers_partial_tail
from kvimpl.prefill_checkpoints import checkpoint_granularity, checkpoint_prefill_end, positional_checkpoints
from kvimpl.retention import retention_applies
from kvimpl.single_type_kv_cache_manager import (
    MambaManager,
    eagle_window_hit_before_drop,
    find_longest_cache_hit,
    make_manager,
)
from kvspec.block_pool import BlockId
from kvspec.config import AttentionKind, ChunkedLocal, CrossAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.errors import EagleAlignmentLookupError
from kvspec.hashing import BlockHash, coarse_block_hashes
from kvspec.request import Request

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
        self.scheduler_block_size = scheduler_block_size(config)
        self.hash_block_size = hash_block_size(config)
        p = config.profile
        unhashed_first, skipped_first = requeue_unhashed_first(config)
        pool_args = (config.num_blocks, enable_caching, self.hash_block_size, config.enable_kv_cache_events,
                     config.int_block_hashes, unhashed_first, p.event_group_idx, p.coarse_hash_last_fine,
                     skipped_first, p.event_extra_keys, (p.mm_key_with_offset, p.prompt_embeds_digest))  # fmt: skip
        self.pool: BlockPool
        if has_tail_entries(config, self.hash_block_size):
            self.pool = TailBlockPool(*pool_args, mm_resume_from_first=p.mm_resume_from_first_feature)
        else:
            self.pool = BlockPool(*pool_args)
        self.pool.num_hash_lookahead_tokens = config.num_hash_lookahead_tokens
        self.eagle_group_ids = eagle_group_ids(config)
        self.num_reprefillable_tokens = max(0, config.num_prefill_lookahead - 1)
        """Trailing computed tokens whose KV is not final (multi-module MTP)."""
        mnbt, mml = batched_tokens(config), config.max_model_len
        # NOTE: the managers run the context-parallel (scaled) kinds, but the admission cap counts
        # in the engine's unscaled block size, as in every vLLM release (kvspec's coordinator too).
        self.managers = tuple(
            make_manager(kind, self.pool, enable_caching, gid, self.scheduler_block_size,
                         admission_cap(engine_kind, mnbt, mml), config)
            for gid, (kind, engine_kind) in enumerate(zip(manager_kinds(config), config.groups, strict=True))
        )  # fmt: skip
        if config.profile.cp_swa_mask_unscaled:
            for m, engine_kind in zip(self.managers, config.groups, strict=True):
                m.mask_kind = engine_kind
        self.partial_hash_hits = partial_hash_hits_enabled(config)
        """Hits may end on any hash boundary (:mod:`kvimpl.partial_hits`)."""
        self.hit_alignment = self.hash_block_size if self.partial_hash_hits else self.scheduler_block_size
        """Every hit length is a multiple of this (upstream ``_cache_hit_alignment_tokens``)."""
        mask_alignment: int | None = self.hit_alignment if p.cache_mask_hit_alignment else self.scheduler_block_size
        # The alignment sliding-window caching masks assume: the scheduler block, from vLLM 0.29.0
        # on the hit alignment (profile switch cache_mask_hit_alignment); vLLM 0.16.0 masks nothing
        # (hybrid_cache_reachable_only off).
        if not p.hybrid_cache_reachable_only:
            mask_alignment = None
        self.shared_prefix_boundary: dict[str, int] = {}
        """Non-zero ``shared_prefix_boundary`` of each request's latest lookup
        (vLLM keeps it on the request; the retention masks read it)."""
        retention, replay_eagle = config.prefix_cache_retention_interval, bool(self.eagle_group_ids)
        for m, engine_kind in zip(self.managers, config.groups, strict=True):
            m.cache_mask_alignment = mask_alignment
            m.junctions = self.shared_prefix_boundary
            m.replay_eagle = replay_eagle
            if retention_applies(engine_kind, p):
                m.retention = retention
            if isinstance(m, MambaManager):
                m.checkpoint_granularity = checkpoint_granularity(p, self.hash_block_size, self.hit_alignment)
        self.weighs_prefill_end = any(isinstance(m, MambaManager) and m.positional for m in self.managers)
        """A Mamba group takes positional checkpoints, whose estimate weighs the
        request's prefill end (:func:`kvimpl.prefill_checkpoints.checkpoint_prefill_end`)."""
        self.is_cross = tuple(isinstance(kind, CrossAttention) for kind in config.groups)
        # Only these kinds ever skip leading tokens; the others' remove_skipped_blocks is a no-op.
        self.skipping = tuple(m for m in self.managers if isinstance(m.kind, SlidingWindow | ChunkedLocal | Mamba))

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
        vLLM 0.31.0 on a Mamba group with positional checkpoints also weighs
        them against the ``request``'s prefill end
        (:func:`kvimpl.prefill_checkpoints.checkpoint_prefill_end`)."""
        total = 0
        prefill_end = 0
        if request is not None and self.weighs_prefill_end:
            prefill_end = checkpoint_prefill_end(
                self.config.profile, self.config.prefix_cache_retention_interval, request.num_prompt_tokens,
                request.num_tokens,
            )  # fmt: skip
        for m, cross, hits in zip(self.managers, self.is_cross, new_computed_blocks, strict=True):
            if cross:
                total += m.get_num_blocks_to_allocate(
                    request_id, num_encoder_tokens, (), 0, num_encoder_tokens, apply_admission_cap
                )
            elif prefill_end and isinstance(m, MambaManager):
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
            m.allocate_new_blocks(request_id, num_encoder_tokens if cross else num_tokens, num_tokens_main_model)
            for m, cross in zip(self.managers, self.is_cross, strict=True)
        )

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Every group caches its full blocks up to ``num_tokens`` less the
        tokens a multi-module MTP drafter may prefill again."""
        final = max(0, num_tokens - self.num_reprefillable_tokens)
        for m in self.managers:
            m.cache_blocks(request, final)

    def free(self, request_id: str) -> None:
        """Each group frees its table, last entry first, in group order."""
        for m in self.managers:
            m.free(request_id)

    def emit_cached_block_events(self, request: Request, hit: Sequence[Sequence[BlockId]]) -> None:
        """Announce a lookup's hit again, one BlockStored per group whose list
        is not empty, at the group's configured (unscaled) block size."""
        for gid, blocks in enumerate(hit):
            if blocks:
                self.pool.emit_cached_block_events(request, len(blocks), self.config.groups[gid].block_size, gid)

    def pop_blocks_for_free(self, request_id: str) -> list[BlockId]:
        """Every group's table, concatenated in group order."""
        return [b for m in self.managers for b in m.pop_blocks_for_free(request_id)]

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """Each group frees what its attention no longer reads (full-type and
        cross groups never skip a token, so they are not asked)."""
        for m in self.skipping:
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
        Ring groups (not prefix-cacheable) join no spec group: their hit stays
        empty and they never drop an EAGLE block."""
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
        p = config.profile
        self.mamba_eagle_counts_verified = p.mamba_eagle_counts_verified
        """Profile switch read by :func:`hybrid_hit_search`."""
        self.eagle_margin_hashed_cap = p.eagle_margin_hashed_cap
        """Profile switch read by :func:`eagle_search_limit` (through :func:`hybrid_hit_search`)."""
        self.eagle_lookahead = p.hybrid_eagle_lookahead
        """Profile switch ``hybrid_eagle_lookahead``: off, :func:`hybrid_hit_search_v016` runs."""
        self.cache_reachable_only = p.hybrid_cache_reachable_only
        """Profile switch ``hybrid_cache_reachable_only``, read by :meth:`cache_blocks`."""
        self.per_group_eagle_margin = p.per_group_eagle_margin
        """Profile switch read by :meth:`find_longest_cache_hit_per_group`."""
        first = self.spec_groups[0] if self.spec_groups else None
        self.full_attention_group_id = (
            first.group_ids[0] if first is not None and isinstance(first.kind, FULL_TYPE_KINDS) else None
        )
        """The group a connector's lookup reports: the first group of the first
        spec group when that is of a full-attention type, else None."""

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[GroupBlocks, int]:
        """Shrink a candidate length until every spec group accepts it.

        Full-attention groups are looked up once and only trimmed afterwards
        (their hits are downward closed). An EAGLE spec group looks one block
        further and drops it, once per candidate length. With fine-grained
        hits (:mod:`kvimpl.partial_hits`) lengths are multiples of the hash
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
        if self.eagle_lookahead:
            hit, hits, longest = hybrid_hit_search_longest(self, block_hashes, max_cache_hit_length)
            self.num_uncached_common_prefix_tokens = longest - hit
        else:
            hit, hits = hybrid_hit_search_v016(self, block_hashes, max_cache_hit_length)
        for sg in self.spec_groups:
            if isinstance(sg.kind, FULL_TYPE_KINDS):
                for gid in sg.group_ids:
                    del hits[gid][-(-hit // sg.kind.block_size) :]
        return tuple(hits), hit

    def find_longest_cache_hit_per_group(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[GroupBlocks, tuple[int, ...]]:
        """Each spec group's own hit, with no agreement between them (kvspec's
        ``HybridCoordinator.find_longest_cache_hit_per_group``): lists and
        lengths per group; groups in no spec group have none."""
        hits: list[list[BlockId]] = [[] for _ in self.managers]
        lengths = [0] * len(self.managers)
        hashed = len(block_hashes) * self.hash_block_size
        for sg in self.spec_groups:
            limit = max_cache_hit_length
            if sg.use_eagle and self.per_group_eagle_margin and not isinstance(sg.kind, Mamba):
                limit = min(limit + eagle_margin(sg.kind, self.hash_block_size, self.partial_hash_hits), hashed)
            found, n = spec_group_hit(self, sg, block_hashes, limit, sg.use_eagle)
            for gid, blocks in zip(sg.group_ids, found, strict=True):
                hits[gid], lengths[gid] = blocks, n
        return tuple(hits), tuple(lengths)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache only up to a scheduler-block boundary (hits always end on one;
        with fine-grained hits every token counts); EAGLE groups one block
        further, the block their look-ahead needs, counted from the tokens whose
        KV is final. vLLM 0.16.0 (profile switch ``hybrid_cache_reachable_only``
        off) caches every full block."""
        if not self.cache_reachable_only:
            super().cache_blocks(request, num_tokens)
            return
        sched = self.scheduler_block_size
        aligned = num_tokens if self.partial_hash_hits else num_tokens // sched * sched
        final = max(0, num_tokens - self.num_reprefillable_tokens)
        final_aligned = final if self.partial_hash_hits else final // sched * sched
        for m in self.managers:
            n = aligned
            if m.use_eagle and m.eagle_reach and aligned > 0:
                n = min(final, final_aligned + m.block_size)
            m.cache_blocks(request, n)


def hybrid_hit_search(
    coord: HybridCoordinator, block_hashes: Sequence[BlockHash], max_len: int
) -> tuple[int, list[list[BlockId]]]:
    """The fixed-point loop of :meth:`HybridCoordinator.find_longest_cache_hit`;
    returns the hit length and untrimmed hit lists per group."""
    hit, hits, _ = hybrid_hit_search_longest(coord, block_hashes, max_len)
    return hit, hits


def hybrid_hit_search_longest(
    coord: HybridCoordinator, block_hashes: Sequence[BlockHash], max_len: int
) -> tuple[int, list[list[BlockId]], int]:
    """:func:`hybrid_hit_search`, also returning the longest length any one
    spec-group lookup reached (vLLM's ``longest_hit_length``), at least the hit."""
    longest = 0
    hits: list[list[BlockId]] = [[] for _ in coord.managers]
    lengths: dict[int, int] = {}
    verified: set[int] = set()
    simple = len(coord.spec_groups) == 2 and isinstance(coord.spec_groups[0].kind, FULL_TYPE_KINDS)
    mamba_counts, hashed_cap = coord.mamba_eagle_counts_verified, coord.eagle_margin_hashed_cap
    hbs, fine = coord.hash_block_size, coord.partial_hash_hits
    hashed = len(block_hashes) * hbs
    hit = max_len
    while True:
        cur = hit
        for idx, sg in enumerate(coord.spec_groups):
            if isinstance(sg.kind, FULL_TYPE_KINDS) and idx in lengths:
                # Downward closed: any shorter candidate is still a hit of the first lookup.
                n = lengths[idx]
                cur = n if n < cur else cur
                continue
            mamba = isinstance(sg.kind, Mamba)
            drop = sg.use_eagle and idx not in verified and (mamba_counts or not mamba)
            if drop and not mamba:
                limit = eagle_search_limit(cur, eagle_margin(sg.kind, hbs, fine), max_len, hashed, hashed_cap)
            else:
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
    off; kvspec's ``hybrid_hit_search_v016``): every lookup drops its EAGLE
    block, full attention is looked up once and then cut, a "simple" hybrid
    (two spec groups, full attention first) stops after one pass. Returns the
    hit length and untrimmed hit lists per group."""
    hits: list[list[BlockId]] = [[] for _ in coord.managers]
    searched: set[int] = set()
    simple = len(coord.spec_groups) == 2 and isinstance(coord.spec_groups[0].kind, FULL_TYPE_KINDS)
    hit = max_len
    while True:
        cur = hit
        for idx, sg in enumerate(coord.spec_groups):
            bs = sg.kind.block_size
            if idx in searched and isinstance(sg.kind, FULL_TYPE_KINDS):
                cur = cur // bs * bs
                continue
            found = v016_spec_group_hit(coord, sg, block_hashes, cur)
            searched.add(idx)
            cur = len(found[0]) * bs
            for gid, blocks in zip(sg.group_ids, found, strict=True):
                hits[gid] = blocks
        if cur >= hit or simple:
            return cur, hits
        hit = cur


def v016_spec_group_hit(
    coord: HybridCoordinator, sg: SpecGroup, block_hashes: Sequence[BlockHash], limit: int
) -> list[list[BlockId]]:
    """One spec group's hit in vLLM 0.16.0's search: aligned to the scheduler
    block, its EAGLE block dropped (kvspec's ``v016_spec_group_hit``).

    Raises:
        EagleAlignmentLookupError: A sliding-window EAGLE group whose block is
            not the scheduler block finds a hit (0.16.0 to 0.19.0 assert there;
            profile switch ``v016_swa_eagle_realign``).
    """
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
    fine-grained lookups (:mod:`kvimpl.partial_hits`)."""
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
    ``eagle_margin_hashed_cap``).

    pre: cur >= 0 and margin >= 1
    post: __return__ >= 0
    """
    limit = cur + margin
    cap = hashed if hashed_cap else max_len
    return limit if limit < cap else cap


def make_coordinator(config: KVCacheConfig) -> KVCacheCoordinator:
    """The coordinator vLLM would pick for ``config``."""
    if not config.enable_caching:
        return NoPrefixCacheCoordinator(config, False)
    if len(config.groups) == 1:
        return UnitaryCoordinator(config, True)
    return HybridCoordinator(config, True)


def has_tail_entries(config: KVCacheConfig, hash_block_size: int) -> bool:
    """Whether some group of a cached ``config`` registers tail entries
    (:mod:`kvimpl.partial_tail`, :mod:`kvimpl.mamba_tail`) or re-keys its
    prefill checkpoints to their positions (vLLM 0.30.0 on,
    :func:`kvimpl.prefill_checkpoints.rekey_checkpoint_block`), so that its
    pool is a :class:`kvimpl.block_pool.TailBlockPool`."""
    if not config.enable_caching:
        return False
    p, hbs = config.profile, hash_block_size
    return any(
        (registers_mamba_tail(k, p, hbs) or positional_checkpoints(k, p))
        if isinstance(k, Mamba)
        else registers_partial_tail(k, p, hbs)
        for k in config.groups
    )
