"""One manager per attention kind: block tables of one KV-cache group.

A manager keeps, per request, a *table*: the block ids that hold the
request's KV for this group, position ``i`` covering tokens
``[i*bs, (i+1)*bs)``. Positions that no longer matter to attention hold the
null block. Each kind differs only in a few pure rules, written as top-level
functions below the classes: how many leading tokens attention skips, how a
prefix hit is searched, and which full blocks are worth caching.

Upstream: ``vllm/v1/core/single_type_kv_cache_manager.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.block_pool import NULL_BLOCK, BlockId, BlockPool
from kvspec.config import (
    FULL_TYPE_KINDS,
    MLA,
    RING_KINDS,
    AttentionKind,
    ChunkedLocal,
    CircularBuffer,
    CrossAttention,
    FullAttention,
    Mamba,
    SinkFullAttention,
    SlidingWindow,
)
from kvspec.hashing import BlockHash, BlockHashWithGroupId
from kvspec.invariants import require
from kvspec.mamba_tail import cache_mamba_tail_block, registers_mamba_tail
from kvspec.partial_hits import apply_cow, has_partial_local_hit, move_block_hashes, record_partial_hit
from kvspec.partial_tail import cache_partial_tail_block, registers_partial_tail
from kvspec.prefill_checkpoints import (
    POSITIONAL_FORMS,
    CheckpointGeometry,
    checkpoint_kept,
    checkpoint_position,
    chunk_checkpoint,
    num_checkpoint_blocks,
    positional_checkpoints,
    rekey_checkpoint_block,
)
from kvspec.profiles import NEWEST, SemanticsProfile
from kvspec.request import Request
from kvspec.retention import reachable_boundaries


def cdiv(a: int, b: int) -> int:
    """Ceiling division with Python floor semantics (``-(a // -b)``).

    pre: b > 0
    post: __return__ * b >= a > (__return__ - 1) * b
    """
    return -(a // -b)


class SingleTypeKVCacheManager:
    """Block tables of one group.

    inv: entries at index >= num_cached_block[r] carry no full-block key
    inv: num_cached_block[r] <= len(req_to_blocks[r])
    inv: Full-type tables hold no null block; SWA/chunked/Mamba(all, none)
         tables are null^a · real^b
    """

    def __init__(
        self,
        kind: AttentionKind,
        pool: BlockPool,
        enable_caching: bool,
        group_id: int,
        scheduler_block_size: int,
        admission_cap: int | None = None,
        profile: SemanticsProfile = NEWEST,
        has_mamba: bool = False,
    ) -> None:
        """A manager with no requests; SinkFull takes its sink blocks here.

        ``has_mamba`` says whether the model has a Mamba group (some releases
        record fresh block ids only then)."""
        self.kind = kind
        self.profile = profile
        self.records_new_ids = records_new_block_ids(kind, profile, has_mamba)
        self.block_size = kind.block_size
        self.pool = pool
        self.enable_caching = enable_caching
        self.group_id = group_id
        self.scheduler_block_size = scheduler_block_size
        self.admission_cap = admission_cap
        self.use_eagle = False
        self.mask_kind = kind
        """The kind the sliding-window cache mask counts in: the engine's
        unscaled kind under context parallelism up to vLLM 0.29.0 (profile
        switch ``cp_swa_mask_unscaled``; set by the coordinator)."""
        self.req_to_blocks: dict[str, list[BlockId]] = {}
        self.num_cached_block: dict[str, int] = {}
        self.new_block_ids: list[BlockId] = []
        self.cache_mask_alignment: int | None = scheduler_block_size
        """Alignment of the caching mask, None for no mask (set by the
        coordinator, :meth:`kvspec.kv_cache_coordinator.KVCacheCoordinator.cache_mask_alignment`)."""
        self.retention: int | None = None
        """The retention interval this group thins its caching by, None for
        none (set by the coordinator where :func:`kvspec.retention.retention_applies`)."""
        self.replay_eagle = False
        """The model has EAGLE groups (the reachable boundaries follow them from
        vLLM 0.30.0 on; set by the coordinator)."""
        self.junctions: dict[str, int] = {}
        """Each request's shared-prefix boundary (the coordinator's dict,
        :attr:`kvspec.kv_cache_manager.KVCacheManager.shared_prefix_boundary`)."""
        self.partial_hit: dict[str, tuple[int, BlockId]] = {}
        """Requests whose table entry (index, block) is shared and is privatised at
        their next allocation (upstream ``_partial_hit_reqs``)."""
        self.tail_owners: set[str] = set()
        """The requests of :attr:`partial_hit` whose record is their own Mamba
        tail entry (made when their blocks were cached), not a hit."""
        self.pending_copies: list[tuple[BlockId, BlockId]] = []
        """Copy-on-write pairs (source, copy) not taken yet, each end holding one
        extra reference (upstream ``_pending_cow_copies``)."""
        if isinstance(kind, SinkFullAttention):
            self.sink_blocks = pool.take_sink_blocks(num_sink_blocks(kind, profile))

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens attention no longer reads (see :func:`num_skipped_tokens`)."""
        return num_skipped_tokens(self.kind, num_computed_tokens)

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[BlockId],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        num_external: int = 0,
        num_local: int = 0,
    ) -> int:
        """Blocks an allocation would take from the free queue, counting hit
        blocks that are currently free (touching removes them from the queue),
        plus the private copy of a hit that ends inside a block (``num_local``:
        computed plus hit tokens; :mod:`kvspec.partial_hits`).
        ``num_external`` only matters to Mamba align (see there)."""
        cap = self.admission_cap if apply_admission_cap else None
        have = len(self.req_to_blocks.get(request_id, ()))
        skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        free = [b != NULL_BLOCK and self.pool.ref_cnt[b] == 0 for b in new_computed_blocks]
        tracked = request_id in self.num_cached_block
        cow = not tracked and has_partial_local_hit(new_computed_blocks, num_local, self.block_size)
        return blocks_to_allocate(cdiv(num_tokens, self.block_size), cap, have, skipped, free, tracked) + cow

    def add_local_computed_blocks(
        self, request_id: str, new_computed_blocks: Sequence[BlockId], num_local: int, num_external: int
    ) -> None:
        """Start the table of a new request with its prefix hits (touched), the
        skipped leading positions replaced by null blocks; a hit that ends
        inside a block leaves a partial-hit record (:mod:`kvspec.partial_hits`)."""
        table = self.req_to_blocks.setdefault(request_id, [])
        assert not table, f"request {request_id} already has a table"
        skipped = self.get_num_skipped_tokens(num_local + num_external) // self.block_size
        hits = list(new_computed_blocks[max(skipped, 0) :])
        if self.enable_caching:
            self.pool.touch(hits)
        table += [NULL_BLOCK] * skipped + hits
        self.num_cached_block[request_id] = len(table)
        if has_partial_local_hit(hits, num_local, self.block_size):
            record_partial_hit(self, request_id, num_local // self.block_size, hits[-1])

    def allocate_external_computed_blocks(
        self, request_id: str, num_local: int, num_external: int, record: bool = True
    ) -> None:
        """Fresh blocks for connector-loaded tokens that attention still reads,
        listed for zeroing only with ``record`` (vLLM 0.32.0's
        ``skip_zeroing_group_ids`` clears it for the groups a load fills)."""
        total = num_local + num_external
        skipped = self.get_num_skipped_tokens(total)
        if skipped > 0:
            num_external = min(total - skipped, num_external)
        if num_external <= 0:
            return
        table = self.req_to_blocks.setdefault(request_id, [])
        self._extend(table, cdiv(total, self.block_size) - len(table), record)

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> list[BlockId]:
        """Privatise a partially hit block first (its copy comes first in the
        result, and always among the fresh block ids), then grow the table to
        cover ``num_tokens`` slots; return the new blocks."""
        cow = []
        if request_id in self.partial_hit:
            idx, src = self.partial_hit.pop(request_id)
            cow = self.pool.get_new_blocks(1)
            apply_cow(self, request_id, idx, src, cow[0])
            self.new_block_ids += cow
        table = self.req_to_blocks.setdefault(request_id, [])
        return cow + self._extend(table, cdiv(num_tokens, self.block_size) - len(table))

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Hash the table's full blocks up to ``num_tokens`` that are not cached
        yet (from vLLM 0.33.0 on never past the request's hashed tokens, which
        lag under look-ahead block hashes: profile switch
        ``lookahead_block_hashes``), a sliding-window group only those a hit
        can read, thinned further under a retention interval
        (:func:`retention_block_mask`); then, from vLLM 0.26.0 on, a full-attention
        group coarser than the hash block registers its partial tail
        (:mod:`kvspec.partial_tail`)."""
        rid = request.request_id
        num_cached = self.num_cached_block.get(rid, 0)
        hashed = len(request.block_hashes) * self.pool.hash_block_size
        num_full = (min(num_tokens, hashed) if self.profile.lookahead_block_hashes else num_tokens) // self.block_size
        if num_cached < num_full:
            align = self.cache_mask_alignment
            mask = None
            if align is not None and self.retention is not None:
                bounds = reachable_boundaries(
                    self.profile, request.num_prompt_tokens, self.scheduler_block_size, self.replay_eagle,
                    self.junctions.get(rid, 0), self.use_eagle, self.block_size,
                )  # fmt: skip
                mask = retention_block_mask(
                    self.mask_kind, num_cached, num_full, align, caches_eagle_peek(self), self.retention, bounds
                )
            elif align is not None:
                mask = reachable_block_mask(self.mask_kind, num_cached, num_full, align, caches_eagle_peek(self))
            table = self.req_to_blocks.setdefault(rid, [])
            self.pool.cache_full_blocks(request, table, num_cached, num_full, self.block_size, self.group_id, mask)
            self.num_cached_block[rid] = num_full
        if registers_partial_tail(self.kind, self.profile, self.pool.hash_block_size):
            cache_partial_tail_block(self, request, num_tokens)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """Null out and free the leading blocks attention no longer reads."""
        skipped = self.get_num_skipped_tokens(total_computed_tokens)
        if skipped <= 0:
            return
        table = self.req_to_blocks.get(request_id, [])
        self._remove_blocks_in_range(request_id, 0, min(skipped // self.block_size, len(table)))

    def pop_blocks_for_free(self, request_id: str) -> list[BlockId]:
        """Forget the request; return its table without releasing references
        (from vLLM 0.33.0 without its leading nulls: profile switch
        ``pop_drops_leading_nulls``)."""
        table = self._forget(request_id)
        return trim_null_head(table) if self.profile.pop_drops_leading_nulls else table

    def free(self, request_id: str) -> None:
        """Release the request's blocks, last table entry first (a sliding
        window's as skipped blocks: :func:`kvspec.block_pool.requeue_unhashed_first`)."""
        self.pool.free_blocks(reversed(self._forget(request_id)), skipped=isinstance(self.kind, SlidingWindow))

    def get_num_common_prefix_blocks(self, request_id: str) -> int:
        """Leading blocks of the request's table held by every table of this
        group (0 for kinds other than full attention)."""
        if not isinstance(self.kind, FULL_TYPE_KINDS):
            return 0
        tables = list(self.req_to_blocks.values())
        return common_prefix_length(self.req_to_blocks.get(request_id, []), tables)

    def take_new_block_ids(self) -> list[BlockId]:
        """Drain the ids of fresh blocks (see :func:`records_new_block_ids`)."""
        ids, self.new_block_ids = self.new_block_ids, []
        return ids

    def record_for_zeroing(self, request_id: str, first: int) -> None:
        """List the request's table from index ``first`` on as fresh blocks again
        (:meth:`kvspec.kv_cache_manager.KVCacheManager.record_blocks_for_zeroing`)."""
        self.new_block_ids += self.req_to_blocks.get(request_id, [])[first:]

    def take_pending_copies(self) -> list[tuple[BlockId, BlockId]]:
        """Drain the copy-on-write pairs, oldest first; their references stay."""
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def new_step_starts(self) -> None:
        """A scheduler step begins (only Mamba cares)."""

    def check_invariants(self) -> None:
        """Raise InvariantViolation if a table invariant is broken."""
        require(inv_uncached_tail(self), f"group {self.group_id}: hashed block past num_cached_block")
        require(inv_null_shape(self), f"group {self.group_id}: table has an impossible null pattern")
        require(self.tail_owners <= self.partial_hit.keys(), f"group {self.group_id}: tail owner without a record")

    def _forget(self, request_id: str) -> list[BlockId]:
        """Drop the request's bookkeeping; return its whole table (pending
        copies and their references stay)."""
        self.num_cached_block.pop(request_id, None)
        self.partial_hit.pop(request_id, None)
        self.tail_owners.discard(request_id)
        return self.req_to_blocks.pop(request_id, [])

    def _extend(self, table: list[BlockId], n: int, record: bool = True) -> list[BlockId]:
        if n <= 0:
            return []
        new = self.pool.get_new_blocks(n)
        table += new
        if self.records_new_ids and record:
            self.new_block_ids += new
        return new

    def _num_evictable(self, blocks: Sequence[BlockId]) -> int:
        return sum(1 for b in blocks if b != NULL_BLOCK and self.pool.ref_cnt[b] == 0)

    def _remove_blocks_in_range(self, request_id: str, first: int, last: int) -> None:
        """Null out ``table[first:last]`` walking backwards, stopping at the first
        null (everything before it was removed earlier); free what was removed."""
        table = self.req_to_blocks.get(request_id, [])
        freed: list[BlockId] = []
        for i in range(min(last, len(table)) - 1, first - 1, -1):
            if table[i] == NULL_BLOCK:
                break
            freed.append(table[i])
            table[i] = NULL_BLOCK
        if freed:
            self.pool.free_blocks(freed, skipped=True)


class CrossAttentionManager(SingleTypeKVCacheManager):
    """Encoder blocks, allocated once from the encoder length; never cached."""

    def add_local_computed_blocks(
        self, request_id: str, new_computed_blocks: Sequence[BlockId], num_local: int, num_external: int
    ) -> None:
        """Cross attention never has prefix hits."""
        assert not new_computed_blocks

    def allocate_external_computed_blocks(
        self, request_id: str, num_local: int, num_external: int, record: bool = True
    ) -> None:
        """Connector tokens never need encoder blocks."""


class CircularBufferManager(SingleTypeKVCacheManager):
    """A ring group: one block per request, claimed on the first allocation
    and held until freed; no hits, no hashing, nothing skipped
    (upstream: ``CircularBufferManager``, and ``KpoolTailManager``, which adds
    nothing). The table is never tracked in ``num_cached_block``."""

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[BlockId],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        num_external: int = 0,
        num_local: int = 0,
    ) -> int:
        """1 until the ring is claimed, then 0; token counts and caps are ignored."""
        return 0 if self.req_to_blocks.get(request_id) else 1

    def add_local_computed_blocks(
        self, request_id: str, new_computed_blocks: Sequence[BlockId], num_local: int, num_external: int
    ) -> None:
        """A ring group never has hits; nothing is recorded."""

    def allocate_external_computed_blocks(
        self, request_id: str, num_local: int, num_external: int, record: bool = True
    ) -> None:
        """Claim the ring (the caller returns no external-phase block)."""
        self._claim_ring(request_id, record)

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> list[BlockId]:
        """The ring on the call that claims it, else nothing."""
        return self._claim_ring(request_id)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Ring blocks are never hashed."""

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """The ring is never skipped."""

    def get_num_common_prefix_blocks(self, request_id: str) -> int:
        """Always 0."""
        return 0

    def _claim_ring(self, request_id: str, record: bool = True) -> list[BlockId]:
        table = self.req_to_blocks.setdefault(request_id, [])
        return [] if table else self._extend(table, 1, record)


class MambaManager(SingleTypeKVCacheManager):
    """Recurrent state blocks; only the state after the last token matters.

    In ``align`` mode a table holds the running state at index
    ``cdiv(T, bs) - 1`` followed by ``num_speculative_blocks`` spare blocks,
    which move forward (old slot nulled) instead of being reallocated.
    """

    def __init__(
        self,
        kind: Mamba,
        pool: BlockPool,
        enable_caching: bool,
        group_id: int,
        sched: int,
        profile: SemanticsProfile = NEWEST,
    ) -> None:
        """A Mamba manager with no requests."""
        super().__init__(kind, pool, enable_caching, group_id, sched, None, profile, True)
        self.mamba = kind
        self.drop_eagle_checkpoint = False
        """The model uses EAGLE (set by the coordinator; upstream
        ``drop_eagle_checkpoint_block``): the tail boundary moves down."""
        self.cached_blocks_this_step: set[BlockHashWithGroupId] = set()
        self.last_state_block_idx: dict[str, int] = {}
        self.allocated_block_reqs: set[str] = set()
        self.num_retired_blocks: dict[str, int] = {}
        """Align mode (profile switch ``mamba_align_retired_mark``): per request,
        the table index removal reached (upstream ``_num_retired_blocks``)."""
        self.num_checkpoint_blocks: dict[str, int] = {}
        """Align mode with prefill checkpoints: per request, the checkpoint
        blocks (0 or 1) the last estimate decided on, which the allocation
        that follows takes (:mod:`kvspec.prefill_checkpoints`; upstream
        ``_num_checkpoint_blocks``)."""
        self.checkpoints: dict[str, tuple[int, int]] = {}
        """Align mode with a positional checkpoint form (vLLM 0.30.0 on): per
        request, the ``(position, slot)`` of the checkpoint the last estimate
        decided on, kept until the next estimate (upstream ``_checkpoints``)."""
        self.checkpoint_granularity = pool.hash_block_size
        """The unit of checkpoint positions (set by the coordinator:
        :func:`kvspec.prefill_checkpoints.checkpoint_granularity`)."""

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[BlockId],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        num_external: int = 0,
        num_local: int = 0,
        prefill_end: int = 0,
    ) -> int:
        """As the base, plus speculative blocks; a hit on a state cached in this
        very step cannot be used yet (returns more than the pool holds). In
        align mode a partial hit or a pending tail move needs one more block,
        and so does a prefill checkpoint, which this estimate decides on and
        remembers for the allocation (unless it is the admission check:
        :mod:`kvspec.prefill_checkpoints`; ``prefill_end`` is 0 or the
        prefill end a checkpoint chunk must reach, from vLLM 0.31.0 on).

        NOTE: in align mode vLLM 0.25.1 forgets the block that external
        (connector) tokens take for a new request, so its estimate can be one
        short and the allocation then fails half-way; the spec takes the larger
        of vLLM's estimate and the exact count (docs/divergences.md,
        "mamba-align-external-estimate").
        """
        if mamba_step_guarded(self, new_computed_blocks):
            return self.pool.num_gpu_blocks + 1
        spec = self.mamba.num_speculative_blocks
        if self.mamba.mode != "align":
            return super().get_num_blocks_to_allocate(
                request_id, num_tokens + self.block_size * spec, new_computed_blocks,
                total_computed_tokens, num_tokens_main_model, apply_admission_cap, num_local=num_local,
            )  # fmt: skip
        required = cdiv(num_tokens_main_model, self.block_size) + spec
        raw = required - len(new_computed_blocks) - len(self.req_to_blocks.get(request_id, ()))
        allocated = request_id in self.allocated_block_reqs
        partial = has_partial_local_hit(new_computed_blocks, num_local, self.block_size)
        partial = partial or request_id in self.partial_hit
        table = self.req_to_blocks.get(request_id, [])
        if self.profile.prefill_checkpoints in POSITIONAL_FORMS:
            found = chunk_checkpoint(
                self.mamba, self.profile, self.checkpoint_geometry(), table, num_tokens_main_model,
                total_computed_tokens, allocated, prefill_end,
            )  # fmt: skip
            ckpt = int(found is not None)
            if not apply_admission_cap and found is not None:
                self.checkpoints[request_id] = found
            elif not apply_admission_cap:
                self.checkpoints.pop(request_id, None)
        else:
            ckpt = num_checkpoint_blocks(self.mamba, self.profile, table, num_tokens_main_model, total_computed_tokens)
        if not apply_admission_cap:
            self.num_checkpoint_blocks[request_id] = ckpt
        capped = self.profile.mamba_align_estimate_capped
        early = self.profile.prefill_checkpoints in ("chunk-position", "prompt-end")
        uncapped = self.profile.prefill_checkpoints == "chunk-position"
        new = mamba_align_new_blocks(raw, allocated, spec, capped, partial, ckpt, early, uncapped)
        estimate = new + self._num_evictable(new_computed_blocks)
        if num_external <= 0:
            return estimate
        exact = self._exact_with_external(new_computed_blocks, total_computed_tokens, required, num_local) + ckpt
        return max(estimate, exact)

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> list[BlockId]:
        """Non-align: base plus speculative blocks. Align: see :meth:`_allocate_aligned`."""
        if self.mamba.mode != "align":
            spec_tokens = self.block_size * self.mamba.num_speculative_blocks
            return super().allocate_new_blocks(request_id, num_tokens + spec_tokens, num_tokens_main_model)
        return self._allocate_aligned(request_id, num_tokens_main_model)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """As the base, then the checkpoint's key (re-keyed to its position or,
        transient, dropped; :mod:`kvspec.prefill_checkpoints`) or, in a chunk
        without a positional checkpoint, the tail entry of
        :mod:`kvspec.mamba_tail`; remember the keys cached in this step."""
        rid = request.request_id
        before = self.num_cached_block.get(rid, 0)
        super().cache_blocks(request, num_tokens)
        after = self.num_cached_block.get(rid, 0)
        if rid in self.checkpoints:
            key = self._cache_checkpoint(request, num_tokens)
            if key is not None:
                self.cached_blocks_this_step.add(key)
        elif registers_mamba_tail(self.mamba, self.profile, self.pool.hash_block_size):
            key = cache_mamba_tail_block(self, request, num_tokens)
            if key is not None:
                self.cached_blocks_this_step.add(key)
        for b in self.req_to_blocks.get(rid, [])[before:after]:
            key = self.pool.block_hash[b]
            if b != NULL_BLOCK and key is not None:
                self.cached_blocks_this_step.add(key)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """As the base, after subtracting the speculative block *count* from the
        token count (vLLM's guard against unverified drafts, until 0.26.0:
        profile switch ``mamba_skip_spec_slack``); in align mode also free the
        state block of two steps ago."""
        slack = self.mamba.num_speculative_blocks if self.profile.mamba_skip_spec_slack else 0
        total = max(0, total_computed_tokens - slack)
        super().remove_skipped_blocks(request_id, total)
        idx = self.last_state_block_idx.get(request_id)
        if self.mamba.mode == "align" and idx is not None and idx < cdiv(total, self.block_size) - 1:
            table = self.req_to_blocks[request_id]
            if table[idx] != NULL_BLOCK:
                self.pool.free_blocks([table[idx]])
                table[idx] = NULL_BLOCK

    def _remove_blocks_in_range(self, request_id: str, first: int, last: int) -> None:
        """As the base; in align mode from vLLM 0.30.0 (profile switch
        ``mamba_align_retired_mark``) as :func:`retire_range` says."""
        if self.mamba.mode != "align" or not self.profile.mamba_align_retired_mark:
            super()._remove_blocks_in_range(request_id, first, last)
            return
        table = self.req_to_blocks.get(request_id, [])
        retired = self.num_retired_blocks.get(request_id, 0)
        span = retire_range(first, last, retired, len(table))
        if span is None:
            return
        freed = [table[i] for i in reversed(span) if table[i] != NULL_BLOCK]
        for i in span:
            table[i] = NULL_BLOCK
        if freed:
            self.pool.free_blocks(freed)
        self.num_retired_blocks[request_id] = span.stop

    def _forget(self, request_id: str) -> list[BlockId]:
        """As the base, forgetting the align-mode bookkeeping too."""
        self.allocated_block_reqs.discard(request_id)
        self.last_state_block_idx.pop(request_id, None)
        self.num_retired_blocks.pop(request_id, None)
        self.num_checkpoint_blocks.pop(request_id, None)
        self.checkpoints.pop(request_id, None)
        return super()._forget(request_id)

    def new_step_starts(self) -> None:
        """States cached in earlier steps become usable."""
        self.cached_blocks_this_step.clear()

    def checkpoint_geometry(self) -> CheckpointGeometry:
        """What this group's checkpoint positions depend on besides the chunk."""
        pool = self.pool
        granularity, eagle = self.checkpoint_granularity, self.drop_eagle_checkpoint
        return CheckpointGeometry(pool.hash_block_size, granularity, eagle, pool.num_hash_lookahead_tokens)

    def _cache_checkpoint(self, request: Request, num_tokens: int) -> BlockHashWithGroupId | None:
        """After the full-block caching up to ``num_tokens``: key the request's
        checkpoint block at the checkpoint position (nothing if it is keyed
        there already), or, for a transient checkpoint, drop every key it has
        (:func:`kvspec.prefill_checkpoints.checkpoint_kept`). Returns the new key.

        NOTE: a step with draft tokens can end past the request's tokens and
        its checkpoint past the request's hashes; vLLM 0.30.0 on then fails an
        assertion (``checkpoint-past-hashes-crash`` in docs/divergences.md).
        kvspec leaves such a block alone: it keys no state the request cannot
        name."""
        rid = request.request_id
        position, slot = self.checkpoints[rid]
        table = self.req_to_blocks[rid]
        assert 0 <= slot < len(table), f"request {rid}: checkpoint slot {slot} outside its table"
        b = table[slot]
        g = self.checkpoint_geometry()
        prompt = checkpoint_position(self.profile, request.num_prompt_tokens, g.granularity, g.drop_eagle, g.lookahead)
        junction = self.junctions.get(rid, 0)
        kept = checkpoint_kept(
            self.profile, self.block_size, position, prompt, junction, self.retention, num_tokens,
            request.num_prompt_tokens,
        )  # fmt: skip
        if not kept:
            self.pool._evict(b)
            return None
        if self.pool.hash_num_tokens[b] == position:
            return None
        if position > len(request.block_hashes) * self.pool.hash_block_size:
            return None
        return rekey_checkpoint_block(self.pool, request, b, position, self.group_id)

    def _exact_with_external(self, hits: Sequence[BlockId], total: int, required: int, num_local: int) -> int:
        """Blocks a new align-mode request with external tokens really takes:
        the external state block, then the copy of a partial hit that
        attention still reads, the running state and spare blocks (a prefill
        checkpoint's block comes on top: its slot lies past the state the
        chunk starts from)."""
        spec = self.mamba.num_speculative_blocks
        skipped = max(total - 1, 0) // self.block_size
        have = max(skipped, len(hits))
        ext = max(cdiv(total, self.block_size) - have, 0)
        new = max(required - max(have + ext, required - spec - 1), 0)
        cow = has_partial_local_hit(hits[skipped:], num_local, self.block_size)
        return ext + new + cow + self._num_evictable(hits[skipped:])

    def _allocate_aligned(self, request_id: str, num_tokens: int) -> list[BlockId]:
        """Align mode: the running state goes to index ``cdiv(T, bs) - 1``, padded
        with nulls; last step's spare blocks move there before new ones are taken.
        A prefill checkpoint keeps the slot before the running state out of the
        padding, so a fresh block fills it; with a positional checkpoint
        (vLLM 0.30.0 on) the allocation runs even when the table is long
        enough, the spare blocks stay where they are (0.30.0, 0.31.0) or
        move except the one in the checkpoint's slot (0.32.0 on).
        Returns the table from its previous length on (nulls and moved blocks
        included); a partial hit is privatised first (:meth:`_privatise`)."""
        spec = self.mamba.num_speculative_blocks
        form = self.profile.prefill_checkpoints
        positional = form in POSITIONAL_FORMS
        ckpt = int(request_id in self.checkpoints) if positional else self.num_checkpoint_blocks.get(request_id, 0)
        table = self.req_to_blocks.setdefault(request_id, [])
        required = cdiv(num_tokens, self.block_size) + spec
        prev = len(table)
        partial = self.partial_hit.pop(request_id, None)
        owner = request_id in self.tail_owners
        self.tail_owners.discard(request_id)
        if required <= prev and partial is None and not (positional and ckpt):
            if self.profile.mamba_early_return_allocated:
                self.allocated_block_reqs.add(request_id)
            return []
        allocated = request_id in self.allocated_block_reqs
        if allocated or prev > 0:
            self.last_state_block_idx[request_id] = prev - 1 - (spec if allocated else 0)
        skip = required - spec - 1
        table += [NULL_BLOCK] * (skip - ckpt - prev)
        scratch_stays = bool(ckpt) and form in ("chunk-position", "prompt-end")
        moves_below = skip - ckpt if positional else skip
        for idx in range(prev - spec, prev) if allocated and not scratch_stays else ():
            if idx >= moves_below:
                break
            table.append(table[idx])
            table[idx] = NULL_BLOCK
        fresh = max(required - len(table), 0) + (partial is not None)
        spare = spec if not allocated or scratch_stays else 0
        assert fresh <= 1 + spare + (partial is not None) + ckpt
        new = self.pool.get_new_blocks(fresh)
        returned = table[prev:]
        if partial is not None:
            # NOTE: the owner of a tail entry always keeps its block and moves the entry, even when
            # it is not marked as allocated yet: its table was handed out by an earlier call, and a
            # table handed out is append-only. vLLM 0.26.0 and 0.27.x copy into the table instead
            # when the owner's first allocation needed no block (the divergence mamba-cow-owner)
            returned = self._privatise(request_id, partial, new.pop(0), allocated or owner) + returned
        table += new
        self.allocated_block_reqs.add(request_id)
        return returned + new

    def _privatise(self, request_id: str, partial: tuple[int, BlockId], cow: BlockId, keeps: bool) -> list[BlockId]:
        """Serve a partial-hit record with the fresh block ``cow``: a new request
        takes ``cow`` into its table (returned); the owner of a tail entry keeps
        its block and moves the entry to ``cow`` instead, which no table holds
        and which counts as cached in this step (returns nothing). Either way
        the copy is queued; see :mod:`kvspec.partial_hits`. ``keeps``: the
        request keeps its block (it is the owner, or already allocated)."""
        idx, src = partial
        if not keeps:
            apply_cow(self, request_id, idx, src, cow)
            return [cow]
        assert self.req_to_blocks[request_id][idx] == src, f"request {request_id}: entry {idx} is not {src}"
        move_block_hashes(self.pool, src, cow)
        self.pending_copies.append((src, cow))
        self.pool.ref_cnt[src] += 1
        key = self.pool.block_hash[cow]
        if key is not None:
            self.cached_blocks_this_step.add(key)
        return []


def caches_eagle_peek(manager: SingleTypeKVCacheManager) -> bool:
    """Whether an EAGLE group of a cached hybrid caches for its look-ahead
    block: one block past the scheduler-block boundary, and a window mask
    shifted by it; from vLLM 0.23.0 on (profile switch
    ``hybrid_cache_eagle_reach``; 0.22.x caches it like any other group).

    post: not __return__ or manager.use_eagle
    post: not manager.use_eagle or __return__ == manager.profile.hybrid_cache_eagle_reach
    """
    return manager.use_eagle and manager.profile.hybrid_cache_eagle_reach


def records_new_block_ids(kind: AttentionKind, profile: SemanticsProfile, has_mamba: bool) -> bool:
    """Whether a group of ``kind`` reports its fresh blocks to ``take_new_block_ids``.

    vLLM 0.17.1: full attention (the exact type, so not MLA or SinkFull);
    0.23.0: full attention and MLA.
    0.26.0: the same, but only in models with a Mamba group (the ids are for
    zeroing recycled Mamba state pages). 0.28.0: every attention kind (not
    Mamba) of a model with a Mamba group (profile switch ``new_block_ids``).
    A ``CircularBuffer`` ring never reports (vLLM excludes its spec class; a
    ``KpoolTail`` ring is a sliding-window spec there, so it follows the rule).

    post: not (__return__ and isinstance(kind, CircularBuffer | Mamba))
    post: profile.new_block_ids != "full" or __return__ == (type(kind) is FullAttention)
    post: profile.new_block_ids != "full-mla" or __return__ == isinstance(kind, FullAttention | MLA)
    post: not __return__ or profile.new_block_ids == "attention-with-mamba" or isinstance(kind, FullAttention | MLA)
    post: not __return__ or profile.new_block_ids in ("full", "full-mla") or has_mamba
    post: __return__ or not has_mamba or not isinstance(kind, FullAttention | MLA) or profile.new_block_ids == "full"
    """
    if isinstance(kind, CircularBuffer):
        return False
    if profile.new_block_ids == "full":
        return type(kind) is FullAttention
    if profile.new_block_ids == "full-mla":
        return type(kind) in (FullAttention, MLA)
    if profile.new_block_ids == "full-mla-with-mamba":
        return has_mamba and type(kind) in (FullAttention, MLA)
    return has_mamba and not isinstance(kind, Mamba)


def mamba_step_guarded(manager: MambaManager, hits: Sequence[BlockId]) -> bool:
    """Whether a Mamba hit ends on a state cached in this very scheduler step,
    which is not usable before ``new_step_starts``: from vLLM 0.25.1 on (profile
    switch ``mamba_step_guard``; before it the hit is admitted at once).

    post: manager.profile.mamba_step_guard or not __return__
    post: __return__ == (len(hits) > 0 and manager.pool.block_hash[hits[-1]] in manager.cached_blocks_this_step) or not manager.profile.mamba_step_guard
    """  # noqa: E501 - a PEP 316 condition is one line
    if not manager.profile.mamba_step_guard or not hits:
        return False
    return manager.pool.block_hash[hits[-1]] in manager.cached_blocks_this_step


def num_sink_blocks(kind: SinkFullAttention, profile: SemanticsProfile) -> int:
    """Blocks a SinkFull group takes for good at construction: ``sink_len /
    block_size`` until vLLM 0.30.0, none since (profile switch
    ``sink_blocks_reserved``).

    pre: kind.block_size >= 1 and kind.sink_len % kind.block_size == 0
    post: __return__ >= 0
    post: profile.sink_blocks_reserved or __return__ == 0
    post: not profile.sink_blocks_reserved or __return__ * kind.block_size == kind.sink_len
    """
    return kind.sink_len // kind.block_size if profile.sink_blocks_reserved else 0


def trim_null_head(table: Sequence[BlockId]) -> list[BlockId]:
    """``table`` without its leading null blocks.

    post: NULL_BLOCK not in __return__[:1]
    post: __return__ == list(table[len(table) - len(__return__) :])
    post: all(b == NULL_BLOCK for b in table[: len(table) - len(__return__)])
    """
    first = next((i for i, b in enumerate(table) if b != NULL_BLOCK), len(table))
    return list(table[first:])


def mamba_align_new_blocks(
    raw: int,
    allocated: bool,
    spec: int,
    capped: bool,
    partial: bool = False,
    checkpoint: int = 0,
    spec_on_checkpoint: bool = False,
    uncapped_on_checkpoint: bool = False,
) -> int:
    """Mamba align's estimate of fresh blocks for a request whose table lacks
    ``raw`` entries: a running state block, plus the speculative blocks for a
    request not allocated yet (also for a checkpoint chunk with
    ``spec_on_checkpoint``: vLLM 0.30.0 and 0.31.0), plus (``partial``) the
    copy of a partial hit, which also counts as one more missing entry, plus
    the ``checkpoint`` blocks of a prefill checkpoint
    (:mod:`kvspec.prefill_checkpoints`); from vLLM 0.31.0 on never more than
    that need (profile switch ``mamba_align_estimate_capped``). With
    ``uncapped_on_checkpoint`` (vLLM 0.30.0) an allocated request's
    checkpoint chunk counts the whole shortfall instead.

    pre: spec >= 0 and checkpoint in (0, 1)
    post: raw > 0 or partial or __return__ == raw
    post: (raw <= 0 and not partial) or __return__ >= 1
    post: (raw <= 0 and not partial) or (uncapped_on_checkpoint and checkpoint and allocated) or __return__ <= 1 + (spec if not allocated or (checkpoint and spec_on_checkpoint) else 0) + partial + checkpoint
    post: not (uncapped_on_checkpoint and checkpoint and allocated) or (raw <= 0 and not partial) or __return__ == max(raw, 0) + partial
    post: not capped or __return__ <= max(raw, 0) + partial
    post: not capped or uncapped_on_checkpoint or __return__ == min(mamba_align_new_blocks(raw, allocated, spec, False, partial, checkpoint, spec_on_checkpoint), max(raw, 0) + partial)
    post: capped or (raw <= 0 and not partial) or (uncapped_on_checkpoint and checkpoint and allocated) or __return__ == 1 + (spec if not allocated or (checkpoint and spec_on_checkpoint) else 0) + partial + checkpoint
    post: checkpoint or __return__ == mamba_align_new_blocks(raw, allocated, spec, capped, partial)
    """  # noqa: E501 - a PEP 316 condition is one line
    if partial:
        raw = max(raw, 0) + 1
    if raw <= 0:
        return raw
    if checkpoint and allocated and uncapped_on_checkpoint:
        return raw
    cap = 1 + (spec if not allocated or (checkpoint and spec_on_checkpoint) else 0) + partial + checkpoint
    return min(raw, cap) if capped else cap


def blocks_to_allocate(
    required: int, cap: int | None, have: int, skipped: int, hit_free: Sequence[bool], tracked: bool
) -> int:
    """Blocks an allocation takes from the free queue: the arithmetic of
    upstream ``get_num_blocks_to_allocate`` (base manager).

    The table must reach ``required`` entries (at most ``cap`` when one is
    given) and holds ``have``. A request the manager already tracks only
    grows (fast path). A new request first takes its ``len(hit_free)`` hits;
    positions before ``skipped`` become null, and those hits are neither
    touched nor counted. Every other hit still in the free queue
    (``hit_free[i]``) leaves it when touched, so it costs a block too.

    pre: required >= 0 and have >= 0 and (cap is None or cap >= 1)
    post: __return__ >= 0
    post: not tracked or __return__ == max(min(required, cap or required) - have, 0)
    post: cap is None or __return__ <= blocks_to_allocate(required, None, have, skipped, hit_free, tracked)
    post: tracked or __return__ >= sum(hit_free[max(0, skipped - have) :])
    """
    if cap is not None:
        required = min(required, cap)
    if tracked:
        return max(required - have, 0)
    new = max(required - max(skipped, len(hit_free) + have), 0)
    return new + sum(hit_free[max(0, skipped - have) :])


def retire_range(first: int, last: int, retired: int, table_len: int) -> range | None:
    """The table entries a Mamba align removal of ``[first, last)`` nulls out
    from vLLM 0.30.0 on (profile switch ``mamba_align_retired_mark``): from
    the request's retired mark (where the previous removal ended) up to
    ``last``, at most the table's length; every state block in it is freed,
    walking backwards over the null gaps that prefill leaves between states.
    None when the range is empty (the mark stays); otherwise the mark moves to
    its end.

    pre: 0 <= first and 0 <= retired and 0 <= table_len
    post: __return__ is None or (__return__.start >= max(first, retired) and __return__.stop <= table_len)
    post: __return__ is None or (__return__.start == max(first, retired) and __return__.stop == min(last, table_len))
    post: __return__ is not None or max(first, retired) >= min(last, table_len)
    """
    start, stop = max(first, retired), min(last, table_len)
    return range(start, stop) if start < stop else None


def num_skipped_tokens(kind: AttentionKind, num_computed_tokens: int) -> int:
    """Leading tokens that attention for the next token no longer reads.

    Sliding window ``w``: ``max(0, n - w + 1 - e)`` with ``e`` its
    ``extra_retained_tokens`` (window 4, 7 computed → 4; with ``e = 2`` → 2).
    Chunked local ``c``: ``n // c * c`` (chunk 8: 13 → 8, 8 → 8, 7 → 0).
    Mamba: ``n - 1`` (only the last state; -1 for n = 0). Others: 0.

    pre: num_computed_tokens >= 0
    pre: not isinstance(kind, SlidingWindow) or (kind.window >= 1 and kind.extra_retained_tokens >= 0)
    pre: not isinstance(kind, ChunkedLocal) or kind.chunk >= 1
    post: __return__ <= num_computed_tokens
    post: not isinstance(kind, SlidingWindow) or num_computed_tokens - __return__ == min(num_computed_tokens, kind.window - 1 + kind.extra_retained_tokens)
    post: not isinstance(kind, ChunkedLocal) or (__return__ % kind.chunk == 0 and num_computed_tokens - __return__ < kind.chunk)
    post: not isinstance(kind, Mamba) or __return__ == num_computed_tokens - 1
    post: isinstance(kind, SlidingWindow | ChunkedLocal | Mamba) or __return__ == 0
    """  # noqa: E501 - a PEP 316 condition is one line
    if isinstance(kind, SlidingWindow):
        return max(0, num_computed_tokens - kind.window + 1 - kind.extra_retained_tokens)
    if isinstance(kind, ChunkedLocal):
        return num_computed_tokens // kind.chunk * kind.chunk
    if isinstance(kind, Mamba):
        return num_computed_tokens - 1
    return 0


def contiguous_blocks_for_hit(window: int, block_size: int, use_eagle: bool) -> int:
    """Consecutive cached blocks a sliding-window hit needs (+1 under EAGLE).

    pre: window >= 1 and block_size >= 1
    post: __return__ >= 0
    """
    return cdiv(window - 1, block_size) + (1 if use_eagle else 0)


def align_down(num_blocks: int, block_size: int, alignment: int) -> int:
    """Drop blocks until ``num_blocks * block_size`` is a multiple of ``alignment``.

    pre: num_blocks >= 0 and block_size >= 1 and alignment >= 1
    post: 0 <= __return__ <= num_blocks
    post: block_size == alignment or (__return__ * block_size) % alignment == 0
    """
    while block_size != alignment and num_blocks * block_size % alignment:
        num_blocks -= 1
    return num_blocks


def full_attention_hit(present: Sequence[bool], drop_eagle: bool, block_size: int, alignment: int) -> int:
    """Hit length in blocks: the cached prefix scanned left to right up to the
    first miss, minus the EAGLE block, aligned down. Downward closed.

    pre: block_size >= 1 and alignment >= 1
    post: 0 <= __return__ <= len(present)
    post: all(present[:__return__])
    post: block_size == alignment or __return__ * block_size % alignment == 0
    post: not drop_eagle or __return__ == 0 or present[__return__]
    """
    n = 0
    while n < len(present) and present[n]:
        n += 1
    if drop_eagle and n > 0:
        n -= 1
    return align_down(n, block_size, alignment)


def sliding_window_hit(
    present: Sequence[bool], contiguous: int, drop_eagle: bool, block_size: int, alignment: int
) -> tuple[int, int]:
    """``(first, length)``: a hit of ``length`` blocks whose positions before
    ``first`` are null. Scans right to left for the rightmost run of
    ``contiguous`` cached blocks whose end is aligned (measured after the EAGLE
    drop); otherwise accepts the run that starts at block 0, however short.

    NOTE: for that fallback run vLLM 0.25.1 aligns, drops the EAGLE block and
    aligns again, which can lose a whole alignment unit; the spec drops first
    and aligns once (docs/divergences.md, "swa-eagle-fallback").

    pre: contiguous >= 0 and block_size >= 1 and alignment >= 1
    post: 0 <= __return__[1] <= len(present)
    post: all(present[__return__[0]:__return__[1]])
    post: block_size == alignment or __return__[1] * block_size % alignment == 0
    post: __return__[0] == 0 or __return__[1] + drop_eagle - __return__[0] >= contiguous
    """
    run = 0
    for i in range(len(present) - 1, -1, -1):
        if not present[i]:
            run = 0
            continue
        end = i if drop_eagle else i + 1
        if run == 0 and block_size != alignment and end * block_size % alignment:
            continue
        run += 1
        if run >= contiguous:
            length = i + run - (1 if drop_eagle else 0)
            return i, align_down(length, block_size, alignment)
    length = run - (1 if drop_eagle and run > 0 else 0)
    return 0, align_down(length, block_size, alignment)


def chunked_local_hit(present: Sequence[bool], max_length: int, chunk: int, block_size: int) -> tuple[int, int]:
    """``(first, length)``: blocks before the current chunk count as hits (null,
    no lookup); within the chunk the cached prefix up to the first miss.

    pre: chunk >= 1 and block_size >= 1 and len(present) == max(0, max_length) // block_size
    post: __return__[0] <= __return__[1] <= len(present)
    post: __return__[0] * block_size == (max_length // chunk * chunk if max_length > 0 else 0) // block_size * block_size
    post: all(present[__return__[0] : __return__[1]])
    post: __return__[1] == len(present) or not present[__return__[1]]
    """  # noqa: E501 - a PEP 316 condition is one line
    first = (max_length // chunk * chunk if max_length > 0 else 0) // block_size
    n = first
    while n < len(present) and present[n]:
        n += 1
    return first, n


def mamba_hit(present: Sequence[bool], block_size: int, alignment: int) -> tuple[int, int]:
    """``(i, i + 1)`` for the rightmost cached state whose end is aligned, else
    ``(0, 0)``: only the last state is needed, earlier positions are null.

    pre: block_size >= 1 and alignment >= 1
    post: __return__ == (0, 0) or present[__return__[0]]
    post: __return__ == (0, 0) or __return__[1] == __return__[0] + 1
    post: block_size == alignment or __return__[1] * block_size % alignment == 0
    """
    for i in range(len(present) - 1, -1, -1):
        if present[i] and (block_size == alignment or (i + 1) * block_size % alignment == 0):
            return i, i + 1
    return 0, 0


def find_longest_cache_hit(
    kind: AttentionKind,
    block_hashes: Sequence[BlockHash],
    max_length: int,
    group_ids: Sequence[int],
    pool: BlockPool,
    drop_eagle: bool,
    alignment: int,
) -> list[list[BlockId]]:
    """The longest hit of at most ``max_length`` tokens, one list per group in
    ``group_ids`` (every group must hold each block); null where not needed.

    The lists are equally long, hold ``length * block_size <= max_length``
    tokens, aligned as the kind's rule (:func:`full_attention_hit` and the
    others) requires, and each entry that is not null is the block cached
    under that position's hash in that group. Full-attention kinds have no
    null entry; a ring kind never has a hit.

    pre: alignment >= 1 and len(group_ids) >= 1
    raises: NotImplementedError
    post: len(__return__) == len(group_ids) and len({len(h) for h in __return__}) == 1
    post: len(__return__[0]) * kind.block_size <= max(max_length, 0)
    post: isinstance(kind, ChunkedLocal) or kind.block_size == alignment or len(__return__[0]) * kind.block_size % alignment == 0
    post: all(b == NULL_BLOCK or b == pool.get_cached_block(block_hashes[i], group_ids)[g] for g, h in enumerate(__return__) for i, b in enumerate(h))
    post: not isinstance(kind, FULL_TYPE_KINDS) or NULL_BLOCK not in __return__[0]
    post: not isinstance(kind, RING_KINDS) or not __return__[0]
    """  # noqa: E501 - a PEP 316 condition is one line
    max_blocks = max(max_length, 0) // kind.block_size
    looked_up = [pool.get_cached_block(h, group_ids) for h in block_hashes[:max_blocks]]
    present = [f is not None for f in looked_up]
    found = [f or [] for f in looked_up]
    bs = kind.block_size
    if isinstance(kind, SlidingWindow):
        first, length = sliding_window_hit(
            present, contiguous_blocks_for_hit(kind.window, bs, drop_eagle), drop_eagle, bs, alignment
        )
    elif isinstance(kind, ChunkedLocal):
        first, length = chunked_local_hit(present, max_length, kind.chunk, bs)
    elif isinstance(kind, Mamba):
        first, length = mamba_hit(present, bs, alignment)
    elif isinstance(kind, CrossAttention):
        raise NotImplementedError("cross attention does not support prefix caching")
    elif isinstance(kind, RING_KINDS):
        return [[] for _ in group_ids]
    else:
        first, length = 0, full_attention_hit(present, drop_eagle, bs, alignment)
    return [[NULL_BLOCK if i < first else found[i][g] for i in range(length)] for g in range(len(group_ids))]


def eagle_window_hit_before_drop(
    kind: SlidingWindow,
    block_hashes: Sequence[BlockHash],
    max_length: int,
    group_ids: Sequence[int],
    pool: BlockPool,
    alignment: int,
) -> bool:
    """Whether vLLM 0.16.0's sliding-window search under EAGLE finds a hit
    before it drops the EAGLE block: a run of one block more than the window
    needs whose end is aligned, or an aligned run from block 0. Where the
    block is not ``alignment``, 0.16.0 then fails an assertion. Changes nothing.

    Such a run also holds a hit without EAGLE (its ``need`` blocks).

    pre: alignment >= 1 and len(group_ids) >= 1
    post: not __return__ or len(find_longest_cache_hit(kind, block_hashes, max_length, group_ids, pool, False, alignment)[0]) > 0
    """  # noqa: E501 - a PEP 316 condition is one line
    max_blocks = max(max_length, 0) // kind.block_size
    present = [pool.get_cached_block(h, group_ids) is not None for h in block_hashes[:max_blocks]]
    need = contiguous_blocks_for_hit(kind.window, kind.block_size, True)
    return sliding_window_hit(present, need, False, kind.block_size, alignment)[1] > 0


def reachable_block_mask(
    kind: AttentionKind, start: int, end: int, alignment: int, use_eagle: bool
) -> list[bool] | None:
    """Which of blocks ``[start, end)`` are worth caching; None means all.

    Only sliding window restricts it: a hit always ends on an
    ``alignment``-token boundary (shifted one block right under EAGLE), so
    only the ``need`` blocks before each boundary can ever be part of a hit.

    pre: 0 <= start <= end and alignment >= 1
    pre: not isinstance(kind, SlidingWindow) or (kind.window >= 1 and kind.block_size >= 1)
    post: __return__ is None or len(__return__) == end - start
    post: isinstance(kind, SlidingWindow) or __return__ is None
    post: __return__ is None or not use_eagle or start > 0 or not __return__[:1] or not __return__[0]
    """
    if not isinstance(kind, SlidingWindow):
        return None
    need = contiguous_blocks_for_hit(kind.window, kind.block_size, use_eagle)
    per = alignment // kind.block_size
    if need >= per:
        return None
    shift = 1 if use_eagle else 0
    return [i >= shift and (i - shift) % per >= per - need for i in range(start, end)]


def retention_block_mask(
    kind: AttentionKind,
    start: int,
    end: int,
    alignment: int,
    use_eagle: bool,
    retention: int,
    boundaries: Sequence[int],
) -> list[bool] | None:
    """Which of blocks ``[start, end)`` a group of ``kind`` caches under the
    retention interval ``retention``; None means all of them (every kind
    other than a sliding window or a Mamba group, and an interval too fine
    to leave a block out).

    A sliding-window hit ending on a boundary reads the ``need`` blocks
    below it (one block further under EAGLE, whose hits are one block
    longer); a Mamba hit reads the state block that ends on it. A boundary
    counts at the alignment boundary at or below it.

    pre: 0 <= start <= end and alignment >= 1 and retention >= 0
    pre: not isinstance(kind, SlidingWindow | Mamba) or kind.block_size >= 1
    pre: not isinstance(kind, SlidingWindow) or kind.window >= 1
    post: __return__ is None or len(__return__) == end - start
    post: isinstance(kind, SlidingWindow | Mamba) or __return__ is None
    post: retention != 0 or __return__ is not None or not isinstance(kind, SlidingWindow | Mamba)
    """
    if isinstance(kind, SlidingWindow):
        bs = kind.block_size
        need = contiguous_blocks_for_hit(kind.window, bs, use_eagle)
        shift = 1 if use_eagle else 0
        mask = [False] * (end - start)
        if retention:
            per = retention // bs
            if need >= per:
                return None
            mask = [i >= shift and (i - shift) % per >= per - need for i in range(start, end)]
        for b in boundaries:
            top = (b // alignment * alignment) // bs + shift
            for j in range(max(start, top - need), min(end, top)):
                mask[j - start] = True
        return mask
    if isinstance(kind, Mamba):
        bs = kind.block_size
        mask = [False] * (end - start)
        if retention:
            per = retention // bs
            if per <= 1:
                return None
            mask = [(i + 1) % per == 0 for i in range(start, end)]
        for b in boundaries:
            last = (b // alignment * alignment) // bs - 1
            if start <= last < end:
                mask[last - start] = True
        return mask
    return None


def common_prefix_length(table: Sequence[BlockId], tables: Sequence[Sequence[BlockId]]) -> int:
    """Leading blocks of ``table`` that every table in ``tables`` contains.

    NOTE: vLLM compares ``ref_cnt`` with the number of tables instead, which
    is the same while no popped blocks await their deferred free and wrong
    in both directions otherwise (docs/divergences.md, "common-prefix-pending").

    post: 0 <= __return__ <= len(table)
    post: all(all(b in t for t in tables) for b in table[:__return__])
    post: __return__ == len(table) or any(table[__return__] not in t for t in tables)
    """
    n = 0
    while n < len(table) and all(table[n] in t for t in tables):
        n += 1
    return n


def make_manager(
    kind: AttentionKind,
    pool: BlockPool,
    enable_caching: bool,
    group_id: int,
    sched: int,
    cap: int | None,
    profile: SemanticsProfile = NEWEST,
    has_mamba: bool = False,
) -> SingleTypeKVCacheManager:
    """The manager class for ``kind`` (upstream: ``get_manager_for_kv_cache_spec``).

    post: isinstance(__return__, MambaManager) == isinstance(kind, Mamba)
    post: isinstance(__return__, CircularBufferManager) == isinstance(kind, RING_KINDS)
    post: isinstance(__return__, CrossAttentionManager) == isinstance(kind, CrossAttention)
    post: (__return__.kind, __return__.group_id, __return__.profile, __return__.pool) == (kind, group_id, profile, pool)
    post: __return__.admission_cap == (cap if type(__return__) is SingleTypeKVCacheManager else None)
    post: not __return__.req_to_blocks and not __return__.new_block_ids
    """
    if isinstance(kind, Mamba):
        return MambaManager(kind, pool, enable_caching, group_id, sched, profile)
    if isinstance(kind, CrossAttention):
        return CrossAttentionManager(kind, pool, enable_caching, group_id, sched, None, profile, has_mamba)
    if isinstance(kind, RING_KINDS):
        return CircularBufferManager(kind, pool, enable_caching, group_id, sched, None, profile, has_mamba)
    return SingleTypeKVCacheManager(kind, pool, enable_caching, group_id, sched, cap, profile, has_mamba)


def inv_uncached_tail(m: SingleTypeKVCacheManager) -> bool:
    """Table entries at or past ``num_cached_block`` carry no full-block key
    (at most a partial-tail entry, a key for fewer tokens than the block's
    end), and ``num_cached_block`` never exceeds the table length. A Mamba
    group's checkpoint block under a positional form (vLLM 0.30.0 on) is
    keyed at its checkpoint position whatever the full-block caching
    reached (a hybrid caches only whole scheduler blocks), so there an
    entry may carry a key for up to the block's end."""
    ahead = int(isinstance(m, MambaManager) and positional_checkpoints(m.mamba, m.profile))
    for rid, table in m.req_to_blocks.items():
        n = m.num_cached_block.get(rid, 0)
        if n > len(table):
            return False
        for i, b in enumerate(table[n:], start=n):
            if b != NULL_BLOCK and (m.pool.hash_num_tokens[b] or 0) >= (i + 1) * m.block_size + ahead:
                return False
    return all(rid in m.req_to_blocks for rid in m.num_cached_block)


def inv_null_shape(m: SingleTypeKVCacheManager) -> bool:
    """Full-type tables hold no null block; sliding-window, chunked-local and
    non-align Mamba tables are nulls followed by real blocks."""
    for table in m.req_to_blocks.values():
        if isinstance(m.kind, FULL_TYPE_KINDS) and NULL_BLOCK in table:
            return False
        leading = isinstance(m.kind, SlidingWindow | ChunkedLocal)
        leading = leading or (isinstance(m.kind, Mamba) and m.kind.mode != "align")
        first_real = next((i for i, b in enumerate(table) if b != NULL_BLOCK), len(table))
        if leading and NULL_BLOCK in table[first_real:]:
            return False
    return True
