"""kvspec configurations from vLLM's own objects and names.

:func:`config_from_vllm` takes what a vLLM engine passes to its
``KVCacheManager`` -- the ``vllm.v1.kv_cache_interface.KVCacheConfig`` with
its ``KVCacheGroupSpec`` groups, and the manager's keyword arguments under
their vLLM names -- and returns the :class:`kvspec.config.KVCacheConfig` that
behaves like it under that release's semantics profile::

    config = config_from_vllm(kv_cache_config, release="0.33.0",
                              max_model_len=4096, scheduler_block_size=16,
                              hash_block_size=16, enable_caching=True)

The names are the release's: the translation tables are the vLLM adapter's
API eras (:mod:`kvref.adapters.vllm.eras`), read backwards, so a renamed
keyword (``max_num_batched_tokens`` became ``max_in_flight_tokens`` in
0.26.0) is accepted under the name that release uses. vLLM itself need not be
installed: objects are recognised by their class names and read by attribute,
so a fork's objects with the same names work too.

NOTE: **Nothing is dropped silently.** A value kvspec cannot express raises
:class:`kvspec.errors.ConfigError` naming it, instead of becoming a config
that behaves otherwise: a spec class with no kvspec kind, a field of a vLLM
dataclass that the manager reads and kvspec does not model, set to other than
its default (e.g. ``MambaSpec``'s shared-prefix checkpoint; under context
parallelism a ``dcp_sharded`` other than the spec class's), a keyword the
release's manager does not take, or a ``scheduler_block_size`` other than the
one kvspec derives. Fields that only size pages or choose kernels (head
counts and sizes, dtypes, state shapes, padding, quantisation) are ignored:
the manager's bookkeeping never reads them. Two groups whose vLLM specs differ
only in such fields would be looked up separately by vLLM's hybrid
coordinator (it groups by spec equality) but jointly by kvspec (it groups by
kind equality), so that case is refused too.

:func:`status_from_vllm` maps a vLLM ``RequestStatus`` (member or name) to
kvspec's status of the same name.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any, Final

from kvref.adapters.vllm.eras import VllmApi, era_for
from kvref.adapters.vllm.errors import VllmUnavailable
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
from kvspec.errors import ConfigError
from kvspec.profiles import PROFILES, SemanticsProfile
from kvspec.request import RequestStatus

__all__ = ["config_from_vllm", "kind_from_vllm_spec", "status_from_vllm"]

_KINDS: Final[dict[str, type]] = {
    c.__name__: c
    for c in (
        FullAttention, MLA, SinkFullAttention, SlidingWindow, ChunkedLocal, Mamba, CrossAttention, CircularBuffer,
        KpoolTail,
    )
}  # fmt: skip

LAYOUT_FIELDS: Final = frozenset(
    {
        # Page sizing, kernels and placement: never read by the bookkeeping.
        "num_kv_heads",
        "head_size",
        "head_size_v",
        "dtype",
        "dtypes",
        "shapes",
        "kv_quant_mode",
        "page_size_padded",
        "indexes_kv_by_block_stride",
        "cache_dtype_str",
        "alignment",
        "model_version",
        "mamba_type",
        "block_stride_alignment",
        "is_draft",
        "num_head_slots",
        "state_content_bytes",
        "max_tp_shards",
        "tp_replicated",
        "num_heads",
        "tokens_per_state",
        # Read only under context parallelism (checked there: _check_cp_sharding).
        "dcp_sharded",
        # A FullAttentionSpec standing in for a windowed layer (the hybrid
        # allocator off): FullAttentionManager ignores both.
        "sliding_window",
        "attention_chunk_size",
        # KVCacheConfig and KVCacheGroupSpec fields without bookkeeping meaning.
        "layer_names",
        "kv_cache_tensors",
        "kv_cache_layout",
    }
)
"""vLLM dataclass fields ignored by the translation (see the module NOTE)."""

DEFAULT_ONLY_KEYWORDS: Final[Mapping[str, Any]] = {
    "metrics_collector": None,
    "enable_mamba_shared_prefix_checkpoint": False,
}
"""``KVCacheManager`` keywords kvspec models only at vLLM's default value
(``num_prefill_lookahead``, vLLM 0.28.0 on, and ``num_hash_lookahead_tokens``,
0.33.0 on, are modelled: config fields)."""


def kind_from_vllm_spec(spec: Any, release: str | None = None) -> AttentionKind:
    """The kvspec attention kind of one vLLM ``KVCacheSpec``.

    Args:
        spec: A ``FullAttentionSpec``, ``MLAAttentionSpec``, ``SlidingWindowSpec``,
            ``ChunkedLocalAttentionSpec``, ``MambaSpec``, ``CrossAttentionSpec``
            or ``SinkFullAttentionSpec`` (recognised by exact class name).
        release: The vLLM release whose field names apply (default: the
            installed vLLM's).

    Raises:
        ConfigError: For another class, or a bookkeeping field kvspec does not
            model set to other than its default.
    """
    era = _era(release)
    return _kind(era, spec, "spec")


def config_from_vllm(
    kv_cache_config: Any,
    /,
    *,
    release: str | None = None,
    hash_function: str = "sha256_cbor",
    hash_seed: str = "0",
    int_block_hashes: bool = True,
    **manager_kwargs: Any,
) -> KVCacheConfig:
    """The kvspec configuration of ``KVCacheManager(kv_cache_config, **manager_kwargs)``.

    Args:
        kv_cache_config: vLLM's ``KVCacheConfig`` (``num_blocks``,
            ``kv_cache_groups``; each group's ``kv_cache_spec`` and
            ``is_eagle_group``).
        release: The vLLM release (default: the installed ``vllm.__version__``);
            it selects the keyword names and the semantics profile
            ``vllm-<release>``.
        hash_function: vLLM's prefix-caching hash name (``--prefix-caching-hash-algo``).
        hash_seed: The ``PYTHONHASHSEED`` the engine ran with.
        int_block_hashes: Events carry 64-bit ints (vLLM's default) or bytes.
        **manager_kwargs: The manager's keyword arguments, under the release's
            names (``max_model_len``, ``scheduler_block_size``,
            ``hash_block_size``, ``enable_caching``, ...).

    Raises:
        ConfigError: Naming the first value kvspec cannot express (see the
            module NOTE), a missing required keyword, or a release without a
            semantics profile.
    """
    era = _era(release)
    profile = _profile(era.version)
    names = _keyword_names(era.api)
    values: dict[str, Any] = {}
    for keyword, value in manager_kwargs.items():
        if keyword in names:
            values[names[keyword]] = value
        elif keyword in DEFAULT_ONLY_KEYWORDS:
            if value != DEFAULT_ONLY_KEYWORDS[keyword]:
                raise ConfigError(
                    f"KVCacheManager({keyword}={value!r}): kvspec models only {keyword}="
                    f"{DEFAULT_ONLY_KEYWORDS[keyword]!r}"
                )
        else:
            known = sorted([*names, *DEFAULT_ONLY_KEYWORDS])
            raise ConfigError(f"vLLM {era.version}'s KVCacheManager takes no keyword {keyword!r} (known: {known})")
    for required in ("max_model_len", "hash_block_size"):
        if required not in values:
            raise ConfigError(f"KVCacheManager needs {required}=..., which vLLM requires too")

    _check_defaults(
        kv_cache_config, "KVCacheConfig",
        allowed={"num_blocks", "kv_cache_groups", "hash_block_size", "prefix_cache_retention_interval"},
    )  # fmt: skip
    retention = _retention(era, kv_cache_config)
    config_hbs = getattr(kv_cache_config, "hash_block_size", None)
    if config_hbs is not None and config_hbs != values["hash_block_size"]:
        raise ConfigError(
            f"KVCacheConfig.hash_block_size={config_hbs} differs from KVCacheManager(hash_block_size="
            f"{values['hash_block_size']})"
        )
    groups: list[AttentionKind] = []
    eagle_groups: list[int] = []
    specs: list[Any] = []
    for g, group in enumerate(kv_cache_config.kv_cache_groups):
        where = f"kv_cache_groups[{g}]"
        _check_defaults(group, where, allowed={"kv_cache_spec", "is_eagle_group"})
        spec = group.kv_cache_spec
        kind = _kind(era, spec, f"{where}.kv_cache_spec")
        for h, (earlier, earlier_spec) in enumerate(zip(groups, specs, strict=True)):
            if earlier == kind and earlier_spec != spec:
                raise ConfigError(
                    f"{where} and kv_cache_groups[{h}] are both {kind!r} in kvspec, but their vLLM specs "
                    "differ (in page-size fields): vLLM looks them up separately, kvspec jointly"
                )
        groups.append(kind)
        specs.append(spec)
        if getattr(group, "is_eagle_group", False):
            eagle_groups.append(g)
    if not groups:
        raise ConfigError("kv_cache_config.kv_cache_groups is empty")
    if values.get("dcp_world_size", 1) * values.get("pcp_world_size", 1) != 1:
        _check_cp_sharding(specs)

    scheduler_block_size = values.pop("scheduler_block_size", None)
    config = KVCacheConfig(
        num_blocks=kv_cache_config.num_blocks,
        groups=tuple(groups),
        eagle_groups=tuple(eagle_groups),
        hash_function=hash_function,
        hash_seed=hash_seed,
        int_block_hashes=int_block_hashes,
        profile=profile,
        prefix_cache_retention_interval=retention,
        **values,
    )
    if scheduler_block_size is not None and scheduler_block_size != config.scheduler_block_size:
        raise ConfigError(
            f"scheduler_block_size={scheduler_block_size}: kvspec derives {config.scheduler_block_size} "
            "(the LCM of the group block sizes) and takes no other"
        )
    return config


def _retention(era: _Release, kv_cache_config: Any) -> int | None:
    """The retention interval the release's coordinator would read: the
    ``KVCacheConfig`` field from the 0.29 era on, before it the environment
    variable ``VLLM_PREFIX_CACHE_RETENTION_INTERVAL`` of this process (read
    when the coordinator is built).

    Raises:
        ConfigError: A variable that is not an int.
    """
    if era.api.retention_field:
        value = getattr(kv_cache_config, "prefix_cache_retention_interval", None)
        return None if value is None else int(value)
    name = era.api.env.retention_interval
    raw = None if name is None else os.environ.get(name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an int") from None


def _check_cp_sharding(specs: list[Any]) -> None:
    """Under context parallelism kvspec scales groups by the release's rule
    (``kvspec.config.scales_by_dcp``), which follows each spec class's
    default ``dcp_sharded``; refuse a spec that sets another value."""
    for g, spec in enumerate(specs):
        if not dataclasses.is_dataclass(spec):
            continue
        for f in dataclasses.fields(spec):
            if f.name == "dcp_sharded" and getattr(spec, f.name) != f.default:
                raise ConfigError(
                    f"kv_cache_groups[{g}].kv_cache_spec: dcp_sharded={getattr(spec, f.name)!r} is not modelled "
                    f"(kvspec follows {type(spec).__name__}'s default, {f.default!r})"
                )


def status_from_vllm(status: Any) -> RequestStatus:
    """kvspec's status of the same name as vLLM's ``RequestStatus`` member (or name).

    Raises:
        ConfigError: For a name kvspec does not know.
    """
    name = status if isinstance(status, str) else getattr(status, "name", None)
    if not isinstance(name, str) or name not in RequestStatus.__members__:
        raise ConfigError(f"unknown vLLM request status {status!r}; known: {', '.join(RequestStatus.__members__)}")
    return RequestStatus[name]


# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Release:
    """A release and its API era's translation tables."""

    version: str
    api: type[VllmApi]


def _era(release: str | None) -> _Release:
    if release is None:
        try:
            import vllm  # noqa: PLC0415 - optional: only to learn the installed release
        except ImportError as exc:
            raise ConfigError("no vLLM is installed: pass release='X.Y.Z' to name the release") from exc
        release = str(vllm.__version__)
    try:
        return _Release(release, era_for(release))
    except VllmUnavailable as exc:
        raise ConfigError(str(exc)) from exc


def _profile(release: str | None) -> SemanticsProfile:
    name = f"vllm-{release}"
    if name not in PROFILES:
        raise ConfigError(f"no semantics profile for vLLM {release}; profiles: {', '.join(PROFILES)}")
    return PROFILES[name]


def _keyword_names(api: type[VllmApi]) -> dict[str, str]:
    """The release's ``KVCacheManager`` keyword -> kvspec config field."""
    return {keyword: name for name, keyword in api.manager_args.items() if keyword is not None}


def _kind(era: _Release, spec: Any, where: str) -> AttentionKind:
    cls_name = type(spec).__name__
    by_class = {vllm_name: kind_name for kind_name, vllm_name in era.api.spec_classes.items()}
    if cls_name not in by_class:
        raise ConfigError(
            f"{where}: vLLM's {cls_name} has no kvspec kind (kinds: {', '.join(sorted(by_class))})"
        )
    kind_cls = _KINDS[by_class[cls_name]]
    read: dict[str, Any] = {}
    # a kind field newer than the release (SlidingWindow.extra_retained_tokens before 0.28.0) keeps its default
    fields = [f.name for f in dataclasses.fields(kind_cls) if f.name in era.api.spec_fields]
    for name in fields:
        vllm_field = era.api.spec_fields[name]
        if not hasattr(spec, vllm_field):
            raise ConfigError(f"{where}: {cls_name} has no field {vllm_field!r} (vLLM {era.version})")
        read[name] = getattr(spec, vllm_field)
    mapped = {era.api.spec_fields[name] for name in fields}
    _check_defaults(spec, f"{where} ({cls_name})", allowed=mapped)
    kind: AttentionKind = kind_cls(**read)
    return kind


def _zeroing_follows_mamba(obj: Any, where: str) -> None:
    """vLLM 0.34.0's ``KVCacheConfig.needs_kv_cache_zeroing`` (derived, not
    given): kvspec zeroes exactly for Mamba layers, not for a mixed-precision
    KV cache."""
    if bool(obj.needs_kv_cache_zeroing) != bool(getattr(obj, "has_mamba_layers", False)):
        raise ConfigError(
            f"{where}: needs_kv_cache_zeroing={obj.needs_kv_cache_zeroing!r} without Mamba layers "
            "(a mixed-precision KV cache) is not modelled by kvspec"
        )


DERIVED_FIELDS: Final[Mapping[str, Callable[[Any, str], None]]] = {
    "needs_kv_cache_zeroing": _zeroing_follows_mamba,
}
"""vLLM dataclass fields derived from the others (``init=False``): each is
checked against what kvspec models instead of against a default."""


def _check_defaults(obj: Any, where: str, allowed: set[str]) -> None:
    """Refuse a dataclass field outside ``allowed`` and the layout fields that differs from its default."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return
    for f in dataclasses.fields(obj):
        if f.name in allowed or f.name in LAYOUT_FIELDS:
            continue
        if f.name in DERIVED_FIELDS:
            DERIVED_FIELDS[f.name](obj, where)
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            raise ConfigError(f"{where}: field {f.name!r} has no default and kvspec does not model it")
        value = getattr(obj, f.name)
        if value != default:
            raise ConfigError(
                f"{where}: {f.name}={value!r} is not modelled by kvspec (only the default {default!r})"
            )
