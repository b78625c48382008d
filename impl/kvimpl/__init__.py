"""kvimpl: an optimized implementation of vLLM's paged KV-cache manager.

It follows every semantics profile of :mod:`kvspec.profiles` (one per
supported vLLM release), the one its configuration carries
(``KVCacheConfig.profile``): each behaviour switch is read once, when the
manager is built, in the kvimpl module that mirrors the spec module reading
it. Observably identical to the executable specification :mod:`kvspec` (same
block ids in the same order, same events, same errors raised before any
state change, same :class:`kvspec.view.KVView`), as checked in lockstep by
the conformance kit (``kvref check --target impl --against spec``). Module
for module it mirrors the spec with the same public names and signatures;
the bookkeeping sits in flat per-block lists (an intrusive doubly linked
free queue, ref counts, block hashes, per-group holder counts) instead of
the spec's O(n) list operations.

It imports from ``kvspec`` only value types (the configuration classes,
errors, events, view, stats, request types, ``BlockId`` and
``InvariantViolation``) and the hashing functions backed by the stored hash
vectors, never its logic: kvimpl keeps its own copies of the rules it needs
(:mod:`kvimpl.config_rules`, :mod:`kvimpl.checks`), because a shared helper is
a shared bug.

Layers (bottom up): :mod:`kvimpl.block_pool`,
:mod:`kvimpl.single_type_kv_cache_manager`, :mod:`kvimpl.kv_cache_coordinator`,
:mod:`kvimpl.kv_cache_manager` (the facade, method for method the spec's).
What the manager offers beyond the spec's facade lives in its base class
:class:`kvimpl.step_api.StepAPI`: a batched step (``allocate_slots_batch``,
``free_batch``), the running-step fast path and, when built with a
``device``, per-group device block tables (:mod:`kvimpl.device_tables`, the only
module that imports torch, lazily).
"""

from kvimpl.kv_cache_manager import KVCacheManager as KVCacheManager

PROFILE_SWITCHES = frozenset(
    {
        # Read where kvimpl mirrors the spec module that reads them.
        "free_unhashed_first", "free_unhashed_needs_caching", "skipped_unhashed_first",  # block_pool.requeue_...
        "sink_blocks_reserved", "new_block_ids", "mamba_skip_spec_slack",  # single_type_kv_cache_manager
        "mamba_align_retired_mark",  # single_type_kv_cache_manager.MambaManager._remove_blocks_in_range
        "mamba_align_estimate_capped", "pop_drops_leading_nulls",
        "mamba_eagle_counts_verified", "eagle_margin_hashed_cap",  # kv_cache_coordinator.hybrid_hit_search
        "hybrid_eagle_lookahead", "hybrid_cache_reachable_only",  # kv_cache_coordinator.HybridCoordinator
        "coarse_hash_last_fine",  # block_pool.coarse_hash, kv_cache_coordinator.KVCacheCoordinator._hashes_for
        "eagle_flags_need_use_eagle", "eagle_group_flags",  # config_rules.eagle_group_ids
        "event_group_idx", "event_extra_keys",  # block_pool.BlockPool(annotated_events=..., event_extra_keys=...)
        "event_annotations",  # kv_cache_manager.KVCacheManager._annotate
        "v016_swa_eagle_realign",  # kv_cache_coordinator.v016_spec_group_hit
        "hybrid_cache_eagle_reach",  # single_type_kv_cache_manager.SingleTypeKVCacheManager.eagle_reach
        "full_sequence_arg", "reserved_blocks_arg",  # kv_cache_manager.check_admission_args
        "mamba_step_guard",  # single_type_kv_cache_manager.MambaManager, kv_cache_manager.require_operation
        "admission_controls", "deferred_free", "new_block_ids_list",  # kv_cache_manager
        "stats_at_lookup", "adopt_hit_without_new_tokens", "common_prefix",  # kv_cache_manager
        "lookup_returns_boundary",  # kv_cache_manager.get_prefix_hint
        "report_mode_full",  # kv_cache_manager.KVCacheManager.get_computed_blocks (reports_hits)
        "skip_on_processed_tokens",  # kv_cache_manager.skip_basis (and StepAPI._running_step)
        "num_cached_tokens_op", "record_zeroing_op",  # kv_cache_manager.require_operation
        "zeroing_range_op",  # kv_cache_manager.require_operation (get_zeroing_block_ids_in_range)
        "skip_zeroing_arg",  # checks.check_skip_zeroing
        "prefill_lookahead",  # config_rules.admission_cap, num_skipped_tokens, KVCacheCoordinator.cache_blocks
        "lookahead_block_hashes",  # request.RequestHasher, SingleTypeKVCacheManager.cache_blocks, block_pool events
        "retention_kinds", "retention_zero_any_model",  # retention.retention_applies (and kvspec's validation)
        "retention_boundaries",  # retention.reachable_boundaries
        "connector_lookup_op",  # kv_cache_manager.require_operation, config_rules.lagging_hits
        "truncate_mamba_lagging",  # kv_cache_manager.truncated_group
        "per_group_eagle_margin",  # kv_cache_coordinator.HybridCoordinator.find_longest_cache_hit_per_group
        "hit_limit_at_construction", "hit_length_bound",  # kv_cache_manager.reads_prefix_cache, lookup_length
        "prompt_logprobs_hit_cap", "token_ids_int32",  # request.RequestHasher (the hit limit, the token-id limit)
        "computed_block_ids_op", "estimate_cached_tokens_op", "prefix_hint_op",  # kv_cache_manager.require_operation
        "estimate_skips_uncacheable",  # config_rules.estimate_groups
        "partial_tail_entries", "fa_tail_below_last_token",  # partial_tail.registers_partial_tail, fa_tail_boundary
        "mamba_tail_entries", "mamba_tail_skip_keyed", "mamba_tail_eagle",  # mamba_tail.cache_mamba_tail_block
        "cp_block_scaling",  # config_rules.cp_block_factor, dcp_scales_kind, cp_lookup_refusal
        "cp_swa_mask_unscaled",  # kv_cache_coordinator.KVCacheCoordinator (the managers' mask_kind)
        "partial_hash_hits", "partial_hits_gated",  # partial_hits.partial_hash_hits_enabled (and
        # mamba_tail.registers_mamba_tail, kv_cache_manager.KVCacheManager.take_kv_cache_block_copies)
        "cache_mask_hit_alignment",  # kv_cache_coordinator.KVCacheCoordinator (the managers' cache_mask_alignment)
        "mamba_early_return_allocated",  # single_type_kv_cache_manager.MambaManager._allocate_aligned
        "prefill_checkpoints",  # prefill_checkpoints (every rule), config_rules.features_needed
        # Applied before kvimpl sees a value: the request hasher (kvspec.request) hashes with them.
        # (mm_resume_from_first_feature also by partial_tail.partial_stored_event.)
        "extra_keys_tagged", "mm_resume_from_first_feature", "mm_key_with_offset", "prompt_embeds_digest",
        # Applied by KVCacheConfig's own validation (a configuration kvimpl is given already obeys them).
        "single_spec_group_hybrid", "mamba_caching_needs_align", "external_cap_any_skip",
        "circular_buffer_kind", "kpool_tail_kind",  # which release has which ring kind (config.validate_ring_kind)
    }
)  # fmt: skip
"""The fields of :class:`kvspec.profiles.SemanticsProfile` whose values kvimpl
follows. A profile that sets any other field away from its default needs
behaviour kvimpl does not have yet (the impl adapter refuses it)."""
