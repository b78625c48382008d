"""The facade the scheduler sees: ``KVCacheManager``.

Block lists cross this boundary as block ids per group
(:data:`kvspec.view.BlockIds`). Every operation validates its arguments
first and raises a :mod:`kvspec.errors` class without changing anything.

Upstream: ``vllm/v1/core/kv_cache_manager.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace

from kvspec.block_pool import NULL_BLOCK, BlockId, annotated_events, event_fields
from kvspec.config import (
    FULL_TYPE_KINDS,
    RING_KINDS,
    AttentionKind,
    CrossAttention,
    KVCacheConfig,
    Mamba,
    cacheable_blocks,
    cp_lookup_refusal,
    event_sliding_window,
    kind_name,
    prefix_cacheable,
)
from kvspec.errors import (
    CacheBeyondAllocationError,
    ContextParallelLookupError,
    DoubleFreeError,
    ExceedsMaxModelLenError,
    GroupCountError,
    InvalidBlockIdError,
    InvalidRequestError,
    InvalidTokenCountError,
    StaleHitError,
    UnexpectedPrefixHitError,
    UnknownRequestError,
    UnsupportedOperationError,
)
from kvspec.events import BlockRemoved, BlockStored, KVCacheEvent
from kvspec.hashing import (
    BlockHash,
    BlockHashWithGroupId,
    coarse_block_hashes,
    external_block_hash,
    make_key,
    split_key,
)
from kvspec.invariants import require
from kvspec.kv_cache_coordinator import GroupBlocks, HybridCoordinator, make_coordinator
from kvspec.prefill_checkpoints import positional_checkpoints
from kvspec.profiles import SemanticsProfile
from kvspec.request import Request, RequestStatus
from kvspec.single_type_kv_cache_manager import MambaManager, cdiv
from kvspec.stats import PrefixCacheStats
from kvspec.view import BlockIds, KVView


class KVCacheManager:
    """Allocates, caches and frees the KV-cache blocks of requests.

    inv: every invariant of the pool and of each manager
    inv: ref_cnt[b] == occurrences of b in all tables + in pending (popped or
         retained) lists + in the managers' pending copies
    inv: a non-null block is in the tables of at most one group
    """

    def __init__(self, config: KVCacheConfig) -> None:
        """An empty manager (SinkFull groups take their sink blocks now)."""
        self.config = config
        self.kinds = config.manager_groups()
        """The kinds the managers run (context parallelism scales block sizes)."""
        self.enable_caching = config.enable_caching
        self.coordinator = make_coordinator(config)
        self.block_pool = self.coordinator.pool
        self.watermark_blocks = int(config.watermark * config.num_blocks)
        self.pending: Counter[BlockId] = Counter()
        self.requests: dict[str, Request] = {}
        """Latest value of each request holding blocks (for :func:`inv_hash_content`)."""
        self.event_keys: Counter[tuple[object, int | None]] = Counter()
        """Cache keys implied by the events taken so far (:func:`inv_events_replay_to_cache`)."""
        self.prefix_cache_stats = PrefixCacheStats() if config.log_stats else None
        self.shared_prefix_boundary = self.coordinator.shared_prefix_boundary
        """Non-zero ``shared_prefix_boundary`` of each request's latest lookup
        (vLLM keeps it on the request; :meth:`get_prefix_hint`; the
        coordinator's dict, which the retention masks read)."""

    @property
    def usage(self) -> float:
        """Fraction of non-null blocks in use (cached free blocks count as free)."""
        return self.block_pool.get_usage()

    def get_computed_blocks(self, request: Request, max_cache_hit_length: int | None = None) -> tuple[BlockIds, int]:
        """The longest prefix-cache hit, at most ``num_tokens - 1`` tokens (the
        last token is always recomputed for its logits; :func:`lookup_length`
        says how the request's own limit and ``max_cache_hit_length``, vLLM
        0.33.0 on, change that). Changes nothing but the event queue: the hit
        blocks are only pinned by ``allocate_slots``; a hit of a request in
        report mode "full" is announced again (:func:`reports_hits`).

        Raises:
            UnsupportedOperationError: ``max_cache_hit_length`` before vLLM 0.33.0.
            InvalidTokenCountError: ``max_cache_hit_length`` is not None or an int >= 0.
            ContextParallelLookupError: A sliding-window, chunked-local or Mamba
                group under context parallelism (:func:`kvspec.config.cp_lookup_refusal`).
            EagleAlignmentLookupError: vLLM 0.16.0's assertion on a sliding-window
                EAGLE hit in a group whose block is not the scheduler block
                (:func:`kvspec.kv_cache_coordinator.v016_spec_group_hit`).
        """
        check_request(request)
        check_hit_length_bound(self.config.profile, max_cache_hit_length)
        reads = self.enable_caching and reads_prefix_cache(self.config.profile, request)
        if reads:
            self._check_cp_lookup()
        self.shared_prefix_boundary.pop(request.request_id, None)
        if not reads:
            return self._ids(tuple([] for _ in self.config.groups)), 0
        max_len = lookup_length(self.config.profile, request, max_cache_hit_length)
        blocks, n = self.coordinator.find_longest_cache_hit(request.block_hashes, max_len)
        if n > 0 and reports_hits(self.config, request):
            self.coordinator.emit_cached_block_events(request, blocks)
        uncached = self.coordinator.num_uncached_common_prefix_tokens
        if uncached:
            self.shared_prefix_boundary[request.request_id] = n + uncached
        covered = hit_covers_length(self.config, blocks, n, max_len, self.coordinator.hit_alignment)
        require(covered, f"malformed hit {blocks}, {n}")
        if self.prefix_cache_stats is not None and self.config.profile.stats_at_lookup:
            self.prefix_cache_stats.record(request.num_tokens, n, request.num_preemptions > 0)
        return self._ids(blocks), n

    def get_num_cached_tokens(self, request: Request) -> int:
        """How many leading tokens of ``request`` a lookup would hit now
        (vLLM 0.34.0 on; the scheduler asks before it admits): the hit length
        of :meth:`get_computed_blocks` at ``num_tokens - 1``, without the
        request's prompt-logprob limit (only a limit of 0, no reads, makes it
        0). Changes nothing: no statistics, no prefix hint.

        Raises:
            UnsupportedOperationError: Before vLLM 0.34.0 (switch ``num_cached_tokens_op``).
            InvalidRequestError: ``request`` is not a Request.
            ContextParallelLookupError: As :meth:`get_computed_blocks`.
        """
        require_operation(self.config.profile, "get_num_cached_tokens")
        check_request(request)
        if not self.enable_caching or not reads_prefix_cache(self.config.profile, request):
            return 0
        self._check_cp_lookup()
        kept = self.coordinator.num_uncached_common_prefix_tokens
        _, n = self.coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)
        self.coordinator.num_uncached_common_prefix_tokens = kept
        return n

    def get_computed_blocks_for_connector(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[BlockIds, int, bool]:
        """The local lookup vLLM's scheduler makes for a request when a KV
        connector may load the rest (vLLM 0.27.0 on; from 0.28.0 only for a
        connector that accepts diverging hybrid hits). Changes nothing.

        In a cached hybrid with a Mamba group and a full-attention group
        (:attr:`kvspec.kv_cache_coordinator.HybridCoordinator.full_attention_group_id`),
        every spec group is looked up alone
        (:meth:`~kvspec.kv_cache_coordinator.HybridCoordinator.find_longest_cache_hit_per_group`)
        and the full-attention group's hit is the hit: the lists as found (a
        lagging group's list is shorter), that group's length, no shared-prefix
        boundary, and whether some group lags behind it (a ring group always
        does: its hit is 0). Where a group reaches past the full-attention
        group, and in every other model, it is :meth:`get_computed_blocks`
        with the flag off.

        Raises:
            UnsupportedOperationError: Before vLLM 0.27.0 (switch ``connector_lookup_op``).
            InvalidRequestError, InvalidTokenCountError, ContextParallelLookupError,
            EagleAlignmentLookupError: As :meth:`get_computed_blocks`.
        """
        require_operation(self.config.profile, "get_computed_blocks_for_connector")
        check_request(request)
        check_hit_length_bound(self.config.profile, max_cache_hit_length)
        coord = self.coordinator
        fa = coord.full_attention_group_id if isinstance(coord, HybridCoordinator) else None
        if fa is None or not isinstance(coord, HybridCoordinator) or not any(isinstance(k, Mamba) for k in self.kinds):
            blocks, n = self.get_computed_blocks(request, max_cache_hit_length)
            return blocks, n, False
        self.shared_prefix_boundary.pop(request.request_id, None)
        if not reads_prefix_cache(self.config.profile, request):
            return self._ids(tuple([] for _ in self.config.groups)), 0, False
        max_len = lookup_length(self.config.profile, request, max_cache_hit_length)
        per_group, hits = coord.find_longest_cache_hit_per_group(request.block_hashes, max_len)
        if any(n > hits[fa] for n in hits):
            found, n = self.get_computed_blocks(request, max_cache_hit_length)
            return found, n, False
        return self._ids(per_group), hits[fa], min(hits) < hits[fa]

    def truncate_computed_blocks(self, blocks: Sequence[Sequence[int]], num_computed_tokens: int) -> BlockIds:
        """A lookup's result cut to its first ``num_computed_tokens`` tokens
        (vLLM 0.27.0 on: the scheduler drops a hit's partial last block when a
        connector loads past it). Pure slicing, per group
        (:func:`truncated_group`): nothing is touched or changed.

        Raises:
            UnsupportedOperationError: Before vLLM 0.27.0.
            GroupCountError: ``blocks`` has another number of groups than the config.
            InvalidBlockIdError: An id outside the pool.
            InvalidTokenCountError: ``num_computed_tokens`` is not an int >= 0, is
                not a multiple of a group's block size, or is longer than a
                group's list (where vLLM asserts; a lagging Mamba list is kept
                from 0.28.0 on).
            StaleHitError: A list for a ring group (never cached).
        """
        require_operation(self.config.profile, "truncate_computed_blocks")
        n = num_computed_tokens
        if not is_int(n) or n < 0:
            raise InvalidTokenCountError(f"truncate_computed_blocks: num_computed_tokens {n!r} is not an int >= 0")
        if len(blocks) != len(self.config.groups):
            raise GroupCountError(
                f"truncate_computed_blocks: {len(blocks)} groups of blocks, the config has {len(self.config.groups)}"
            )
        for b in (b for ids in blocks for b in ids):
            if not is_int(b) or not 0 <= b < self.config.num_blocks:
                raise InvalidBlockIdError(f"truncate_computed_blocks: block id {b!r} is outside the pool")
        profile = self.config.profile
        return tuple(
            tuple(truncated_group(kind, list(ids), n, g, profile))
            for g, (kind, ids) in enumerate(zip(self.kinds, blocks, strict=True))
        )

    def _check_cp_lookup(self) -> None:
        """Raise ContextParallelLookupError where a one-group lookup refuses
        context parallelism (:func:`kvspec.config.cp_lookup_refusal`)."""
        refusal = cp_lookup_refusal(self.config.groups[0], self.config) if len(self.kinds) == 1 else None
        if refusal is not None:
            raise ContextParallelLookupError(f"get_computed_blocks: {refusal}")

    def get_prefix_hint(self, request: Request) -> int:
        """The prefix hint vLLM's scheduler reads right after ``request``'s
        lookup to choose its chunk (:func:`prefix_hint`): up to vLLM 0.25.1 the
        coordinator's ``num_uncached_common_prefix_tokens`` (of the last lookup
        that searched, whichever request), from 0.26.0 on the request's
        ``shared_prefix_boundary`` (0 without an uncached shared prefix).
        Changes nothing.

        Raises:
            UnsupportedOperationError: In vLLM 0.16.0, whose scheduler reads no
                hint (switch ``prefix_hint_op``).
            InvalidRequestError: ``request`` is not a Request.
        """
        require_operation(self.config.profile, "get_prefix_hint")
        check_request(request)
        return prefix_hint(
            self.config.profile.lookup_returns_boundary,
            self.coordinator.num_uncached_common_prefix_tokens,
            self.shared_prefix_boundary.get(request.request_id, 0),
        )

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        """Record one admitted request's lookup in the statistics (vLLM 0.27.0
        on, where the scheduler calls it after a successful admission; before,
        ``get_computed_blocks`` records and this method does not exist).
        Nothing is recorded without ``log_stats``, with caching off or when the
        request skips reading the prefix cache.

        Raises:
            UnsupportedOperationError: Before vLLM 0.27.0.
            InvalidTokenCountError: A negative ``num_hits``.
        """
        if self.config.profile.stats_at_lookup:
            raise UnsupportedOperationError(
                f"record_prefix_cache_stats: not in {self.config.profile.name} (lookups record the statistics)"
            )
        check_request(request)
        if not is_int(num_hits) or num_hits < 0:
            raise InvalidTokenCountError(f"record_prefix_cache_stats: num_hits {num_hits!r} is not an int >= 0")
        if (
            self.prefix_cache_stats is None
            or not self.enable_caching
            or not reads_prefix_cache(self.config.profile, request)
        ):
            return
        self.prefix_cache_stats.record(request.num_tokens, num_hits, request.num_preemptions > 0)

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: BlockIds | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: Iterable[int] = (),
    ) -> BlockIds | None:
        """Give the request slots for its new tokens; None if they do not fit.

        Let C = computed tokens, H = new hit tokens, E = external (connector)
        tokens, N = new tokens, K = lookahead slots, L = max_model_len.
        Slots are needed for ``min(C+H+E+N+K, L)`` tokens. A waiting or
        preempted request must also leave ``watermark_blocks`` free when
        ``has_scheduled_reqs``; the main check also leaves ``reserved_blocks``.
        The groups of ``skip_zeroing_group_ids`` (vLLM 0.32.0 on) do not list
        the blocks they take for external tokens for zeroing (the connector
        load fills them).
        With ``full_sequence_must_fit`` the whole request (SWA and chunked
        local capped per request) must fit first. Blocks outside the attention
        window are freed *before* the capacity check, even when it fails (from
        vLLM 0.26.0 on the window of ``C+H+E`` less the request's in-flight
        tokens: :func:`skip_basis`).

        Returns:
            The blocks newly taken from the free queue per group (not the hit
            blocks, not external-token blocks), or None.

        Raises:
            InvalidTokenCountError, GroupCountError, ExceedsMaxModelLenError,
            UnexpectedPrefixHitError, InvalidBlockIdError, StaleHitError: in
            this order of checking; nothing has changed when they are raised.
            UnsupportedOperationError: Before vLLM 0.25.1, for a non-default
                ``full_sequence_must_fit``, ``reserved_blocks`` or
                ``has_scheduled_reqs``, and before 0.32.0 for any
                ``skip_zeroing_group_ids`` (first of all).
            GroupCountError: ``skip_zeroing_group_ids`` holds something that
                is not a group id of the model (checked next).
        """
        check_admission_args(self.config.profile, full_sequence_must_fit, reserved_blocks, has_scheduled_reqs)
        quiet = check_skip_zeroing(self.config.profile, len(self.kinds), skip_zeroing_group_ids)
        hits = self._validate_allocation(
            request, num_new_tokens, num_new_computed_tokens, new_computed_blocks, num_lookahead_tokens,
            num_external_computed_tokens, num_encoder_tokens, reserved_blocks,
        )  # fmt: skip
        cache_now = self.enable_caching and not delay_cache_blocks  # read before anything changes
        local = request.num_computed_tokens + num_new_computed_tokens
        total = min(local + num_external_computed_tokens, self.config.max_model_len)
        wm = self.watermark_blocks if has_scheduled_reqs and request.status in _WATERMARKED else 0
        coord, rid = self.coordinator, request.request_id
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.config.max_model_len)
            need = coord.get_num_blocks_to_allocate(
                rid, full, hits, num_encoder_tokens, total, full, True, num_local=local, request=request
            )
            if need + wm > self.block_pool.get_num_free_blocks():
                return None
        main = total + num_new_tokens
        slots = min(main + num_lookahead_tokens, self.config.max_model_len)
        coord.remove_skipped_blocks(rid, skip_basis(self.config.profile, total, request.num_in_flight_tokens))
        need = coord.get_num_blocks_to_allocate(
            rid, slots, hits, num_encoder_tokens, local + num_external_computed_tokens, main,
            num_external=num_external_computed_tokens, num_local=local, request=request,
        )  # fmt: skip
        if need + wm > self.block_pool.get_num_free_blocks() - reserved_blocks:
            return None
        if any(hits) or num_external_computed_tokens > 0:
            coord.allocate_new_computed_blocks(rid, hits, local, num_external_computed_tokens, quiet)
        new = coord.allocate_new_blocks(rid, slots, main, num_encoder_tokens)
        self.requests[rid] = request
        require(tables_cover_slots(self, rid, slots), f"request {rid}: tables shorter than {slots} slots")
        if cache_now:
            coord.cache_blocks(request, min(total + num_new_tokens, request.num_tokens))
        return self._ids(new)

    def free(self, request_id: str) -> None:
        """Free the request's blocks, each group's table last entry first, in
        group order. Lenient: an unknown request is a no-op (as in vLLM)."""
        check_request_id("free", request_id)
        self.requests.pop(request_id, None)
        self.coordinator.free(request_id)

    def pop_blocks_for_free(self, request_id: str) -> tuple[BlockId, ...]:
        """Forget the request but keep its references: the blocks (groups
        concatenated) are *pending* until the caller passes them to
        :meth:`free_blocks`, normally reversed. Unknown request → ()."""
        require_operation(self.config.profile, "pop_blocks_for_free")
        check_request_id("pop_blocks_for_free", request_id)
        self.requests.pop(request_id, None)
        blocks = tuple(self.coordinator.pop_blocks_for_free(request_id))
        self.pending.update(b for b in blocks if b != NULL_BLOCK)
        return blocks

    def free_blocks(self, ordered_block_ids: Sequence[int]) -> None:
        """The deferred free of popped or retained blocks (upstream: the
        scheduler calling ``block_pool.free_blocks``). Null ids are ignored.

        Raises:
            InvalidBlockIdError: An id outside the pool.
            DoubleFreeError: A block that is not pending (as often as given).
        """
        for b in ordered_block_ids:
            if not is_int(b) or not 0 <= b < self.config.num_blocks:
                raise InvalidBlockIdError(f"free_blocks: block id {b!r} is outside 0..{self.config.num_blocks - 1}")
        wanted = Counter(BlockId(b) for b in ordered_block_ids if b != NULL_BLOCK)
        for b, n in wanted.items():
            if self.pending[b] < n:
                raise DoubleFreeError(
                    f"free_blocks: block {b} is freed {n} time(s) but pending {self.pending[b]} "
                    "time(s); it was freed more often than popped"
                )
        self.pending -= wanted
        self.block_pool.free_blocks(BlockId(b) for b in ordered_block_ids)

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Free the blocks attention no longer reads (``num_prompt_tokens`` is
        only used by R-SWA, which is out of scope). Unknown request → no-op."""
        check_request_id("remove_skipped_blocks", request_id)
        if not is_int(total_computed_tokens) or total_computed_tokens < 0:
            raise InvalidTokenCountError(f"remove_skipped_blocks: total_computed_tokens {total_computed_tokens} < 0")
        self.coordinator.remove_skipped_blocks(request_id, total_computed_tokens)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop blocks from the prefix cache (ascending id order); references
        and queue positions stay."""
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        """Forget every hash if only the null block is in use."""
        if not self.block_pool.reset_prefix_cache():
            return False
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    def get_num_common_prefix_blocks(self, request_id: str) -> tuple[int, ...]:
        """Per group, the leading blocks of the request's table that every
        request with a table in that group holds (0 for non-full kinds); from
        vLLM 0.32.0 on always zeros, and gone in 0.34.0 (profile switch
        ``common_prefix``).

        Raises:
            UnsupportedOperationError: From vLLM 0.34.0 on.
            UnknownRequestError: If the request holds no block.
        """
        if self.config.profile.common_prefix == "absent":
            raise UnsupportedOperationError(f"get_num_common_prefix_blocks: not in {self.config.profile.name}")
        check_request_id("get_num_common_prefix_blocks", request_id)
        if not any(self.coordinator.get_blocks(request_id)):
            raise UnknownRequestError(f"get_num_common_prefix_blocks: request {request_id!r} holds no blocks")
        if self.config.profile.common_prefix == "zero":
            return (0,) * len(self.config.groups)
        return tuple(self.coordinator.get_num_common_prefix_blocks(request_id))

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the events; BlockStored gets its group's kind and window."""
        events = [self._annotate(ev) for ev in self.block_pool.take_events()]
        replay_events(self.event_keys, events)
        return events

    def _annotate(self, ev: KVCacheEvent) -> KVCacheEvent:
        if not isinstance(ev, BlockStored) or ev.group_idx is None or not event_fields(self.config.profile)[2]:
            return ev
        kind = self.config.groups[ev.group_idx]
        return replace(ev, kv_cache_spec_kind=kind_name(kind), kv_cache_spec_sliding_window=event_sliding_window(kind))

    def get_blocks(self, request_id: str) -> BlockIds:
        """The request's tables per group (empty for an unknown request)."""
        check_request_id("get_blocks", request_id)
        return self._ids(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> BlockIds:
        """Same as :meth:`get_blocks` (upstream returns objects vs ids)."""
        return self.get_blocks(request_id)

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int) -> BlockIds:
        """The request's tables clipped to its first ``num_computed_tokens``
        tokens (:func:`clip_to_computed`), what vLLM's scheduler hands a KV
        connector (vLLM 0.25.1 on: switch ``computed_block_ids_op``). Changes
        nothing; an unknown request has empty tables.

        Raises:
            UnsupportedOperationError: Before vLLM 0.25.1.
            InvalidTokenCountError: ``num_computed_tokens`` is not an int >= 0.
        """
        require_operation(self.config.profile, "get_block_ids_for_computed_tokens")
        check_request_id("get_block_ids_for_computed_tokens", request_id)
        if not is_int(num_computed_tokens) or num_computed_tokens < 0:
            raise InvalidTokenCountError(
                f"get_block_ids_for_computed_tokens: num_computed_tokens {num_computed_tokens!r} is not an int >= 0"
            )
        return clip_to_computed(self.get_blocks(request_id), self.config.groups, num_computed_tokens)

    def estimate_cached_tokens(self, request: Request) -> int:
        """How many leading tokens ``request``'s cached blocks stand for, the
        figure vLLM's scheduler reports when a prefill ends (vLLM 0.26.0 on:
        switch ``estimate_cached_tokens_op``): per group the largest
        ``hash_num_tokens`` of a block in its table, then the smallest over the
        groups (:func:`estimate_from_tables`). Changes nothing.

        Raises:
            UnsupportedOperationError: Before vLLM 0.26.0.
            InvalidRequestError: ``request`` is not a Request.
        """
        require_operation(self.config.profile, "estimate_cached_tokens")
        check_request(request)
        counts = self.block_pool.hash_num_tokens
        tables = self.get_blocks(request.request_id)
        per_group = [[counts[b] or 0 for b in table] for table in tables]
        return estimate_from_tables(per_group, self.config.groups, self.config.profile.estimate_skips_uncacheable)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Hash full blocks up to ``num_computed_tokens`` (after a delayed
        allocation); no-op with caching off.

        Raises:
            InvalidTokenCountError: A negative count.
            CacheBeyondAllocationError: Tokens beyond the request, or more
                full blocks than a table holds for tokens (a Mamba group's
                speculative blocks left out: :func:`kvspec.config.cacheable_blocks`).
        """
        if not self.enable_caching:
            return
        check_request(request)
        if not is_int(num_computed_tokens) or num_computed_tokens < 0:
            raise InvalidTokenCountError(f"cache_blocks: num_computed_tokens {num_computed_tokens!r}, not an int >= 0")
        if num_computed_tokens > request.num_tokens:
            raise CacheBeyondAllocationError(
                f"cache_blocks: {num_computed_tokens} tokens > the request's {request.num_tokens}"
            )
        for g, (kind, table) in enumerate(zip(self.kinds, self.get_blocks(request.request_id), strict=True)):
            have = cacheable_blocks(kind, len(table))
            if have is not None and num_computed_tokens // kind.block_size > have:
                raise CacheBeyondAllocationError(
                    f"cache_blocks: group {g} holds {have} blocks for tokens, fewer than "
                    f"{num_computed_tokens // kind.block_size} full blocks to cache"
                )
        self.coordinator.cache_blocks(request, num_computed_tokens)
        self.requests[request.request_id] = request

    def take_new_block_ids(self) -> list[BlockId]:
        """Drain fresh full-attention/MLA block ids, in group order
        (UnsupportedOperationError before vLLM 0.25.1)."""
        require_operation(self.config.profile, "take_new_block_ids")
        return [b for m in self.coordinator.managers for b in m.take_new_block_ids()]

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """List the request's blocks from ``start_token`` on for zeroing again,
        in every group that lists fresh blocks
        (:func:`kvspec.single_type_kv_cache_manager.records_new_block_ids`),
        in group order and table order (null entries included, as vLLM lists
        them); the next :meth:`take_new_block_ids` returns them. vLLM's
        scheduler calls it when a connector load failed part-way: the blocks
        past the valid prefix were never written, and their zeroing was
        skipped while the load was expected to fill them (vLLM 0.26.0 on:
        switch ``record_zeroing_op``). An unknown request has empty tables.

        Raises:
            UnsupportedOperationError: Before vLLM 0.26.0.
            InvalidRequestError: ``request_id`` is not a str.
            InvalidTokenCountError: ``start_token`` is not an int >= 0, or not
                a multiple of the block size of a group that lists fresh
                blocks (zeroing part of a block would wipe its valid tokens);
                nothing is listed then.
        """
        require_operation(self.config.profile, "record_blocks_for_zeroing")
        check_request_id("record_blocks_for_zeroing", request_id)
        if not is_int(start_token) or start_token < 0:
            raise InvalidTokenCountError(f"record_blocks_for_zeroing: start_token {start_token!r} is not an int >= 0")
        listing = [m for m in self.coordinator.managers if m.records_new_ids]
        for m in listing:
            if start_token % m.block_size:
                raise InvalidTokenCountError(
                    f"record_blocks_for_zeroing: start_token {start_token} is not a multiple of group "
                    f"{m.group_id}'s block size {m.block_size}"
                )
        for m in listing:
            m.record_for_zeroing(request_id, start_token // m.block_size)

    def get_zeroing_block_ids_in_range(self, request_id: str, start_token: int, end_token: int) -> list[BlockId]:
        """The request's table entries covering tokens ``[start_token,
        end_token)`` in every group that lists fresh blocks for zeroing
        (:func:`kvspec.single_type_kv_cache_manager.records_new_block_ids`):
        per group the entries from ``start_token // block_size`` up to
        ``cdiv(end_token, block_size)``, in group order and table order, null
        entries included. vLLM's scheduler (0.26.0 to 0.31.0: switch
        ``zeroing_range_op``) asks for the range a delayed connector load
        fills right after the admission and leaves those ids out of the next
        zeroing list, which the load would otherwise race. An unknown request
        has empty tables. Nothing changes.

        Raises:
            UnsupportedOperationError: Before vLLM 0.26.0 and from 0.32.0 on.
            InvalidRequestError: ``request_id`` is not a str.
            InvalidTokenCountError: ``start_token`` is not an int >= 0, or
                ``end_token`` not an int >= ``start_token``.
        """
        op = "get_zeroing_block_ids_in_range"
        require_operation(self.config.profile, op)
        check_request_id(op, request_id)
        if not is_int(start_token) or start_token < 0:
            raise InvalidTokenCountError(f"{op}: start_token {start_token!r} is not an int >= 0")
        if not is_int(end_token) or end_token < start_token:
            raise InvalidTokenCountError(f"{op}: end_token {end_token!r} is not an int >= start_token {start_token}")
        ids: list[BlockId] = []
        for m in self.coordinator.managers:
            if m.records_new_ids:
                table = m.req_to_blocks.get(request_id, [])
                ids += table[start_token // m.block_size : cdiv(end_token, m.block_size)]
        return ids

    def take_kv_cache_block_copies(self) -> tuple[list[tuple[BlockId, BlockId]], list[BlockId]]:
        """Drain the copy-on-write copies of fine-grained hits (vLLM 0.26.0 on;
        :mod:`kvspec.partial_hits`): ``(source, copy)`` pairs in group order,
        oldest first, and the retained blocks ``[source0, copy0, source1, ...]``.
        Each retained block holds one reference until the caller releases it
        with :meth:`free_blocks` (it is pending, like a popped block).

        Raises:
            UnsupportedOperationError: Before vLLM 0.26.0.
        """
        if not self.config.profile.partial_hash_hits:
            raise UnsupportedOperationError(f"take_kv_cache_block_copies: not in {self.config.profile.name}")
        copies = [pair for m in self.coordinator.managers for pair in m.take_pending_copies()]
        retained = [b for pair in copies for b in pair]
        self.pending.update(retained)
        return copies, retained

    def new_step_starts(self) -> None:
        """A scheduler step begins (Mamba may now use states cached earlier;
        UnsupportedOperationError before vLLM 0.25.1)."""
        require_operation(self.config.profile, "new_step_starts")
        self.coordinator.new_step_starts()

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Take the statistics and start new ones (None unless ``log_stats``)."""
        if self.prefix_cache_stats is None:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    def to_view(self) -> KVView:
        """The normalized observable state."""
        pool = self.block_pool
        tables = []
        for rid in sorted({r for m in self.coordinator.managers for r in m.req_to_blocks}):
            groups = self.get_blocks(rid)
            if any(groups):
                tables.append((rid, groups))
        return KVView(
            free_queue=tuple(pool.free_queue),
            ref_cnt=tuple((b, n) for b, n in enumerate(pool.ref_cnt) if b != NULL_BLOCK and n > 0),
            cached=tuple(sorted((k, tuple(ids)) for k, ids in pool.cached.items())),
            tables=tuple(tables),
            usage=pool.get_usage(),
        )

    def check_invariants(self) -> None:
        """Raise InvariantViolation if any invariant of the manager is broken."""
        self.block_pool.check_invariants()
        for m in self.coordinator.managers:
            m.check_invariants()
        require(inv_ref_cnt_counts_holders(self), "ref_cnt != table occurrences + pending")
        require(inv_group_exclusive(self), "a block is in the tables of two groups")
        require(inv_hash_content(self), "a cached block's key is not its prefix hash")
        require(inv_events_replay_to_cache(self), "the event stream does not rebuild the cache map")

    def _validate_allocation(
        self,
        request: Request,
        n_new: int,
        n_hit: int,
        hits: BlockIds | None,
        n_lookahead: int,
        n_external: int,
        n_encoder: int,
        reserved: int,
    ) -> tuple[tuple[BlockId, ...], ...]:
        """Check ``allocate_slots`` arguments; return the hits (empty if None)."""
        check_request(request)
        counts = {
            "num_new_tokens": n_new, "num_new_computed_tokens": n_hit, "num_lookahead_tokens": n_lookahead,
            "num_external_computed_tokens": n_external, "num_encoder_tokens": n_encoder,
            "reserved_blocks": reserved, "request.num_computed_tokens": request.num_computed_tokens,
            "request.num_in_flight_tokens": request.num_in_flight_tokens,
        }  # fmt: skip
        for name, value in counts.items():
            if not is_int(value) or value < 0:
                raise InvalidTokenCountError(f"allocate_slots: {name} is {value!r}, not a non-negative int")
        if not allocation_without_tokens(self.config.profile, n_new, n_hit, n_external):
            raise InvalidTokenCountError(
                "num_new_tokens must be greater than 0 when there are no external computed tokens"
            )
        groups = len(self.config.groups)
        if hits is not None and len(hits) != groups:
            raise GroupCountError(f"allocate_slots: new_computed_blocks has {len(hits)} groups, config has {groups}")
        total = request.num_computed_tokens + n_hit + n_external + n_new
        if total > self.config.max_model_len:
            raise ExceedsMaxModelLenError(
                f"allocate_slots: request {request.request_id!r} would reach {total} tokens "
                f"> max_model_len {self.config.max_model_len}"
            )
        hits = hits if hits is not None else tuple(() for _ in range(groups))
        rid = request.request_id
        holds = any(rid in m.num_cached_block for m in self.coordinator.managers) or any(self.get_blocks(rid))
        if holds and (any(hits) or n_external > 0):
            raise UnexpectedPrefixHitError(
                f"allocate_slots: request {rid!r} already holds blocks; prefix hits and external "
                "tokens are only accepted on a request's first allocation"
            )
        if any(hits):
            self._validate_hits(request, hits, n_hit)
        return tuple(tuple(BlockId(b) for b in g) for g in hits)

    def _validate_hits(self, request: Request, hits: BlockIds, n_hit: int) -> None:
        rid = request.request_id
        for b in (b for ids in hits for b in ids):
            if not 0 <= b < self.config.num_blocks:
                raise InvalidBlockIdError(f"allocate_slots: hit block id {b} is outside the pool")
        if not self.config.enable_caching:
            raise StaleHitError(f"allocate_slots: prefix caching is off, so request {rid!r} can have no hit")
        for g, kind in enumerate(self.config.groups):
            if not prefix_cacheable(kind) and hits[g]:
                raise StaleHitError(f"allocate_slots: a hit in group {g}, a ring group, which is never cached")
            if isinstance(kind, FULL_TYPE_KINDS) and NULL_BLOCK in hits[g]:
                raise StaleHitError(
                    f"allocate_slots: the null block in group {g}'s hit: a full-attention hit never contains it"
                )
        lagging = lagging_hits_allowed(self.config)
        for g, kind in enumerate(self.kinds):
            need = -(-n_hit // kind.block_size)
            if prefix_cacheable(kind) and not hit_list_fits(kind, len(hits[g]), need, lagging):
                raise StaleHitError(
                    f"allocate_slots: group {g}'s hit has {len(hits[g])} blocks, but {n_hit} hit tokens take {need} "
                    f"(block size {kind.block_size}): get_computed_blocks never returns such a hit"
                )
        hbs, fine = self.coordinator.hash_block_size, self.coordinator.partial_hash_hits
        last_fine = self.config.profile.coarse_hash_last_fine
        for g, (kind, ids) in enumerate(zip(self.kinds, hits, strict=True)):
            for i, b in enumerate(ids):
                if kind.block_size % hbs:
                    expected = []
                else:
                    partial = fine and i == len(ids) - 1
                    expected = hit_keys(request.block_hashes, hbs, kind.block_size, g, i, partial, last_fine)
                if b != NULL_BLOCK and not set(expected) & set(self.block_pool.keys_of(BlockId(b))):
                    raise StaleHitError(
                        f"allocate_slots: hit block {b} (group {g}, index {i}) is no longer cached for "
                        f"request {rid!r}; it was evicted after get_computed_blocks"
                    )

    @staticmethod
    def _ids(blocks: GroupBlocks) -> BlockIds:
        return tuple(tuple(g) for g in blocks)


_WATERMARKED = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


def is_int(value: object) -> bool:
    """Whether ``value`` is an int and not a bool (``True`` is not a count).

    post: __return__ == (isinstance(value, int) and not isinstance(value, bool))
    """
    return isinstance(value, int) and not isinstance(value, bool)


def lagging_hits_allowed(config: KVCacheConfig) -> bool:
    """Whether ``allocate_slots`` takes hit lists shorter than the hit in
    groups that are not of a full-attention type: those
    :meth:`KVCacheManager.get_computed_blocks_for_connector` returns (vLLM
    0.27.0 on, a cached model with a Mamba group and several groups).

    post: __return__ == (config.profile.connector_lookup_op and config.enable_caching and len(config.groups) > 1 and any(isinstance(k, Mamba) for k in config.groups))
    """  # noqa: E501 - a PEP 316 condition is one line
    return (
        config.profile.connector_lookup_op and config.enable_caching and len(config.groups) > 1
        and any(isinstance(k, Mamba) for k in config.groups)
    )  # fmt: skip


def hit_list_fits(kind: AttentionKind, length: int, need: int, lagging: bool) -> bool:
    """Whether a hit list of ``length`` blocks can come with a hit that takes
    ``need`` blocks of ``kind``: exactly that many, or, where a connector's
    lookup may let a group lag (``lagging``: :func:`lagging_hits_allowed`),
    fewer in a group that is not of a full-attention type.

    pre: length >= 0 and need >= 0
    post: __return__ == (length == need or (lagging and not isinstance(kind, FULL_TYPE_KINDS) and length < need))
    """
    return length == need or (lagging and not isinstance(kind, FULL_TYPE_KINDS) and length < need)


def truncated_group(
    kind: AttentionKind, ids: list[int], num_computed_tokens: int, group: int, profile: SemanticsProfile
) -> list[int]:
    """One group's list of :meth:`KVCacheManager.truncate_computed_blocks`:
    its blocks of the first ``num_computed_tokens`` tokens. A ring group has
    none (and must be given none); a Mamba list that ends before the length
    is kept whole from vLLM 0.28.0 on (switch ``truncate_mamba_lagging``;
    its null padding stays, its state block past the length goes); every
    other list must cover the length, which must be a multiple of the block size.

    raises: InvalidTokenCountError, StaleHitError
    post: __return__ == ids[: len(__return__)]
    post: not prefix_cacheable(kind) or len(__return__) == min(num_computed_tokens // kind.block_size, len(ids))
    """
    if not prefix_cacheable(kind):
        if ids:
            raise StaleHitError(f"truncate_computed_blocks: blocks for group {group}, a ring group (never cached)")
        return []
    bs = kind.block_size
    if num_computed_tokens % bs:
        raise InvalidTokenCountError(
            f"truncate_computed_blocks: {num_computed_tokens} tokens is not a multiple of group {group}'s "
            f"block size {bs}"
        )
    keep = num_computed_tokens // bs
    if keep > len(ids) and not (isinstance(kind, Mamba) and profile.truncate_mamba_lagging):
        raise InvalidTokenCountError(
            f"truncate_computed_blocks: {num_computed_tokens} tokens take {keep} blocks of group {group}, "
            f"which has {len(ids)}"
        )
    return ids[:keep]


def prefix_hint(lookup_returns_boundary: bool, num_uncached_common_prefix_tokens: int, boundary: int) -> int:
    """The scheduler's prefix hint (profile switch ``lookup_returns_boundary``):
    the request's shared-prefix boundary (the hit plus the uncached common
    prefix, 0 when there is none) or the coordinator's uncached common prefix.

    pre: num_uncached_common_prefix_tokens >= 0 and boundary >= 0
    post: __return__ >= 0
    post: __return__ == (boundary if lookup_returns_boundary else num_uncached_common_prefix_tokens)
    """
    return boundary if lookup_returns_boundary else num_uncached_common_prefix_tokens


def skip_basis(profile: SemanticsProfile, total_computed_tokens: int, num_in_flight_tokens: int) -> int:
    """The computed-token count ``allocate_slots`` frees skipped blocks on
    (profile switch ``skip_on_processed_tokens``): from vLLM 0.26.0 the
    processed tokens, the computed ones less those still in flight (a step
    in flight still reads its window below the optimistic count, and draft
    tokens it rejects move the count back: vLLM#47728); before, the computed
    tokens.

    pre: total_computed_tokens >= 0 and num_in_flight_tokens >= 0
    post: 0 <= __return__ <= total_computed_tokens
    post: profile.skip_on_processed_tokens or __return__ == total_computed_tokens
    post: __return__ >= total_computed_tokens - num_in_flight_tokens
    """
    if not profile.skip_on_processed_tokens:
        return total_computed_tokens
    return max(0, total_computed_tokens - num_in_flight_tokens)


def reads_prefix_cache(profile: SemanticsProfile, request: Request) -> bool:
    """Whether ``request`` may read the prefix cache (caching on aside): from
    vLLM 0.34.0 on its ``prefix_cache_hit_limit`` is not 0, a value fixed
    when the request was made (switch ``hit_limit_at_construction``); before,
    its ``skip_reading_prefix_cache`` as it is now.

    post: profile.hit_limit_at_construction or __return__ == (not request.skip_reading_prefix_cache)
    post: not profile.hit_limit_at_construction or __return__ == (request.prefix_cache_hit_limit != 0)
    """
    if profile.hit_limit_at_construction:
        return request.prefix_cache_hit_limit != 0
    return not request.skip_reading_prefix_cache


def lookup_length(profile: SemanticsProfile, request: Request, bound: int | None) -> int:
    """The longest hit a lookup of ``request`` may return: ``num_tokens - 1``
    (the last token is recomputed for its logits), lowered by the request's
    ``prefix_cache_hit_limit`` where the release reads it; an explicit
    ``bound`` (``max_cache_hit_length``) replaces that as given in vLLM 0.33.0
    (even above it) and can only lower it from 0.34.0 on (switch
    ``hit_length_bound``).

    pre: request.num_tokens >= 1
    pre: bound is None or bound >= 0
    post: __return__ >= 0
    post: bound is not None or __return__ <= request.num_tokens - 1
    post: bound is not None or profile.hit_limit_at_construction or __return__ == request.num_tokens - 1
    post: bound is None or profile.hit_length_bound != "capped" or __return__ == min(lookup_length(profile, request, None), bound)
    post: bound is None or profile.hit_length_bound == "capped" or __return__ == bound
    """  # noqa: E501 - a PEP 316 condition is one line
    length = request.num_tokens - 1
    limit = request.prefix_cache_hit_limit
    if profile.hit_limit_at_construction and limit is not None:
        length = min(length, limit)
    if bound is None:
        return length
    return min(length, bound) if profile.hit_length_bound == "capped" else bound


def check_hit_length_bound(profile: SemanticsProfile, bound: object) -> None:
    """Raise UnsupportedOperationError for a bound before vLLM 0.33.0 (switch
    ``hit_length_bound``), InvalidTokenCountError for one that is not an int >= 0.

    raises: UnsupportedOperationError, InvalidTokenCountError
    post: bound is None or profile.hit_length_bound != "absent"
    post: bound is None or (isinstance(bound, int) and not isinstance(bound, bool) and bound >= 0)
    """
    if bound is None:
        return
    if profile.hit_length_bound == "absent":
        raise UnsupportedOperationError(f"get_computed_blocks(max_cache_hit_length=...): not in {profile.name}")
    if not isinstance(bound, int) or isinstance(bound, bool) or bound < 0:
        raise InvalidTokenCountError(f"get_computed_blocks: max_cache_hit_length {bound!r} is not an int >= 0")


def check_request(request: object) -> None:
    """Raise InvalidRequestError unless ``request`` is a :class:`Request` with a str id.

    raises: InvalidRequestError
    post: isinstance(request, Request) and isinstance(request.request_id, str)
    """
    if not isinstance(request, Request) or not isinstance(request.request_id, str):
        raise InvalidRequestError(f"expected a kvspec Request with a str request_id, got {request!r}")


def check_request_id(op: str, request_id: object) -> None:
    """Raise InvalidRequestError unless ``request_id`` is a str.

    raises: InvalidRequestError
    post: isinstance(request_id, str)
    """
    if not isinstance(request_id, str):
        raise InvalidRequestError(f"{op}: request_id must be a str, got {request_id!r}")


OPERATION_SWITCHES = {
    "pop_blocks_for_free": "deferred_free",
    "take_new_block_ids": "new_block_ids_list",
    "new_step_starts": "mamba_step_guard",
    "get_block_ids_for_computed_tokens": "computed_block_ids_op",
    "estimate_cached_tokens": "estimate_cached_tokens_op",
    "get_prefix_hint": "prefix_hint_op",
    "get_num_cached_tokens": "num_cached_tokens_op",
    "record_blocks_for_zeroing": "record_zeroing_op",
    "get_zeroing_block_ids_in_range": "zeroing_range_op",
    "get_computed_blocks_for_connector": "connector_lookup_op",
    "truncate_computed_blocks": "connector_lookup_op",
}
"""Facade operations that exist only with a profile switch on."""


def require_operation(profile: SemanticsProfile, op: str) -> None:
    """Raise UnsupportedOperationError if ``op`` does not exist in the
    profile's release: ``pop_blocks_for_free`` needs ``deferred_free``
    (``free_blocks`` stays: the pool's method exists, and with nothing
    popped every block it is given is a double free), ``take_new_block_ids`` needs ``new_block_ids_list``,
    ``new_step_starts`` needs ``mamba_step_guard``, ``get_block_ids_for_computed_tokens``
    needs ``computed_block_ids_op`` (all from vLLM 0.25.1), ``estimate_cached_tokens``
    needs ``estimate_cached_tokens_op`` (from 0.26.0), ``get_prefix_hint``
    needs ``prefix_hint_op`` (0.25.1 on), ``get_num_cached_tokens`` needs
    ``num_cached_tokens_op`` (0.34.0 on), ``record_blocks_for_zeroing`` needs
    ``record_zeroing_op`` (0.26.0 on), ``get_zeroing_block_ids_in_range``
    needs ``zeroing_range_op`` (0.26.0 to 0.31.0), the connector lookups need
    ``connector_lookup_op`` (0.27.0 on).

    pre: op in OPERATION_SWITCHES
    raises: UnsupportedOperationError
    post: getattr(profile, OPERATION_SWITCHES[op])
    """
    if not getattr(profile, OPERATION_SWITCHES[op]):
        raise UnsupportedOperationError(f"{op}: not in {profile.name}")


def estimate_from_tables(
    counts: Sequence[Sequence[int]], kinds: Sequence[AttentionKind], skip_uncacheable: bool
) -> int:
    """The smallest over the groups of each group's largest per-block token
    count (``counts[g]``: ``hash_num_tokens`` of each block of the request's
    table, 0 where a block has no key). Cross-attention groups never count;
    with ``skip_uncacheable`` neither do the ring kinds. 0 when no group counts.

    pre: len(counts) == len(kinds)
    pre: all(all(n >= 0 for n in c) for c in counts)
    post: __return__ >= 0
    post: all(__return__ <= max(c, default=0) for c, k in zip(counts, kinds) if not isinstance(k, CrossAttention) and (prefix_cacheable(k) or not skip_uncacheable))
    post: __return__ == 0 or __return__ in {max(c, default=0) for c in counts}
    post: not skip_uncacheable or __return__ >= estimate_from_tables(counts, kinds, False) or all(not prefix_cacheable(k) or isinstance(k, CrossAttention) for k in kinds)
    """  # noqa: E501 - a PEP 316 condition is one line
    found = [
        max(c, default=0)
        for c, kind in zip(counts, kinds, strict=True)
        if not isinstance(kind, CrossAttention) and (prefix_cacheable(kind) or not skip_uncacheable)
    ]
    return min(found, default=0)


def clip_to_computed(tables: BlockIds, kinds: Sequence[AttentionKind], num_computed_tokens: int) -> BlockIds:
    """Each attention group's table cut to the ``cdiv(num_computed_tokens,
    block_size)`` blocks that hold the computed tokens, in the engine's own
    block size (``kinds`` are the configured groups: under context
    parallelism that is the unscaled size, so the cut keeps more blocks than
    the scaled table needs). Mamba and cross-attention tables are whole (vLLM
    cuts only ``AttentionSpec`` groups other than cross attention).

    pre: len(tables) == len(kinds) and num_computed_tokens >= 0
    post: all(len(c) <= len(t) for c, t in zip(__return__, tables))
    post: all(c == tuple(t[: len(c)]) for c, t in zip(__return__, tables))
    post: all(len(c) == len(t) for c, t, k in zip(__return__, tables, kinds) if isinstance(k, Mamba | CrossAttention))
    post: all(len(c) == min(len(t), -(-num_computed_tokens // k.block_size)) for c, t, k in zip(__return__, tables, kinds) if not isinstance(k, Mamba | CrossAttention))
    """  # noqa: E501 - a PEP 316 condition is one line
    clipped: list[tuple[int, ...]] = []
    for table, kind in zip(tables, kinds, strict=True):
        whole = isinstance(kind, Mamba | CrossAttention)
        clipped.append(tuple(table) if whole else tuple(table[: -(-num_computed_tokens // kind.block_size)]))
    return tuple(clipped)


def check_admission_args(profile: SemanticsProfile, must_fit: bool, reserved: int, has_scheduled: bool) -> None:
    """Raise UnsupportedOperationError for an admission argument of
    ``allocate_slots`` the profile's release lacks: ``full_sequence_must_fit``
    before vLLM 0.21.0 (profile switch ``full_sequence_arg``),
    ``reserved_blocks`` before 0.23.0 (``reserved_blocks_arg``),
    ``has_scheduled_reqs`` before 0.24.0 (``admission_controls``).

    raises: UnsupportedOperationError
    post: profile.full_sequence_arg or not must_fit
    post: profile.reserved_blocks_arg or reserved == 0
    post: profile.admission_controls or has_scheduled
    """
    args = (
        ("full_sequence_must_fit", must_fit, False, profile.full_sequence_arg),
        ("reserved_blocks", reserved, 0, profile.reserved_blocks_arg),
        ("has_scheduled_reqs", has_scheduled, True, profile.admission_controls),
    )
    given = [f"{k}={v!r}" for k, v, d, has in args if v != d and not has]
    if given:
        raise UnsupportedOperationError(f"allocate_slots: {profile.name} has no {', '.join(given)}")


def check_skip_zeroing(profile: SemanticsProfile, num_groups: int, group_ids: object) -> frozenset[int]:
    """``skip_zeroing_group_ids`` of ``allocate_slots``, checked: the group
    ids as a set. The argument exists from vLLM 0.32.0 on
    (``skip_zeroing_arg``); before, only an empty one is accepted.

    raises: UnsupportedOperationError, GroupCountError
    post: all(0 <= g < num_groups for g in __return__)
    post: profile.skip_zeroing_arg or not __return__
    """
    if isinstance(group_ids, str | bytes) or not isinstance(group_ids, Iterable):
        raise GroupCountError(f"allocate_slots: skip_zeroing_group_ids {group_ids!r} is not a collection of group ids")
    ids = list(group_ids)
    if ids and not profile.skip_zeroing_arg:
        raise UnsupportedOperationError(f"allocate_slots: {profile.name} has no skip_zeroing_group_ids")
    for g in ids:
        if not is_int(g) or not 0 <= g < num_groups:
            raise GroupCountError(
                f"allocate_slots: skip_zeroing_group_ids names {g!r}, not a group of this model (0 to {num_groups - 1})"
            )
    return frozenset(ids)


def allocation_without_tokens(profile: SemanticsProfile, n_new: int, n_hit: int, n_external: int) -> bool:
    """Whether an allocation's token counts are acceptable: some new or
    external tokens, or, from vLLM 0.31.0 on, hit tokens to adopt (profile
    switch ``adopt_hit_without_new_tokens``).

    post: __return__ == (n_new > 0 or n_external > 0 or (profile.adopt_hit_without_new_tokens and n_hit > 0))
    post: not __return__ or allocation_without_tokens(replace(profile, adopt_hit_without_new_tokens=True), n_new, n_hit, n_external)
    """  # noqa: E501 - a PEP 316 condition is one line
    if n_new > 0 or n_external > 0:
        return True
    return profile.adopt_hit_without_new_tokens and n_hit > 0


def inv_ref_cnt_counts_holders(mgr: KVCacheManager) -> bool:
    """Every non-null block's ref_cnt equals its occurrences in all tables plus
    its pending (popped or retained, not yet freed) references plus one per
    end of a copy not taken yet."""
    held: Counter[int] = Counter(mgr.pending)
    for m in mgr.coordinator.managers:
        for table in m.req_to_blocks.values():
            held.update(b for b in table if b != NULL_BLOCK)
        held.update(b for pair in m.pending_copies for b in pair)
    pool = mgr.block_pool
    return all(pool.ref_cnt[b] == held[b] for b in range(1, pool.num_gpu_blocks))


def inv_group_exclusive(mgr: KVCacheManager) -> bool:
    """A non-null block appears in the tables of at most one group, and a
    hashed block in a group's table carries that group's id in its key."""
    owner: dict[int, int] = {}
    for g, m in enumerate(mgr.coordinator.managers):
        for table in m.req_to_blocks.values():
            for b in table:
                if b == NULL_BLOCK:
                    continue
                key = mgr.block_pool.block_hash[b]
                if owner.setdefault(b, g) != g or (key is not None and int.from_bytes(key[-4:], "big") != g):
                    return False
    return True


def hit_keys(
    fine: Sequence[BlockHash],
    hash_block_size: int,
    block_size: int,
    group_id: int,
    i: int,
    partial: bool,
    last_fine: bool = True,
) -> list[BlockHashWithGroupId]:
    """The keys under which the hit block at table index ``i`` may be cached
    for a request with hashes ``fine``: its full-block key (the coarse hash of
    :func:`kvspec.hashing.coarse_block_hashes`, ``last_fine`` as there); with
    ``partial`` (the last block of a fine-grained hit) also the key of any
    hash boundary inside the block (:mod:`kvspec.partial_hits`).

    pre: hash_block_size >= 1 and block_size >= 1 and block_size % hash_block_size == 0 and i >= 0
    pre: 0 <= group_id < 2 ** 32
    post: len(__return__) == ((i + 1) * (block_size // hash_block_size) <= len(fine)) + (partial and max(0, min((i + 1) * (block_size // hash_block_size) - 1, len(fine)) - i * (block_size // hash_block_size)))
    post: all(split_key(k)[1] == group_id for k in __return__)
    post: not last_fine or all(split_key(k)[0] in fine for k in __return__)
    """  # noqa: E501 - a PEP 316 condition is one line
    k = block_size // hash_block_size
    keys = []
    if (i + 1) * k <= len(fine):
        whole = fine[(i + 1) * k - 1] if last_fine else BlockHash(b"".join(fine[i * k : (i + 1) * k]))
        keys.append(make_key(whole, group_id))
    if partial:
        keys += [make_key(fine[j], group_id) for j in range(i * k, min((i + 1) * k - 1, len(fine)))]
    return keys


def hit_covers_length(config: KVCacheConfig, blocks: GroupBlocks, n: int, max_len: int, alignment: int) -> bool:
    """A hit never exceeds the lookup length ``max_len`` (``num_tokens - 1``
    unless the request's limit or a bound lowers it: :func:`lookup_length`), is a multiple of the hit
    alignment (the scheduler block size; the hash block size with
    fine-grained hits), and every group's list has the ``cdiv(n, bs)`` blocks
    that cover exactly ``n`` tokens (vLLM 0.25.1 breaks this in two places,
    registered as the divergences ``eagle-mamba-hit`` and ``second-full-group``);
    a ring group's list is always empty.

    pre: alignment >= 1 and len(blocks) == len(config.groups)
    post: not __return__ or 0 <= n <= max(max_len, 0) and n % alignment == 0
    post: not __return__ or all(not b for b, k in zip(blocks, config.manager_groups()) if not prefix_cacheable(k))
    post: __return__ or n > max(max_len, 0) or n % alignment or any(len(b) != (-(-n // k.block_size) if prefix_cacheable(k) else 0) for b, k in zip(blocks, config.manager_groups()))
    """  # noqa: E501 - a PEP 316 condition is one line
    exact = all(
        len(b) == -(-n // k.block_size) if prefix_cacheable(k) else not b
        for b, k in zip(blocks, config.manager_groups(), strict=True)
    )
    return n <= max(max_len, 0) and n % alignment == 0 and exact


def tables_cover_slots(mgr: KVCacheManager, request_id: str, slots: int) -> bool:
    """After an allocation, every group but Mamba and cross attention holds
    at least ``cdiv(slots, bs)`` entries; a ring group holds exactly one."""
    for kind, table in zip(mgr.kinds, mgr.get_blocks(request_id), strict=True):
        if isinstance(kind, RING_KINDS):
            if len(table) != 1:
                return False
        elif not isinstance(kind, Mamba | CrossAttention) and len(table) * kind.block_size < slots:
            return False
    return True


def inv_hash_content(mgr: KVCacheManager) -> bool:
    """A hashed block at table index ``i`` of group ``g`` is keyed by the
    request's prefix hash at ``(i+1)*bs`` tokens and ``g``, or, where its
    primary key stands for fewer tokens (a partial-tail entry that
    registered on the block after ``evict_blocks`` uncached it while the
    request held it), by the request's hash at that many tokens, which end
    inside the block. A Mamba group under a positional prefill-checkpoint
    form (vLLM 0.30.0 on) re-keys a checkpoint block to the checkpoint
    position (:func:`kvspec.prefill_checkpoints.rekey_checkpoint_block`),
    which may lie at or below the block's start (EAGLE's step back, a
    granularity coarser than the block) or past its end (a hash block finer
    than it): there the count may be any hash boundary, with the request's
    key at it where the request has a hash there. (A later step of the
    request that keyed a checkpoint can key it again further on while
    another request holds it as its hit, as vLLM 0.34.0 does: past that
    request's hashes nothing can be compared.)"""
    hbs = mgr.coordinator.hash_block_size
    pool = mgr.block_pool
    for g, m in enumerate(mgr.coordinator.managers):
        anywhere = isinstance(m, MambaManager) and positional_checkpoints(m.mamba, m.profile)
        for rid, table in m.req_to_blocks.items():
            req = mgr.requests.get(rid)
            if req is None or m.block_size % hbs:
                continue
            hashes = coarse_block_hashes(req.block_hashes, hbs, m.block_size, mgr.config.profile.coarse_hash_last_fine)
            bs = m.block_size
            for i, b in enumerate(table[: m.num_cached_block.get(rid, 0)]):
                key = pool.block_hash[b]
                if b == NULL_BLOCK or key is None:
                    continue
                n = pool.hash_num_tokens[b]
                if n is None or n <= 0 or n % hbs:
                    return False
                if anywhere and n != (i + 1) * bs:
                    if n <= len(req.block_hashes) * hbs and key != make_key(req.block_hashes[n // hbs - 1], g):
                        return False
                    continue
                if not i * bs < n <= (i + 1) * bs:
                    return False
                if key != make_key(hashes[i] if n == (i + 1) * bs else req.block_hashes[n // hbs - 1], g):
                    return False
    return True


def replay_events(keys: Counter[tuple[object, int | None]], events: Sequence[KVCacheEvent]) -> None:
    """Apply events to a multiset of (external hash, group) cache entries.

    post: not all(isinstance(e, BlockStored | BlockRemoved) for e in events) or sum(keys.values()) == sum(__old__.keys.values()) + sum(len(e.block_hashes) * (1 if isinstance(e, BlockStored) else -1) for e in events)
    post: not events or isinstance(events[-1], BlockStored | BlockRemoved) or not keys
    """  # noqa: E501 - a PEP 316 condition is one line
    for ev in events:
        if isinstance(ev, BlockStored):
            keys.update((h, ev.group_idx) for h in ev.block_hashes)
        elif isinstance(ev, BlockRemoved):
            keys.subtract((h, ev.group_idx) for h in ev.block_hashes)
        else:
            keys.clear()


def reports_hits(config: KVCacheConfig, request: Request) -> bool:
    """Whether a lookup that hits announces the hit blocks again: events on
    and the request in report mode "full", from vLLM 0.26.0 on (profile
    switch ``report_mode_full``).

    post: __return__ == (config.enable_kv_cache_events and config.profile.report_mode_full and request.kv_cache_report_mode == "full")
    """  # noqa: E501 - a PEP 316 condition is one line
    return config.enable_kv_cache_events and config.profile.report_mode_full and request.kv_cache_report_mode == "full"


def inv_events_replay_to_cache(mgr: KVCacheManager) -> bool:
    """With events on, replaying every event since construction rebuilds the
    cache map's entries exactly, once the re-announcements of report mode
    "full" (which store nothing) are taken out."""
    pool = mgr.block_pool
    if not pool.enable_kv_cache_events:
        return True
    keys = Counter(mgr.event_keys)
    replay_events(keys, pool.events)
    keys.subtract(pool.reannounced)
    expected: Counter[tuple[object, int | None]] = Counter()
    for key, ids in pool.cached.items():
        digest, gid = split_key(key)
        group = gid if annotated_events(pool) else None
        expected[(external_block_hash(digest, pool.int_block_hashes), group)] += len(ids)
    return {k: v for k, v in keys.items() if v} == expected
