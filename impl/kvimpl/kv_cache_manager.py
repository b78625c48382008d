"""The facade the scheduler sees: ``KVCacheManager``.

Block lists cross this boundary as block ids per group
(:data:`kvspec.view.BlockIds`). Every operation validates its arguments
first and raises a :mod:`kvspec.errors` class without changing anything.

kvimpl's copy of :mod:`kvspec.kv_cache_manager`, method for method in the
same order: the same checks in the same order, minus the spec's per-call
self-checks on the hot path (hit shape, table coverage), which
:meth:`KVCacheManager.check_invariants` covers. What kvimpl adds beyond the
spec's facade (the batched step API, the running-step fast path, device
block tables) is the base class :class:`kvimpl.step_api.StepAPI`; the
facade only calls into it where the spec has no counterpart: a running
``allocate_slots`` call is answered from the request's quiet-step limits
(the one test of them, inline here) or goes to
:meth:`StepAPI._running_step`, and every operation that changes a
request's tables or cache cursor drops its limits and refreshes its device
row. The module is as long as the spec's facade, which it mirrors.

Upstream: ``vllm/v1/core/kv_cache_manager.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import cast

from kvimpl.block_pool import NULL_BLOCK, TailBlockPool, coarse_hash
from kvimpl.checks import (
    REQUEST_TYPES,
    check_manager_arguments,
    check_request,
    check_request_id,
    check_skip_zeroing,
    check_zeroing_range,
    check_zeroing_start,
    is_int,
    out_of_memory,
)
from kvimpl.config_rules import (
    FULL_TYPE_KINDS,
    cacheable_blocks,
    clip_block_sizes,
    cp_lookup_refusal,
    estimate_groups,
    event_sliding_window,
    kind_name,
    lagging_hits,
    manager_kinds,
    prefix_cacheable,
    unmodelled_features,
)
from kvimpl.invariants import require
from kvimpl.kv_cache_coordinator import GroupBlocks, HybridCoordinator, make_coordinator
from kvimpl.single_type_kv_cache_manager import MambaManager
from kvimpl.step_api import WATERMARKED, StepAPI, inv_device_rows_match
from kvspec.block_pool import BlockId
from kvspec.config import AttentionKind, KVCacheConfig, Mamba
from kvspec.errors import (
    CacheBeyondAllocationError,
    ContextParallelLookupError,
    DoubleFreeError,
    ExceedsMaxModelLenError,
    GroupCountError,
    InvalidBlockIdError,
    InvalidTokenCountError,
    StaleHitError,
    UnexpectedPrefixHitError,
    UnknownRequestError,
    UnsupportedByProfileError,
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
from kvspec.profiles import SemanticsProfile
from kvspec.request import Request
from kvspec.stats import PrefixCacheStats
from kvspec.view import BlockIds, KVView

_NO_GROUPS: tuple[int, ...] = ()
"""The default ``skip_zeroing_group_ids`` (told apart by identity: the common call checks nothing)."""
_NO_SKIP: frozenset[int] = frozenset()


class KVCacheManager(StepAPI):
    """Allocates, caches and frees the KV-cache blocks of requests.

    inv: every invariant of the pool and of each manager
    inv: ref_cnt[b] == occurrences of b in all tables + in pending (popped or
         retained) lists + in the managers' pending copies
    inv: a non-null block is in the tables of at most one group
    """

    def __init__(self, config: KVCacheConfig, device: str | None = None) -> None:
        """An empty manager (SinkFull groups take their sink blocks now).

        Args:
            config: The cache configuration.
            device: None (the default) keeps no tensors at all; "cpu" or "cuda"
                also maintains a :class:`kvimpl.device_tables.BlockTable` (needs torch).

        Raises:
            UnsupportedByProfileError: If ``config`` needs a feature kvimpl does
                not model yet (:func:`kvimpl.config_rules.unmodelled_features`).
            ConfigError: For an argument kvimpl cannot build a manager from
                (:func:`kvimpl.checks.check_manager_arguments`), or a pool whose
                bookkeeping does not fit in memory.
        """
        check_manager_arguments(config)
        missing = unmodelled_features(config)
        if missing:
            raise UnsupportedByProfileError(f"{config.profile.name}: kvimpl does not model {', '.join(missing)} yet")
        self.config = config
        self.kinds = manager_kinds(config)
        """The kinds the managers run (context parallelism scales block sizes)."""
        self.enable_caching = config.enable_caching
        try:
            self.coordinator = make_coordinator(config)
        except MemoryError:
            raise out_of_memory(config) from None
        self.block_pool = self.coordinator.pool
        self.watermark_blocks = int(config.watermark * config.num_blocks)
        self.estimate_groups = estimate_groups(config)
        """The groups :meth:`estimate_cached_tokens` counts."""
        self.clip_sizes = clip_block_sizes(config)
        """Per group, the cut of :meth:`get_block_ids_for_computed_tokens` (0: whole)."""
        self.admission_controls = config.profile.admission_controls
        """Profile switch ``admission_controls`` (see :func:`check_admission_args`)."""
        self.pending: Counter[BlockId] = Counter()
        self.requests: dict[str, Request] = {}
        """Latest value of each request holding blocks (for :func:`inv_hash_content`)."""
        self.event_keys: Counter[tuple[object, int | None]] = Counter()
        """Cache keys implied by the events taken so far (:func:`inv_events_replay_to_cache`)."""
        self.prefix_cache_stats = PrefixCacheStats() if config.log_stats else None
        self.shared_prefix_boundary = self.coordinator.shared_prefix_boundary
        """Non-zero ``shared_prefix_boundary`` of each request's latest lookup
        (vLLM keeps it on the request; :meth:`get_prefix_hint`; the coordinator
        owns the dict, which the group managers' retention masks read)."""
        p = config.profile
        self.stats_at_lookup = p.stats_at_lookup
        self.lookup_returns_boundary = p.lookup_returns_boundary
        """Profile switch read by :meth:`get_prefix_hint`."""
        self.reports_hits = config.enable_kv_cache_events and p.report_mode_full
        """A hit of a request in report mode "full" is announced again (profile switch ``report_mode_full``)."""
        """Profile switch: lookups record the statistics (else ``record_prefix_cache_stats`` does)."""
        self.adopt_hit_without_new_tokens = p.adopt_hit_without_new_tokens
        """Profile switch read by :func:`allocation_without_tokens`."""
        self.common_prefix = p.common_prefix
        """Profile switch ``common_prefix``: ``get_num_common_prefix_blocks`` counts, answers zeros or is gone."""
        self.partial_hash_hits_op = p.partial_hash_hits
        """Profile switch ``partial_hash_hits``: :meth:`take_kv_cache_block_copies` exists."""
        self.has_mamba = any(isinstance(k, Mamba) for k in config.groups)
        self.lagging_hits = lagging_hits(config)
        """Whether ``allocate_slots`` takes hit lists that lag the hit outside full-attention groups
        (those a connector's lookup returns: :func:`hit_list_fits`; :func:`kvimpl.config_rules.lagging_hits`)."""
        StepAPI.__init__(self, device)

    @property
    def usage(self) -> float:
        """Fraction of non-null blocks in use (cached free blocks count as free)."""
        return self.block_pool.get_usage()

    def get_computed_blocks(self, request: Request, max_cache_hit_length: int | None = None) -> tuple[BlockIds, int]:
        """The longest prefix-cache hit, at most ``num_tokens - 1`` tokens (the
        last token is always recomputed for its logits; :func:`lookup_length`
        says how the request's limit and ``max_cache_hit_length`` change that).
        Changes nothing: the hit blocks are only pinned by ``allocate_slots``.

        Raises:
            UnsupportedOperationError: ``max_cache_hit_length`` before vLLM 0.33.0.
            InvalidTokenCountError: ``max_cache_hit_length`` is not None or an int >= 0.
            ContextParallelLookupError: A sliding-window, chunked-local or Mamba
                group under context parallelism (:func:`kvimpl.config_rules.cp_lookup_refusal`).
            EagleAlignmentLookupError: vLLM 0.16.0's assertion on a sliding-window
                EAGLE hit in a group whose block is not the scheduler block
                (:func:`kvimpl.kv_cache_coordinator.v016_spec_group_hit`).
        """
        check_request(request)
        p = self.config.profile
        check_hit_length_bound(p, max_cache_hit_length)
        reads = self.enable_caching and reads_prefix_cache(p, request)
        if reads:
            self._check_cp_lookup()
        self.shared_prefix_boundary.pop(request.request_id, None)
        if not reads:
            return self._ids(tuple([] for _ in self.config.groups)), 0
        max_len = lookup_length(p, request, max_cache_hit_length)
        blocks, n = self.coordinator.find_longest_cache_hit(request.block_hashes, max_len)
        if n > 0 and self.reports_hits and request.kv_cache_report_mode == "full":
            self.coordinator.emit_cached_block_events(request, blocks)
        uncached = self.coordinator.num_uncached_common_prefix_tokens
        if uncached:
            self.shared_prefix_boundary[request.request_id] = n + uncached
        if self.prefix_cache_stats is not None and self.stats_at_lookup:
            self.prefix_cache_stats.record(request.num_tokens, n, request.num_preemptions > 0)
        return self._ids(blocks), n

    def get_num_cached_tokens(self, request: Request) -> int:
        """How many leading tokens of ``request`` a lookup would hit now
        (vLLM 0.34.0 on; kvspec's ``KVCacheManager.get_num_cached_tokens``).
        Changes nothing.

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
        """A KV connector's local lookup (vLLM 0.27.0 on; kvspec's
        ``KVCacheManager.get_computed_blocks_for_connector``): in a cached
        hybrid with a Mamba group and a full-attention group, each group's own
        hit, the full-attention group's length, and whether a group lags
        behind it; else :meth:`get_computed_blocks` with the flag off.
        Changes nothing.

        Raises:
            UnsupportedOperationError: Before vLLM 0.27.0 (switch ``connector_lookup_op``).
            InvalidTokenCountError, ContextParallelLookupError, EagleAlignmentLookupError:
                As :meth:`get_computed_blocks`.
        """
        p = self.config.profile
        require_operation(p, "get_computed_blocks_for_connector")
        check_request(request)
        check_hit_length_bound(p, max_cache_hit_length)
        coord = self.coordinator
        fa = coord.full_attention_group_id if isinstance(coord, HybridCoordinator) else None
        if fa is None or not isinstance(coord, HybridCoordinator) or not self.has_mamba:
            blocks, n = self.get_computed_blocks(request, max_cache_hit_length)
            return blocks, n, False
        self.shared_prefix_boundary.pop(request.request_id, None)
        if not reads_prefix_cache(p, request):
            return self._ids(tuple([] for _ in self.config.groups)), 0, False
        per_group, hits = coord.find_longest_cache_hit_per_group(
            request.block_hashes, lookup_length(p, request, max_cache_hit_length)
        )
        if max(hits) > hits[fa]:
            found, n = self.get_computed_blocks(request, max_cache_hit_length)
            return found, n, False
        return self._ids(per_group), hits[fa], min(hits) < hits[fa]

    def truncate_computed_blocks(self, blocks: Sequence[Sequence[int]], num_computed_tokens: int) -> BlockIds:
        """A lookup's result cut to its first ``num_computed_tokens`` tokens
        (vLLM 0.27.0 on; kvspec's ``KVCacheManager.truncate_computed_blocks``):
        pure slicing per group (:func:`truncated_group`).

        Raises:
            UnsupportedOperationError: Before vLLM 0.27.0.
            GroupCountError, InvalidBlockIdError, InvalidTokenCountError, StaleHitError:
                As kvspec's.
        """
        require_operation(self.config.profile, "truncate_computed_blocks")
        return truncated_lists(self.config, self.kinds, blocks, num_computed_tokens)

    def _check_cp_lookup(self) -> None:
        if len(self.kinds) == 1:
            refusal = cp_lookup_refusal(self.config.groups[0], self.config)
            if refusal is not None:
                raise ContextParallelLookupError(f"get_computed_blocks: {refusal}")

    def get_prefix_hint(self, request: Request) -> int:
        """The prefix hint vLLM's scheduler reads right after ``request``'s
        lookup (kvspec's ``KVCacheManager.get_prefix_hint``): the coordinator's
        ``num_uncached_common_prefix_tokens`` up to vLLM 0.25.1, the request's
        ``shared_prefix_boundary`` from 0.26.0 on. Changes nothing.

        Raises:
            UnsupportedOperationError: In vLLM 0.16.0 (switch ``prefix_hint_op``).
            InvalidRequestError: ``request`` is not a Request.
        """
        require_operation(self.config.profile, "get_prefix_hint")
        check_request(request)
        if self.lookup_returns_boundary:
            return self.shared_prefix_boundary.get(request.request_id, 0)
        return self.coordinator.num_uncached_common_prefix_tokens

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        """Record one admitted request's lookup in the statistics (vLLM 0.27.0
        on, where the scheduler calls it after a successful admission; before,
        ``get_computed_blocks`` records and this method does not exist).
        Nothing is recorded without ``log_stats``, with caching off or when the
        request does not read the prefix cache (:func:`reads_prefix_cache`).

        Raises:
            UnsupportedOperationError: Before vLLM 0.27.0.
            InvalidTokenCountError: A negative ``num_hits``.
        """
        if self.stats_at_lookup:
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
        skip_zeroing_group_ids: Iterable[int] = _NO_GROUPS,
    ) -> BlockIds | None:
        """Give the request slots for its new tokens; None if they do not fit.

        Let C = computed tokens, H = new hit tokens, E = external (connector)
        tokens, N = new tokens, K = lookahead slots, L = max_model_len.
        Slots are needed for ``min(C+H+E+N+K, L)`` tokens. A waiting or
        preempted request must also leave ``watermark_blocks`` free when
        ``has_scheduled_reqs``; the main check also leaves ``reserved_blocks``.
        With ``full_sequence_must_fit`` the whole request (SWA and chunked
        local capped per request) must fit first. Blocks outside the attention
        window are freed *before* the capacity check, even when it fails. The
        groups of ``skip_zeroing_group_ids`` (vLLM 0.32.0 on) do not list the
        blocks they take for external tokens for zeroing.

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
        if not self.admission_controls:
            check_admission_args(self.config.profile, full_sequence_must_fit, reserved_blocks, has_scheduled_reqs)
        quiet = _NO_SKIP
        if skip_zeroing_group_ids is not _NO_GROUPS:
            quiet = check_skip_zeroing(self.config.profile, len(self.kinds), skip_zeroing_group_ids)
        if (
            type(request) in REQUEST_TYPES
            and new_computed_blocks is None
            and num_new_computed_tokens is num_external_computed_tokens is num_encoder_tokens is _ZERO
            and reserved_blocks is _ZERO
            and not full_sequence_must_fit
            and type(num_new_tokens) is int
            and type(num_lookahead_tokens) is int
            and type(c := request.num_computed_tokens) is int
            and type(f := request.num_in_flight_tokens) is int
            and num_new_tokens > 0
            and num_lookahead_tokens >= 0
            and c >= 0
            and f >= 0
            and (end := c + num_new_tokens) <= self._max_len
        ):  # fmt: skip
            # A running step whose arguments pass every check below: kvimpl's fast path. Exact
            # types only (``type(x) is int`` refuses bools; the four unused counts must be the int 0
            # itself, which CPython keeps as one object); anything else takes the ordinary path and
            # its checks. A quiet step (the limits of StepAPI._set_quiet hold) only records the
            # request's latest value; any other takes StepAPI._running_step. The test is inline: a
            # call costs 40% of a quiet step.
            rid = request.request_id
            q = self._quiet.get(rid)  # only str ids that passed an allocation's checks have limits
            if (
                q is not None
                and c < q[2]
                and end + num_lookahead_tokens <= q[0]
                and (end < q[1] or request.num_tokens < q[1])
                and request.status not in WATERMARKED
            ):
                self.requests[rid] = request
                return self._no_hits
            if type(rid) is str:
                return self._running_step(
                    request, num_new_tokens, num_lookahead_tokens, has_scheduled_reqs, not delay_cache_blocks
                )
        hits = self._validate_allocation(
            request, num_new_tokens, num_new_computed_tokens, new_computed_blocks, num_lookahead_tokens,
            num_external_computed_tokens, num_encoder_tokens, reserved_blocks,
        )  # fmt: skip
        local = request.num_computed_tokens + num_new_computed_tokens
        total = min(local + num_external_computed_tokens, self.config.max_model_len)
        wm = self.watermark_blocks if has_scheduled_reqs and request.status in WATERMARKED else 0
        coord, rid = self.coordinator, request.request_id
        self._forget_quiet(rid)
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.config.max_model_len)
            need = coord.get_num_blocks_to_allocate(
                rid, full, hits, num_encoder_tokens, total, full, True, num_local=local, request=request
            )
            if need + wm > self.block_pool.get_num_free_blocks():
                return None
        main = total + num_new_tokens
        slots = min(main + num_lookahead_tokens, self.config.max_model_len)
        coord.remove_skipped_blocks(rid, skip_basis(self.skip_on_processed, total, request.num_in_flight_tokens))
        need = coord.get_num_blocks_to_allocate(
            rid, slots, hits, num_encoder_tokens, local + num_external_computed_tokens, main,
            num_external=num_external_computed_tokens, num_local=local, request=request,
        )  # fmt: skip
        if need + wm > self.block_pool.get_num_free_blocks() - reserved_blocks:
            self._sync_device_row(rid)
            return None
        if any(hits) or num_external_computed_tokens > 0:
            coord.allocate_new_computed_blocks(rid, hits, local, num_external_computed_tokens, quiet)
        new = coord.allocate_new_blocks(rid, slots, main, num_encoder_tokens)
        self.requests[rid] = request
        if self.enable_caching and not delay_cache_blocks:
            coord.cache_blocks(request, min(total + num_new_tokens, request.num_tokens))
        self._sync_device_row(rid)
        self._set_quiet(rid)
        return self._ids(new)

    def free(self, request_id: str) -> None:
        """Free the request's blocks, each group's table last entry first, in
        group order. Lenient: an unknown request is a no-op (as in vLLM)."""
        check_request_id("free", request_id)
        self.requests.pop(request_id, None)
        self.coordinator.free(request_id)
        self._forget_request(request_id)

    def pop_blocks_for_free(self, request_id: str) -> tuple[BlockId, ...]:
        """Forget the request but keep its references: the blocks (groups
        concatenated) are *pending* until the caller passes them to
        :meth:`free_blocks`, normally reversed. Unknown request → ()."""
        require_operation(self.config.profile, "pop_blocks_for_free")
        check_request_id("pop_blocks_for_free", request_id)
        self.requests.pop(request_id, None)
        blocks = tuple(self.coordinator.pop_blocks_for_free(request_id))
        self.pending.update(b for b in blocks if b != NULL_BLOCK)
        self._forget_request(request_id)
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
        self._forget_quiet(request_id)
        self.coordinator.remove_skipped_blocks(request_id, total_computed_tokens)
        self._sync_device_row(request_id)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop blocks from the prefix cache (ascending id order); references
        and queue positions stay."""
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        """Forget every hash if only the null block is in use."""
        if not self.block_pool.reset_prefix_cache():
            return False
        self._quiet.clear()  # hashes are gone: any cache limit may be stale
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    def get_num_common_prefix_blocks(self, request_id: str) -> tuple[int, ...]:
        """Per group, the leading blocks of the request's table that every
        request with a table in that group holds (0 for non-full kinds); from
        vLLM 0.32.0 on always zeros, and gone in 0.34.0 (profile switch ``common_prefix``).

        Raises:
            UnsupportedOperationError: From vLLM 0.34.0 on.
            UnknownRequestError: If the request holds no block.
        """
        if self.common_prefix == "absent":
            raise UnsupportedOperationError(f"get_num_common_prefix_blocks: not in {self.config.profile.name}")
        check_request_id("get_num_common_prefix_blocks", request_id)
        if not any(m.req_to_blocks.get(request_id) for m in self.coordinator.managers):
            raise UnknownRequestError(f"get_num_common_prefix_blocks: request {request_id!r} holds no blocks")
        if self.common_prefix == "zero":
            return (0,) * len(self.config.groups)
        return tuple(self.coordinator.get_num_common_prefix_blocks(request_id))

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the events; BlockStored gets its group's kind and window."""
        events = [self._annotate(ev) for ev in self.block_pool.take_events()]
        replay_events(self.event_keys, events)
        return events

    def _annotate(self, ev: KVCacheEvent) -> KVCacheEvent:
        """A BlockStored event with its group's kind and window (vLLM 0.22.0 on,
        profile switch ``event_annotations``)."""
        if not isinstance(ev, BlockStored) or ev.group_idx is None or not self.config.profile.event_annotations:
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
        """The request's tables cut to its first ``num_computed_tokens`` tokens
        per :func:`kvimpl.config_rules.clip_block_sizes` (vLLM 0.25.1 on);
        changes nothing.

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
        tables = self.get_blocks(request_id)
        n = num_computed_tokens
        return tuple(t[: -(-n // bs)] if bs else t for t, bs in zip(tables, self.clip_sizes, strict=True))

    def estimate_cached_tokens(self, request: Request) -> int:
        """How many leading tokens ``request``'s cached blocks stand for (vLLM
        0.26.0 on): per group of :func:`kvimpl.config_rules.estimate_groups`
        the largest prefix length a key of its table stands for, then the
        smallest over those groups (0 when none). Changes nothing.

        NOTE: a key's prefix length is its table position times the group's
        block size (a block is cached at the position it holds in every table
        that shares it); only a pool with tail entries records lengths,
        because a tail key stands for less than its block.

        Raises:
            UnsupportedOperationError: Before vLLM 0.26.0.
            InvalidRequestError: ``request`` is not a Request.
        """
        require_operation(self.config.profile, "estimate_cached_tokens")
        check_request(request)
        pool = self.block_pool
        counts: list[int | None] | None = getattr(pool, "hash_num_tokens", None)
        rid, managers = request.request_id, self.coordinator.managers
        found = [
            table_cached_tokens(
                managers[g].req_to_blocks.get(rid, ()), pool.block_hash, counts, self.kinds[g].block_size
            )
            for g in self.estimate_groups
        ]
        return min(found, default=0)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Hash full blocks up to ``num_computed_tokens`` (after a delayed
        allocation); no-op with caching off.

        Raises:
            InvalidTokenCountError: A negative count.
            CacheBeyondAllocationError: Tokens beyond the request or its tables.
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
        rid = request.request_id
        for g, (kind, m) in enumerate(zip(self.kinds, self.coordinator.managers, strict=True)):
            have = cacheable_blocks(kind, len(m.req_to_blocks.get(rid, ())))
            if have is not None and num_computed_tokens // kind.block_size > have:
                raise CacheBeyondAllocationError(
                    f"cache_blocks: group {g} holds {have} blocks for tokens, fewer than "
                    f"{num_computed_tokens // kind.block_size} full blocks to cache"
                )
        self._forget_quiet(rid)
        self.coordinator.cache_blocks(request, num_computed_tokens)
        self.requests[rid] = request

    def take_new_block_ids(self) -> list[BlockId]:
        """Drain the fresh block ids of the groups that record them, in group
        order (UnsupportedOperationError before vLLM 0.25.1)."""
        require_operation(self.config.profile, "take_new_block_ids")
        return [b for m in self.coordinator.managers for b in m.take_new_block_ids()]

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """List the request's blocks from ``start_token`` on for zeroing again,
        in the groups that list fresh blocks, group order then table order
        (vLLM 0.26.0 on; kvspec's ``KVCacheManager.record_blocks_for_zeroing``).

        Raises:
            UnsupportedOperationError: Before vLLM 0.26.0.
            InvalidRequestError: ``request_id`` is not a str.
            InvalidTokenCountError: ``start_token`` is not an int >= 0 or not a
                multiple of such a group's block size (nothing listed).
        """
        require_operation(self.config.profile, "record_blocks_for_zeroing")
        check_request_id("record_blocks_for_zeroing", request_id)
        listing = [m for m in self.coordinator.managers if m.records_new_ids]
        check_zeroing_start(start_token, [(m.group_id, m.block_size) for m in listing])
        for m in listing:
            m.record_for_zeroing(request_id, start_token // m.block_size)

    def get_zeroing_block_ids_in_range(self, request_id: str, start_token: int, end_token: int) -> list[BlockId]:
        """The request's table entries covering tokens ``[start_token,
        end_token)`` in the groups that list fresh blocks, group order then
        table order, nulls included (vLLM 0.26.0 to 0.31.0; kvspec's
        ``KVCacheManager.get_zeroing_block_ids_in_range``). Nothing changes.

        Raises:
            UnsupportedOperationError: Outside vLLM 0.26.0 to 0.31.0.
            InvalidRequestError: ``request_id`` is not a str.
            InvalidTokenCountError: ``start_token`` is not an int >= 0, or
                ``end_token`` not an int >= ``start_token``.
        """
        require_operation(self.config.profile, "get_zeroing_block_ids_in_range")
        check_request_id("get_zeroing_block_ids_in_range", request_id)
        start, end = check_zeroing_range(start_token, end_token)
        ids: list[BlockId] = []
        for m in self.coordinator.managers:
            if m.records_new_ids:
                ids += m.req_to_blocks.get(request_id, [])[start // m.block_size : -(-end // m.block_size)]
        return ids

    def take_kv_cache_block_copies(self) -> tuple[list[tuple[BlockId, BlockId]], list[BlockId]]:
        """Drain the copy-on-write copies of fine-grained hits (vLLM 0.26.0 on;
        :mod:`kvimpl.partial_hits`): ``(source, copy)`` pairs in group order,
        oldest first, and the retained blocks ``[source0, copy0, source1, ...]``.
        Each retained block holds one reference until the caller releases it
        with :meth:`free_blocks` (it is pending, like a popped block).

        Raises:
            UnsupportedOperationError: Before vLLM 0.26.0.
        """
        if not self.partial_hash_hits_op:
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
            free_queue=tuple(pool.free_order()),
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
        if self.device_tables is not None:
            self.device_tables.check_invariants()
            require(inv_device_rows_match(self), "a device block-table row differs from the request's tables")

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
        counts = (
            n_new, n_hit, n_lookahead, n_external, n_encoder, reserved, request.num_computed_tokens,
            request.num_in_flight_tokens,
        )  # fmt: skip
        # Exact ints (every call but a caller's mistake) pass in two C loops; anything else is checked per count.
        exact = {*map(type, counts)} == _INT_ONLY and min(counts) >= 0
        if not exact and not all(is_int(v) and v >= 0 for v in counts):
            _raise_bad_count(*counts)
        if not allocation_without_tokens(self.adopt_hit_without_new_tokens, n_new, n_hit, n_external):
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
        has_hits = hits is not None and any(hits)
        if not has_hits and n_external <= 0:
            return self._no_hits
        rid = request.request_id
        managers = self.coordinator.managers
        holds = any(rid in m.num_cached_block or m.req_to_blocks.get(rid) for m in managers)
        if holds:
            raise UnexpectedPrefixHitError(
                f"allocate_slots: request {rid!r} already holds blocks; prefix hits and external "
                "tokens are only accepted on a request's first allocation"
            )
        if hits is None or not has_hits:
            return self._no_hits
        self._validate_hits(request, hits, n_hit)
        return cast(tuple[tuple[BlockId, ...], ...], tuple(tuple(g) for g in hits))

    def _validate_hits(self, request: Request, hits: BlockIds, n_hit: int) -> None:
        rid, n_blocks = request.request_id, self.config.num_blocks
        for ids in hits:
            for b in ids:
                if not 0 <= b < n_blocks:
                    raise InvalidBlockIdError(f"allocate_slots: hit block id {b} is outside the pool")
        if not self.enable_caching:
            raise StaleHitError(f"allocate_slots: prefix caching is off, so request {rid!r} can have no hit")
        for g, kind in enumerate(self.config.groups):
            if not prefix_cacheable(kind) and hits[g]:
                raise StaleHitError(f"allocate_slots: a hit in group {g}, a ring group, which is never cached")
            if isinstance(kind, FULL_TYPE_KINDS) and NULL_BLOCK in hits[g]:
                raise StaleHitError(
                    f"allocate_slots: the null block in group {g}'s hit: a full-attention hit never contains it"
                )
        for g, kind in enumerate(self.kinds):
            need = -(-n_hit // kind.block_size)
            if prefix_cacheable(kind) and not hit_list_fits(kind, len(hits[g]), need, self.lagging_hits):
                raise StaleHitError(
                    f"allocate_slots: group {g}'s hit has {len(hits[g])} blocks, but {n_hit} hit tokens take {need} "
                    f"(block size {kind.block_size}): get_computed_blocks never returns such a hit"
                )
        hbs, partial_hits = self.coordinator.hash_block_size, self.coordinator.partial_hash_hits
        pool = self.block_pool
        fine, bh, last_fine = request.block_hashes, pool.block_hash, pool.coarse_hash_last_fine
        for g, (kind, ids) in enumerate(zip(self.kinds, hits, strict=True)):
            k = kind.block_size // hbs if kind.block_size % hbs == 0 else 0
            num_hashes = len(fine) // k if k else 0
            suffix = make_key(BlockHash(b""), g)  # make_key(h, g) == h + suffix, inlined below
            last = len(ids) - 1
            for i, b in enumerate(ids):
                if b == NULL_BLOCK or (i < num_hashes and bh[b] == coarse_hash(fine, i, k, last_fine) + suffix):
                    continue
                # Not the primary key: a secondary one (kvimpl.block_pool.TailBlockPool) counts too,
                # and the last block of a fine-grained hit may be cached at a hash boundary inside it.
                keys = pool.keys_of(BlockId(b))
                full = i < num_hashes and coarse_hash(fine, i, k, last_fine) + suffix in keys
                inner = k > 0 and partial_hits and i == last and partial_hit_keyed(fine, k, i, suffix, keys)
                if not full and not inner:
                    raise StaleHitError(
                        f"allocate_slots: hit block {b} (group {g}, index {i}) is no longer cached for "
                        f"request {rid!r}; it was evicted after get_computed_blocks"
                    )

    @staticmethod
    def _ids(blocks: GroupBlocks) -> BlockIds:
        return tuple(tuple(g) for g in blocks)


_ZERO = 0
"""The int 0, compared by identity on the fast path (see ``allocate_slots``)."""
_INT_ONLY = {int}
"""The set of types of counts that are all exact ints (see ``_validate_allocation``)."""


def inv_ref_cnt_counts_holders(mgr: KVCacheManager) -> bool:
    """Every non-null block's ref_cnt equals its occurrences in all tables plus
    its pending (popped or retained, not yet freed) references plus one per
    end of a copy not taken yet."""
    held: Counter[int] = Counter(mgr.pending)
    for m in mgr.coordinator.managers:
        for table in m.req_to_blocks.values():
            held.update(b for b in table if b != NULL_BLOCK)
        held.update(b for pair in m.pending_copies for b in pair)
    ref = mgr.block_pool.ref_cnt
    return all(ref[b] == held[b] for b in range(1, len(ref)))


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


def inv_hash_content(mgr: KVCacheManager) -> bool:
    """A hashed block at table index ``i`` of group ``g`` is keyed by the
    request's prefix hash at ``(i+1)*bs`` tokens and ``g``, or, where its
    primary key stands for fewer tokens (a partial-tail entry that
    registered on the block after ``evict_blocks`` uncached it while the
    request held it), by the request's hash at that many tokens, which end
    inside the block. In a Mamba group with positional checkpoints
    (:mod:`kvimpl.prefill_checkpoints`) a checkpoint block holds the state
    at its position, which may lie at or below the block's start (EAGLE's
    step back, a granularity coarser than the block) or past its end (a hash
    block finer than it): any hash boundary of the request's tokens."""
    hbs = mgr.coordinator.hash_block_size
    pool = mgr.block_pool
    tails = pool.hash_num_tokens if isinstance(pool, TailBlockPool) else None  # else every key is a full one
    for g, m in enumerate(mgr.coordinator.managers):
        anywhere = isinstance(m, MambaManager) and m.positional
        for rid, table in m.req_to_blocks.items():
            req = mgr.requests.get(rid)
            if req is None or m.block_size % hbs:
                continue
            hashes = coarse_block_hashes(req.block_hashes, hbs, m.block_size, mgr.block_pool.coarse_hash_last_fine)
            bs = m.block_size
            for i, b in enumerate(table[: m.num_cached_block.get(rid, 0)]):
                key = pool.block_hash[b]
                if b == NULL_BLOCK or key is None:
                    continue
                n = (i + 1) * bs if tails is None else tails[b]
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
    """Apply events to a multiset of (external hash, group) cache entries."""
    for ev in events:
        if isinstance(ev, BlockStored):
            keys.update((h, ev.group_idx) for h in ev.block_hashes)
        elif isinstance(ev, BlockRemoved):
            keys.subtract((h, ev.group_idx) for h in ev.block_hashes)
        else:
            keys.clear()


def inv_events_replay_to_cache(mgr: KVCacheManager) -> bool:
    """With events on, replaying every event since construction rebuilds the
    cache map's entries exactly."""
    pool = mgr.block_pool
    if not pool.enable_kv_cache_events:
        return True
    keys = Counter(mgr.event_keys)
    replay_events(keys, pool.events)
    keys.subtract(pool.reannounced)
    expected: Counter[tuple[object, int | None]] = Counter()
    for key, ids in pool.cached.items():
        digest, gid = split_key(key)
        group = gid if pool.annotated_events else None
        expected[(external_block_hash(digest, pool.int_block_hashes), group)] += len(ids)
    return {k: v for k, v in keys.items() if v} == expected


_OPERATION_SWITCHES = {
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


def hit_list_fits(kind: AttentionKind, length: int, need: int, lagging: bool) -> bool:
    """Whether a hit list of ``length`` blocks goes with a hit of ``need``
    blocks: exactly, or fewer in a group not of a full-attention type where a
    connector's lookup lets groups lag (kvspec's ``hit_list_fits``)."""
    return length == need or (lagging and not isinstance(kind, FULL_TYPE_KINDS) and length < need)


def truncated_lists(
    config: KVCacheConfig, kinds: Sequence[AttentionKind], blocks: Sequence[Sequence[int]], n: int
) -> BlockIds:
    """``truncate_computed_blocks`` of both builds after its release check: the
    caller errors, then :func:`truncated_group` per group (``kinds``: the
    groups at the block sizes the managers run them)."""
    if not is_int(n) or n < 0:
        raise InvalidTokenCountError(f"truncate_computed_blocks: num_computed_tokens {n!r} is not an int >= 0")
    if len(blocks) != len(config.groups):
        raise GroupCountError(
            f"truncate_computed_blocks: {len(blocks)} groups of blocks, the config has {len(config.groups)}"
        )
    for b in (b for ids in blocks for b in ids):
        if not is_int(b) or not 0 <= b < config.num_blocks:
            raise InvalidBlockIdError(f"truncate_computed_blocks: block id {b!r} is outside the pool")
    keep = config.profile.truncate_mamba_lagging
    pairs = enumerate(zip(kinds, blocks, strict=True))
    return tuple(tuple(truncated_group(kind, list(ids), n, g, keep)) for g, (kind, ids) in pairs)


def truncated_group(kind: AttentionKind, ids: list[int], n: int, group: int, keep_lagging_mamba: bool) -> list[int]:
    """One group's list cut to ``n`` tokens (kvspec's ``truncated_group``)."""
    if not prefix_cacheable(kind):
        if ids:
            raise StaleHitError(f"truncate_computed_blocks: blocks for group {group}, a ring group (never cached)")
        return []
    bs = kind.block_size
    if n % bs:
        raise InvalidTokenCountError(
            f"truncate_computed_blocks: {n} tokens is not a multiple of group {group}'s block size {bs}"
        )
    keep = n // bs
    if keep > len(ids) and not (isinstance(kind, Mamba) and keep_lagging_mamba):
        raise InvalidTokenCountError(
            f"truncate_computed_blocks: {n} tokens take {keep} blocks of group {group}, which has {len(ids)}"
        )
    return ids[:keep]


def partial_hit_keyed(
    fine: Sequence[BlockHash], k: int, i: int, suffix: bytes, keys: Sequence[BlockHashWithGroupId]
) -> bool:
    """Whether the last hit block at table index ``i`` of a fine-grained hit
    is cached under the key of a hash boundary inside it (``k`` hash units a
    block, the group's key ``suffix``): kvspec's ``hit_keys`` with
    ``partial``, less the full-block key the caller tried first.

    pre: k >= 1 and i >= 0
    """
    return any(fine[j] + suffix in keys for j in range(i * k, min((i + 1) * k - 1, len(fine))))


def table_cached_tokens(
    table: Sequence[BlockId], keys: Sequence[object | None], counts: Sequence[int | None] | None, block_size: int
) -> int:
    """The largest prefix length a keyed block of ``table`` stands for: its
    recorded length where ``counts`` are kept, else (position + 1) x
    ``block_size`` of the last keyed block; 0 without a keyed block."""
    if counts is not None:
        return max((counts[b] or 0 for b in table), default=0)
    for i in range(len(table) - 1, -1, -1):
        if keys[table[i]] is not None:
            return (i + 1) * block_size
    return 0


def reads_prefix_cache(profile: SemanticsProfile, request: Request) -> bool:
    """Whether ``request`` may read the prefix cache (caching aside): its
    ``prefix_cache_hit_limit`` is not 0 (fixed when it was made) from vLLM
    0.34.0 on (switch ``hit_limit_at_construction``), else it does not skip
    reading now (kvspec's ``reads_prefix_cache``)."""
    if profile.hit_limit_at_construction:
        return getattr(request, "prefix_cache_hit_limit", None) != 0
    return not request.skip_reading_prefix_cache


def lookup_length(profile: SemanticsProfile, request: Request, bound: int | None) -> int:
    """The longest hit a lookup of ``request`` may return (kvspec's
    ``lookup_length``): ``num_tokens - 1``, lowered by the request's limit
    from vLLM 0.34.0 on; an explicit ``bound`` replaces it as given in 0.33.0
    and can only lower it from 0.34.0 on (switch ``hit_length_bound``)."""
    length: int = request.num_tokens - 1
    limit = getattr(request, "prefix_cache_hit_limit", None)
    if profile.hit_limit_at_construction and limit is not None:
        length = min(length, limit)
    if bound is None:
        return length
    return min(length, bound) if profile.hit_length_bound == "capped" else bound


def check_hit_length_bound(profile: SemanticsProfile, bound: object) -> None:
    """Raise UnsupportedOperationError for a bound before vLLM 0.33.0,
    InvalidTokenCountError for one that is not an int >= 0."""
    if bound is None:
        return
    if profile.hit_length_bound == "absent":
        raise UnsupportedOperationError(f"get_computed_blocks(max_cache_hit_length=...): not in {profile.name}")
    if not isinstance(bound, int) or isinstance(bound, bool) or bound < 0:
        raise InvalidTokenCountError(f"get_computed_blocks: max_cache_hit_length {bound!r} is not an int >= 0")


def require_operation(profile: SemanticsProfile, op: str) -> None:
    """Raise UnsupportedOperationError if ``op`` does not exist in the
    profile's release (before vLLM 0.25.1: profile switches ``deferred_free``,
    ``new_block_ids_list``, ``mamba_step_guard``, ``computed_block_ids_op``)."""
    if not getattr(profile, _OPERATION_SWITCHES[op]):
        raise UnsupportedOperationError(f"{op}: not in {profile.name}")


def check_admission_args(profile: SemanticsProfile, must_fit: bool, reserved: int, has_scheduled: bool) -> None:
    """Raise UnsupportedOperationError for an admission argument of
    ``allocate_slots`` the profile's release lacks (kvspec's
    ``check_admission_args``: profile switches ``full_sequence_arg``,
    ``reserved_blocks_arg``, ``admission_controls``)."""
    args = (
        ("full_sequence_must_fit", must_fit, False, profile.full_sequence_arg),
        ("reserved_blocks", reserved, 0, profile.reserved_blocks_arg),
        ("has_scheduled_reqs", has_scheduled, True, profile.admission_controls),
    )
    given = [f"{k}={v!r}" for k, v, d, has in args if v != d and not has]
    if given:
        raise UnsupportedOperationError(f"allocate_slots: {profile.name} has no {', '.join(given)}")


def allocation_without_tokens(adopt_hit: bool, n_new: int, n_hit: int, n_external: int) -> bool:
    """Whether an allocation's token counts are acceptable: some new or
    external tokens, or, from vLLM 0.31.0 on, hit tokens to adopt (profile
    switch ``adopt_hit_without_new_tokens``, passed as ``adopt_hit``)."""
    if n_new > 0 or n_external > 0:
        return True
    return adopt_hit and n_hit > 0


def skip_basis(skip_on_processed_tokens: bool, total_computed_tokens: int, num_in_flight_tokens: int) -> int:
    """The computed-token count skipped blocks are freed on (kvspec.kv_cache_manager.skip_basis;
    profile switch ``skip_on_processed_tokens``): from vLLM 0.26.0 the computed tokens less
    those in flight, before the computed tokens."""
    if not skip_on_processed_tokens:
        return total_computed_tokens
    return max(0, total_computed_tokens - num_in_flight_tokens)


def _raise_bad_count(
    n_new: object, n_hit: object, n_lookahead: object, n_external: object, n_encoder: object, reserved: object,
    computed: object, in_flight: object,
) -> None:  # fmt: skip
    """Raise InvalidTokenCountError for the first count that is not a
    non-negative int, in the spec's order."""
    counts = {
        "num_new_tokens": n_new, "num_new_computed_tokens": n_hit, "num_lookahead_tokens": n_lookahead,
        "num_external_computed_tokens": n_external, "num_encoder_tokens": n_encoder,
        "reserved_blocks": reserved, "request.num_computed_tokens": computed,
        "request.num_in_flight_tokens": in_flight,
    }  # fmt: skip
    for name, value in counts.items():
        if not is_int(value) or value < 0:
            raise InvalidTokenCountError(f"allocate_slots: {name} is {value!r}, not a non-negative int")
