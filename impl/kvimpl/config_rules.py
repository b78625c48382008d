"""The rules kvimpl derives from a configuration and its attention kinds.

kvimpl's own copies of the functions and derived values of
:mod:`kvspec.config` (duplicated on purpose: a shared helper is a shared bug,
and the lockstep comparison with the spec only catches a wrong rule if the
two sides do not share it). The configuration classes themselves are value
types and stay imported from :mod:`kvspec.config`.

Upstream: ``vllm/v1/kv_cache_interface.py`` (the ``*Spec`` classes),
``vllm/v1/core/kv_cache_utils.py`` (block-size resolution) and
``vllm/v1/core/kv_cache_coordinator.py`` (the EAGLE groups).
"""

from __future__ import annotations

import math
from dataclasses import replace

from kvspec.config import (
    MLA,
    AttentionKind,
    ChunkedLocal,
    CircularBuffer,
    CrossAttention,
    FullAttention,
    KpoolTail,
    KVCacheConfig,
    Mamba,
    SinkFullAttention,
    SlidingWindow,
)

FULL_TYPE_KINDS = (FullAttention, MLA, SinkFullAttention)
"""Kinds vLLM manages with ``FullAttentionManager`` semantics."""

RING_KINDS = (CircularBuffer, KpoolTail)
"""Ring kinds: one block per request, never prefix-cached
(``kvimpl.single_type_kv_cache_manager.CircularBufferManager``)."""

_KIND_NAMES: dict[type, str] = {
    FullAttention: "full_attention",
    MLA: "mla_attention",
    SinkFullAttention: "sink_full_attention",
    SlidingWindow: "sliding_window",
    ChunkedLocal: "chunked_local_attention",
    Mamba: "mamba",
    CrossAttention: "cross_attention",
    CircularBuffer: "unknown",
    KpoolTail: "sliding_window",
}


def kind_name(kind: AttentionKind) -> str:
    """The kind string carried by BlockStored events (vLLM's ``KVCacheSpecKind``)."""
    return _KIND_NAMES[type(kind)]


def event_sliding_window(kind: AttentionKind) -> int | None:
    """The sliding window carried by BlockStored events (None unless SWA;
    a ``KpoolTail`` ring is a sliding-window spec in vLLM)."""
    return kind.window if isinstance(kind, SlidingWindow | KpoolTail) else None


def prefix_cacheable(kind: AttentionKind) -> bool:
    """Whether groups of ``kind`` take part in prefix caching (vLLM's
    ``KVCacheSpec.prefix_cacheable``): all but the ring kinds, which the
    hybrid lookup, the hit checks and the hash block size leave out."""
    return not isinstance(kind, RING_KINDS)


def admission_cap(kind: AttentionKind, max_num_batched_tokens: int, max_model_len: int) -> int | None:
    """Per-request block cap of the full-sequence admission gate, or None.

    pre: max_num_batched_tokens > 0 and max_model_len > 0
    post: __return__ is None or __return__ >= 1
    """
    if isinstance(kind, SlidingWindow):
        tokens = min(kind.window - 1 + kind.extra_retained_tokens + max_num_batched_tokens, max_model_len)
        return -(-tokens // kind.block_size) + 1
    if isinstance(kind, ChunkedLocal):
        tokens = min(kind.chunk + max_num_batched_tokens, max_model_len)
        return -(-tokens // kind.block_size)
    return None


def scheduler_block_size(config: KVCacheConfig) -> int:
    """The LCM of the manager block sizes (:func:`manager_kinds`; the group's
    size for one group)."""
    return math.lcm(*(g.block_size for g in manager_kinds(config)))


def hash_block_size(config: KVCacheConfig) -> int:
    """Hash granularity: the override, else the GCD of the manager block
    sizes of the prefix-cacheable groups (all groups if none is) when caching
    a hybrid model, else the scheduler block size."""
    if config.hash_block_size is not None:
        return config.hash_block_size
    if len(config.groups) == 1 or not config.enable_caching:
        return scheduler_block_size(config)
    kinds = manager_kinds(config)
    sizes = [g.block_size for g in kinds if prefix_cacheable(g)] or [g.block_size for g in kinds]
    return math.gcd(*sizes)


def manager_kinds(config: KVCacheConfig) -> tuple[AttentionKind, ...]:
    """The kinds the managers run: the groups with each block size multiplied
    by :func:`cp_block_factor` (the groups themselves without context
    parallelism). Upstream: ``SingleTypeKVCacheManager.block_size``; kvspec
    calls it ``KVCacheConfig.manager_groups``."""
    if config.dcp_world_size == 1 and config.pcp_world_size == 1:
        return config.groups
    return tuple(replace(k, block_size=k.block_size * cp_block_factor(k, config)) for k in config.groups)


def cp_block_factor(kind: AttentionKind, config: KVCacheConfig) -> int:
    """What context parallelism multiplies ``kind``'s manager block size by
    (kvspec: ``cp_scale``): up to vLLM 0.25.1 the product of the DCP and PCP
    sizes for every kind (profile switch ``cp_block_scaling`` ``dcp-pcp``);
    later the DCP size where :func:`dcp_scales_kind`, else 1.

    pre: config.dcp_world_size >= 1 and config.pcp_world_size >= 1
    post: __return__ >= 1
    """
    rule = config.profile.cp_block_scaling
    if rule == "dcp-pcp":
        return config.dcp_world_size * config.pcp_world_size
    return config.dcp_world_size if dcp_scales_kind(kind, rule) else 1


def dcp_scales_kind(kind: AttentionKind, rule: str) -> bool:
    """Whether the DCP size multiplies ``kind``'s manager block size under the
    profile's ``cp_block_scaling`` ``rule`` (kvspec: ``scales_by_dcp``):
    ``dcp-full-attention`` (vLLM 0.29.0, 0.30.0) only the full-attention-type
    kinds; ``dcp`` (0.26.0 to 0.28.0, where ``MambaManager`` undoes it) and
    ``dcp-sharded`` (0.31.0 on) every kind but Mamba; ``dcp-pcp`` every kind."""
    if rule == "dcp-full-attention":
        return isinstance(kind, FULL_TYPE_KINDS)
    if rule == "dcp-pcp":
        return True
    return not isinstance(kind, Mamba)


_CP_REFUSED_NAMES: dict[type, str] = {
    SlidingWindow: "sliding window attn",
    ChunkedLocal: "chunked local attn",
    Mamba: "mamba",
}


def cp_lookup_refusal(kind: AttentionKind, config: KVCacheConfig) -> str | None:
    """Why the prefix-cache lookup of ``kind``'s one group refuses context
    parallelism, or None (kvspec: ``cp_lookup_refusal``). Sliding-window,
    chunked-local and Mamba lookups require DCP and PCP sizes of 1: up to
    vLLM 0.28.0 the DCP size checked is the process's (rules ``dcp-pcp`` and
    ``dcp``), from 0.29.0 the one the group's manager was given (1 where
    :func:`dcp_scales_kind` is false); the PCP size is always the process's."""
    name = _CP_REFUSED_NAMES.get(type(kind))
    if name is None:
        return None
    rule = config.profile.cp_block_scaling
    per_process = rule in ("dcp-pcp", "dcp")
    dcp = config.dcp_world_size if per_process or dcp_scales_kind(kind, rule) else 1
    if dcp > 1:
        return f"DCP not support {name} now (dcp_world_size={dcp}, {config.profile.name})"
    if config.pcp_world_size > 1:
        return f"PCP not support {name} now (pcp_world_size={config.pcp_world_size}, {config.profile.name})"
    return None


def batched_tokens(config: KVCacheConfig) -> int:
    """``max_num_batched_tokens`` with vLLM's default (``max_model_len``) applied."""
    if config.max_num_batched_tokens is None:
        return config.max_model_len
    return config.max_num_batched_tokens


def has_mamba(config: KVCacheConfig) -> bool:
    """Whether any group is a Mamba group (vLLM's ``has_mamba_layers``)."""
    return any(isinstance(g, Mamba) for g in config.groups)


def searches_per_group(config: KVCacheConfig) -> bool:
    """Whether a connector's lookup searches each spec group alone: a cached
    model of several groups with a Mamba group (vLLM 0.27.0's
    ``get_computed_blocks_for_connector``; kvspec's ``lagging_hits_allowed``
    less the release)."""
    return config.enable_caching and len(config.groups) > 1 and has_mamba(config)


def lagging_hits(config: KVCacheConfig) -> bool:
    """Whether ``allocate_slots`` takes hit lists that lag the hit outside
    full-attention groups, those a connector's per-group lookup returns
    (vLLM 0.27.0 on: profile switch ``connector_lookup_op``)."""
    return config.profile.connector_lookup_op and searches_per_group(config)


def eagle_group_ids(config: KVCacheConfig) -> frozenset[int]:
    """Groups that drop the EAGLE block: the flagged ones, else all groups
    under ``use_eagle``; from vLLM 0.33.0 flags need ``use_eagle`` too
    (profile switch ``eagle_flags_need_use_eagle``); before 0.25.1 there are
    no flags (``eagle_group_flags``)."""
    if config.profile.eagle_flags_need_use_eagle and not config.use_eagle:
        return frozenset()
    if config.eagle_groups and config.profile.eagle_group_flags:
        return frozenset(config.eagle_groups)
    return frozenset(range(len(config.groups))) if config.use_eagle else frozenset()


MODELLED_FEATURES: frozenset[str] = frozenset(
    {
        "partial-tail-entries", "mamba-tail-entries", "ring-kinds", "context-parallelism", "partial-hash-hits",
        "prefill-checkpoints",
    }
)  # fmt: skip
"""The state-adding features of :func:`features_needed` that the pure-Python
manager models (the native core models none of them: :mod:`kvimpl.native`
hands such a configuration to the pure-Python manager)."""


def unmodelled_features(config: KVCacheConfig) -> list[str]:
    """The features of :func:`features_needed` that the pure-Python manager
    does not model (not in :data:`MODELLED_FEATURES`), sorted."""
    return [f for f in features_needed(config) if f not in MODELLED_FEATURES]


def features_needed(config: KVCacheConfig) -> list[str]:
    """The state-adding features of vLLM 0.26.0 on that ``config`` needs
    (kvspec models each: ``kvspec.partial_tail``, ``kvspec.mamba_tail``, the
    ring managers, ``kvspec.config.cp_scale``), sorted.

    * ``partial-tail-entries``: a cached full-attention-type group coarser
      than the hash block (profile switch ``partial_tail_entries``);
    * ``partial-hash-hits``: a cached Mamba align group coarser than the hash
      block (``partial_hash_hits``);
    * ``mamba-tail-entries``: a cached Mamba align group (``mamba_tail_entries``);
    * ``ring-kinds``: a ring group, ``CircularBuffer`` or ``KpoolTail``, cached
      or not (``circular_buffer_kind``, ``kpool_tail_kind``);
    * ``context-parallelism``: ``dcp_world_size`` or ``pcp_world_size`` above 1
      (``cp_block_scaling``, ``cp_swa_mask_unscaled``);
    * ``prefill-checkpoints``: a Mamba align group with
      ``num_prefill_checkpoint_blocks`` above 0, cached or not, under any
      release that has checkpoints (``prefill_checkpoints``: 0.29.0's
      block-aligned form and the positional forms of 0.30.0 on, each
      modelled by the pure-Python manager, :mod:`kvimpl.prefill_checkpoints`).

    NOTE: only a hybrid has a group coarser than the hash block: one cached
    group whose hash block differs from its block is a ConfigError (vLLM's
    unitary coordinator asserts they are equal), so the test needs no group
    count.
    """
    p = config.profile
    ring = ["ring-kinds"] if any(isinstance(k, RING_KINDS) for k in config.groups) else []
    if config.dcp_world_size * config.pcp_world_size > 1:
        ring.append("context-parallelism")
    form = p.prefill_checkpoints
    if form != "none" and any(
        isinstance(k, Mamba) and k.mode == "align" and k.num_prefill_checkpoint_blocks > 0 for k in config.groups
    ):
        ring.append("prefill-checkpoints")
    if not config.enable_caching:
        return sorted(ring)
    hbs = hash_block_size(config)
    used: list[str] = list(ring)
    for kind in config.groups:
        align = isinstance(kind, Mamba) and kind.mode == "align"
        coarse = kind.block_size > hbs
        if p.partial_tail_entries and coarse and isinstance(kind, FULL_TYPE_KINDS):
            used.append("partial-tail-entries")
        if p.partial_hash_hits and coarse and align:
            used.append("partial-hash-hits")
        if p.mamba_tail_entries and align:
            used.append("mamba-tail-entries")
    return sorted(set(used))


def clip_block_sizes(config: KVCacheConfig) -> tuple[int, ...]:
    """Per group, the block size ``get_block_ids_for_computed_tokens`` cuts
    its table by (the configured, unscaled size: vLLM reads the group's
    ``AttentionSpec``), or 0 where the table is returned whole (Mamba and
    cross attention)."""
    return tuple(0 if isinstance(k, Mamba | CrossAttention) else k.block_size for k in config.groups)


def estimate_groups(config: KVCacheConfig) -> tuple[int, ...]:
    """The groups ``estimate_cached_tokens`` takes the smallest count over:
    all but cross attention, and from vLLM 0.30.0 (profile switch
    ``estimate_skips_uncacheable``) all but the groups not prefix cacheable."""
    skip = config.profile.estimate_skips_uncacheable
    return tuple(
        g
        for g, k in enumerate(config.groups)
        if not isinstance(k, CrossAttention) and (prefix_cacheable(k) or not skip)
    )


def speculative_blocks(kind: AttentionKind) -> int:
    """The spare blocks a group's tables hold past the request's tokens: a
    Mamba group's ``num_speculative_blocks``, else 0 (as
    :func:`kvspec.config.speculative_blocks`)."""
    return kind.num_speculative_blocks if isinstance(kind, Mamba) else 0


def cacheable_blocks(kind: AttentionKind, table_len: int) -> int | None:
    """Full blocks ``cache_blocks`` may cache in a group of ``kind`` holding
    ``table_len`` blocks, or None where the group caches nothing (as
    :func:`kvspec.config.cacheable_blocks`)."""
    if isinstance(kind, CrossAttention) or not prefix_cacheable(kind):
        return None
    return table_len - speculative_blocks(kind)
