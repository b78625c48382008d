"""Semantics profiles: the observable behaviour of each supported vLLM release.

A profile is a frozen value of named behaviour switches. Each release's
constant is built from its predecessor with :func:`dataclasses.replace`,
naming only what that release changed, so this module reads as a changelog of
observable behaviour, oldest first (every release from 0.16.0 to 0.34.0). A release with no observable change
shares its predecessor's switches (and says so). Each switch is read in one
named place of the spec (given after it below), so every rule stays a small
function a port can check alone.

NOTE: The dataclass defaults are vLLM 0.25.1's switches, the release kvspec
was first written against; :data:`VLLM_0_16_0` (the oldest) names every
switch that differs from them, and the releases between build up to
:data:`VLLM_0_25_1`, which equals the defaults, so the changelog still reads
oldest first.

Releases change more than these switches: some add state (partial-tail
entries, fine-grained hits with copy-on-write, new managers, a second pool).
A modelled one is its own module, switched on by a profile field;
:func:`features_used` names the ones a configuration exercises. Where kvspec
does not model such a feature yet, :func:`unsupported_reason` names the
configurations that would need it, and ``KVCacheConfig`` refuses them for
that profile with :class:`kvspec.errors.UnsupportedByProfileError` instead of
silently behaving like another release.

``docs/vllm-versions.md`` describes every change in prose, with the switch
that models it and a trace that shows it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from kvspec.config import KVCacheConfig

NewBlockIds = Literal["full", "full-mla", "full-mla-with-mamba", "attention-with-mamba"]
CommonPrefix = Literal["tables", "zero", "absent"]
HitLengthBound = Literal["absent", "as-given", "capped"]
CpBlockScaling = Literal["dcp-pcp", "dcp", "dcp-full-attention", "dcp-sharded"]
TailEagle = Literal["none", "group", "model"]
RetentionKinds = Literal["none", "swa", "swa+mamba"]
RetentionBoundaries = Literal["prompt", "junction", "replay", "replay-eagle-junction"]
PrefillCheckpoints = Literal["none", "block-aligned", "chunk-position", "prompt-end", "reachable", "hash-lookahead"]


@dataclass(frozen=True, slots=True)
class SemanticsProfile:
    """The behaviour switches of one vLLM release (see the module docstring).

    Attributes are grouped by the module that reads them.
    """

    name: str
    """``"vllm-<release>"``, the string traces carry in their ``semantics`` header."""
    release: str

    # -- hashing (kvspec.hashing) ------------------------------------------------------
    extra_keys_tagged: bool = False
    """Extra hash keys carry their source tag (``("lora", name, path)``,
    ``("mm", id, offset)``, ``("cache_salt", s)``, ``("prompt_embeds", d)``):
    :func:`kvspec.hashing.block_extra_keys`. Events keep the untagged form."""
    mm_resume_from_first_feature: bool = False
    """Hashing that resumes after construction looks at every multimodal
    feature, not only the last: :func:`kvspec.hashing.extend_block_hashes`."""
    mm_key_with_offset: bool = True
    """The multimodal extra key is ``(identifier, offset - start)`` and a
    feature overlaps a block only if it ends after the block's start; without
    it (before 0.19.0) the key is the bare identifier and a block starting
    exactly at a feature's end gets that key too: :func:`kvspec.request.key_forms`."""
    prompt_embeds_digest: bool = True
    """The prompt-embedding extra key is the SHA-256 digest of the block's
    rows; without it (before 0.17.0) the raw bytes: :func:`kvspec.request.key_forms`."""

    # -- block pool (kvspec.block_pool) ------------------------------------------------
    free_unhashed_first: bool = True
    """Freed blocks without a hash go to the front of the free queue (they can
    never be hit), hashed ones to the tail: :func:`kvspec.block_pool.requeue_unhashed_first`."""
    event_extra_keys: bool = True
    """``BlockStored`` events carry ``extra_keys`` (from 0.17.0; before, None):
    :func:`kvspec.block_pool.event_fields`."""
    event_group_idx: bool = True
    """Events carry the group index ``group_idx`` (from 0.20.0; before, None):
    :func:`kvspec.block_pool.event_fields`."""
    event_annotations: bool = True
    """``BlockStored`` events carry the group's attention kind and window,
    added by the facade (from 0.22.0; before, None): :func:`kvspec.block_pool.event_fields`."""
    skipped_unhashed_first: bool = True
    """Blocks freed by ``remove_skipped_blocks``, and a sliding-window group's
    blocks freed with its request, go unhashed first even where other frees
    do not (0.23.0, the release before ``free_unhashed_first``):
    :func:`kvspec.block_pool.requeue_unhashed_first`."""
    free_unhashed_needs_caching: bool = False
    """Freed unhashed blocks go to the front of the free queue only with prefix
    caching on (otherwise every freed block goes to the tail):
    :func:`kvspec.block_pool.requeue_unhashed_first`."""
    sink_blocks_reserved: bool = True
    """SinkFull groups take ``sink_len / block_size`` blocks for good at
    construction: :func:`kvspec.single_type_kv_cache_manager.num_sink_blocks`."""

    # -- single-type managers (kvspec.single_type_kv_cache_manager) ---------------------
    new_block_ids: NewBlockIds = "full-mla"
    """Which groups report fresh blocks to ``take_new_block_ids``:
    :func:`kvspec.single_type_kv_cache_manager.records_new_block_ids`."""
    mamba_skip_spec_slack: bool = True
    """Mamba's ``remove_skipped_blocks`` first subtracts the speculative block
    count from the computed tokens: :meth:`MambaManager.remove_skipped_blocks`."""
    mamba_early_return_allocated: bool = False
    """An align-mode allocation that needs no block still marks the request as
    allocated (which decides, for a partial hit, between copying into the
    table and moving the tail entry): :meth:`MambaManager._allocate_aligned`."""

    mamba_step_guard: bool = True
    """A Mamba hit on a state cached in the current scheduler step is not
    usable until ``new_step_starts`` (which exists only with this switch):
    :func:`kvspec.single_type_kv_cache_manager.mamba_step_guarded`."""
    mamba_align_estimate_capped: bool = False
    """Mamba align's admission estimate is ``min(need, 1 + spec)`` instead of
    ``1 + spec`` for a request that needs any block:
    :func:`kvspec.single_type_kv_cache_manager.mamba_align_new_blocks`."""
    mamba_align_retired_mark: bool = False
    """Mamba align's removal of skipped blocks steps over null gaps (freeing
    every state block below the skipped count, not only those after the last
    null) and never goes below the table index it reached before:
    :func:`kvspec.single_type_kv_cache_manager.retire_range`."""

    # -- context parallelism (kvspec.config, the managers' block sizes) ---------------------
    cp_block_scaling: CpBlockScaling = "dcp-pcp"
    """Which groups' manager block size ``dcp_world_size`` / ``pcp_world_size``
    multiply: every group by both (``dcp-pcp``); every group but Mamba by DCP
    only, lookups getting the process DCP size (``dcp``); full-attention-type
    groups by DCP only, lookups getting their manager's size
    (``dcp-full-attention``); every ``dcp_sharded`` group (every kind but
    Mamba) by DCP only, lookups getting their manager's size (``dcp-sharded``):
    :func:`kvspec.config.cp_scale`, :func:`kvspec.config.cp_lookup_refusal`."""
    cp_swa_mask_unscaled: bool = True
    """The sliding-window cache mask counts its window and alignment in the
    unscaled block size while indexing the scaled manager blocks, so a
    DCP-scaled window group caches only some of its full blocks:
    :meth:`SingleTypeKVCacheManager.cache_blocks`."""

    # -- coordinator (kvspec.kv_cache_coordinator) ----------------------------------------
    v016_swa_eagle_realign: bool = True
    """In 0.16.0's hybrid search (``hybrid_eagle_lookahead`` off), a
    sliding-window EAGLE hit in a group whose block is not the scheduler block
    drops its block and aligns again (0.19.1) instead of failing an assertion:
    :func:`kvspec.kv_cache_coordinator.v016_spec_group_hit`."""
    mamba_eagle_counts_verified: bool = False
    """In the hybrid search an EAGLE Mamba group gets no look-ahead but counts
    as having made its drop (a Mamba shrink then keeps the other groups'
    verified drops); kvspec's 0.25.1 rule treats Mamba as never dropping:
    :func:`kvspec.kv_cache_coordinator.hybrid_hit_search`."""
    eagle_margin_hashed_cap: bool = False
    """The hybrid search's EAGLE look-ahead is capped by the request's hashed
    tokens instead of ``num_tokens - 1``: :func:`kvspec.kv_cache_coordinator.eagle_search_limit`."""
    eagle_group_flags: bool = True
    """Groups can be flagged as EAGLE groups (``eagle_groups``); without it
    (before 0.25.1) EAGLE applies to every group or none:
    :meth:`kvspec.config.KVCacheConfig.eagle_group_ids`."""
    eagle_flags_need_use_eagle: bool = False
    """Per-group EAGLE flags drop blocks only when ``use_eagle`` is set:
    :meth:`kvspec.config.KVCacheConfig.eagle_group_ids`."""
    single_spec_group_hybrid: bool = False
    """A cached model of several groups with one attention kind is allowed
    (looked up jointly): :func:`kvspec.config.validate_groups`."""

    # -- attention kinds (kvspec.config) ----------------------------------------------------
    circular_buffer_kind: bool = False
    """The ring kind ``CircularBuffer`` (one block per request, never cached)
    exists: :func:`kvspec.config.validate_ring_kind`."""
    kpool_tail_kind: bool = False
    """The ring kind ``KpoolTail`` exists (0.30.0 and 0.31.0 only):
    :func:`kvspec.config.validate_ring_kind`."""

    # -- facade (kvspec.kv_cache_manager) -------------------------------------------------
    full_sequence_arg: bool = True
    """``allocate_slots(full_sequence_must_fit=...)`` exists (0.21.0 on):
    :func:`kvspec.kv_cache_manager.check_admission_args`."""
    reserved_blocks_arg: bool = True
    """``allocate_slots(reserved_blocks=...)`` exists (0.23.0 on):
    :func:`kvspec.kv_cache_manager.check_admission_args`."""
    admission_controls: bool = True
    """The watermark, ``max_num_batched_tokens`` and ``allocate_slots``'s
    ``has_scheduled_reqs`` exist (0.24.0 on; ``max_num_batched_tokens`` came
    with 0.20.0, but before 0.24.0 kvspec refuses it as not modelled, see
    ``docs/vllm-versions.md``): :func:`kvspec.config.validate_release_options`,
    :func:`kvspec.kv_cache_manager.check_admission_args`."""
    deferred_free: bool = True
    """``pop_blocks_for_free`` exists (before 0.25.1 a request is always freed
    at once; ``free_blocks`` then only ever sees double frees):
    :func:`kvspec.kv_cache_manager.require_operation`."""
    new_block_ids_list: bool = True
    """``take_new_block_ids`` exists (before 0.25.1 there is no zeroing list):
    :func:`kvspec.kv_cache_manager.require_operation`."""
    prefix_hint_op: bool = True
    """The scheduler reads a prefix hint after each lookup (0.16.0's
    coordinator has no ``num_uncached_common_prefix_tokens`` and its scheduler
    reads none): :func:`kvspec.kv_cache_manager.require_operation`."""
    computed_block_ids_op: bool = True
    """``get_block_ids_for_computed_tokens`` exists (the tables clipped to the
    computed tokens, which the scheduler hands a KV connector; new in 0.25.1):
    :func:`kvspec.kv_cache_manager.require_operation`."""
    estimate_cached_tokens_op: bool = False
    """``estimate_cached_tokens`` exists (the prefix length a request's cached
    blocks stand for, which the scheduler reports in its prefill statistics;
    new in 0.26.0): :func:`kvspec.kv_cache_manager.estimate_cached_tokens`."""
    record_zeroing_op: bool = False
    """``record_blocks_for_zeroing`` exists (after a failed connector load the
    scheduler lists the request's blocks from the first token the load did not
    deliver for zeroing again; new in 0.26.0):
    :func:`kvspec.kv_cache_manager.require_operation`."""
    zeroing_range_op: bool = False
    """``get_zeroing_block_ids_in_range`` exists (the scheduler asks for the
    blocks a delayed connector load will fill and leaves them out of the next
    zeroing list; 0.26.0 to 0.31.0, replaced by ``skip_zeroing_arg``):
    :func:`kvspec.kv_cache_manager.require_operation`."""
    skip_zeroing_arg: bool = False
    """``allocate_slots(skip_zeroing_group_ids=...)`` exists: the listed groups
    do not list the blocks they take for external (connector) tokens for
    zeroing (new in 0.32.0): :func:`kvspec.kv_cache_manager.check_admission_args`."""
    prefill_lookahead: bool = False
    """Multi-module MTP inputs exist: the manager's ``num_prefill_lookahead``
    (caching lags the last ``num_prefill_lookahead - 1`` computed tokens, which
    the drafter may prefill again) and ``SlidingWindowSpec.extra_retained_tokens``
    (a window keeps that many more tokens below it; new in 0.28.0):
    :func:`kvspec.config.num_reprefillable_tokens`."""
    estimate_skips_uncacheable: bool = False
    """``estimate_cached_tokens`` leaves out groups that are not prefix
    cacheable (the ring kinds; before 0.30.0 a ring group, never hashed,
    makes every estimate 0): :func:`kvspec.kv_cache_manager.estimate_cached_tokens`."""
    stats_at_lookup: bool = True
    """``get_computed_blocks`` records prefix-cache statistics; without it the
    scheduler calls ``record_prefix_cache_stats`` at admission."""
    adopt_hit_without_new_tokens: bool = False
    """``allocate_slots`` with 0 new tokens is legal when it adopts hit tokens:
    :func:`kvspec.kv_cache_manager.allocation_without_tokens`."""
    common_prefix: CommonPrefix = "tables"
    """``get_num_common_prefix_blocks``: leading blocks held by every table,
    always zeros (cascade attention removed), or no such method:
    :meth:`KVCacheManager.get_num_common_prefix_blocks`."""
    num_cached_tokens_op: bool = False
    """``get_num_cached_tokens`` exists (a lookup's hit length without its
    blocks, which changes nothing; the scheduler reads it before admitting):
    :func:`kvspec.kv_cache_manager.require_operation`."""
    connector_lookup_op: bool = False
    """``get_computed_blocks_for_connector`` and ``truncate_computed_blocks``
    exist (a KV connector's local lookup: in a cached hybrid with a Mamba
    group, each group looked up alone and the full-attention group's hit
    reported, with a flag when another group lags behind it; and the slicing
    of a lookup's result to a shorter aligned length; new in 0.27.0):
    :meth:`kvspec.kv_cache_manager.KVCacheManager.get_computed_blocks_for_connector`."""
    truncate_mamba_lagging: bool = False
    """``truncate_computed_blocks`` keeps a Mamba group's list as it is where
    it ends before the new length (a connector supplies that state); before
    0.28.0 every group must cover the length:
    :func:`kvspec.kv_cache_manager.truncated_group`."""
    per_group_eagle_margin: bool = False
    """The per-group lookup of ``get_computed_blocks_for_connector`` lets an
    EAGLE group other than Mamba look one margin further before it drops
    (capped by the hashed tokens), so its hit is not a block short (new in
    0.32.0): :meth:`kvspec.kv_cache_coordinator.HybridCoordinator.find_longest_cache_hit_per_group`."""
    hit_limit_at_construction: bool = False
    """Whether a request reads the prefix cache is its ``prefix_cache_hit_limit``
    (0: no reads), fixed when the request is made, not its
    ``skip_reading_prefix_cache`` as it is at each lookup (changing that
    attribute later does nothing): :func:`kvspec.kv_cache_manager.reads_prefix_cache`."""
    prompt_logprobs_hit_cap: bool = False
    """A request that asks for prompt logprobs may read at most its first
    scored row (``prompt_logprob_start``, 0 without one) from the prefix
    cache (before, with reads not turned off, it reads as far as any other):
    :func:`kvspec.request.construction_hit_limit`."""
    hit_length_bound: HitLengthBound = "absent"
    """``get_computed_blocks(request, max_cache_hit_length)``: no such argument;
    the bound replaces ``num_tokens - 1`` as given (even above it); or it can
    only lower the request's own limit: :func:`kvspec.kv_cache_manager.lookup_length`."""
    pop_drops_leading_nulls: bool = False
    """``pop_blocks_for_free`` leaves out each group's leading null blocks:
    :meth:`SingleTypeKVCacheManager.pop_blocks_for_free`."""
    mamba_caching_needs_align: bool = False
    """A Mamba group with prefix caching on must use ``align`` mode:
    :func:`kvspec.config.validate_kind`."""
    lookup_returns_boundary: bool = False
    """The scheduler's prefix hint is the lookup's ``shared_prefix_boundary``
    (``get_computed_blocks`` returns it, the request keeps it), not the
    coordinator's last ``num_uncached_common_prefix_tokens``:
    :func:`kvspec.kv_cache_manager.prefix_hint`."""
    report_mode_full: bool = False
    """A lookup that hits announces the hit blocks again, one ``BlockStored``
    per group with hit blocks, for a request whose ``kv_cache_report_mode`` is
    "full" (vLLM 0.26.0 on; the request's sampling parameters'
    ``extra_args``): :meth:`kvspec.kv_cache_coordinator.KVCacheCoordinator.emit_cached_block_events`."""
    skip_on_processed_tokens: bool = False
    """``allocate_slots`` frees the blocks attention no longer reads on the
    processed-token basis, the computed tokens less the request's
    ``num_in_flight_tokens`` (scheduled in steps whose output is not processed
    yet), instead of on the computed tokens alone (vLLM#47728):
    :func:`kvspec.kv_cache_manager.skip_basis`."""

    # -- rules of cached hybrids that changed between 0.16.0 and 0.25.1 --------------------
    coarse_hash_last_fine: bool = True
    """A group coarser than the hash block keys each block by the last fine
    hash inside it, which already chains the whole prefix (0.16.0: by the
    concatenation of its fine hashes): :func:`kvspec.hashing.coarse_block_hashes`."""
    hybrid_cache_eagle_reach: bool = True
    """With ``hybrid_cache_reachable_only``, an EAGLE group caches one block
    past the scheduler-block boundary and its window mask counts the EAGLE
    peek (0.23.0 on; 0.22.x caches an EAGLE group like any other):
    :meth:`kvspec.kv_cache_coordinator.HybridCoordinator.cache_blocks`."""
    hybrid_cache_reachable_only: bool = True
    """A cached hybrid caches its blocks only up to a scheduler-block boundary
    (an EAGLE group one block further) and a sliding-window group only the
    blocks a hit can reach (0.16.0: every group caches all its full blocks):
    :meth:`kvspec.kv_cache_coordinator.HybridCoordinator.cache_blocks`."""
    hybrid_eagle_lookahead: bool = True
    """The hybrid hit search lets an EAGLE group look one block past the
    candidate length and drop that block, once per candidate (0.16.0: every
    lookup drops a block, so sliding-window groups lose one on every pass of
    the fixed point, which a "simple" hybrid of full attention and one other
    kind cuts to one pass; and a sliding-window EAGLE hit in a group whose
    block is not the scheduler block fails an assertion):
    :func:`kvspec.kv_cache_coordinator.hybrid_hit_search_v016`."""

    # -- requests (kvspec.request) -------------------------------------------------------
    token_ids_int32: bool = False
    """Token ids are stored as 32-bit ints: an id of 2**31 or more is refused
    (vLLM raises on it): :func:`kvspec.request.token_id_limit`."""

    # -- a rule of 0.16.0's degenerate windows (not modelled yet) ---------------------------
    external_cap_any_skip: bool = True
    """The external-token cap applies whenever tokens are skipped (0.16.0:
    only when a whole block is), which differs only for a sliding window of 1
    or a chunk below the block size; without it kvspec refuses those windows:
    :func:`unsupported_reason`."""

    # -- features that add state (their own modules; unsupported_reason) ------------------
    partial_tail_entries: bool = False
    """Full-attention groups coarser than the hash block register an extra
    cache key at the prompt's last hash boundary (a block can hold two keys):
    :func:`kvspec.partial_tail.registers_partial_tail`."""
    fa_tail_below_last_token: bool = False
    """The full-attention partial tail sits at the last hash boundary at or
    below ``num_prompt_tokens - 1`` (EAGLE groups: ``num_prompt_tokens``):
    :func:`kvspec.partial_tail.fa_tail_boundary`."""
    partial_hash_hits: bool = False
    """A Mamba align group coarser than the hash block enables hits inside a
    block, served by copy-on-write:
    :func:`kvspec.partial_hits.partial_hash_hits_enabled`."""
    partial_hits_gated: bool = False
    """Fine-grained hits stay off when another group that cannot do them is
    coarser than the hash block (before, vLLM fails an assertion):
    :func:`kvspec.partial_hits.partial_hash_hits_enabled`."""
    cache_mask_hit_alignment: bool = False
    """The sliding-window caching mask uses the hit alignment (the hash block
    under fine-grained hits) instead of the scheduler block:
    :meth:`kvspec.kv_cache_coordinator.KVCacheCoordinator.cache_mask_alignment`."""
    mamba_tail_eagle: TailEagle = "none"
    """Which EAGLE flag lowers the Mamba tail boundary by one hash unit: none,
    the group's own, or the model's ``use_eagle``:
    :func:`kvspec.mamba_tail.tail_eagle_shift`."""
    mamba_tail_entries: bool = False
    """Mamba align groups key their state block at the prompt's tail boundary
    (which also re-caches a state block evicted while held):
    :func:`kvspec.mamba_tail.registers_mamba_tail`."""
    mamba_tail_skip_keyed: bool = False
    """The Mamba tail leaves a block already keyed at the boundary alone
    (0.32.0 marks it cached in this step again):
    :func:`kvspec.mamba_tail.cache_mamba_tail_block`."""
    lookahead_block_hashes: bool = False
    """Look-ahead block hashes exist (new in 0.33.0, the default of EAGLE-style
    speculative decoding with prefix caching): with ``num_hash_lookahead_tokens``
    ``L`` a block's hash also covers the ``L`` tokens after it, so it exists only
    once they do; blocks are cached up to the hashed tokens, the Mamba tail sits
    at or below ``num_prompt_tokens - L``, and stored events name the look-ahead
    tokens: :func:`kvspec.hashing.extend_block_hashes`."""
    retention_kinds: RetentionKinds = "swa+mamba"
    """Which groups thin their caching under a prefix-cache retention interval
    (new in 0.23.0, sliding-window groups; Mamba groups too from 0.24.0 on);
    "none": the release has no retention interval:
    :mod:`kvspec.retention`."""
    retention_boundaries: RetentionBoundaries = "prompt"
    """The positions a sparse caching mask keeps reachable: the prompt's last
    token; from 0.26.0 also the request's shared-prefix boundary; from 0.30.0
    the replay positions under EAGLE; from 0.33.0 also one block below the
    junction in an EAGLE group: :func:`kvspec.retention.reachable_boundaries`."""
    retention_zero_any_model: bool = False
    """A retention interval of 0 is accepted in a model without sliding-window
    and Mamba groups (0.29.0 on; before, any interval is refused there):
    :func:`kvspec.config.validate_retention`."""
    prefill_checkpoints: PrefillCheckpoints = "none"
    """Mamba prefill checkpoints: an align-mode chunk keeps one more state
    block, below its running state, so a prompt that ends inside a block
    leaves a cached state a later hit can resume from. "none": the release
    has no ``num_prefill_checkpoint_blocks`` (before 0.29.0);
    "block-aligned" (0.29.0): a chunk that starts on a block boundary and
    ends inside a block keeps the slot before its running state, whose state
    is the last block boundary it crosses; "chunk-position" (0.30.0): a
    checkpoint at a hash-aligned position of the chunk end, with a
    ``prefill_checkpoint_alignment``; "prompt-end" (0.31.0): with a
    retention interval of 0 only the chunk that reaches the prompt end gets
    one; "reachable" (0.32.0): a transient checkpoint stays cached only
    where the retention mask keeps it; "hash-lookahead" (0.33.0): the
    position steps back over the look-ahead tokens. Only
    :data:`PREFILL_CHECKPOINTS_MODELLED` forms are modelled:
    :mod:`kvspec.prefill_checkpoints`."""


VLLM_0_16_0 = SemanticsProfile(
    "vllm-0.16.0",
    "0.16.0",
    mm_key_with_offset=False,
    prompt_embeds_digest=False,
    free_unhashed_first=False,
    skipped_unhashed_first=False,
    event_extra_keys=False,
    event_group_idx=False,
    event_annotations=False,
    mamba_skip_spec_slack=False,
    mamba_step_guard=False,
    eagle_group_flags=False,
    full_sequence_arg=False,
    reserved_blocks_arg=False,
    admission_controls=False,
    deferred_free=False,
    new_block_ids_list=False,
    computed_block_ids_op=False,
    prefix_hint_op=False,
    coarse_hash_last_fine=False,
    hybrid_cache_reachable_only=False,
    hybrid_cache_eagle_reach=False,
    hybrid_eagle_lookahead=False,
    v016_swa_eagle_realign=False,
    external_cap_any_skip=False,
    cp_swa_mask_unscaled=False,
    retention_kinds="none",
)
"""vLLM 0.16.0, the oldest modelled release: freed blocks all go to the
free-queue tail; multimodal keys are bare identifiers (closed at a feature's
end) and prompt-embedding keys raw bytes; events have no extra keys, group
index or kind; EAGLE is global; Mamba keeps no speculative slack when
freeing skipped blocks, and a state cached this step is usable at once; no
watermark, admission arguments, deferred free, zeroing list or clipped
tables for a connector; context
parallelism scales every group's block size by DCP x PCP and the window
cache mask uses the scaled size. Cached hybrids key coarse blocks by the
concatenated fine hashes, cache every full block, and drop an EAGLE block at
every lookup of the hit search. Degenerate windows are refused (not modelled
yet)."""

VLLM_0_17_0 = replace(
    VLLM_0_16_0,
    name="vllm-0.17.0",
    release="0.17.0",
    prompt_embeds_digest=True,
    event_extra_keys=True,
    mamba_skip_spec_slack=True,
    mamba_step_guard=True,
)
"""0.17.0: prompt-embedding keys are digests; ``BlockStored`` carries extra
keys; Mamba subtracts its speculative block count when freeing skipped
blocks and a state cached this step waits for ``new_step_starts``."""

VLLM_0_17_1 = replace(VLLM_0_17_0, name="vllm-0.17.1", release="0.17.1", new_block_ids_list=True, new_block_ids="full")
"""0.17.1: ``take_new_block_ids`` reports the fresh blocks of full-attention
groups (exactly ``FullAttentionSpec``: not MLA)."""

VLLM_0_18_0 = replace(VLLM_0_17_1, name="vllm-0.18.0", release="0.18.0")
"""0.18.0: no observable change from 0.17.1."""

VLLM_0_18_1 = replace(VLLM_0_18_0, name="vllm-0.18.1", release="0.18.1")
"""0.18.1: no observable change from 0.18.0."""

VLLM_0_19_0 = replace(VLLM_0_18_1, name="vllm-0.19.0", release="0.19.0", mm_key_with_offset=True)
"""0.19.0: multimodal keys carry the feature's offset in the block, and a
feature no longer keys the block that starts exactly at its end."""

VLLM_0_19_1 = replace(VLLM_0_19_0, name="vllm-0.19.1", release="0.19.1", v016_swa_eagle_realign=True)
"""0.19.1: a sliding-window EAGLE hit in a group whose block is not the
scheduler block drops its block and aligns again instead of failing an
assertion."""

VLLM_0_20_0 = replace(
    VLLM_0_19_1,
    name="vllm-0.20.0",
    release="0.20.0",
    hybrid_eagle_lookahead=True,
    eagle_group_flags=True,
    event_group_idx=True,
)
"""0.20.0: the hybrid hit search gives EAGLE groups a look-ahead block
(dropped once per candidate); per-group EAGLE flags; events carry the group
index. (``max_num_batched_tokens`` arrives too; kvspec refuses it before
0.24.0, ``docs/vllm-versions.md``.)"""

VLLM_0_20_1 = replace(VLLM_0_20_0, name="vllm-0.20.1", release="0.20.1")
"""0.20.1: no observable change from 0.20.0."""

VLLM_0_20_2 = replace(VLLM_0_20_1, name="vllm-0.20.2", release="0.20.2")
"""0.20.2: no observable change from 0.20.1 (the per-request cap applies only
to the full-sequence gate again, which ends 0.20.0's half-way failures)."""

VLLM_0_21_0 = replace(VLLM_0_20_2, name="vllm-0.21.0", release="0.21.0", full_sequence_arg=True)
"""0.21.0: ``allocate_slots(full_sequence_must_fit=...)`` replaces
``can_fit_full_sequence``."""

VLLM_0_22_0 = replace(
    VLLM_0_21_0, name="vllm-0.22.0", release="0.22.0", event_annotations=True, hybrid_cache_reachable_only=True
)
"""0.22.0: ``BlockStored`` carries the group's kind and window; a cached
hybrid caches up to a scheduler-block boundary, a sliding-window group only
the blocks a hit can reach."""

VLLM_0_22_1 = replace(VLLM_0_22_0, name="vllm-0.22.1", release="0.22.1")
"""0.22.1: no observable change from 0.22.0."""

VLLM_0_23_0 = replace(
    VLLM_0_22_1,
    name="vllm-0.23.0",
    release="0.23.0",
    hybrid_cache_eagle_reach=True,
    reserved_blocks_arg=True,
    new_block_ids="full-mla",
    skipped_unhashed_first=True,
    cp_swa_mask_unscaled=True,
    retention_kinds="swa",
)
"""0.23.0: an EAGLE group of a cached hybrid caches one block further;
``allocate_slots(reserved_blocks=...)``; ``take_new_block_ids`` reports MLA
groups too; skipped blocks and a sliding-window request's freed blocks go
unhashed first; the window cache mask counts in the unscaled block size;
the prefix-cache retention interval (sliding-window groups)."""

VLLM_0_24_0 = replace(
    VLLM_0_23_0,
    name="vllm-0.24.0",
    release="0.24.0",
    free_unhashed_first=True,
    admission_controls=True,
    deferred_free=True,
    prefix_hint_op=True,
    coarse_hash_last_fine=True,
    external_cap_any_skip=True,
    retention_kinds="swa+mamba",
)
"""0.24.0: every free puts unhashed blocks first; the watermark and
``has_scheduled_reqs``; ``pop_blocks_for_free``; the prefix hint; a coarse
block's key is its last fine hash; the external-token cap applies whenever
tokens are skipped; the retention interval thins Mamba groups too."""

VLLM_0_25_0 = replace(VLLM_0_24_0, name="vllm-0.25.0", release="0.25.0", computed_block_ids_op=True)
"""0.25.0: ``get_block_ids_for_computed_tokens``."""

VLLM_0_25_1 = replace(VLLM_0_25_0, name="vllm-0.25.1", release="0.25.1")
"""vLLM 0.25.1 (the dataclass defaults; no observable change from 0.25.0):
freed unhashed blocks go to the front; offset multimodal keys and digested
embeddings; annotated events; per-group EAGLE flags; Mamba's speculative
slack when freeing skipped blocks and its this-step guard with
``new_step_starts``; the admission controls, ``pop_blocks_for_free``,
``take_new_block_ids`` and ``get_block_ids_for_computed_tokens``; the hybrid
caching and lookup rules kvspec was written against; under context
parallelism the window cache mask counts in the unscaled block size."""

VLLM_0_26_0 = replace(
    VLLM_0_25_1,
    name="vllm-0.26.0",
    release="0.26.0",
    new_block_ids="full-mla-with-mamba",
    mamba_skip_spec_slack=False,
    mamba_eagle_counts_verified=True,
    partial_tail_entries=True,
    partial_hash_hits=True,
    lookup_returns_boundary=True,
    report_mode_full=True,
    cp_block_scaling="dcp",
    estimate_cached_tokens_op=True,
    record_zeroing_op=True,
    zeroing_range_op=True,
    skip_on_processed_tokens=True,
    retention_boundaries="junction",
)
"""0.26.0: fresh-block ids are recorded only for models with a Mamba group;
Mamba keeps no speculative slack when freeing skipped blocks and gets no EAGLE
look-ahead; coarse full-attention groups get partial-tail entries; Mamba
align groups coarser than the hash block get fine-grained hits with
copy-on-write; the lookup returns the shared-prefix boundary as the
scheduler's prefix hint; PCP no longer scales block sizes, nor DCP a Mamba
group's; ``estimate_cached_tokens`` and ``record_blocks_for_zeroing`` are new; skipped blocks are freed on the
processed-token basis (the request's in-flight tokens are subtracted); the
retention masks keep the shared-prefix boundary reachable; a request in
report mode "full" has its hit blocks announced again at each lookup."""

VLLM_0_27_0 = replace(
    VLLM_0_26_0,
    name="vllm-0.27.0",
    release="0.27.0",
    stats_at_lookup=False,
    free_unhashed_needs_caching=True,
    connector_lookup_op=True,
)
"""0.27.0: lookups stop recording prefix-cache statistics (the scheduler
records them at admission); with caching off every freed block goes to the
free-queue tail; ``get_computed_blocks_for_connector`` and
``truncate_computed_blocks`` are new."""

VLLM_0_27_1 = replace(VLLM_0_27_0, name="vllm-0.27.1", release="0.27.1")
"""0.27.1: no observable change from 0.27.0."""

VLLM_0_28_0 = replace(
    VLLM_0_27_1,
    name="vllm-0.28.0",
    release="0.28.0",
    free_unhashed_needs_caching=False,
    new_block_ids="attention-with-mamba",
    partial_hits_gated=True,
    mamba_early_return_allocated=True,
    truncate_mamba_lagging=True,
    prefill_lookahead=True,
)
"""0.28.0: the free order of 0.26.0 is back; with a Mamba group every
attention kind records its fresh blocks; fine-grained hits are switched off
when a group cannot do them; an align-mode allocation that needs no block
marks the request as allocated; ``truncate_computed_blocks`` keeps a lagging
Mamba list; multi-module MTP inputs (``num_prefill_lookahead``,
``extra_retained_tokens``) are new."""

VLLM_0_29_0 = replace(
    VLLM_0_28_0,
    name="vllm-0.29.0",
    release="0.29.0",
    single_spec_group_hybrid=True,
    cache_mask_hit_alignment=True,
    circular_buffer_kind=True,
    cp_block_scaling="dcp-full-attention",
    retention_zero_any_model=True,
    prefill_checkpoints="block-aligned",
)
"""0.29.0: every full-attention group is trimmed to the hit (kvspec always
did; the ``second-full-group`` divergence ends); cached models whose groups
share one kind are allowed; the sliding-window caching mask follows the hit
alignment; the ring kind ``CircularBuffer``; DCP scales only
full-attention-type groups; a retention interval of 0 is accepted in any model;
Mamba prefill checkpoints at block boundaries (``num_prefill_checkpoint_blocks``)."""

VLLM_0_30_0 = replace(
    VLLM_0_29_0,
    name="vllm-0.30.0",
    release="0.30.0",
    sink_blocks_reserved=False,
    mamba_tail_eagle="group",
    kpool_tail_kind=True,
    cp_swa_mask_unscaled=False,
    estimate_skips_uncacheable=True,
    mamba_align_retired_mark=True,
    retention_boundaries="replay",
    prefill_checkpoints="chunk-position",
)
"""0.30.0: SinkFull groups reserve no sink blocks (plain full attention); an
EAGLE Mamba group's tail boundary is one hash unit lower; the ring kind
``KpoolTail``; the window cache mask counts in the DCP-scaled block size;
``estimate_cached_tokens`` leaves out the groups that are not prefix cacheable;
Mamba align removes skipped state blocks across null gaps, above a retired mark;
under EAGLE the retention masks keep the replay positions; Mamba prefill
checkpoints sit at a hash-aligned position of the chunk end and need a
``prefill_checkpoint_alignment``."""

VLLM_0_31_0 = replace(
    VLLM_0_30_0,
    name="vllm-0.31.0",
    release="0.31.0",
    extra_keys_tagged=True,
    mm_resume_from_first_feature=True,
    adopt_hit_without_new_tokens=True,
    mamba_align_estimate_capped=True,
    cp_block_scaling="dcp-sharded",
    mamba_tail_eagle="model",
    prefill_checkpoints="prompt-end",
)
"""0.31.0: tagged extra hash keys (the LoRA key includes the adapter path);
resumed hashing sees every multimodal feature; an allocation may adopt hit
tokens without new ones; Mamba align's estimate is capped by the real need;
the Mamba tail's EAGLE shift follows the model's ``use_eagle``; DCP scales
every ``dcp_sharded`` group (every attention kind, not Mamba); with a retention
interval of 0 only the prompt's last chunk gets a Mamba prefill checkpoint,
and that checkpoint stays cached."""

VLLM_0_32_0 = replace(
    VLLM_0_31_0,
    name="vllm-0.32.0",
    release="0.32.0",
    common_prefix="zero",
    eagle_margin_hashed_cap=True,
    per_group_eagle_margin=True,
    fa_tail_below_last_token=True,
    mamba_tail_entries=True,
    kpool_tail_kind=False,
    zeroing_range_op=False,
    skip_zeroing_arg=True,
    prefill_checkpoints="reachable",
)
"""0.32.0: ``get_num_common_prefix_blocks`` always answers zeros; the hybrid
EAGLE look-ahead is capped by hashed tokens, and the connector's per-group
lookup takes it too; the full-attention partial tail
moves to the last hash boundary below the prompt's last token; Mamba align
tail entries; ``KpoolTailSpec`` is gone; ``allocate_slots`` takes
``skip_zeroing_group_ids`` where ``get_zeroing_block_ids_in_range`` was; a
transient Mamba prefill checkpoint stays cached only where a hit can reach it."""

VLLM_0_33_0 = replace(
    VLLM_0_32_0,
    name="vllm-0.33.0",
    release="0.33.0",
    pop_drops_leading_nulls=True,
    mamba_caching_needs_align=True,
    eagle_flags_need_use_eagle=True,
    mamba_tail_skip_keyed=True,
    hit_length_bound="as-given",
    lookahead_block_hashes=True,
    retention_boundaries="replay-eagle-junction",
    prefill_checkpoints="hash-lookahead",
)
"""0.33.0: ``pop_blocks_for_free`` drops leading nulls; cached Mamba groups
must use align mode; EAGLE group flags need ``use_eagle``; the Mamba tail
skips a block already keyed at the boundary; ``get_computed_blocks`` takes
an upper bound on the hit length; look-ahead block hashes; an EAGLE group's
retention mask keeps one block below the junction too; a Mamba prefill
checkpoint steps back over the look-ahead tokens."""

VLLM_0_34_0 = replace(
    VLLM_0_33_0,
    name="vllm-0.34.0",
    release="0.34.0",
    common_prefix="absent",
    num_cached_tokens_op=True,
    hit_limit_at_construction=True,
    prompt_logprobs_hit_cap=True,
    hit_length_bound="capped",
    token_ids_int32=True,
)
"""0.34.0: ``get_num_common_prefix_blocks`` is gone; ``get_num_cached_tokens``
is new; whether a request reads the prefix cache is fixed when it is made
(``prefix_cache_hit_limit``); a prompt-logprob request reads at most up to
its first scored row; an explicit ``max_cache_hit_length`` can only lower the
limit; token ids are 32-bit."""

PROFILES: dict[str, SemanticsProfile] = {
    p.name: p
    for p in (
        VLLM_0_16_0,
        VLLM_0_17_0,
        VLLM_0_17_1,
        VLLM_0_18_0,
        VLLM_0_18_1,
        VLLM_0_19_0,
        VLLM_0_19_1,
        VLLM_0_20_0,
        VLLM_0_20_1,
        VLLM_0_20_2,
        VLLM_0_21_0,
        VLLM_0_22_0,
        VLLM_0_22_1,
        VLLM_0_23_0,
        VLLM_0_24_0,
        VLLM_0_25_0,
        VLLM_0_25_1,
        VLLM_0_26_0,
        VLLM_0_27_0,
        VLLM_0_27_1,
        VLLM_0_28_0,
        VLLM_0_29_0,
        VLLM_0_30_0,
        VLLM_0_31_0,
        VLLM_0_32_0,
        VLLM_0_33_0,
        VLLM_0_34_0,
    )
}
"""Every supported profile by name, oldest first."""

NEWEST = VLLM_0_34_0
"""The default profile: the newest supported release."""


def profile_named(name: str) -> SemanticsProfile:
    """The profile called ``name`` (``"vllm-0.33.0"``; a bare ``"0.33.0"`` works too).

    Raises:
        KeyError: For an unknown name, listing the known ones.

    raises: KeyError
    post: __return__ in PROFILES.values() and name in (__return__.name, __return__.release)
    """
    key = name if name.startswith("vllm-") else f"vllm-{name}"
    if key not in PROFILES:
        raise KeyError(f"unknown semantics profile {name!r}; known: {', '.join(PROFILES)}")
    return PROFILES[key]


def profile_for_release(release: str) -> SemanticsProfile:
    """The profile to run vLLM ``release`` (``"0.35.0"``) under: its own, else
    the newest profile of an older release (for a release newer than
    :data:`NEWEST`, the newest).

    Raises:
        KeyError: For an unparsable release or one older than every profile.

    raises: KeyError
    post: __return__ in PROFILES.values()
    post: release_key(__return__.release) <= release_key(release)
    post: not any(release_key(__return__.release) < release_key(p.release) <= release_key(release) for p in PROFILES.values())
    """  # noqa: E501 - a PEP 316 condition is one line
    want = release_key(release)
    older = [p for p in PROFILES.values() if release_key(p.release) <= want]
    if not older:
        raise KeyError(f"vLLM {release} is older than every semantics profile ({', '.join(PROFILES)})")
    return max(older, key=lambda p: release_key(p.release))


def release_key(release: str) -> tuple[int, int, int]:
    """``"0.25.1"`` (or ``"0.25.1.dev3"``, ``"vllm-0.25.1"``) -> ``(0, 25, 1)``.

    Raises:
        KeyError: If it does not start with ``MAJOR.MINOR``.

    raises: KeyError
    post: len(__return__) == 3 and __return__[2] >= 0
    post: release_key("vllm-" + release.removeprefix("vllm-")) == __return__
    post: __return__[:2] == release_key(".".join(release.removeprefix("vllm-").split(".")[:2]))[:2]
    """
    parts = release.removeprefix("vllm-").split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise KeyError(f"{release!r} is not a vLLM release number") from None
    patch = parts[2] if len(parts) > 2 else "0"
    digits = "".join(c for c in patch[: len(patch) - len(patch.lstrip("0123456789"))] or "0")
    return major, minor, int(digits or 0)


def features_used(config: KVCacheConfig) -> frozenset[str]:
    """The state-adding features ``config`` exercises under its profile.

    * ``"partial-tail-entries"`` (0.26.0 on): a cached hybrid with a
      full-attention-type group coarser than the hash block;
    * ``"partial-hash-hits"`` (0.26.0 on): a cached hybrid with a Mamba
      align group coarser than the hash block (fine-grained hits with
      copy-on-write);
    * ``"mamba-tail-entries"`` (0.32.0 on): a cached Mamba align group;
    * ``"ring-kinds"`` (0.29.0 on): a ring group (``CircularBuffer``,
      ``KpoolTail``), cached or not;
    * ``"context-parallelism"`` (every release): ``dcp_world_size`` or
      ``pcp_world_size`` above 1 (scaled manager block sizes, lookup refusals);
    * ``"prefill-checkpoints"`` (0.29.0 on): a Mamba align group with
      ``num_prefill_checkpoint_blocks`` above 0, cached or not (the
      checkpoint block is allocated either way).

    An implementation that models only some of them refuses the others
    (kvref's impl adapter compares this set with what kvimpl models).

    post: __return__ <= FEATURE_SWITCHES.keys()
    post: ("context-parallelism" in __return__) == (config.dcp_world_size * config.pcp_world_size > 1)
    post: config.enable_caching or __return__ <= {"ring-kinds", "context-parallelism", "prefill-checkpoints"}
    post: "prefill-checkpoints" not in __return__ or config.profile.prefill_checkpoints != "none"
    post: all(name not in __return__ or getattr(config.profile, switch) for name, switch in (("partial-tail-entries", "partial_tail_entries"), ("partial-hash-hits", "partial_hash_hits"), ("mamba-tail-entries", "mamba_tail_entries")))
    """  # noqa: E501 - a PEP 316 condition is one line
    from kvspec.config import FULL_TYPE_KINDS, RING_KINDS, Mamba  # noqa: PLC0415 - config imports this module

    p = config.profile
    ring = {"ring-kinds"} if any(isinstance(k, RING_KINDS) for k in config.groups) else set()
    if config.dcp_world_size * config.pcp_world_size > 1:
        ring.add("context-parallelism")
    if p.prefill_checkpoints != "none" and any(
        isinstance(k, Mamba) and k.mode == "align" and k.num_prefill_checkpoint_blocks > 0 for k in config.groups
    ):
        ring.add("prefill-checkpoints")
    if not config.enable_caching:
        return frozenset(ring)
    hbs = config.resolved_hash_block_size()
    used: set[str] = set(ring)
    for kind in config.groups:
        align = isinstance(kind, Mamba) and kind.mode == "align"
        if p.mamba_tail_entries and align:
            used.add("mamba-tail-entries")
        if len(config.groups) < 2 or kind.block_size <= hbs:
            continue
        if p.partial_tail_entries and isinstance(kind, FULL_TYPE_KINDS):
            used.add("partial-tail-entries")
        if p.partial_hash_hits and align:
            used.add("partial-hash-hits")
    return frozenset(used)


MODELLED_FEATURES = frozenset({"partial-tail-entries", "mamba-tail-entries", "ring-kinds", "context-parallelism"})
"""The features of :func:`features_used` that kvspec models under every
profile; fine-grained hits (``"partial-hash-hits"``) only under those of
:data:`PARTIAL_HASH_HITS_CHECKED`."""

FEATURE_SWITCHES: dict[str, frozenset[str]] = {
    "partial-tail-entries": frozenset({"partial_tail_entries", "fa_tail_below_last_token"}),
    "partial-hash-hits": frozenset(
        {
            "partial_hash_hits",
            "partial_hits_gated",
            "cache_mask_hit_alignment",
            "mamba_early_return_allocated",
            "mamba_tail_eagle",
        }
    ),
    "mamba-tail-entries": frozenset({"mamba_tail_entries", "mamba_tail_skip_keyed", "mamba_tail_eagle"}),
    "ring-kinds": frozenset({"circular_buffer_kind", "kpool_tail_kind"}),
    "context-parallelism": frozenset({"cp_block_scaling", "cp_swa_mask_unscaled"}),
    "prefill-checkpoints": frozenset({"prefill_checkpoints"}),
}
"""The profile switches each feature of :func:`features_used` reads. They
change nothing for a configuration that does not use the feature, so an
implementation that refuses the feature need not read them."""


PARTIAL_HASH_HITS_CHECKED: frozenset[str] = frozenset({"vllm-0.26.0", "vllm-0.27.1", "vllm-0.28.0", "vllm-0.29.0"})
"""The profiles whose fine-grained hits with copy-on-write
(``"partial-hash-hits"``, :mod:`kvspec.partial_hits`) have been checked in
lockstep against that vLLM release; for the others a configuration that uses
them is refused."""


PREFILL_CHECKPOINTS_MODELLED: frozenset[str] = frozenset(
    {"block-aligned", "chunk-position", "prompt-end", "reachable", "hash-lookahead"}
)
"""The forms of the profile switch ``prefill_checkpoints`` that kvspec models
(:mod:`kvspec.prefill_checkpoints`); a configuration with checkpoints under a
profile of another form is refused."""


def unsupported_reason(config: KVCacheConfig) -> str | None:
    """Why kvspec cannot model ``config`` under its profile, or None.

    Every state-adding feature of :func:`features_used` is modelled, but
    fine-grained hits with copy-on-write only for the profiles of
    :data:`PARTIAL_HASH_HITS_CHECKED`, and Mamba prefill checkpoints only
    in the forms of :data:`PREFILL_CHECKPOINTS_MODELLED`. Also refused is a configuration on
    which the release itself fails: in vLLM 0.26.x and 0.27.x, fine-grained
    hits together with a group that cannot do them (a sliding-window or
    chunked-local group coarser than the hash block) fail an assertion at
    the first lookup.
    Some rules of vLLM 0.16.0 are not modelled either
    (:func:`unmodelled_v016_rules`), nor context parallelism beyond one plain
    group (:func:`unmodelled_cp_rules`).

    post: __return__ is None or __return__.startswith(f"{config.profile.name}: ")
    post: __return__ is not None or (unmodelled_v016_rules(config) is None and unmodelled_cp_rules(config) is None)
    post: __return__ is not None or features_used(config) - {"partial-hash-hits", "prefill-checkpoints"} <= MODELLED_FEATURES
    post: __return__ is not None or "prefill-checkpoints" not in features_used(config) or config.profile.prefill_checkpoints in PREFILL_CHECKPOINTS_MODELLED
    post: __return__ is not None or "partial-hash-hits" not in features_used(config) or config.profile.name in PARTIAL_HASH_HITS_CHECKED
    post: __return__ is None or unmodelled_v016_rules(config) or unmodelled_cp_rules(config) or "partial-hash-hits" in features_used(config) or "prefill-checkpoints" in features_used(config) or not features_used(config) <= MODELLED_FEATURES
    """  # noqa: E501 - a PEP 316 condition is one line
    from kvspec.partial_hits import blocks_fine_hits  # noqa: PLC0415 - partial_hits imports config

    old_rules = unmodelled_v016_rules(config) or unmodelled_cp_rules(config)
    if old_rules is not None:
        return f"{config.profile.name}: {old_rules}"
    p = config.profile
    used = features_used(config)
    missing = sorted(used - MODELLED_FEATURES - {"partial-hash-hits", "prefill-checkpoints"})
    if missing:
        return f"{p.name}: {', '.join(missing)} not modelled"
    if "prefill-checkpoints" in used and p.prefill_checkpoints not in PREFILL_CHECKPOINTS_MODELLED:
        return (
            f"{p.name}: Mamba prefill checkpoints (num_prefill_checkpoint_blocks > 0 in align mode) of the form "
            f"{p.prefill_checkpoints!r} are not modelled (modelled: {', '.join(sorted(PREFILL_CHECKPOINTS_MODELLED))})"
        )
    if "partial-hash-hits" in used and not p.partial_hits_gated:
        hbs = config.resolved_hash_block_size()
        for gid, kind in enumerate(config.groups):
            if blocks_fine_hits(kind, hbs):
                return (
                    f"{p.name}: group {gid} ({type(kind).__name__}, block size {kind.block_size}) is coarser than "
                    f"the hash block ({hbs}) in a model with fine-grained hits; vLLM {p.release} fails an "
                    "assertion at the first lookup"
                )
    if "partial-hash-hits" in used and p.name not in PARTIAL_HASH_HITS_CHECKED:
        return (
            f"{p.name}: a Mamba align group coarser than the hash block needs fine-grained hits with "
            "copy-on-write, which are not modelled for this release"
        )
    return None


def unmodelled_v016_rules(config: KVCacheConfig) -> str | None:
    """Which 0.16.0 rule kvspec would need for ``config`` and lacks, or None:
    without ``external_cap_any_skip``, a sliding window of 1 token or a chunk
    shorter than the block (where 0.16.0's external-token cap differs).

    post: __return__ is None or not config.profile.external_cap_any_skip
    """
    from kvspec.config import ChunkedLocal, SlidingWindow  # noqa: PLC0415 - config imports this module

    if not config.profile.external_cap_any_skip:
        for kind in config.manager_groups():  # block sizes as the managers run them
            if (isinstance(kind, SlidingWindow) and kind.window == 1) or (
                isinstance(kind, ChunkedLocal) and kind.chunk < kind.block_size
            ):
                return "its external-token cap for a window of 1 or a chunk below the block size is not modelled"
    return None


def unmodelled_cp_rules(config: KVCacheConfig) -> str | None:
    """Which context-parallel configuration kvspec does not model, or None.

    kvspec models ``dcp_world_size`` / ``pcp_world_size`` above 1 for one
    group of full attention, MLA, SinkFull, sliding window, chunked local,
    Mamba or cross attention, and, up to vLLM 0.25.1 (``cp_block_scaling``
    ``dcp-pcp``), for several groups (with prefix caching the release refuses
    them: :func:`kvspec.config.validate_cp`). It refuses several groups from
    0.26.0 on (per-kind checks and per-group scaled sizes), the ring kinds,
    a cached Mamba group from 0.26.0 to 0.28.0, and up to 0.25.1 a Mamba
    group with speculative blocks outside ``align`` mode.

    post: __return__ is None or config.dcp_world_size * config.pcp_world_size > 1
    post: __return__ is not None or len(config.groups) == 1 or config.profile.cp_block_scaling == "dcp-pcp" or config.dcp_world_size * config.pcp_world_size == 1
    """  # noqa: E501 - a PEP 316 condition is one line
    from kvspec.config import RING_KINDS, Mamba  # noqa: PLC0415 - config imports this module

    if config.dcp_world_size * config.pcp_world_size == 1:
        return None
    if len(config.groups) > 1 and config.profile.cp_block_scaling != "dcp-pcp":
        return "context parallelism with several KV-cache groups is not modelled"
    if any(isinstance(kind, RING_KINDS) for kind in config.groups):
        return "context parallelism with a ring kind is not modelled"
    if config.profile.cp_block_scaling == "dcp-pcp" and any(
        isinstance(k, Mamba) and k.mode != "align" and k.num_speculative_blocks for k in config.groups
    ):
        # vLLM's estimate adds the speculative blocks in the unscaled block
        # size and the allocation in the scaled one: an admission the
        # estimate lets through can then run out of blocks half-way.
        return "context parallelism with a Mamba group's speculative blocks is not modelled"
    kind = config.groups[0]
    if isinstance(kind, Mamba) and config.enable_caching and config.profile.cp_block_scaling == "dcp":
        # The unitary coordinator scales its block size while MambaManager
        # undoes the scaling: the two disagree and vLLM fails assertions.
        return "context parallelism with a cached Mamba group is not modelled"
    return None
