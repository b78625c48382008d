"""Building a real vLLM ``KVCacheManager`` from a kvspec configuration.

Each kvspec attention kind becomes the vLLM ``KVCacheSpec`` of the era's
:attr:`~.eras.VllmApi.spec_classes` table, one ``KVCacheGroupSpec`` per group,
and the manager gets the era's constructor keywords.

NOTE: **SinkFull construction shim.** vLLM 0.25.1 to 0.33.0 cannot construct a
manager with a ``SinkFullAttentionSpec`` group: the factory passes keywords
that ``SinkFullAttentionManager.__init__`` does not accept (``TypeError``:
unexpected keyword ``scheduler_block_size`` in 0.25, ``needs_kv_cache_zeroing``
from 0.26 on; 0.16.0 constructs it unaided). For such configs only, and only
when the error names the era's defect, construction is retried with
``SinkFullAttentionManager.__init__`` temporarily replaced by
:func:`_sinkfull_init`; the original is restored right after, so every later
operation runs unmodified vLLM code, and the adapter records
:data:`SINKFULL_WORKAROUND`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from kvspec.config import (
    AttentionKind,
    ChunkedLocal,
    KpoolTail,
    KVCacheConfig,
    Mamba,
    SinkFullAttention,
    SlidingWindow,
)

from .eras import VllmApi

SINKFULL_WORKAROUND: Final = "sinkfull-ctor"
"""The adapter's ``construction_workaround`` when the SinkFull shim was used."""

# Head settings shared by every attention spec: they only influence page sizes,
# never the bookkeeping, and being equal they keep "equal kinds -> equal specs".
_NUM_KV_HEADS: Final = 1
_HEAD_SIZE: Final = 8
_MAMBA_SHAPES: Final = ((2, 4),)


def build_manager(api: VllmApi, config: KVCacheConfig, hash_block_size: int) -> tuple[Any, str | None]:
    """A fresh vLLM ``KVCacheManager`` for ``config``.

    Returns:
        The manager and the construction workaround used (None, or
        :data:`SINKFULL_WORKAROUND`).

    Raises:
        Unsupported: If ``config`` needs a parameter the release lacks.
        ConfigError: If the release cannot construct ``config``.
    """
    api.check_config(config)
    groups = [
        api.group_spec(f"layer.{i}", make_attention_spec(api, kind), i in config.eagle_groups)
        for i, kind in enumerate(config.groups)
    ]
    retention = config.prefix_cache_retention_interval
    kv_cache_config = api.kv_cache_config(config.num_blocks, groups, retention)
    kwargs = api.manager_kwargs(config, hash_block_size)
    api.apply_retention(retention)  # read when the coordinator is built (up to the 0.28 era)
    defect = api.sinkfull_ctor_defect
    try:
        return api.new_manager(kv_cache_config, kwargs), None
    except TypeError as exc:
        has_sink = any(isinstance(k, SinkFullAttention) for k in config.groups)
        if not (has_sink and defect is not None and defect in str(exc)):
            raise
    # The release's SinkFullAttentionManager.__init__ signature defect: patch the
    # constructor for this one construction only, then restore it.
    sink_cls = api.sinkfull_manager_class()
    original = sink_cls.__dict__["__init__"]
    sink_cls.__init__ = _sinkfull_init(api, sink_cls)
    try:
        manager = api.new_manager(kv_cache_config, kwargs)
    finally:
        sink_cls.__init__ = original
    return manager, SINKFULL_WORKAROUND


def make_attention_spec(api: VllmApi, kind: AttentionKind) -> Any:
    """The vLLM ``KVCacheSpec`` of one kvspec attention kind."""
    if type(kind).__name__ not in api.spec_classes:
        raise TypeError(f"unknown attention kind {kind!r}")
    fp16 = api.torch.float16
    if isinstance(kind, Mamba):
        fields: dict[str, Any] = {
            "block_size": kind.block_size,
            "shapes": _MAMBA_SHAPES,
            "dtypes": (fp16,),
            "mode": kind.mode,
            "num_speculative_blocks": kind.num_speculative_blocks,
        }
        # the prefill checkpoint fields (vLLM 0.29.0 and 0.30.0 on), sent only when set
        for name in ("num_prefill_checkpoint_blocks", "prefill_checkpoint_alignment"):
            value = getattr(kind, name)
            if value in (0, None):
                continue
            if name not in api.spec_fields:
                raise api.unsupported(f"MambaSpec.{name}", "the config sets it")
            fields[name] = value
        return api.attention_spec(kind, fields)
    fields = {"block_size": kind.block_size, "num_kv_heads": _NUM_KV_HEADS, "head_size": _HEAD_SIZE, "dtype": fp16}
    if isinstance(kind, SlidingWindow | KpoolTail):
        fields["window"] = kind.window
    if isinstance(kind, SlidingWindow) and kind.extra_retained_tokens:
        if "extra_retained_tokens" not in api.spec_fields:
            raise api.unsupported("SlidingWindowSpec.extra_retained_tokens", "the config sets it")
        fields["extra_retained_tokens"] = kind.extra_retained_tokens
    elif isinstance(kind, ChunkedLocal):
        fields["chunk"] = kind.chunk
    elif isinstance(kind, SinkFullAttention):
        fields["sink_len"] = kind.sink_len
    return api.attention_spec(kind, fields)


def _sinkfull_init(api: VllmApi, sink_cls: Any) -> Callable[..., None]:
    """A corrected ``SinkFullAttentionManager.__init__`` (construction-time only).

    The release's own ``__init__`` lacks parameters of the base class that the
    factory passes by keyword. This replacement forwards every argument to the
    base class's ``__init__`` unchanged and then does what the release's own
    body does after its ``super().__init__`` call
    (:meth:`~.eras.VllmApi.reserve_sink_blocks`).
    """

    def __init__(self: Any, kv_cache_spec: Any, block_pool: Any, *args: Any, **kwargs: Any) -> None:
        super(sink_cls, self).__init__(kv_cache_spec, block_pool, *args, **kwargs)
        api.reserve_sink_blocks(self, kv_cache_spec)

    return __init__
