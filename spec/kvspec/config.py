"""Attention kinds and the manager configuration.

One KV-cache *group* is a set of layers that share block tables; each group
has one attention kind. Kinds are frozen values compared by equality: in a
hybrid model, groups with equal kinds are looked up jointly.

Upstream: the ``*Spec`` classes of ``vllm/v1/kv_cache_interface.py`` (our
names drop "Spec"), ``KVCacheConfig``/``KVCacheGroupSpec``, the
``KVCacheManager`` constructor arguments and
``resolve_kv_cache_block_sizes``.

NOTE: The module is above the usual length because the context-parallel
rules (:func:`cp_scale`, :func:`scales_by_dcp`, :func:`cp_lookup_refusal`,
:func:`validate_cp`) decide the block sizes ``KVCacheConfig`` derives and
validates; split off, they would import the kinds from here and be imported
back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
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
    (upstream: ``SlidingWindowSpec``).

    ``extra_retained_tokens`` more tokens below the window stay in the table
    though attention no longer reads them: a multi-module MTP drafter may
    prefill the last ``num_prefill_lookahead - 1`` tokens again (vLLM 0.28.0
    on, whose planner sets it to that number; 0 elsewhere)."""

    block_size: int
    window: int
    extra_retained_tokens: int = 0


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

    ``num_prefill_checkpoint_blocks`` (vLLM 0.29.0 on; profile switch
    ``prefill_checkpoints``): in align mode a prefill chunk may keep one more
    state block, a checkpoint below its running state
    (:mod:`kvspec.prefill_checkpoints`); other modes ignore it. vLLM takes
    any int: 0 or less disables checkpoints, and every value above 1 acts as
    1 (one checkpoint block per chunk); kvspec refuses a negative count.
    ``prefill_checkpoint_alignment`` (vLLM 0.30.0 on): the token granularity
    at which the kernel can export a state, counted from the chunk start;
    None disables checkpoints. vLLM accepts 0 and negative values and fails
    an assertion inside ``allocate_slots`` at the first chunk it weighs for
    a checkpoint; kvspec refuses them when the configuration is made.
    """

    block_size: int
    mode: MambaMode = "none"
    num_speculative_blocks: int = 0
    num_prefill_checkpoint_blocks: int = 0
    prefill_checkpoint_alignment: int | None = None


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
    hybrid lookup, its block-size checks and the hash block size leave out.

    post: __return__ == (not isinstance(kind, CircularBuffer | KpoolTail))
    """
    return not isinstance(kind, RING_KINDS)


def speculative_blocks(kind: AttentionKind) -> int:
    """The spare blocks a group's tables hold past the request's tokens: a
    Mamba group's ``num_speculative_blocks`` (every mode allocates them), else 0.
    ``cache_blocks`` does not count them as blocks that tokens fill.

    post: __return__ == (kind.num_speculative_blocks if isinstance(kind, Mamba) else 0)
    post: __return__ >= 0
    """
    return kind.num_speculative_blocks if isinstance(kind, Mamba) else 0


def cacheable_blocks(kind: AttentionKind, table_len: int) -> int | None:
    """How many full blocks ``cache_blocks`` may cache in a group of ``kind``
    whose table holds ``table_len`` blocks: the table less its speculative
    blocks (:func:`speculative_blocks`; vLLM would cache them as states no
    token filled). None for a group that caches nothing (cross attention and
    the ring kinds), where any count is accepted. A count ``n`` asks for
    ``n // block_size`` full blocks; more than this is refused
    (``CacheBeyondAllocationError``).

    post: (__return__ is None) == (isinstance(kind, CrossAttention) or not prefix_cacheable(kind))
    post: __return__ is None or __return__ == table_len - speculative_blocks(kind)
    """
    if isinstance(kind, CrossAttention) or not prefix_cacheable(kind):
        return None
    return table_len - speculative_blocks(kind)


def kind_name(kind: AttentionKind) -> str:
    """The kind string carried by BlockStored events (vLLM's ``KVCacheSpecKind``).

    post: __return__ in ("full_attention", "mla_attention", "sink_full_attention", "sliding_window", "chunked_local_attention", "mamba", "cross_attention", "unknown")
    post: (__return__ == "sliding_window") == isinstance(kind, SlidingWindow | KpoolTail)
    post: (__return__ == "unknown") == isinstance(kind, CircularBuffer)
    post: (__return__ == "full_attention") == isinstance(kind, FullAttention)
    """  # noqa: E501 - a PEP 316 condition is one line
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
    """The sliding window carried by BlockStored events (None unless SWA).

    post: (__return__ is not None) == isinstance(kind, SlidingWindow | KpoolTail)
    post: __return__ is None or __return__ == kind.window
    """
    return kind.window if isinstance(kind, SlidingWindow | KpoolTail) else None


def tracks_new_block_ids(kind: AttentionKind) -> bool:
    """Whether fresh blocks of this kind are reported by ``take_new_block_ids``.

    NOTE: vLLM checks the exact spec type, so SinkFull, SWA, Mamba,
    ChunkedLocal and Cross groups are not reported.

    post: __return__ == isinstance(kind, FullAttention | MLA)
    """
    return type(kind) in (FullAttention, MLA)


def admission_cap(kind: AttentionKind, max_num_batched_tokens: int, max_model_len: int) -> int | None:
    """Per-request block cap of the full-sequence admission gate, or None.

    pre: max_num_batched_tokens > 0 and max_model_len > 0
    post: __return__ is None or __return__ >= 1
    post: (__return__ is None) == (not isinstance(kind, SlidingWindow | ChunkedLocal))
    post: not isinstance(kind, SlidingWindow) or (__return__ - 1) * kind.block_size >= min(kind.window - 1 + kind.extra_retained_tokens + max_num_batched_tokens, max_model_len)
    post: not isinstance(kind, ChunkedLocal) or __return__ * kind.block_size >= min(kind.chunk + max_num_batched_tokens, max_model_len)
    """  # noqa: E501 - a PEP 316 condition is one line
    if isinstance(kind, SlidingWindow):
        tokens = min(kind.window - 1 + kind.extra_retained_tokens + max_num_batched_tokens, max_model_len)
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
        dcp_world_size: Decode context parallelism: ranks a group's KV is
            sharded over (vLLM's ``dcp_world_size``); it multiplies the
            manager block size of the groups the profile scales
            (:func:`cp_scale`).
        pcp_world_size: Prefill context parallelism (vLLM's
            ``pcp_world_size``); up to vLLM 0.25.1 it scales block sizes too.
        num_prefill_lookahead: The prefill tokens a multi-module MTP drafter
            reads past a chunk's end (vLLM's ``num_prefill_lookahead``, 0.28.0
            on); caching lags the last ``num_prefill_lookahead - 1`` computed
            tokens (:func:`num_reprefillable_tokens`).
        num_hash_lookahead_tokens: Look-ahead block hashes (vLLM's
            ``num_hash_lookahead_tokens``, 0.33.0 on; the scheduler sets it to
            the drafter's prefill look-ahead for EAGLE-style speculative
            decoding with prefix caching, and then builds the manager without
            ``use_eagle``): each block hash also covers the next this many
            tokens (:class:`kvspec.request.RequestBlockHasher`), so blocks are
            cached only up to the hashed tokens.
        prefix_cache_retention_interval: Sparse caching in sliding-window
            and Mamba groups (vLLM 0.23.0 on; upstream the environment
            variable ``VLLM_PREFIX_CACHE_RETENTION_INTERVAL`` up to 0.28.0,
            the ``KVCacheConfig`` field of this name from 0.29.0 on): None
            caches as before, 0 only what the reachable boundaries need, a
            positive multiple of the scheduler block size also what a hit at
            each of its multiples needs (:mod:`kvspec.retention`).
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
    dcp_world_size: int = 1
    pcp_world_size: int = 1
    num_prefill_lookahead: int = 0
    num_hash_lookahead_tokens: int = 0
    prefix_cache_retention_interval: int | None = None

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def scheduler_block_size(self) -> int:
        """The LCM of the manager block sizes (the group's size for one group;
        context parallelism scales them, :meth:`manager_groups`)."""
        return scheduler_block_size_of(self.manager_groups())

    def resolved_hash_block_size(self) -> int:
        """Hash granularity: the override, else the GCD of the prefix-cacheable
        group sizes (all groups if none is) when caching a hybrid model, else
        the scheduler block size; sizes are manager block sizes."""
        if self.hash_block_size is not None:
            return self.hash_block_size
        if len(self.groups) == 1 or not self.enable_caching:
            return self.scheduler_block_size
        groups = self.manager_groups()
        sizes = [g.block_size for g in groups if prefix_cacheable(g)] or [g.block_size for g in groups]
        return math.gcd(*sizes)

    def manager_groups(self) -> tuple[AttentionKind, ...]:
        """The kinds the managers run: ``groups`` with each block size
        multiplied by :func:`cp_scale` (``groups`` itself without context
        parallelism). Upstream: ``SingleTypeKVCacheManager.block_size``."""
        if self.dcp_world_size * self.pcp_world_size == 1:
            return self.groups
        return tuple(replace(g, block_size=g.block_size * cp_scale(g, self)) for g in self.groups)

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
    for name in ("dcp_world_size", "pcp_world_size"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a positive int, got {value!r}")
    lookahead = cfg.num_prefill_lookahead
    if not isinstance(lookahead, int) or isinstance(lookahead, bool) or lookahead < 0:
        raise ConfigError(f"num_prefill_lookahead must be a non-negative int, got {lookahead!r}")
    hash_lookahead = cfg.num_hash_lookahead_tokens
    if not isinstance(hash_lookahead, int) or isinstance(hash_lookahead, bool) or hash_lookahead < 0:
        raise ConfigError(f"num_hash_lookahead_tokens must be a non-negative int, got {hash_lookahead!r}")
    get_hash_fn_by_name(cfg.hash_function)
    validate_release_options(cfg)
    for gid, kind in enumerate(cfg.groups):
        validate_kind(gid, kind, cfg)
    validate_groups(cfg)
    for gid in cfg.eagle_groups:
        if not 0 <= gid < len(cfg.groups):
            raise ConfigError(f"eagle_groups names group {gid}, but there are {len(cfg.groups)} groups")
    validate_prefill_lookahead(cfg)
    validate_retention(cfg)
    hbs = cfg.resolved_hash_block_size()
    if hbs < 1 or cfg.scheduler_block_size % hbs:
        raise ConfigError(f"hash_block_size {hbs} must divide the scheduler block size")
    if cfg.enable_caching and any(g.block_size % hbs for g in cfg.manager_groups() if prefix_cacheable(g)):
        raise ConfigError(f"hash_block_size {hbs} must divide every prefix-cacheable group block size when caching")
    validate_cp(cfg)
    validate_sink_room(cfg)
    validate_unitary_hash_block(cfg)
    reason = unsupported_reason(cfg)
    if reason is not None:
        raise UnsupportedByProfileError(reason)


def validate_release_options(cfg: KVCacheConfig) -> None:
    """Refuse options the profile's release does not have: before vLLM 0.24.0
    there is no watermark (profile switch ``admission_controls``), and
    ``max_num_batched_tokens`` is refused too (0.16.0 to 0.19.1 lack it;
    0.20.0 to 0.23.0 have it, but kvspec does not model it there); before
    0.20.0 there is no per-group EAGLE flag (``eagle_group_flags``); before
    0.28.0 no multi-module MTP input, before 0.33.0 no look-ahead block hashes
    (``lookahead_block_hashes``).

    Raises:
        UnsupportedByProfileError: Naming the option and the release.

    raises: UnsupportedByProfileError
    post: cfg.profile.admission_controls or (cfg.watermark == 0.0 and cfg.max_num_batched_tokens is None)
    post: cfg.profile.eagle_group_flags or not cfg.eagle_groups
    post: cfg.profile.prefill_lookahead or not uses_prefill_lookahead(cfg)
    post: cfg.profile.lookahead_block_hashes or cfg.num_hash_lookahead_tokens == 0
    """
    p = cfg.profile
    if not p.lookahead_block_hashes and cfg.num_hash_lookahead_tokens:
        raise UnsupportedByProfileError(
            f"{p.name} has no look-ahead block hashes (num_hash_lookahead_tokens="
            f"{cfg.num_hash_lookahead_tokens}); they are new in vllm-0.33.0"
        )
    if not p.prefill_lookahead and uses_prefill_lookahead(cfg):
        raise UnsupportedByProfileError(
            f"{p.name} has no multi-module MTP inputs (num_prefill_lookahead={cfg.num_prefill_lookahead}, "
            "SlidingWindow.extra_retained_tokens); they are new in vllm-0.28.0"
        )
    if not p.admission_controls:
        if cfg.watermark != 0.0:
            raise UnsupportedByProfileError(f"{p.name} has no watermark (got {cfg.watermark})")
        if cfg.max_num_batched_tokens is not None:
            raise UnsupportedByProfileError(
                f"{p.name}: max_num_batched_tokens (got {cfg.max_num_batched_tokens}) is not modelled before "
                "vllm-0.24.0 (0.16.0-0.19.1 lack it)"
            )
    if not p.eagle_group_flags and cfg.eagle_groups:
        raise UnsupportedByProfileError(f"{p.name} has no per-group EAGLE flags (got eagle_groups={cfg.eagle_groups})")


def uses_prefill_lookahead(cfg: KVCacheConfig) -> bool:
    """Whether ``cfg`` sets a multi-module MTP input: ``num_prefill_lookahead``
    or a sliding window's ``extra_retained_tokens``. A configuration without
    them caches and frees as before the inputs existed.

    post: __return__ or num_reprefillable_tokens(cfg) == 0
    post: __return__ or all(g.extra_retained_tokens == 0 for g in cfg.groups if isinstance(g, SlidingWindow))
    """
    return cfg.num_prefill_lookahead != 0 or any(
        isinstance(g, SlidingWindow) and g.extra_retained_tokens != 0 for g in cfg.groups
    )


def num_reprefillable_tokens(cfg: KVCacheConfig) -> int:
    """The trailing computed tokens a multi-module MTP drafter may prefill
    again (``num_prefill_lookahead - 1``, at least 0): their KV is not final,
    so caching stops short of them (vLLM 0.28.0 on).

    post: __return__ >= 0
    post: __return__ == 0 or __return__ == cfg.num_prefill_lookahead - 1
    """
    return max(0, cfg.num_prefill_lookahead - 1)


def validate_prefill_lookahead(cfg: KVCacheConfig) -> None:
    """With prefix caching and an EAGLE group (flagged, or every group under
    ``use_eagle``; a flag counts without ``use_eagle`` too), a hit's dropped
    tail (one scheduler block) must hold every look-ahead token: refuse
    ``num_prefill_lookahead`` above the scheduler block size (vLLM 0.28.0 on
    raises ValueError when the coordinator is built).

    raises: ConfigError
    post: not (cfg.enable_caching and (cfg.use_eagle or cfg.eagle_groups)) or cfg.num_prefill_lookahead <= cfg.scheduler_block_size
    """  # noqa: E501 - a PEP 316 condition is one line
    eagle = cfg.use_eagle or bool(cfg.eagle_groups)
    if cfg.enable_caching and eagle and cfg.scheduler_block_size < cfg.num_prefill_lookahead:
        raise ConfigError(
            f"num_prefill_lookahead {cfg.num_prefill_lookahead} exceeds the scheduler block size "
            f"{cfg.scheduler_block_size}: with prefix caching and EAGLE groups, a hit's dropped tail "
            "must hold every look-ahead token"
        )


def validate_retention(cfg: KVCacheConfig) -> None:
    """The retention interval: a release that has one (profile switch
    ``retention_kinds``), not under context parallelism or with ring groups
    (not modelled), a model with a group that acts on it (a sliding window;
    from vLLM 0.24.0 on a Mamba group too; from 0.29.0 on an interval of 0 is
    accepted in any model), and a non-negative multiple of the scheduler
    block size (vLLM raises ValueError when the coordinator is built).

    raises: ConfigError, UnsupportedByProfileError
    post: cfg.prefix_cache_retention_interval is None or cfg.prefix_cache_retention_interval % cfg.scheduler_block_size == 0
    post: cfg.prefix_cache_retention_interval is None or cfg.profile.retention_kinds != "none"
    """  # noqa: E501 - a PEP 316 condition is one line
    ret, p = cfg.prefix_cache_retention_interval, cfg.profile
    if ret is None:
        return
    if not isinstance(ret, int) or isinstance(ret, bool):
        raise ConfigError(f"prefix_cache_retention_interval must be None or an int, got {ret!r}")
    if p.retention_kinds == "none":
        raise UnsupportedByProfileError(
            f"{p.name} has no prefix-cache retention interval (got {ret}); it is new in vllm-0.23.0"
        )
    if cfg.dcp_world_size * cfg.pcp_world_size > 1 or any(isinstance(g, RING_KINDS) for g in cfg.groups):
        raise UnsupportedByProfileError(
            f"{p.name}: a retention interval (got {ret}) with context parallelism or ring groups is not modelled"
        )
    kinds = (SlidingWindow, Mamba) if p.retention_kinds == "swa+mamba" else (SlidingWindow,)
    if not any(isinstance(g, kinds) for g in cfg.groups) and not (ret == 0 and p.retention_zero_any_model):
        acting = "sliding-window or Mamba" if p.retention_kinds == "swa+mamba" else "sliding-window"
        raise ConfigError(
            f"prefix_cache_retention_interval={ret}: the model has no {acting} group, the only groups it acts on"
        )
    if ret < 0 or ret % cfg.scheduler_block_size:
        raise ConfigError(
            f"prefix_cache_retention_interval={ret} must be a non-negative multiple of the scheduler block "
            f"size {cfg.scheduler_block_size}"
        )


def validate_groups(cfg: KVCacheConfig) -> None:
    """A cached model of several groups needs a prefix-cacheable group; before
    vLLM 0.29.0 it needs two distinct kinds (profile switch
    ``single_spec_group_hybrid``).

    raises: ConfigError
    post: not cfg.enable_caching or len(cfg.groups) < 2 or any(prefix_cacheable(g) for g in cfg.groups)
    post: cfg.profile.single_spec_group_hybrid or not cfg.enable_caching or len(set(cfg.groups)) > 1 or len(cfg.groups) < 2
    """  # noqa: E501 - a PEP 316 condition is one line
    if cfg.enable_caching and len(cfg.groups) > 1 and not any(prefix_cacheable(g) for g in cfg.groups):
        raise ConfigError("a cached hybrid needs at least one prefix-cacheable group (ring groups are not)")
    if cfg.profile.single_spec_group_hybrid:
        return
    if cfg.enable_caching and len(cfg.groups) > 1 and len(set(cfg.groups)) < 2:
        raise ConfigError("a cached hybrid needs at least two distinct kinds; equal groups are one group")


def validate_kind(gid: int, kind: AttentionKind, cfg: KVCacheConfig) -> None:
    """Raise ConfigError naming the first broken condition of group ``gid``
    (UnsupportedByProfileError for a Mamba checkpoint field the release lacks:
    :func:`validate_prefill_checkpoints`).

    raises: ConfigError, UnsupportedByProfileError
    post: kind.block_size >= 1 and (not isinstance(kind, SlidingWindow | KpoolTail) or kind.window >= 1)
    post: not isinstance(kind, ChunkedLocal) or kind.chunk >= 1
    post: not isinstance(kind, SinkFullAttention) or (kind.sink_len >= 1 and kind.sink_len % kind.block_size == 0)
    post: not isinstance(kind, Mamba) or (kind.mode in ("none", "all", "align") and kind.num_speculative_blocks >= 0)
    post: not (isinstance(kind, Mamba) and cfg.enable_caching and cfg.profile.mamba_caching_needs_align) or kind.mode == "align"
    post: not isinstance(kind, CrossAttention) or not cfg.enable_caching
    post: not isinstance(kind, ChunkedLocal) or not cfg.enable_caching or gid not in cfg.eagle_group_ids()
    post: not isinstance(kind, CircularBuffer) or cfg.profile.circular_buffer_kind
    post: not isinstance(kind, KpoolTail) or cfg.profile.kpool_tail_kind
    """  # noqa: E501 - a PEP 316 condition is one line
    where = f"group {gid} ({type(kind).__name__})"
    if not isinstance(kind, AttentionKind):
        raise ConfigError(f"{where}: not an attention kind of kvspec.config (FullAttention, SlidingWindow, ...)")
    if kind.block_size < 1:
        raise ConfigError(f"{where}: block_size must be positive, got {kind.block_size}")
    if isinstance(kind, RING_KINDS):
        validate_ring_kind(where, kind, cfg.profile)
    if isinstance(kind, SlidingWindow | KpoolTail) and kind.window < 1:
        raise ConfigError(f"{where}: window must be positive, got {kind.window}")
    if isinstance(kind, SlidingWindow) and (
        not isinstance(kind.extra_retained_tokens, int) or isinstance(kind.extra_retained_tokens, bool)
        or kind.extra_retained_tokens < 0
    ):  # fmt: skip
        extra = kind.extra_retained_tokens
        raise ConfigError(f"{where}: extra_retained_tokens must be a non-negative int, got {extra!r}")
    if isinstance(kind, ChunkedLocal):
        if kind.chunk < 1:
            raise ConfigError(f"{where}: chunk must be positive, got {kind.chunk}")
        if cfg.enable_caching and gid in cfg.eagle_group_ids():
            raise ConfigError(f"{where}: EAGLE is not supported with chunked local attention")
        if cfg.enable_caching and kind.block_size * cp_scale(kind, cfg) != cfg.scheduler_block_size:
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
        validate_prefill_checkpoints(where, kind, cfg.profile)
    if isinstance(kind, CrossAttention) and cfg.enable_caching:
        raise ConfigError(f"{where}: cross attention requires enable_caching=False")


def validate_prefill_checkpoints(where: str, kind: Mamba, profile: SemanticsProfile) -> None:
    """A Mamba group's checkpoint fields: ``num_prefill_checkpoint_blocks``
    a non-negative int, from vLLM 0.29.0 on (profile switch
    ``prefill_checkpoints``); ``prefill_checkpoint_alignment`` None or a
    positive int, from 0.30.0 on (where the switch is past "block-aligned").
    The default values are accepted everywhere.

    Raises:
        ConfigError: A count that is not a non-negative int, an alignment
            that is not None or a positive int.
        UnsupportedByProfileError: A field the release does not have.

    raises: ConfigError, UnsupportedByProfileError
    post: isinstance(kind.num_prefill_checkpoint_blocks, int) and kind.num_prefill_checkpoint_blocks >= 0
    post: kind.prefill_checkpoint_alignment is None or kind.prefill_checkpoint_alignment >= 1
    post: profile.prefill_checkpoints != "none" or kind.num_prefill_checkpoint_blocks == 0
    post: profile.prefill_checkpoints not in ("none", "block-aligned") or kind.prefill_checkpoint_alignment is None
    """
    ncp, alignment = kind.num_prefill_checkpoint_blocks, kind.prefill_checkpoint_alignment
    if not isinstance(ncp, int) or isinstance(ncp, bool) or ncp < 0:
        raise ConfigError(f"{where}: num_prefill_checkpoint_blocks must be a non-negative int, got {ncp!r}")
    if alignment is not None and (not isinstance(alignment, int) or isinstance(alignment, bool) or alignment < 1):
        raise ConfigError(
            f"{where}: prefill_checkpoint_alignment must be None or a positive int, got {alignment!r} (vLLM "
            "accepts it and then fails an assertion in allocate_slots)"
        )
    if ncp and profile.prefill_checkpoints == "none":
        raise UnsupportedByProfileError(
            f"{where}: {profile.name} has no Mamba prefill checkpoints (num_prefill_checkpoint_blocks={ncp}); "
            "they are new in vllm-0.29.0"
        )
    if alignment is not None and profile.prefill_checkpoints in ("none", "block-aligned"):
        raise UnsupportedByProfileError(
            f"{where}: {profile.name} has no prefill_checkpoint_alignment (got {alignment}); it is new in vllm-0.30.0"
        )


def validate_ring_kind(where: str, kind: CircularBuffer | KpoolTail, profile: SemanticsProfile) -> None:
    """A ring kind needs a release that has it: ``CircularBuffer`` from vLLM
    0.29.0, ``KpoolTail`` in 0.30.0 and 0.31.0 only (profile switches
    ``circular_buffer_kind`` and ``kpool_tail_kind``).

    raises: ConfigError
    post: not isinstance(kind, CircularBuffer) or profile.circular_buffer_kind
    post: not isinstance(kind, KpoolTail) or profile.kpool_tail_kind
    """
    if isinstance(kind, CircularBuffer) and not profile.circular_buffer_kind:
        raise ConfigError(f"{where}: CircularBufferSpec is new in vLLM 0.29.0; not in {profile.name}")
    if isinstance(kind, KpoolTail) and not profile.kpool_tail_kind:
        raise ConfigError(f"{where}: KpoolTailSpec exists in vLLM 0.30.0 and 0.31.0 only, not in {profile.name}")


def scheduler_block_size_of(kinds: Sequence[AttentionKind]) -> int:
    """The scheduler block of groups of these manager kinds: the LCM of their
    block sizes (:attr:`KVCacheConfig.scheduler_block_size`; a draw that has
    the kinds before the configuration exists computes it here too).

    pre: len(kinds) >= 1
    post: all(__return__ % k.block_size == 0 for k in kinds)
    post: all(any(m % k.block_size for k in kinds) for m in range(1, __return__))
    """
    return math.lcm(*(k.block_size for k in kinds))


def cp_scale(kind: AttentionKind, cfg: KVCacheConfig) -> int:
    """What context parallelism multiplies ``kind``'s manager block size by:
    ``dcp_world_size`` where :func:`scales_by_dcp`, times ``pcp_world_size``
    up to vLLM 0.25.1 (profile switch ``cp_block_scaling`` ``dcp-pcp``).

    pre: cfg.dcp_world_size >= 1 and cfg.pcp_world_size >= 1
    post: __return__ >= 1
    post: cfg.profile.cp_block_scaling != "dcp-pcp" or __return__ == cfg.dcp_world_size * cfg.pcp_world_size
    post: cfg.profile.cp_block_scaling == "dcp-pcp" or __return__ == (cfg.dcp_world_size if scales_by_dcp(kind, cfg.profile) else 1)
    """  # noqa: E501 - a PEP 316 condition is one line
    if cfg.profile.cp_block_scaling == "dcp-pcp":
        return cfg.dcp_world_size * cfg.pcp_world_size
    return cfg.dcp_world_size if scales_by_dcp(kind, cfg.profile) else 1


def scales_by_dcp(kind: AttentionKind, profile: SemanticsProfile) -> bool:
    """Whether ``kind``'s manager block size is multiplied by the DCP size
    (profile switch ``cp_block_scaling``): every kind up to vLLM 0.25.1; from
    0.26.0 to 0.28.0 every kind but Mamba (``MambaManager`` undoes the
    scaling); in 0.29.0 and 0.30.0 only the full-attention-type kinds
    (``dcp_world_size_for_kv_cache_spec``); from 0.31.0 the ``dcp_sharded``
    specs, every attention kind but Mamba.

    post: profile.cp_block_scaling != "dcp-pcp" or __return__
    post: profile.cp_block_scaling != "dcp-full-attention" or __return__ == isinstance(kind, FULL_TYPE_KINDS)
    post: profile.cp_block_scaling not in ("dcp", "dcp-sharded") or __return__ == (not isinstance(kind, Mamba))
    post: __return__ or isinstance(kind, Mamba) or profile.cp_block_scaling == "dcp-full-attention"
    """
    rule = profile.cp_block_scaling
    if rule == "dcp-pcp":
        return True
    if rule == "dcp-full-attention":
        return isinstance(kind, FULL_TYPE_KINDS)
    return not isinstance(kind, Mamba)


def cp_lookup_refusal(kind: AttentionKind, cfg: KVCacheConfig) -> str | None:
    """Why a prefix-cache lookup of ``kind``'s single group refuses context
    parallelism, or None: sliding window, chunked local and Mamba lookups
    assert that the DCP and PCP sizes they get are 1 (vLLM: ``assert
    dcp_world_size == 1, "DCP not support sliding window attn now."`` and
    the like). Up to vLLM 0.28.0 the coordinator passes the process DCP size;
    from 0.29.0 the size the group's manager got (1 where
    :func:`scales_by_dcp` is false).

    post: __return__ is None or isinstance(kind, SlidingWindow | ChunkedLocal | Mamba)
    post: __return__ is None or cfg.dcp_world_size > 1 or cfg.pcp_world_size > 1
    post: not isinstance(kind, SlidingWindow | ChunkedLocal | Mamba) or cfg.pcp_world_size == 1 or __return__ is not None
    post: not isinstance(kind, SlidingWindow | ChunkedLocal | Mamba) or cfg.pcp_world_size > 1 or cfg.dcp_world_size == 1 or (__return__ is None) == (cfg.profile.cp_block_scaling in ("dcp-full-attention", "dcp-sharded") and not scales_by_dcp(kind, cfg.profile))
    """  # noqa: E501 - a PEP 316 condition is one line
    if not isinstance(kind, SlidingWindow | ChunkedLocal | Mamba):
        return None
    name = {SlidingWindow: "sliding window attn", ChunkedLocal: "chunked local attn", Mamba: "mamba"}[type(kind)]
    process_dcp = cfg.profile.cp_block_scaling in ("dcp-pcp", "dcp")
    dcp = cfg.dcp_world_size if process_dcp or scales_by_dcp(kind, cfg.profile) else 1
    if dcp > 1:
        return f"DCP not support {name} now (dcp_world_size={dcp}, {cfg.profile.name})"
    if cfg.pcp_world_size > 1:
        return f"PCP not support {name} now (pcp_world_size={cfg.pcp_world_size}, {cfg.profile.name})"
    return None


def validate_cp(cfg: KVCacheConfig) -> None:
    """What vLLM asserts under context parallelism when it builds the
    managers: a SinkFull group's ``sink_len`` is a multiple of its scaled
    block size (``SinkFullAttentionManager``); up to vLLM 0.25.1 several
    groups with prefix caching are refused (``HybridKVCacheCoordinator``:
    "DCP not support hybrid attn now").

    Raises:
        ConfigError: Naming the broken condition and the sizes.

    raises: ConfigError
    post: all(k.sink_len % k.block_size == 0 for k in cfg.manager_groups() if isinstance(k, SinkFullAttention)) or cfg.dcp_world_size * cfg.pcp_world_size == 1
    post: cfg.dcp_world_size * cfg.pcp_world_size == 1 or len(cfg.groups) == 1 or not cfg.enable_caching or cfg.profile.cp_block_scaling != "dcp-pcp"
    """  # noqa: E501 - a PEP 316 condition is one line
    if cfg.dcp_world_size * cfg.pcp_world_size == 1:
        return
    for gid, kind in enumerate(cfg.manager_groups()):
        if isinstance(kind, SinkFullAttention) and kind.sink_len % kind.block_size:
            raise ConfigError(
                f"group {gid}: sink_len {kind.sink_len} must be a multiple of the context-parallel manager "
                f"block size {kind.block_size}"
            )
    if len(cfg.groups) > 1 and cfg.enable_caching and cfg.profile.cp_block_scaling == "dcp-pcp":
        raise ConfigError(
            f"{cfg.profile.name}: several KV-cache groups with prefix caching refuse context parallelism "
            f"(dcp_world_size={cfg.dcp_world_size}, pcp_world_size={cfg.pcp_world_size}: the hybrid "
            "coordinator supports neither)"
        )


def validate_sink_room(cfg: KVCacheConfig) -> None:
    """The pool must hold every SinkFull group's sink blocks, which the
    managers take for good when they are built (where the profile reserves
    them, ``sink_blocks_reserved``): vLLM's ``SinkFullAttentionManager``
    pops them off the free queue, and ``popleft_n`` asserts when fewer are
    free, so the engine cannot start.

    Raises:
        ConfigError: Naming the sink blocks needed and the blocks there are.

    raises: ConfigError
    post: not cfg.profile.sink_blocks_reserved or sum(k.sink_len // k.block_size for k in cfg.manager_groups() if isinstance(k, SinkFullAttention)) < cfg.num_blocks
    """  # noqa: E501 - a PEP 316 condition is one line
    if not cfg.profile.sink_blocks_reserved:
        return
    need = sum(k.sink_len // k.block_size for k in cfg.manager_groups() if isinstance(k, SinkFullAttention))
    if need > cfg.num_blocks - 1:
        raise ConfigError(
            f"the SinkFull groups take {need} blocks for good when the managers are built, but the pool has "
            f"{cfg.num_blocks - 1} besides the null block (num_blocks={cfg.num_blocks})"
        )


def validate_unitary_hash_block(cfg: KVCacheConfig) -> None:
    """With prefix caching, one group's hash block must be its manager block,
    in every release (vLLM's ``UnitaryKVCacheCoordinator`` asserts
    ``hash_block_size == block_size``; a finer hash block needs two groups).

    Raises:
        ConfigError: Naming both sizes (and the context-parallel factor).

    raises: ConfigError
    post: not cfg.enable_caching or len(cfg.groups) != 1 or cfg.resolved_hash_block_size() == cfg.manager_groups()[0].block_size
    """  # noqa: E501 - a PEP 316 condition is one line
    if not cfg.enable_caching or len(cfg.groups) != 1:
        return
    bs, hbs = cfg.manager_groups()[0].block_size, cfg.resolved_hash_block_size()
    if hbs == bs:
        return
    factor = bs // cfg.groups[0].block_size
    which = f"context-parallel manager block size {bs} (block_size {cfg.groups[0].block_size} x {factor})"
    raise ConfigError(
        f"hash_block_size {hbs} must equal the {which if factor > 1 else f'block size {bs}'} for one group with caching"
    )
