"""One manager per attention kind: block tables of one KV-cache group.

kvimpl's copy of :mod:`kvspec.single_type_kv_cache_manager` (duplicated on
purpose: a shared helper is a shared bug). Tables are already lists of ints;
what changes is the common prefix (per-block holder counts instead of list
membership scans) and the hit search (full attention stops at the first miss).

A manager keeps, per request, a *table*: the block ids that hold the
request's KV for this group, position ``i`` covering tokens
``[i*bs, (i+1)*bs)``. Positions that no longer matter to attention hold the
null block. Each kind differs only in a few pure rules, written as top-level
functions below the classes: how many leading tokens attention skips, how a
prefix hit is searched, and which full blocks are worth caching.

Upstream: ``vllm/v1/core/single_type_kv_cache_manager.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from kvimpl.block_pool import NULL_BLOCK, BlockPool, TailBlockPool
from kvimpl.config_rules import FULL_TYPE_KINDS, RING_KINDS, has_mamba
from kvimpl.invariants import require
from kvimpl.mamba_tail import cache_mamba_tail_block, registers_mamba_tail
from kvimpl.partial_hits import apply_cow, has_partial_local_hit, move_block_hashes, record_partial_hit
from kvimpl.partial_tail import cache_partial_tail_block, registers_partial_tail
from kvimpl.prefill_checkpoints import (
    CheckpointGeometry,
    checkpoint_enabled,
    checkpoint_kept,
    checkpoint_position,
    chunk_checkpoint,
    num_checkpoint_blocks,
    positional_checkpoints,
    rekey_checkpoint_block,
)
from kvimpl.retention import reachable_boundaries
from kvspec.block_pool import BlockId
from kvspec.config import (
    MLA,
    AttentionKind,
    ChunkedLocal,
    CircularBuffer,
    CrossAttention,
    FullAttention,
    KVCacheConfig,
    Mamba,
    SinkFullAttention,
    SlidingWindow,
)
from kvspec.hashing import BlockHash, BlockHashWithGroupId, make_key
from kvspec.request import Request


def cdiv(a: int, b: int) -> int:
    """Ceiling division with Python floor semantics (``-(a // -b)``).

    pre: b > 0
    post: __return__ * b >= a > (__return__ - 1) * b
    """
    return -(a // -b)


class SingleTypeKVCacheManager:
    """Block tables of one group.

    inv: entries at index >= num_cached_block[r] are unhashed
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
        admission_cap: int | None,
        config: KVCacheConfig,
    ) -> None:
        """A manager with no requests; SinkFull takes its sink blocks here.

        ``config`` is the whole configuration, read here once for the
        switches of its semantics profile (the spec passes the profile and
        whether the model has a Mamba group)."""
        self.kind = kind
        self.records_new_ids = records_new_block_ids(kind, config)
        self.pop_trims_nulls = config.profile.pop_drops_leading_nulls
        """Whether :meth:`pop_blocks_for_free` leaves out leading nulls (see :func:`trim_null_head`)."""
        self.block_size = kind.block_size
        self.pool = pool
        self.enable_caching = enable_caching
        self.group_id = group_id
        self.scheduler_block_size = scheduler_block_size
        self.admission_cap = admission_cap
        self.eagle_reach = config.profile.hybrid_cache_eagle_reach
        """An EAGLE group caches for its look-ahead block (vLLM 0.23.0 on; profile switch
        ``hybrid_cache_eagle_reach``, kvspec's ``caches_eagle_peek``)."""
        self.cache_hashed_only = config.profile.lookahead_block_hashes
        """Caching stops at the request's hashed tokens (vLLM 0.33.0 on; profile switch
        ``lookahead_block_hashes``); before, a request with fewer hashes raises IndexError."""
        self.profile = config.profile
        """The semantics profile (read for the retention boundaries, :func:`kvimpl.retention.reachable_boundaries`)."""
        self.use_eagle = False
        self.mask_kind = kind
        """The kind the sliding-window cache mask counts in: the engine's
        unscaled kind under context parallelism up to vLLM 0.29.0 (profile
        switch ``cp_swa_mask_unscaled``; set by the coordinator)."""
        self.req_to_blocks: dict[str, list[BlockId]] = {}
        self.num_cached_block: dict[str, int] = {}
        self.new_block_ids: list[BlockId] = []
        self.cache_mask_alignment: int | None = scheduler_block_size
        """Alignment of the caching mask, None for no mask (set by the coordinator)."""
        self.retention: int | None = None
        """The retention interval this group thins its caching by (set by the coordinator)."""
        self.replay_eagle = False
        """The model has EAGLE groups (set by the coordinator)."""
        self.junctions: dict[str, int] = {}
        """Each request's shared-prefix boundary (the manager's dict, set by it)."""
        self.partial_hit: dict[str, tuple[int, BlockId]] = {}
        """Requests whose table entry (index, block) is shared and is privatised at
        their next allocation (upstream ``_partial_hit_reqs``)."""
        self.tail_owners: set[str] = set()
        """The requests of :attr:`partial_hit` whose record is their own Mamba
        tail entry (made when their blocks were cached), not a hit."""
        self.pending_copies: list[tuple[BlockId, BlockId]] = []
        """Copy-on-write pairs (source, copy) not taken yet, each end holding one
        extra reference (upstream ``_pending_cow_copies``)."""
        self.track_holders = isinstance(kind, FULL_TYPE_KINDS)
        self.holders = [0] * pool.num_gpu_blocks if self.track_holders else []
        """Per block, its occurrences in this group's tables (full-type kinds only)."""
        p = config.profile
        self.partial_tail = enable_caching and registers_partial_tail(kind, p, pool.hash_block_size)
        """The group registers partial-tail entries (:mod:`kvimpl.partial_tail`)."""
        self.fa_tail_below_last = p.fa_tail_below_last_token
        """Profile switch ``fa_tail_below_last_token`` (see :func:`kvimpl.partial_tail.fa_tail_boundary`)."""
        if isinstance(kind, SinkFullAttention):
            self.sink_blocks = pool.take_sink_blocks(num_sink_blocks(kind, config))

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
        computed plus hit tokens; :mod:`kvimpl.partial_hits`).
        ``num_external`` only matters to Mamba align (see there)."""
        cap = self.admission_cap if apply_admission_cap else None
        have = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:
            return blocks_to_allocate(cdiv(num_tokens, self.block_size), cap, have, 0, (), True)
        skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        ref = self.pool.ref_cnt
        free = [b != NULL_BLOCK and ref[b] == 0 for b in new_computed_blocks]
        cow = has_partial_local_hit(new_computed_blocks, num_local, self.block_size)
        return blocks_to_allocate(cdiv(num_tokens, self.block_size), cap, have, skipped, free, False) + cow

    def add_local_computed_blocks(
        self, request_id: str, new_computed_blocks: Sequence[BlockId], num_local: int, num_external: int
    ) -> None:
        """Start the table of a new request with its prefix hits (touched), the
        skipped leading positions replaced by null blocks; a hit that ends
        inside a block leaves a partial-hit record (:mod:`kvimpl.partial_hits`)."""
        table = self.req_to_blocks.setdefault(request_id, [])
        assert not table, f"request {request_id} already has a table"
        skipped = self.get_num_skipped_tokens(num_local + num_external) // self.block_size
        hits = list(new_computed_blocks[max(skipped, 0) :])
        if self.enable_caching:
            self.pool.touch(hits)
        added = [NULL_BLOCK] * skipped + hits
        table += added
        if self.track_holders:
            h = self.holders
            for b in added:
                h[b] += 1
        self.num_cached_block[request_id] = len(table)
        if has_partial_local_hit(hits, num_local, self.block_size):
            record_partial_hit(self, request_id, num_local // self.block_size, hits[-1])

    def allocate_external_computed_blocks(
        self, request_id: str, num_local: int, num_external: int, record: bool = True
    ) -> None:
        """Fresh blocks for connector-loaded tokens that attention still reads,
        listed for zeroing only with ``record``."""
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
        table = self.req_to_blocks.setdefault(request_id, [])
        if request_id not in self.partial_hit:
            return self._extend(table, cdiv(num_tokens, self.block_size) - len(table))
        idx, src = self.partial_hit.pop(request_id)
        cow = self.pool.get_new_blocks(1)
        apply_cow(self, request_id, idx, src, cow[0])
        self.new_block_ids += cow
        return cow + self._extend(table, cdiv(num_tokens, self.block_size) - len(table))

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Hash the table's full blocks up to ``num_tokens`` that are not cached
        yet (from vLLM 0.33.0 on never past the hashed tokens, which lag under
        look-ahead block hashes); then, from vLLM 0.26.0 on, a full-attention
        group coarser than the hash block registers its partial tail
        (:mod:`kvimpl.partial_tail`)."""
        rid = request.request_id
        num_cached = self.num_cached_block.get(rid, 0)
        num_full = num_tokens // self.block_size
        if self.cache_hashed_only and num_cached < num_full:
            num_full = min(num_full, len(request.block_hashes) * self.pool.hash_block_size // self.block_size)
        if num_cached < num_full:
            align = self.cache_mask_alignment
            mask = None
            if align is not None:
                eagle = self.use_eagle and self.eagle_reach
                if self.retention is None:
                    mask = reachable_block_mask(self.mask_kind, num_cached, num_full, align, eagle)
                else:
                    bounds = reachable_boundaries(
                        self.profile, request.num_prompt_tokens, self.scheduler_block_size, self.replay_eagle,
                        self.junctions.get(rid, 0), self.use_eagle, self.block_size,
                    )  # fmt: skip
                    mask = retention_block_mask(
                        self.mask_kind, num_cached, num_full, align, eagle, self.retention, bounds
                    )
            table = self.req_to_blocks.setdefault(rid, [])
            self.pool.cache_full_blocks(request, table, num_cached, num_full, self.block_size, self.group_id, mask)
            self.num_cached_block[rid] = num_full
        if self.partial_tail:
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
        return trim_null_head(table) if self.pop_trims_nulls else table

    def free(self, request_id: str) -> None:
        """Release the request's blocks, last table entry first."""
        table = self._forget(request_id)
        # The pool skips null entries; leading ones (sliding window, chunked
        # local and Mamba tables are mostly nulls) are dropped here by C loops
        # instead of one pool iteration each. ``not any(...)``: all of the
        # first ``n`` entries are the null block 0, so no null comes later.
        n = table.count(NULL_BLOCK)
        if n and not any(table[:n]):
            table = table[n:]
        # a sliding window's blocks go as skipped ones (vLLM 0.23.0: kvspec's requeue_unhashed_first)
        self.pool.free_blocks(reversed(table), isinstance(self.kind, SlidingWindow))

    def get_num_common_prefix_blocks(self, request_id: str) -> int:
        """Leading blocks of the request's table held by every table of this
        group (0 for kinds other than full attention)."""
        if not self.track_holders:
            return 0
        return common_prefix_length(self.req_to_blocks.get(request_id, []), self.req_to_blocks, self.holders)

    def take_new_block_ids(self) -> list[BlockId]:
        """Drain the ids of fresh blocks (see :func:`records_new_block_ids`)."""
        ids, self.new_block_ids = self.new_block_ids, []
        return ids

    def record_for_zeroing(self, request_id: str, first: int) -> None:
        """List the request's table from index ``first`` on as fresh blocks again
        (:meth:`kvimpl.kv_cache_manager.KVCacheManager.record_blocks_for_zeroing`)."""
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
        require(inv_holders_count(self), f"group {self.group_id}: holder counts disagree with the tables")
        require(self.tail_owners <= self.partial_hit.keys(), f"group {self.group_id}: tail owner without a record")

    def _forget(self, request_id: str) -> list[BlockId]:
        """Drop the request's bookkeeping; return its whole table (pending
        copies and their references stay)."""
        self.num_cached_block.pop(request_id, None)
        self.partial_hit.pop(request_id, None)
        self.tail_owners.discard(request_id)
        table = self.req_to_blocks.pop(request_id, [])
        if self.track_holders:
            h = self.holders
            for b in table:
                h[b] -= 1
        return table

    def _extend(self, table: list[BlockId], n: int, record: bool = True) -> list[BlockId]:
        if n <= 0:
            return []
        new = self.pool.get_new_blocks(n)
        table += new
        if self.track_holders:
            h = self.holders
            for b in new:
                h[b] += 1
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
            if self.track_holders:
                self.holders[table[i]] -= 1
                self.holders[NULL_BLOCK] += 1
            table[i] = NULL_BLOCK
        if freed:
            self.pool.free_blocks(freed, True)


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
    """A ring group: one block per request, claimed by its first allocation
    and held until it is freed; no hits, no hashing, nothing skipped
    (upstream: ``CircularBufferManager``, and ``KpoolTailManager``, which adds
    nothing). Its requests never get a ``num_cached_block`` entry.

    inv: every table holds at most one block, never the null block
    inv: num_cached_block is empty
    """

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
        """1 while the ring is unclaimed, then 0 (token counts and caps do not matter)."""
        return 0 if self.req_to_blocks.get(request_id) else 1

    def add_local_computed_blocks(
        self, request_id: str, new_computed_blocks: Sequence[BlockId], num_local: int, num_external: int
    ) -> None:
        """A ring never has hits, and nothing is recorded for it here."""

    def allocate_external_computed_blocks(
        self, request_id: str, num_local: int, num_external: int, record: bool = True
    ) -> None:
        """Claim the ring (the allocation does not return it)."""
        self._claim(request_id, record)

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> list[BlockId]:
        """The ring, on the call that claims it; afterwards nothing."""
        return self._claim(request_id)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """A ring block is never hashed."""

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """A ring is never skipped."""

    def get_num_common_prefix_blocks(self, request_id: str) -> int:
        """Always 0."""
        return 0

    def check_invariants(self) -> None:
        """As the base, plus the ring's own shape."""
        super().check_invariants()
        require(inv_ring_tables(self), f"group {self.group_id}: a ring table that is not one real block")

    def _claim(self, request_id: str, record: bool = True) -> list[BlockId]:
        table = self.req_to_blocks.setdefault(request_id, [])
        return [] if table else self._extend(table, 1, record)


class MambaManager(SingleTypeKVCacheManager):
    """Recurrent state blocks; only the state after the last token matters.

    In ``align`` mode a table holds the running state at index
    ``cdiv(T, bs) - 1`` followed by ``num_speculative_blocks`` spare blocks,
    which move forward (old slot nulled) instead of being reallocated.
    """

    def __init__(
        self, kind: Mamba, pool: BlockPool, enable_caching: bool, group_id: int, sched: int, config: KVCacheConfig
    ) -> None:
        """A Mamba manager with no requests."""
        super().__init__(kind, pool, enable_caching, group_id, sched, None, config)
        self.mamba = kind
        p = config.profile
        self.skip_slack = kind.num_speculative_blocks if p.mamba_skip_spec_slack else 0
        """Tokens :meth:`remove_skipped_blocks` subtracts first (profile switch ``mamba_skip_spec_slack``)."""
        self.estimate_capped = p.mamba_align_estimate_capped
        """Profile switch ``mamba_align_estimate_capped`` (see :func:`mamba_align_new_blocks`)."""
        self.step_guard = p.mamba_step_guard
        """Profile switch ``mamba_step_guard``: a hit on a state cached in this step waits."""
        self.early_return_allocated = p.mamba_early_return_allocated
        """Profile switch ``mamba_early_return_allocated`` (see :meth:`_allocate_aligned`)."""
        self.mamba_tail = enable_caching and registers_mamba_tail(kind, p, pool.hash_block_size)
        """The group keys its state at the prompt's tail boundary (:mod:`kvimpl.mamba_tail`)."""
        self.mamba_tail_newer = p.mamba_tail_entries
        """Profile switch ``mamba_tail_entries`` (see :func:`kvimpl.mamba_tail.mamba_tail_boundary`)."""
        self.mamba_tail_skip_keyed = p.mamba_tail_skip_keyed
        """Profile switch ``mamba_tail_skip_keyed`` (see :func:`kvimpl.mamba_tail.cache_mamba_tail_block`)."""
        self.tail_eagle = p.mamba_tail_eagle
        """Profile switch ``mamba_tail_eagle`` (see :func:`kvimpl.mamba_tail.tail_eagle_shift`)."""
        self.drop_eagle_checkpoint = config.use_eagle
        """The model uses EAGLE (upstream ``drop_eagle_checkpoint_block``): the tail
        boundary may move down, and so do checkpoint positions."""
        self.cached_blocks_this_step: set[BlockHashWithGroupId] = set()
        self.last_state_block_idx: dict[str, int] = {}
        self.allocated_block_reqs: set[str] = set()
        self.retired_mark = kind.mode == "align" and p.mamba_align_retired_mark
        """Profile switch ``mamba_align_retired_mark`` in align mode (see :meth:`_remove_blocks_in_range`)."""
        self.num_retired_blocks: dict[str, int] = {}
        """With :attr:`retired_mark`: per request, the table index removal reached."""
        form = p.prefill_checkpoints
        self.checkpoints = checkpoint_enabled(kind, form)
        """The group takes prefill checkpoints (:mod:`kvimpl.prefill_checkpoints`)."""
        self.positional = positional_checkpoints(kind, p)
        """Its checkpoints have a position of their own (vLLM 0.30.0 on)."""
        self.checkpoint_scratch_stays = self.positional and form in ("chunk-position", "prompt-end")
        """vLLM 0.30.0 and 0.31.0: a checkpoint chunk leaves the scratch blocks where they are, and counts them."""
        self.checkpoint_uncapped = self.positional and form == "chunk-position"
        """vLLM 0.30.0: an allocated request's checkpoint chunk estimates its whole shortfall."""
        self.num_checkpoint_blocks: dict[str, int] = {}
        """With :attr:`checkpoints`: per request, the checkpoint blocks the last
        estimate decided on (0 or 1), which the allocation that follows takes."""
        self.checkpoint_at: dict[str, tuple[int, int]] = {}
        """With :attr:`positional`: per request, the ``(position, slot)`` of the
        checkpoint the last estimate decided on, kept until the next estimate
        (kvspec's ``MambaManager.checkpoints``; upstream ``_checkpoints``)."""
        self.checkpoint_granularity = pool.hash_block_size
        """The step between checkpoint positions (set by the coordinator:
        :func:`kvimpl.prefill_checkpoints.checkpoint_granularity`)."""

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
        remembers for the allocation, unless it is the admission check
        (:mod:`kvimpl.prefill_checkpoints`; ``prefill_end`` is 0 or the end
        a checkpoint chunk must reach, from vLLM 0.31.0 on).

        NOTE: in align mode vLLM 0.25.1 forgets the block that external
        (connector) tokens take for a new request, so its estimate can be one
        short and the allocation then fails half-way; the spec takes the larger
        of vLLM's estimate and the exact count (docs/divergences.md,
        "mamba-align-external-estimate").
        """
        if (
            self.step_guard
            and new_computed_blocks
            and self.pool.block_hash[new_computed_blocks[-1]] in self.cached_blocks_this_step
        ):
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
        partial = request_id in self.partial_hit or has_partial_local_hit(
            new_computed_blocks, num_local, self.block_size
        )
        ckpt = 0
        if self.checkpoints:
            ckpt = self._weigh_checkpoint(
                request_id, total_computed_tokens, num_tokens_main_model, allocated, apply_admission_cap, prefill_end
            )
        new = mamba_align_new_blocks(
            raw, allocated, spec, self.estimate_capped, partial, ckpt, self.checkpoint_scratch_stays,
            self.checkpoint_uncapped,
        )  # fmt: skip
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
        """As the base, then the positional checkpoint's key (moved to its
        position or, transient, dropped: :meth:`_cache_checkpoint`) or, in a
        chunk without one, the tail entry of :mod:`kvimpl.mamba_tail`;
        remember the keys cached in this step."""
        rid = request.request_id
        before = self.num_cached_block.get(rid, 0)
        super().cache_blocks(request, num_tokens)
        if rid in self.checkpoint_at:
            key = self._cache_checkpoint(request, num_tokens)
            if key is not None:
                self.cached_blocks_this_step.add(key)
        elif self.mamba_tail:
            key = cache_mamba_tail_block(self, request, num_tokens)
            if key is not None:
                self.cached_blocks_this_step.add(key)
        for b in self.req_to_blocks.get(rid, [])[before : self.num_cached_block.get(rid, 0)]:
            key = self.pool.block_hash[b]
            if b != NULL_BLOCK and key is not None:
                self.cached_blocks_this_step.add(key)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """As the base, after subtracting the speculative block *count* from the
        token count (vLLM's guard against unverified drafts, until 0.26.0:
        profile switch ``mamba_skip_spec_slack``); in align mode also free the
        state block of two steps ago."""
        total = max(0, total_computed_tokens - self.skip_slack)
        super().remove_skipped_blocks(request_id, total)
        idx = self.last_state_block_idx.get(request_id)
        if self.mamba.mode == "align" and idx is not None and idx < cdiv(total, self.block_size) - 1:
            table = self.req_to_blocks[request_id]
            if table[idx] != NULL_BLOCK:
                self.pool.free_blocks([table[idx]])
                table[idx] = NULL_BLOCK

    def _remove_blocks_in_range(self, request_id: str, first: int, last: int) -> None:
        """As the base; with :attr:`retired_mark` (vLLM 0.30.0 on, align mode)
        from the request's retired mark to ``last``, freeing every state block
        there (walking backwards over null gaps), and the mark moves to the end."""
        if not self.retired_mark:
            super()._remove_blocks_in_range(request_id, first, last)
            return
        table = self.req_to_blocks.get(request_id, [])
        start, stop = max(first, self.num_retired_blocks.get(request_id, 0)), min(last, len(table))
        if start >= stop:
            return
        freed = [b for b in reversed(table[start:stop]) if b != NULL_BLOCK]
        table[start:stop] = [NULL_BLOCK] * (stop - start)
        if freed:
            self.pool.free_blocks(freed)
        self.num_retired_blocks[request_id] = stop

    def _forget(self, request_id: str) -> list[BlockId]:
        """As the base, forgetting the align-mode bookkeeping too."""
        self.allocated_block_reqs.discard(request_id)
        self.last_state_block_idx.pop(request_id, None)
        self.num_retired_blocks.pop(request_id, None)
        self.num_checkpoint_blocks.pop(request_id, None)
        self.checkpoint_at.pop(request_id, None)
        return super()._forget(request_id)

    def new_step_starts(self) -> None:
        """States cached in earlier steps become usable."""
        self.cached_blocks_this_step.clear()

    def checkpoint_geometry(self) -> CheckpointGeometry:
        """The group's facts its checkpoint positions depend on besides the chunk."""
        pool = self.pool
        return CheckpointGeometry(
            pool.hash_block_size, self.checkpoint_granularity, self.drop_eagle_checkpoint,
            pool.num_hash_lookahead_tokens,
        )  # fmt: skip

    def _weigh_checkpoint(
        self, request_id: str, start: int, end: int, allocated: bool, admission: bool, prefill_end: int
    ) -> int:
        """The checkpoint blocks (0 or 1) of the chunk ``[start, end)``, judged
        on the request's table before this step's hits; unless it is the
        admission check, remembered for the allocation (and, under a
        positional form, the checkpoint's ``(position, slot)`` for the caching)."""
        table = self.req_to_blocks.get(request_id, ())
        if not self.positional:
            ckpt = num_checkpoint_blocks(self.block_size, table, end, start)
        else:
            found = chunk_checkpoint(
                self.mamba, self.profile, self.checkpoint_geometry(), table, end, start, allocated, prefill_end
            )
            ckpt = 0 if found is None else 1
            if not admission and found is None:
                self.checkpoint_at.pop(request_id, None)
            elif not admission and found is not None:
                self.checkpoint_at[request_id] = found
        if not admission:
            self.num_checkpoint_blocks[request_id] = ckpt
        return ckpt

    def _cache_checkpoint(self, request: Request, num_tokens: int) -> BlockHashWithGroupId | None:
        """After the full-block caching up to ``num_tokens``: key the request's
        checkpoint block at the checkpoint's position alone (nothing to do if
        its primary key is there already), or, when the checkpoint is
        transient (:func:`kvimpl.prefill_checkpoints.checkpoint_kept`), drop
        every key the block has. Returns the key made, if any. A checkpoint
        past the request's hashes (a step with draft tokens that ends past the
        request's tokens) is left alone, as kvspec does."""
        rid = request.request_id
        position, slot = self.checkpoint_at[rid]
        table = self.req_to_blocks[rid]
        assert 0 <= slot < len(table), f"request {rid}: checkpoint slot {slot} is outside its table"
        b, pool = table[slot], self.pool
        assert isinstance(pool, TailBlockPool), "a group with positional checkpoints needs a TailBlockPool"
        g = self.checkpoint_geometry()
        prompt = checkpoint_position(self.profile, request.num_prompt_tokens, g.granularity, g.drop_eagle, g.lookahead)
        kept = checkpoint_kept(
            self.profile, self.block_size, position, prompt, self.junctions.get(rid, 0), self.retention, num_tokens,
            request.num_prompt_tokens,
        )  # fmt: skip
        if not kept:
            pool._evict(b)
            return None
        if pool.hash_num_tokens[b] == position:
            return None
        if position > len(request.block_hashes) * pool.hash_block_size:
            return None
        return rekey_checkpoint_block(pool, request, b, position, self.group_id)

    def _exact_with_external(self, hits: Sequence[BlockId], total: int, required: int, num_local: int) -> int:
        """Blocks a new align-mode request with external tokens really takes:
        the external state block, then the copy of a partial hit that
        attention still reads, the running state and spare blocks (a prefill
        checkpoint's block comes on top: its slot lies past the state the
        chunk resumes from)."""
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
        Returns the table from its previous length on (nulls and moved blocks
        included); a partial hit is privatised first (:meth:`_privatise`). A
        prefill checkpoint leaves the slot below the running state out of the
        padding, so a fresh block fills it. A positional checkpoint (vLLM
        0.30.0 on) runs the allocation even when the table is long enough;
        its chunk leaves the spare blocks in place (0.30.0, 0.31.0) or moves
        them except into the checkpoint's slot (0.32.0 on)."""
        spec = self.mamba.num_speculative_blocks
        if self.positional:
            ckpt = 1 if request_id in self.checkpoint_at else 0
        else:
            ckpt = self.num_checkpoint_blocks.get(request_id, 0)
        table = self.req_to_blocks.setdefault(request_id, [])
        required = cdiv(num_tokens, self.block_size) + spec
        prev = len(table)
        partial = self.partial_hit.pop(request_id, None)
        owner = request_id in self.tail_owners
        self.tail_owners.discard(request_id)
        if required <= prev and partial is None and not (self.positional and ckpt):
            if self.early_return_allocated:
                self.allocated_block_reqs.add(request_id)
            return []
        allocated = request_id in self.allocated_block_reqs
        if allocated or prev > 0:
            self.last_state_block_idx[request_id] = prev - 1 - (spec if allocated else 0)
        skip = required - spec - 1
        table += [NULL_BLOCK] * (skip - ckpt - prev)
        stays = bool(ckpt) and self.checkpoint_scratch_stays
        below = skip - ckpt if self.positional else skip  # a positional checkpoint's slot is no spare's target
        for idx in range(prev - spec, prev) if allocated and not stays else ():
            if idx >= below:
                break
            table.append(table[idx])
            table[idx] = NULL_BLOCK
        fresh = max(required - len(table), 0) + (partial is not None)
        assert fresh <= 1 + (spec if not allocated or stays else 0) + (partial is not None) + ckpt
        new = self.pool.get_new_blocks(fresh)
        returned = table[prev:]
        if partial is not None:
            # NOTE: the owner of a tail entry always keeps its block and moves the entry, even when it
            # is not marked as allocated yet (kvspec's rule): its table was handed out by an earlier
            # call, and a table handed out is append-only (vLLM 0.26.0 and 0.27.x differ: the
            # divergence mamba-cow-owner in docs/divergences.md).
            returned = self._privatise(request_id, partial, new.pop(0), allocated or owner) + returned
        table += new
        self.allocated_block_reqs.add(request_id)
        return returned + new

    def _privatise(self, request_id: str, partial: tuple[int, BlockId], cow: BlockId, keeps: bool) -> list[BlockId]:
        """Serve a partial-hit record with the fresh block ``cow``: a new request
        takes ``cow`` into its table (returned); the owner of a tail entry keeps
        its block and moves the entry to ``cow`` instead, which no table holds
        and which counts as cached in this step (returns nothing). Either way
        the copy is queued; see :mod:`kvimpl.partial_hits`. ``keeps``: the
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


def records_new_block_ids(kind: AttentionKind, config: KVCacheConfig) -> bool:
    """Whether a group of ``kind`` reports its fresh blocks to ``take_new_block_ids``.

    vLLM 0.17.1: full attention (the exact type); 0.23.0: full attention and
    MLA (so not SinkFull). 0.26.0: the same, but only in models with a Mamba group. 0.28.0: every
    attention kind but Mamba, in models with a Mamba group (profile switch
    ``new_block_ids``). A ``CircularBuffer`` ring never records (vLLM leaves
    its spec class out); a ``KpoolTail`` ring is a sliding-window spec in
    vLLM and follows the rule.
    """
    if type(kind) is CircularBuffer:
        return False
    mode = config.profile.new_block_ids
    if mode == "full":
        return type(kind) is FullAttention
    if mode == "full-mla":
        return type(kind) is FullAttention or type(kind) is MLA
    if mode == "full-mla-with-mamba":
        return has_mamba(config) and (type(kind) is FullAttention or type(kind) is MLA)
    return has_mamba(config) and not isinstance(kind, Mamba)


def num_sink_blocks(kind: SinkFullAttention, config: KVCacheConfig) -> int:
    """Blocks a SinkFull group takes for good at construction: ``sink_len /
    block_size`` until vLLM 0.30.0, none since (profile switch
    ``sink_blocks_reserved``).

    pre: kind.block_size >= 1
    post: __return__ >= 0
    """
    return kind.sink_len // kind.block_size if config.profile.sink_blocks_reserved else 0


def trim_null_head(table: list[BlockId]) -> list[BlockId]:
    """``table`` without its leading null blocks (the list itself if it has none).

    post: NULL_BLOCK not in __return__[:1]
    """
    if not table or table[0] != NULL_BLOCK:
        return table
    first = 1
    while first < len(table) and table[first] == NULL_BLOCK:
        first += 1
    return table[first:]


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
    request not allocated yet (or, with ``spec_on_checkpoint``, vLLM 0.30.0
    and 0.31.0, for a checkpoint chunk), plus (``partial``) the copy of a
    partial hit, which also counts as one more missing entry, plus the
    ``checkpoint`` block of a prefill checkpoint; from vLLM 0.31.0 on never
    more than that need (profile switch ``mamba_align_estimate_capped``).
    With ``uncapped_on_checkpoint`` (vLLM 0.30.0) an allocated request's
    checkpoint chunk counts its whole shortfall.

    pre: spec >= 0 and checkpoint in (0, 1)
    post: raw > 0 or partial or __return__ == raw
    post: checkpoint or __return__ == mamba_align_new_blocks(raw, allocated, spec, capped, partial)
    """
    if partial:
        raw = (raw if raw > 0 else 0) + 1
    if raw <= 0:
        return raw
    if checkpoint and allocated and uncapped_on_checkpoint:
        return raw
    spare = spec if not allocated or (checkpoint and spec_on_checkpoint) else 0
    cap = 1 + spare + partial + checkpoint
    return cap if not capped or cap < raw else raw


def blocks_to_allocate(
    required: int, cap: int | None, have: int, skipped: int, hit_free: Sequence[bool], tracked: bool
) -> int:
    """Blocks an allocation takes from the free queue (the spec's
    ``blocks_to_allocate``, written independently): ``required`` entries
    (capped by ``cap``), ``have`` held; a new request's hits from position
    ``skipped - have`` on that are free (``hit_free``) cost one block each.

    pre: required >= 0 and have >= 0 and (cap is None or cap >= 1)
    post: __return__ >= 0
    """
    if cap is not None and cap < required:
        required = cap
    if tracked:
        return required - have if required > have else 0
    held = max(len(hit_free) + have, skipped)
    new = required - held if required > held else 0
    start = skipped - have if skipped > have else 0
    return new + list(hit_free[start:]).count(True)


def num_skipped_tokens(kind: AttentionKind, num_computed_tokens: int) -> int:
    """Leading tokens that attention for the next token no longer reads.

    Sliding window ``w``: ``max(0, n - w + 1 - e)``, ``e`` its
    ``extra_retained_tokens`` (window 4, 7 computed → 4; with ``e = 2`` → 2).
    Chunked local ``c``: ``n // c * c`` (chunk 8: 13 → 8, 8 → 8, 7 → 0).
    Mamba: ``n - 1`` (only the last state; -1 for n = 0). Others: 0.

    pre: num_computed_tokens >= 0
    pre: not isinstance(kind, SlidingWindow) or kind.window >= 1
    pre: not isinstance(kind, ChunkedLocal) or kind.chunk >= 1
    post: __return__ <= num_computed_tokens
    """
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
    """
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
    ``group_ids`` (every group must hold each block); null where not needed."""
    if isinstance(kind, RING_KINDS):
        return [[] for _ in group_ids]
    max_blocks = max(max_length, 0) // kind.block_size
    bs = kind.block_size
    full = isinstance(kind, FULL_TYPE_KINDS)
    if len(group_ids) == 1:
        # One group (a spec group of one KV-cache group): the cache map read in
        # one loop, without get_cached_block's per-hash call and key building.
        if isinstance(kind, Mamba):
            i, state = last_cached_state(pool.cached, block_hashes[:max_blocks], group_ids[0], bs, alignment)
            return [[] if state is None else [NULL_BLOCK] * i + [state]]
        one = cached_in_group(pool.cached, block_hashes[:max_blocks], group_ids[0], full)
        if full:  # no None: the list ends before the first miss
            return [cast(list[BlockId], one[: full_attention_hit([True] * len(one), drop_eagle, bs, alignment)])]
        first, length = hit_span(kind, [b is not None for b in one], max_length, drop_eagle, bs, alignment)
        return [[NULL_BLOCK] * min(first, length) + cast(list[BlockId], one[first:length])]
    if full:
        # Lookups change nothing and the hit is downward closed: stop at the first miss.
        found: list[list[BlockId]] = []
        for h in block_hashes[:max_blocks]:
            f = pool.get_cached_block(h, group_ids)
            if f is None:
                break
            found.append(f)
        length = full_attention_hit([True] * len(found), drop_eagle, bs, alignment)
        return [[found[i][g] for i in range(length)] for g in range(len(group_ids))]
    looked_up = [pool.get_cached_block(h, group_ids) for h in block_hashes[:max_blocks]]
    present = [f is not None for f in looked_up]
    found = [f or [] for f in looked_up]
    first, length = hit_span(kind, present, max_length, drop_eagle, bs, alignment)
    return [[NULL_BLOCK if i < first else found[i][g] for i in range(length)] for g in range(len(group_ids))]


def hit_span(
    kind: AttentionKind, present: Sequence[bool], max_length: int, drop_eagle: bool, block_size: int, alignment: int
) -> tuple[int, int]:
    """``(first, length)`` of a sparse kind's hit over the looked-up hashes
    (``present[i]``: hash ``i`` is cached in every group); positions before
    ``first`` are null."""
    if isinstance(kind, SlidingWindow):
        return sliding_window_hit(
            present, contiguous_blocks_for_hit(kind.window, block_size, drop_eagle), drop_eagle, block_size, alignment
        )
    if isinstance(kind, ChunkedLocal):
        return chunked_local_hit(present, max_length, kind.chunk, block_size)
    if isinstance(kind, Mamba):
        return mamba_hit(present, block_size, alignment)
    if isinstance(kind, CrossAttention):
        raise NotImplementedError("cross attention does not support prefix caching")
    raise AssertionError(f"unhandled attention kind {kind!r}")


def last_cached_state(
    cached: Mapping[Any, Sequence[BlockId]],
    block_hashes: Sequence[BlockHash],
    group_id: int,
    block_size: int,
    alignment: int,
) -> tuple[int, BlockId | None]:
    """:func:`mamba_hit` over :func:`cached_in_group`'s lookups, each made only
    when the scan reads it: ``(i, block)`` for the rightmost hash ``i`` whose
    end is aligned and that is cached in group ``group_id``, else ``(0, None)``.

    NOTE: a Mamba hit needs only the last state, so the scan from the right
    usually stops at its first lookup, where the eager list looked up every
    hash (lookups change nothing, so reading fewer of them is the same rule)."""
    get, suffix = cached.get, make_key(BlockHash(b""), group_id)
    for i in range(len(block_hashes) - 1, -1, -1):
        if block_size == alignment or (i + 1) * block_size % alignment == 0:
            ids = get(block_hashes[i] + suffix)
            if ids:
                return i, ids[0]
    return 0, None


def cached_in_group(
    cached: Mapping[Any, Sequence[BlockId]], block_hashes: Sequence[BlockHash], group_id: int, stop_at_miss: bool
) -> list[BlockId | None]:
    """Per hash, the oldest block cached under it in group ``group_id`` (what
    ``BlockPool.get_cached_block(h, [group_id])`` returns, unwrapped), None on
    a miss; with ``stop_at_miss`` the list ends before the first miss.

    ``cached`` is the pool's cache map (``{make_key(h, g): ids}``); the key's
    group suffix is built once per call."""
    get, suffix = cached.get, make_key(BlockHash(b""), group_id)  # make_key(h, g) == h + suffix
    out: list[BlockId | None] = []
    for h in block_hashes:
        ids = get(h + suffix)
        if ids:
            out.append(ids[0])
        elif stop_at_miss:
            break
        else:
            out.append(None)
    return out


def eagle_window_hit_before_drop(
    kind: SlidingWindow,
    block_hashes: Sequence[BlockHash],
    max_length: int,
    group_ids: Sequence[int],
    pool: BlockPool,
    alignment: int,
) -> bool:
    """Whether vLLM 0.16.0's sliding-window search under EAGLE finds a hit
    before it drops the EAGLE block (kvspec's ``eagle_window_hit_before_drop``):
    where the block is not ``alignment``, 0.16.0 then fails an assertion."""
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
    """Which of blocks ``[start, end)`` a group caches under the retention
    interval ``retention`` (``kvspec.single_type_kv_cache_manager.retention_block_mask``);
    None means all. A window group keeps the ``need`` blocks below each
    multiple of ``retention`` (none at 0) and below each boundary, aligned
    down (one block further under EAGLE); a Mamba group the state block
    ending on each of them.

    pre: 0 <= start <= end and alignment >= 1 and retention >= 0
    post: __return__ is None or len(__return__) == end - start
    """
    if isinstance(kind, SlidingWindow):
        bs = kind.block_size
        need = contiguous_blocks_for_hit(kind.window, bs, use_eagle)
        shift = int(use_eagle)
        if retention and need >= retention // bs:
            return None
        keep: set[int] = set()
        if retention:
            per = retention // bs
            keep.update(i for i in range(start, end) if i >= shift and (i - shift) % per >= per - need)
        for b in boundaries:
            top = b // alignment * alignment // bs + shift
            keep.update(range(max(start, top - need), min(end, top)))
        return [i in keep for i in range(start, end)]
    if isinstance(kind, Mamba):
        bs = kind.block_size
        per = retention // bs
        if retention and per <= 1:
            return None
        ends = {b // alignment * alignment // bs - 1 for b in boundaries}
        return [(retention > 0 and (i + 1) % per == 0) or i in ends for i in range(start, end)]
    return None


def common_prefix_length(table: Sequence[BlockId], tables: dict[str, list[BlockId]], holders: list[int]) -> int:
    """Leading blocks of ``table`` that every table in ``tables`` contains.

    ``holders[b]`` counts the occurrences of ``b`` in ``tables``; a non-null
    block occurs at most once per full-type table (checked by
    :func:`inv_holders_count`), so "every table holds b" is
    ``holders[b] == len(tables)``. The null block can repeat (caller-given
    null hits), so it falls back to the spec's membership scan.

    NOTE: the spec's rule (tables, not vLLM's ``ref_cnt``, which also counts
    popped blocks awaiting their deferred free). Measured with timeit, 64
    tables of 64 blocks sharing a 32-block prefix: 3.7 µs per call vs the
    spec's 884 µs.

    post: 0 <= __return__ <= len(table)
    """
    n_tables = len(tables)
    n = 0
    for b in table:
        if b == NULL_BLOCK:
            if not all(NULL_BLOCK in t for t in tables.values()):
                break
        elif holders[b] != n_tables:
            break
        n += 1
    return n


def make_manager(
    kind: AttentionKind,
    pool: BlockPool,
    enable_caching: bool,
    group_id: int,
    sched: int,
    cap: int | None,
    config: KVCacheConfig,
) -> SingleTypeKVCacheManager:
    """The manager class for ``kind`` (upstream: ``get_manager_for_kv_cache_spec``)."""
    if isinstance(kind, Mamba):
        return MambaManager(kind, pool, enable_caching, group_id, sched, config)
    if isinstance(kind, CrossAttention):
        return CrossAttentionManager(kind, pool, enable_caching, group_id, sched, None, config)
    if isinstance(kind, RING_KINDS):
        return CircularBufferManager(kind, pool, enable_caching, group_id, sched, None, config)
    return SingleTypeKVCacheManager(kind, pool, enable_caching, group_id, sched, cap, config)


def inv_uncached_tail(m: SingleTypeKVCacheManager) -> bool:
    """Table entries at or past ``num_cached_block`` carry no full-block key
    (at most a partial-tail entry, a key for fewer tokens than the block's
    end), and ``num_cached_block`` never exceeds the table length. In a
    Mamba group with positional checkpoints a checkpoint block may be keyed
    ahead of the caching (the hybrid caches up to a scheduler-block boundary
    or the hashed tokens, while the checkpoint is keyed at its position), for
    at most the block's end."""
    pool = m.pool
    ntok = pool.hash_num_tokens if isinstance(pool, TailBlockPool) else None
    ahead = int(isinstance(m, MambaManager) and m.positional)
    for rid, table in m.req_to_blocks.items():
        n = m.num_cached_block.get(rid, 0)
        if n > len(table):
            return False
        for i, b in enumerate(table[n:], start=n):
            if b == NULL_BLOCK or pool.block_hash[b] is None:
                continue
            if ntok is None or (ntok[b] or 0) >= (i + 1) * m.block_size + ahead:
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


def inv_holders_count(m: SingleTypeKVCacheManager) -> bool:
    """For full-type kinds, ``holders`` counts each block's table occurrences,
    and no table holds a non-null block twice."""
    if not m.track_holders:
        return True
    counts = [0] * m.pool.num_gpu_blocks
    for table in m.req_to_blocks.values():
        real = [b for b in table if b != NULL_BLOCK]
        if len(set(real)) != len(real):
            return False
        for b in table:
            counts[b] += 1
    return counts == m.holders


def inv_ring_tables(m: SingleTypeKVCacheManager) -> bool:
    """A ring group's tables hold at most one block each, never the null
    block, and none of its requests has a ``num_cached_block`` entry."""
    return not m.num_cached_block and all(len(t) <= 1 and NULL_BLOCK not in t for t in m.req_to_blocks.values())
