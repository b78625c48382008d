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

_KIND_NAMES: dict[type, str] = {
    FullAttention: "full_attention",
    MLA: "mla_attention",
    SinkFullAttention: "sink_full_attention",
    SlidingWindow: "sliding_window",
    ChunkedLocal: "chunked_local_attention",
    Mamba: "mamba",
    CrossAttention: "cross_attention",
}


def kind_name(kind: AttentionKind) -> str:
    """The kind string carried by BlockStored events (vLLM's ``KVCacheSpecKind``)."""
    return _KIND_NAMES[type(kind)]


def event_sliding_window(kind: AttentionKind) -> int | None:
    """The sliding window carried by BlockStored events (None unless SWA)."""
    return kind.window if isinstance(kind, SlidingWindow) else None


def admission_cap(kind: AttentionKind, max_num_batched_tokens: int, max_model_len: int) -> int | None:
    """Per-request block cap of the full-sequence admission gate, or None.

    pre: max_num_batched_tokens > 0 and max_model_len > 0
    post: __return__ is None or __return__ >= 1
    """
    if isinstance(kind, SlidingWindow):
        tokens = min(kind.window - 1 + max_num_batched_tokens, max_model_len)
        return -(-tokens // kind.block_size) + 1
    if isinstance(kind, ChunkedLocal):
        tokens = min(kind.chunk + max_num_batched_tokens, max_model_len)
        return -(-tokens // kind.block_size)
    return None


def scheduler_block_size(config: KVCacheConfig) -> int:
    """The LCM of the group block sizes (the group's size for one group)."""
    return math.lcm(*(g.block_size for g in config.groups))


def hash_block_size(config: KVCacheConfig) -> int:
    """Hash granularity: the override, else the GCD of the group sizes (ring
    groups left out unless there is nothing else) when caching a hybrid
    model, else the scheduler block size."""
    if config.hash_block_size is not None:
        return config.hash_block_size
    if len(config.groups) == 1 or not config.enable_caching:
        return scheduler_block_size(config)
    rings = (CircularBuffer, KpoolTail)
    sizes = [g.block_size for g in config.groups if not isinstance(g, rings)] or [g.block_size for g in config.groups]
    return math.gcd(*sizes)


def batched_tokens(config: KVCacheConfig) -> int:
    """``max_num_batched_tokens`` with vLLM's default (``max_model_len``) applied."""
    if config.max_num_batched_tokens is None:
        return config.max_model_len
    return config.max_num_batched_tokens


def has_mamba(config: KVCacheConfig) -> bool:
    """Whether any group is a Mamba group (vLLM's ``has_mamba_layers``)."""
    return any(isinstance(g, Mamba) for g in config.groups)


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


MODELLED_FEATURES: frozenset[str] = frozenset({"partial-tail-entries", "mamba-tail-entries"})
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
      (``cp_block_scaling``, ``cp_swa_mask_unscaled``).

    NOTE: a group is coarser than the hash block in a hybrid, or alone under
    a finer ``hash_block_size``; ``kvspec.profiles.features_used`` counts only
    hybrids, but kvspec registers the tail entries of a lone group too
    (``registers_partial_tail``, ``registers_mamba_tail``), so the native core
    must decline it as well.
    """
    p = config.profile
    ring = ["ring-kinds"] if any(isinstance(k, (CircularBuffer, KpoolTail)) for k in config.groups) else []
    if config.dcp_world_size * config.pcp_world_size > 1:
        ring.append("context-parallelism")
    if not config.enable_caching:
        return ring
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
