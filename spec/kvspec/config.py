"""Attention kinds and the manager configuration.

One KV-cache *group* is a set of layers that share block tables; each group
has one attention kind. Kinds are frozen values compared by equality: in a
hybrid model, groups with equal kinds are looked up jointly.

Upstream: the ``*Spec`` classes of ``vllm/v1/kv_cache_interface.py`` (our
names drop "Spec"), ``KVCacheConfig``/``KVCacheGroupSpec``, the
``KVCacheManager`` constructor arguments and
``resolve_kv_cache_block_sizes``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from kvspec.errors import ConfigError, UnsupportedByProfileError
from kvspec.hashing import get_hash_fn_by_name
from kvspec.profiles import NEWEST, SemanticsProfile, unsupported_reason


@dataclass(frozen=True, slots=True)
class FullAttention:
    """Every token attends to every earlier token (upstream: ``FullAttentionSpec``)."""

    block_size: int


@dataclass(frozen=True, slots=True)
class MLA:
    """Multi-head latent attention; managed like full attention
    (upstream: ``MLAAttentionSpec``)."""

    block_size: int


@dataclass(frozen=True, slots=True)
class SinkFullAttention:
    """Full attention plus ``sink_len`` tokens of attention-sink blocks taken
    from the pool at construction (upstream: ``SinkFullAttentionSpec``)."""

    block_size: int
    sink_len: int


@dataclass(frozen=True, slots=True)
class SlidingWindow:
    """Each token attends to the last ``window`` tokens (itself included)
    (upstream: ``SlidingWindowSpec``)."""

    block_size: int
    window: int


@dataclass(frozen=True, slots=True)
class ChunkedLocal:
    """Tokens attend within their ``chunk``-aligned chunk only
    (upstream: ``ChunkedLocalAttentionSpec``)."""

    block_size: int
    chunk: int


MambaMode = Literal["none", "all", "align"]


@dataclass(frozen=True, slots=True)
class Mamba:
    """Recurrent state; only the latest state is needed (upstream: ``MambaSpec``).

    ``mode`` is vLLM's ``mamba_cache_mode``: ``none`` (no prefix caching of
    states), ``all`` (cache the state at every block boundary) or ``align``
    (cache states that land on block boundaries at step ends). The default is
    vLLM's: ``none``.
    """

    block_size: int
    mode: MambaMode = "none"
    num_speculative_blocks: int = 0


@dataclass(frozen=True, slots=True)
class CrossAttention:
    """Encoder-decoder cross attention; blocks sized by the encoder input
    (upstream: ``CrossAttentionSpec``). Requires prefix caching off."""

    block_size: int


@dataclass(frozen=True, slots=True)
class CircularBuffer:
    """A per-request ring block: exactly one block per request for its whole
    life, never prefix-cached; ``block_size`` is the ring capacity
    (upstream: ``CircularBufferSpec``, vLLM 0.29.0 on)."""

    block_size: int


@dataclass(frozen=True, slots=True)
class KpoolTail:
    """A kpool indexer's one-block circular tail, managed like
    :class:`CircularBuffer`; ``window`` is its ``sliding_window``, which only
    names its event kind (upstream: ``KpoolTailSpec``, a ``SlidingWindowSpec``
    subclass, vLLM 0.30.0 and 0.31.0; removed in 0.32.0)."""

    block_size: int
    window: int


AttentionKind = (
    FullAttention | MLA | SinkFullAttention | SlidingWindow | ChunkedLocal | Mamba | CrossAttention | CircularBuffer
    | KpoolTail
)  # fmt: skip

FULL_TYPE_KINDS = (FullAttention, MLA, SinkFullAttention)
"""Kinds vLLM manages with ``FullAttentionManager`` semantics."""

RING_KINDS = (CircularBuffer, KpoolTail)
"""Ring kinds: one block per request, never prefix-cached (``CircularBufferManager``)."""


def prefix_cacheable(kind: AttentionKind) -> bool:
    """Whether groups of ``kind`` take part in prefix caching (vLLM's
    ``KVCacheSpec.prefix_cacheable``): false only for the ring kinds, which a
    hybrid lookup, its block-size checks and the hash block size leave out."""
    return not isinstance(kind, RING_KINDS)


def kind_name(kind: AttentionKind) -> str:
    """The kind string carried by BlockStored events (vLLM's ``KVCacheSpecKind``)."""
    names: dict[type, str] = {
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
    return names[type(kind)]


def event_sliding_window(kind: AttentionKind) -> int | None:
    """The sliding window carried by BlockStored events (None unless SWA)."""
    return kind.window if isinstance(kind, SlidingWindow | KpoolTail) else None


def tracks_new_block_ids(kind: AttentionKind) -> bool:
    """Whether fresh blocks of this kind are reported by ``take_new_block_ids``.

    NOTE: vLLM checks the exact spec type, so SinkFull, SWA, Mamba,
    ChunkedLocal and Cross groups are not reported.
    """
    return type(kind) in (FullAttention, MLA)


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


@dataclass(frozen=True, slots=True)
class KVCacheConfig:
    """Everything needed to construct a ``KVCacheManager``.

    Args:
        num_blocks: Pool size, the null block 0 included.
        groups: One attention kind per KV-cache group, in group order.
        max_model_len: Longest sequence a request may reach.
        max_num_batched_tokens: Step token budget; None means ``max_model_len``.
        enable_caching: Prefix caching on or off.
        use_eagle: EAGLE/MTP speculative decoding (drops the last hit block).
        eagle_groups: Groups flagged ``is_eagle_group``; if empty and
            ``use_eagle``, every group is treated as an EAGLE group.
        enable_kv_cache_events: Record BlockStored/BlockRemoved/AllBlocksCleared.
        watermark: Fraction of ``num_blocks`` kept free when admitting.
        hash_function: One of vLLM's hash function names.
        hash_seed: The ``PYTHONHASHSEED`` string NONE_HASH is derived from.
        hash_block_size: Hash granularity override (default: see
            :meth:`resolved_hash_block_size`).
        int_block_hashes: Events carry 64-bit ints (vLLM default) or bytes.
        log_stats: Keep prefix-cache statistics.
        profile: The vLLM release whose behaviour applies (default: the newest
            supported, :data:`kvspec.profiles.NEWEST`).

    inv: self.scheduler_block_size % self.resolved_hash_block_size() == 0
    """

    num_blocks: int
    groups: tuple[AttentionKind, ...]
    max_model_len: int
    max_num_batched_tokens: int | None = None
    enable_caching: bool = True
    use_eagle: bool = False
    eagle_groups: tuple[int, ...] = field(default=())
    enable_kv_cache_events: bool = False
    watermark: float = 0.0
    hash_function: str = "sha256_cbor"
    hash_seed: str = "0"
    hash_block_size: int | None = None
    int_block_hashes: bool = True
    log_stats: bool = False
    profile: SemanticsProfile = NEWEST

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def scheduler_block_size(self) -> int:
        """The LCM of the group block sizes (the group's size for one group)."""
        return math.lcm(*(g.block_size for g in self.groups))

    def resolved_hash_block_size(self) -> int:
        """Hash granularity: the override, else the GCD of the prefix-cacheable
        group sizes (all groups if none is) when caching a hybrid model, else
        the scheduler block size."""
        if self.hash_block_size is not None:
            return self.hash_block_size
        if len(self.groups) == 1 or not self.enable_caching:
            return self.scheduler_block_size
        sizes = [g.block_size for g in self.groups if prefix_cacheable(g)] or [g.block_size for g in self.groups]
        return math.gcd(*sizes)

    def batched_tokens(self) -> int:
        """``max_num_batched_tokens`` with vLLM's default applied."""
        if self.max_num_batched_tokens is None:
            return self.max_model_len
        return self.max_num_batched_tokens

    def eagle_group_ids(self) -> frozenset[int]:
        """Groups that drop the EAGLE block: the flagged ones, else all groups
        under ``use_eagle``; from vLLM 0.33.0 flags need ``use_eagle`` too
        (profile switch ``eagle_flags_need_use_eagle``); before 0.25.1 there
        are no flags (``eagle_group_flags``; a flagged config is refused)."""
        if self.profile.eagle_flags_need_use_eagle and not self.use_eagle:
            return frozenset()
        if self.eagle_groups and self.profile.eagle_group_flags:
            return frozenset(self.eagle_groups)
        return frozenset(range(len(self.groups))) if self.use_eagle else frozenset()

    def has_mamba(self) -> bool:
        """Whether any group is a Mamba group (vLLM's ``has_mamba_layers``)."""
        return any(isinstance(g, Mamba) for g in self.groups)


def _validate(cfg: KVCacheConfig) -> None:
    """Raise ConfigError naming the first broken condition of ``cfg``."""
    if not isinstance(cfg.profile, SemanticsProfile):
        raise ConfigError(f"profile must be a kvspec.profiles.SemanticsProfile, got {cfg.profile!r}")
    if not isinstance(cfg.num_blocks, int) or cfg.num_blocks < 1:
        raise ConfigError(f"num_blocks must be a positive int, got {cfg.num_blocks!r}")
    if not cfg.groups:
        raise ConfigError("groups is empty; give at least one attention kind")
    if cfg.max_model_len < 1:
        raise ConfigError(f"max_model_len must be positive, got {cfg.max_model_len}")
    if cfg.max_num_batched_tokens is not None and cfg.max_num_batched_tokens < 1:
        raise ConfigError(f"max_num_batched_tokens must be positive, got {cfg.max_num_batched_tokens}")
    if not 0.0 <= cfg.watermark < 1.0:
        raise ConfigError(f"watermark must be in [0, 1), got {cfg.watermark}")
    get_hash_fn_by_name(cfg.hash_function)
    validate_release_options(cfg)
    for gid, kind in enumerate(cfg.groups):
        validate_kind(gid, kind, cfg)
    validate_groups(cfg)
    for gid in cfg.eagle_groups:
        if not 0 <= gid < len(cfg.groups):
            raise ConfigError(f"eagle_groups names group {gid}, but there are {len(cfg.groups)} groups")
    hbs = cfg.resolved_hash_block_size()
    if hbs < 1 or cfg.scheduler_block_size % hbs:
        raise ConfigError(f"hash_block_size {hbs} must divide the scheduler block size")
    if cfg.enable_caching and any(g.block_size % hbs for g in cfg.groups if prefix_cacheable(g)):
        raise ConfigError(f"hash_block_size {hbs} must divide every prefix-cacheable group block size when caching")
    reason = unsupported_reason(cfg)
    if reason is not None:
        raise UnsupportedByProfileError(reason)


def validate_release_options(cfg: KVCacheConfig) -> None:
    """Refuse options the profile's release does not have: before vLLM 0.25.1
    there is no watermark, no ``max_num_batched_tokens`` (profile switch
    ``admission_controls``) and no per-group EAGLE flag (``eagle_group_flags``).

    Raises:
        UnsupportedByProfileError: Naming the option and the release.
    """
    p = cfg.profile
    if not p.admission_controls:
        if cfg.watermark != 0.0:
            raise UnsupportedByProfileError(f"{p.name} has no watermark (got {cfg.watermark})")
        if cfg.max_num_batched_tokens is not None:
            raise UnsupportedByProfileError(
                f"{p.name} has no max_num_batched_tokens (got {cfg.max_num_batched_tokens})"
            )
    if not p.eagle_group_flags and cfg.eagle_groups:
        raise UnsupportedByProfileError(
            f"{p.name} has no per-group EAGLE flags (got eagle_groups={cfg.eagle_groups})"
        )


def validate_groups(cfg: KVCacheConfig) -> None:
    """A cached model of several groups needs a prefix-cacheable group; before
    vLLM 0.29.0 it needs two distinct kinds (profile switch
    ``single_spec_group_hybrid``)."""
    if cfg.enable_caching and len(cfg.groups) > 1 and not any(prefix_cacheable(g) for g in cfg.groups):
        raise ConfigError("a cached hybrid needs at least one prefix-cacheable group (ring groups are not)")
    if cfg.profile.single_spec_group_hybrid:
        return
    if cfg.enable_caching and len(cfg.groups) > 1 and len(set(cfg.groups)) < 2:
        raise ConfigError("a cached hybrid needs at least two distinct kinds; equal groups are one group")


def validate_kind(gid: int, kind: AttentionKind, cfg: KVCacheConfig) -> None:
    """Raise ConfigError naming the first broken condition of group ``gid``."""
    where = f"group {gid} ({type(kind).__name__})"
    if kind.block_size < 1:
        raise ConfigError(f"{where}: block_size must be positive, got {kind.block_size}")
    if isinstance(kind, RING_KINDS):
        validate_ring_kind(where, kind, cfg.profile)
    if isinstance(kind, SlidingWindow | KpoolTail) and kind.window < 1:
        raise ConfigError(f"{where}: window must be positive, got {kind.window}")
    if isinstance(kind, ChunkedLocal):
        if kind.chunk < 1:
            raise ConfigError(f"{where}: chunk must be positive, got {kind.chunk}")
        if cfg.enable_caching and gid in cfg.eagle_group_ids():
            raise ConfigError(f"{where}: EAGLE is not supported with chunked local attention")
        if cfg.enable_caching and kind.block_size != cfg.scheduler_block_size:
            raise ConfigError(f"{where}: chunked local attention needs every group to share its block size")
    if isinstance(kind, SinkFullAttention) and (kind.sink_len < 1 or kind.sink_len % kind.block_size):
        raise ConfigError(f"{where}: sink_len {kind.sink_len} must be a positive multiple of the block size")
    if isinstance(kind, Mamba):
        if kind.mode not in ("none", "all", "align"):
            raise ConfigError(f"{where}: unknown mode {kind.mode!r}")
        if kind.num_speculative_blocks < 0:
            raise ConfigError(f"{where}: num_speculative_blocks must be >= 0")
        if cfg.profile.mamba_caching_needs_align and cfg.enable_caching and kind.mode != "align":
            raise ConfigError(f"{where}: prefix caching needs mode 'align' ({cfg.profile.name}), got {kind.mode!r}")
    if isinstance(kind, CrossAttention) and cfg.enable_caching:
        raise ConfigError(f"{where}: cross attention requires enable_caching=False")


def validate_ring_kind(where: str, kind: CircularBuffer | KpoolTail, profile: SemanticsProfile) -> None:
    """A ring kind needs a release that has it: ``CircularBuffer`` from vLLM
    0.29.0, ``KpoolTail`` in 0.30.0 and 0.31.0 only (profile switches
    ``circular_buffer_kind`` and ``kpool_tail_kind``)."""
    if isinstance(kind, CircularBuffer) and not profile.circular_buffer_kind:
        raise ConfigError(f"{where}: CircularBufferSpec is new in vLLM 0.29.0; not in {profile.name}")
    if isinstance(kind, KpoolTail) and not profile.kpool_tail_kind:
        raise ConfigError(f"{where}: KpoolTailSpec exists in vLLM 0.30.0 and 0.31.0 only, not in {profile.name}")
