"""Every vLLM internal the adapter touches, one object per API era.

An *API era* is a run of vLLM releases whose internals the adapter reaches the
same way: the same module paths, constructor keywords, private attributes,
return shapes and environment variables. Each era is one class here; the base
class :class:`VllmApi` is the 0.25 era (the release kvspec models), and every
other era is a subclass that overrides only what its releases changed. The rest
of the package (:mod:`.adapter`, :mod:`.construct`, :mod:`.view`) reaches vLLM
only through an instance of one of these classes, so supporting another release
means adding (or amending) one era here.

NOTE: An era describes how to *drive* a release, never how it behaves: where a
release lacks a method or parameter, its era raises :class:`.Unsupported`
naming the release and the method instead of emulating it. Behaviour
differences between releases belong to the spec's semantics profiles.

NOTE: This module is long on purpose: it is the one place that names vLLM's
internals, so that a reader (or a fork) finds every dependency on vLLM here.

NOTE: vLLM and torch are untyped here: everything coming from them is ``Any``
and stays inside this package.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Final

from kvspec.config import AttentionKind, KVCacheConfig, Mamba
from kvspec.errors import ConfigError

from .errors import CannotRead, Unsupported, VllmUnavailable

Version = tuple[int, int, int]

OLDEST: Final[Version] = (0, 16, 0)
"""The oldest release the adapter drives. A release newer than every era's
verified ones is driven by the newest era (:func:`era_for`); where an
internal it reads has changed, the adapter says which one (:class:`CannotRead`)."""


def parse_version(text: str) -> Version | None:
    """``"0.25.1"`` (or ``"0.25.1.dev3+g1234"``) -> ``(0, 25, 1)``; None if unparsable."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def era_for(version: str) -> type[VllmApi]:
    """The era class that drives vLLM ``version``.

    The newest era whose first release is not after ``version`` (for a
    release newer than every verified one, the newest era).

    Raises:
        VllmUnavailable: If ``version`` is unparsable or older than :data:`OLDEST`.
    """
    parsed = parse_version(version)
    if parsed is None or parsed < OLDEST:
        raise VllmUnavailable(f"vLLM {version} is not a release the adapter drives ({_dotted(OLDEST)} or newer)")
    candidates = [e for e in ERAS if e.since <= parsed]
    if not candidates:
        raise VllmUnavailable(f"vLLM {version} predates every API era ({', '.join(e.era for e in ERAS)})")
    return max(candidates, key=lambda e: e.since)


def load_api(version: str) -> VllmApi:
    """Import the modules of ``version``'s era and bind them to an era object.

    Args:
        version: The ``__version__`` of the imported ``vllm``.

    Raises:
        VllmUnavailable: If the release is not driven or a module fails to import.
    """
    era = era_for(version)
    loaded: dict[str, Any] = {}
    for key, path in era.modules.items():
        try:
            loaded[key] = importlib.import_module(path)
        except Exception as exc:  # ImportError, or anything torch/vLLM raise on import
            raise VllmUnavailable(f"vLLM {version}: importing {path} failed: {exc!r}") from exc
    return era(version, loaded)


@dataclass(frozen=True, slots=True)
class EnvNames:
    """The process environment variables an era's vLLM reads.

    Attributes:
        int_block_hashes: Events carry 64-bit ints ("1") or bytes ("0").
        hash_seed: The string ``NONE_HASH`` is derived from.
        retention_interval: Prefix-cache retention interval; None where the
            release reads no such variable.
        logging_level: vLLM's log level (set to ERROR unless the user set it).
    """

    int_block_hashes: str
    hash_seed: str
    retention_interval: str | None
    logging_level: str


def quiet_logs(variable: str) -> Callable[[str], None]:
    """Set the engine's log-level ``variable`` to ERROR unless the user set it,
    before the import; the returned function, called after it with the
    engine's package name, also sets that package's logger to ERROR then.

    NOTE: vLLM 0.33.0 configures its loggers only when an engine starts, so
    a manager used alone logs through Python's last-resort handler, which
    ignores ``VLLM_LOGGING_LEVEL``: each refused ``reset_prefix_cache``
    printed a warning (32 lines in a 30-second ``kvref check``). The
    package logger's own level stops them; a user who set the variable
    keeps every message.
    """
    ours = variable not in os.environ
    os.environ.setdefault(variable, "ERROR")

    def after_import(package: str) -> None:
        if ours:
            logging.getLogger(package).setLevel(logging.ERROR)

    return after_import


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


def _dotted(version: Version) -> str:
    return ".".join(str(x) for x in version)


# --------------------------------------------------------------------------
# The 0.25 era (the base of every era)
# --------------------------------------------------------------------------


class VllmApi:
    """vLLM internals as of the 0.25 era (vLLM 0.25.x), the base of every era.

    Class attributes are the era's tables (names only); methods reach the
    bound modules. A subclass overrides a table entry or a method where its
    releases differ.

    Attributes:
        version: The installed vLLM version.
    """

    era: ClassVar[str] = "0.25"
    since: ClassVar[Version] = (0, 25, 0)
    verified: ClassVar[tuple[str, ...]] = ("0.25.0", "0.25.1")
    """Releases this era was run against."""

    modules: ClassVar[Mapping[str, str]] = _frozen(
        {
            "torch": "torch",
            "kci": "vllm.v1.kv_cache_interface",
            "kcm": "vllm.v1.core.kv_cache_manager",
            "ku": "vllm.v1.core.kv_cache_utils",
            "stm": "vllm.v1.core.single_type_kv_cache_manager",
            "hashing": "vllm.utils.hashing",
            "request": "vllm.v1.request",
            "sampling": "vllm.sampling_params",
            "lora": "vllm.lora.request",
            "mm": "vllm.multimodal.inputs",
            "events": "vllm.distributed.kv_events",
        }
    )
    """Short name -> module path of every vLLM (and torch) module used."""

    env: ClassVar[EnvNames] = EnvNames(
        int_block_hashes="VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES",
        hash_seed="PYTHONHASHSEED",
        retention_interval="VLLM_PREFIX_CACHE_RETENTION_INTERVAL",
        logging_level="VLLM_LOGGING_LEVEL",
    )

    manager_args: ClassVar[Mapping[str, str | None]] = _frozen(
        {
            "max_model_len": "max_model_len",
            "scheduler_block_size": "scheduler_block_size",
            "hash_block_size": "hash_block_size",
            "max_num_batched_tokens": "max_num_batched_tokens",
            "enable_caching": "enable_caching",
            "use_eagle": "use_eagle",
            "log_stats": "log_stats",
            "enable_kv_cache_events": "enable_kv_cache_events",
            "watermark": "watermark",
            "dcp_world_size": "dcp_world_size",
            "pcp_world_size": "pcp_world_size",
            "num_prefill_lookahead": None,
            "num_hash_lookahead_tokens": None,
        }
    )
    """kvref config value -> ``KVCacheManager(kv_cache_config, **kw)`` keyword
    (None: the release has no such parameter; see :attr:`manager_arg_defaults`)."""

    manager_arg_defaults: ClassVar[Mapping[str, Any]] = _frozen(
        {"max_num_batched_tokens": None, "watermark": 0.0, "num_prefill_lookahead": 0, "num_hash_lookahead_tokens": 0}
    )
    """The value a missing ``KVCacheManager`` parameter tolerates. A missing
    ``scheduler_block_size`` is always tolerated: it is derived from the
    groups, never chosen."""

    allocate_args: ClassVar[Mapping[str, Any]] = _frozen(
        {
            "num_new_computed_tokens": 0,
            "new_computed_blocks": None,
            "num_lookahead_tokens": 0,
            "num_external_computed_tokens": 0,
            "delay_cache_blocks": False,
            "num_encoder_tokens": 0,
            "full_sequence_must_fit": False,
            "reserved_blocks": 0,
            "has_scheduled_reqs": True,
        }
    )
    """The keywords ``allocate_slots(request, num_new_tokens, ...)`` accepts, with
    the value that means "not used" (a release lacking one accepts only that)."""

    missing_methods: ClassVar[frozenset[str]] = frozenset(
        {"estimate_cached_tokens", "record_blocks_for_zeroing", "get_zeroing_block_ids_in_range"}
    )
    """``KVCacheManager`` facade methods the release does not have."""

    spec_classes: ClassVar[Mapping[str, str]] = _frozen(
        {
            "FullAttention": "FullAttentionSpec",
            "MLA": "MLAAttentionSpec",
            "SlidingWindow": "SlidingWindowSpec",
            "ChunkedLocal": "ChunkedLocalAttentionSpec",
            "Mamba": "MambaSpec",
            "CrossAttention": "CrossAttentionSpec",
            "SinkFullAttention": "SinkFullAttentionSpec",
        }
    )
    """kvspec attention kind -> ``vllm.v1.kv_cache_interface`` spec class."""

    spec_fields: ClassVar[Mapping[str, str]] = _frozen(
        {
            "block_size": "block_size",
            "num_kv_heads": "num_kv_heads",
            "head_size": "head_size",
            "dtype": "dtype",
            "window": "sliding_window",
            "chunk": "attention_chunk_size",
            "sink_len": "sink_len",
            "shapes": "shapes",
            "dtypes": "dtypes",
            "mode": "mamba_cache_mode",
            "num_speculative_blocks": "num_speculative_blocks",
        }
    )
    """kvspec kind field (or head setting) -> spec constructor keyword."""

    group_spec_fields: ClassVar[Mapping[str, str | None]] = _frozen(
        {"layer_names": "layer_names", "kv_cache_spec": "kv_cache_spec", "is_eagle_group": "is_eagle_group"}
    )
    """``KVCacheGroupSpec`` keywords (None: the release has no such field)."""

    request_args: ClassVar[Mapping[str, Any]] = _frozen({})
    """Extra keywords the release's ``Request(...)`` requires (name -> value)."""

    block_stored_fields: ClassVar[tuple[str, ...]] = (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
        "kv_cache_spec_kind",
        "kv_cache_spec_sliding_window",
    )
    """``BlockStored`` fields the release has (kvspec's others stay None)."""

    block_removed_fields: ClassVar[tuple[str, ...]] = ("block_hashes", "medium", "group_idx")
    """``BlockRemoved`` fields the release has."""

    stats_fields: ClassVar[tuple[str, ...]] = (
        "reset",
        "requests",
        "queries",
        "hits",
        "preempted_requests",
        "preempted_queries",
        "preempted_hits",
    )
    """``PrefixCacheStats`` fields read (all of kvspec's)."""

    sinkfull_ctor_defect: ClassVar[str | None] = "scheduler_block_size"
    """Text of the ``TypeError`` with which the release's own
    ``SinkFullAttentionManager.__init__`` refuses the factory's keywords
    (None: the release constructs it unaided)."""

    sinkfull_reserves_sink_blocks: ClassVar[bool] = True
    """Whether the release's ``SinkFullAttentionManager.__init__`` pops
    ``sink_len // block_size`` blocks from the free queue into ``sink_blocks``."""

    lookup_returns_boundary: ClassVar[bool] = False
    """``get_computed_blocks`` returns ``(blocks, num_tokens, shared_prefix_boundary)``;
    the scheduler stores the boundary on the request, and so does the adapter."""

    has_block_copies: ClassVar[bool] = False
    """``take_kv_cache_block_copies()`` exists (copy-on-write of fine-grained hits)."""
    has_prefix_hint: ClassVar[bool] = True
    """The hybrid coordinator sets ``num_uncached_common_prefix_tokens`` at a
    lookup (the scheduler's prefix hint; from the 0.26 era the lookup returns
    it as ``shared_prefix_boundary``)."""

    caller_records_stats: ClassVar[bool] = False
    """The lookup no longer records prefix-cache statistics; the scheduler calls
    ``record_prefix_cache_stats(request, num_hits)`` at admission."""

    request_in_flight: ClassVar[bool] = False
    """``Request.num_in_flight_tokens`` exists (tokens of steps dispatched whose
    output is not processed yet; ``allocate_slots`` frees skipped blocks below
    the computed tokens less these, vLLM#47728)."""
    hit_length_bound: ClassVar[bool] = False
    """``get_computed_blocks(request, max_cache_hit_length)`` exists."""
    has_num_cached_tokens: ClassVar[bool] = False
    """``get_num_cached_tokens(request)`` exists."""
    has_connector_lookup: ClassVar[bool] = False
    """``get_computed_blocks_for_connector(request[, max_cache_hit_length])``
    and ``truncate_computed_blocks(blocks, num_computed_tokens)`` exist."""
    request_skip_attribute: ClassVar[str | None] = "skip_reading_prefix_cache"
    """The ``Request`` attribute the manager reads at each lookup to skip
    prefix-cache reads, which the scheduler may set (None: the release reads a
    limit fixed at construction from the sampling parameters)."""
    sampling_logprob_start: ClassVar[bool] = False
    """``SamplingParams.prompt_logprob_start`` is sent (only where the manager
    reads it: before, the start changes nothing in the KV-cache core)."""

    def __init__(self, version: str, modules: Mapping[str, Any]) -> None:
        """Bind the era to the imported modules (keys of :attr:`modules`)."""
        self.version = version
        self.torch: Any = modules["torch"]
        self.kci: Any = modules["kci"]
        self.kcm: Any = modules["kcm"]
        self.ku: Any = modules["ku"]
        self.stm: Any = modules["stm"]
        self.hashing: Any = modules["hashing"]
        self.request: Any = modules["request"]
        self.sampling: Any = modules["sampling"]
        self.lora: Any = modules["lora"]
        self.mm: Any = modules["mm"]
        self.events: Any = modules["events"]

    def unsupported(self, method: str, detail: str = "") -> Unsupported:
        """The error for ``method`` missing from this release."""
        return Unsupported(self.version, method, detail)

    # ------------------------------------------------------------ hashing

    def hash_fn(self, name: str) -> Any:
        """``vllm.utils.hashing.get_hash_fn_by_name``."""
        return self.hashing.get_hash_fn_by_name(name)

    def init_none_hash(self, hash_fn: Any) -> None:
        """``kv_cache_utils.init_none_hash`` (reads the hash-seed variable)."""
        self.ku.init_none_hash(hash_fn)

    def none_hash(self) -> Any:
        """``kv_cache_utils.NONE_HASH`` (None before the first ``init_none_hash``)."""
        return getattr(self.ku, "NONE_HASH", None)

    def request_block_hasher(self, hash_block_size: int, hash_fn: Any, lookahead: int = 0) -> Any:
        """``kv_cache_utils.get_request_block_hasher`` (with ``lookahead``
        look-ahead tokens per hash from the 0.33 era on; other eras take 0)."""
        if lookahead:
            return self.ku.get_request_block_hasher(hash_block_size, hash_fn, lookahead)
        return self.ku.get_request_block_hasher(hash_block_size, hash_fn)

    def block_key(self, block_hash: Any, group: int) -> Any:
        """``kv_cache_utils.make_block_hash_with_group_id``: the prefix-cache key."""
        return self.ku.make_block_hash_with_group_id(block_hash, group)

    # ------------------------------------------------------------ construction

    def attention_spec(self, kind: AttentionKind, fields: Mapping[str, Any]) -> Any:
        """The ``KVCacheSpec`` of ``kind`` from kvspec-named ``fields``."""
        cls = getattr(self.kci, self.spec_classes[type(kind).__name__])
        return cls(**{self.spec_fields[k]: v for k, v in fields.items()})

    def group_spec(self, layer: str, spec: Any, is_eagle_group: bool) -> Any:
        """``KVCacheGroupSpec`` of one group.

        Raises:
            Unsupported: For an EAGLE group on a release without ``is_eagle_group``.
        """
        names = self.group_spec_fields
        kwargs: dict[str, Any] = {str(names["layer_names"]): [layer], str(names["kv_cache_spec"]): spec}
        flag = names["is_eagle_group"]
        if flag is not None:
            kwargs[flag] = is_eagle_group
        elif is_eagle_group:
            raise self.unsupported("KVCacheGroupSpec.is_eagle_group", "eagle_groups cannot be flagged")
        return self.kci.KVCacheGroupSpec(**kwargs)

    def check_config(self, config: KVCacheConfig) -> None:
        """Configuration errors the release reports by failing an assertion.

        Raises:
            ConfigError: For a configuration the release cannot construct.
        """
        del config

    retention_field: ClassVar[bool] = False
    """The retention interval is a ``KVCacheConfig`` field (the 0.29 era on);
    before, the coordinator reads the environment variable
    :attr:`EnvNames.retention_interval` when it is built."""

    def kv_cache_config(self, num_blocks: int, groups: Sequence[Any], retention: int | None = None) -> Any:
        """``vllm.v1.kv_cache_interface.KVCacheConfig`` without tensors; a
        retention interval goes in its field where the era has one (else
        :meth:`apply_retention` sets the variable).

        Raises:
            Unsupported: A retention interval in a release with neither.
        """
        if retention is not None and not self.retention_field and self.env.retention_interval is None:
            raise self.unsupported("the prefix-cache retention interval", f"the config sets {retention}")
        extra = {"prefix_cache_retention_interval": retention} if self.retention_field else {}
        return self.kci.KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=list(groups), **extra
        )

    def apply_retention(self, retention: int | None) -> None:
        """Set (or, for None, unset) the retention-interval variable the
        era's coordinator reads when it is built; nothing where it reads the
        ``KVCacheConfig`` field or has no interval."""
        name = self.env.retention_interval
        if name is None:
            return
        if retention is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(retention)

    def manager_kwargs(self, config: KVCacheConfig, hash_block_size: int) -> dict[str, Any]:
        """``KVCacheManager`` keywords for ``config``.

        Raises:
            Unsupported: If ``config`` sets a value the release has no parameter for.
        """
        values: dict[str, Any] = {
            "max_model_len": config.max_model_len,
            "scheduler_block_size": config.scheduler_block_size,
            "hash_block_size": hash_block_size,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "enable_caching": config.enable_caching,
            "use_eagle": config.use_eagle,
            "log_stats": config.log_stats,
            "enable_kv_cache_events": config.enable_kv_cache_events,
            "watermark": config.watermark,
            "dcp_world_size": config.dcp_world_size,
            "pcp_world_size": config.pcp_world_size,
            "num_prefill_lookahead": config.num_prefill_lookahead,
            "num_hash_lookahead_tokens": config.num_hash_lookahead_tokens,
        }
        kwargs: dict[str, Any] = {}
        for name, value in values.items():
            keyword = self.manager_args[name]
            if keyword is not None:
                kwargs[keyword] = value
            elif name in self.manager_arg_defaults and value != self.manager_arg_defaults[name]:
                raise self.unsupported(f"KVCacheManager({name}=...)", f"the config sets {name}={value!r}")
        return kwargs

    def new_manager(self, kv_cache_config: Any, kwargs: Mapping[str, Any]) -> Any:
        """``KVCacheManager(kv_cache_config, **kwargs)``."""
        return self.kcm.KVCacheManager(kv_cache_config, **kwargs)

    def sinkfull_manager_class(self) -> Any:
        """``single_type_kv_cache_manager.SinkFullAttentionManager``."""
        return self.stm.SinkFullAttentionManager

    def reserve_sink_blocks(self, manager: Any, spec: Any) -> None:
        """The body of the release's ``SinkFullAttentionManager.__init__`` after
        the base class's: check ``sink_len``, then (if the release does) pop the
        sink blocks from the head of the free queue (ref_cnt stays 0)."""
        sink_len = spec.sink_len
        block_size = manager.block_size
        assert sink_len is not None and sink_len > 0 and sink_len % block_size == 0
        if self.sinkfull_reserves_sink_blocks:
            manager.sink_blocks = manager.block_pool.free_block_queue.popleft_n(sink_len // block_size)

    # ------------------------------------------------------------ manager internals

    def block_pool(self, manager: Any) -> Any:
        """``KVCacheManager.block_pool``."""
        return manager.block_pool

    def partial_hash_hits(self, manager: Any) -> bool:
        """``KVCacheManager.coordinator.enable_partial_hash_hits`` (0.26 era on; False before)."""
        return bool(getattr(manager.coordinator, "enable_partial_hash_hits", False))

    def single_type_managers(self, manager: Any) -> tuple[Any, ...]:
        """``KVCacheManager.coordinator.single_type_managers``, one per group."""
        return tuple(manager.coordinator.single_type_managers)

    def is_cross_attention(self, single: Any) -> bool:
        """Whether a single-type manager is a ``CrossAttentionManager``."""
        return isinstance(single, self.stm.CrossAttentionManager)

    def manager_block_size(self, single: Any) -> int:
        """``SingleTypeKVCacheManager.block_size``."""
        return int(single.block_size)

    def req_to_blocks(self, single: Any) -> Mapping[str, Sequence[Any]]:
        """``SingleTypeKVCacheManager.req_to_blocks``: request id -> its blocks."""
        result: Mapping[str, Sequence[Any]] = single.req_to_blocks
        return result

    def num_cached_block(self, single: Any) -> Mapping[str, int]:
        """``SingleTypeKVCacheManager.num_cached_block``: request id -> hashed blocks."""
        result: Mapping[str, int] = single.num_cached_block
        return result

    def pool_blocks(self, pool: Any) -> Sequence[Any]:
        """``BlockPool.blocks``: every ``KVCacheBlock``, indexed by block id."""
        result: Sequence[Any] = pool.blocks
        return result

    def free_queue(self, pool: Any) -> list[Any]:
        """``BlockPool.free_block_queue.get_all_free_blocks()``, head first."""
        result: list[Any] = pool.free_block_queue.get_all_free_blocks()
        return result

    def cached_entries(self, pool: Any) -> Iterator[tuple[Any, tuple[int, ...]]]:
        """The prefix-cache map ``BlockPool.cached_block_hash_to_block``: key ->
        block ids, duplicates in insertion order.

        The map has no public way to list its keys, so its private layout is
        read, in one of the two known forms: up to vLLM 0.33 ``_cache`` maps
        a key to one ``KVCacheBlock`` or to a dict of them; from 0.34 ``_cache``
        maps a key to one block id and ``_dup_ids`` the keys held by several
        blocks to every id.

        Raises:
            CannotRead: The map has neither form.
        """
        what = "the prefix-cache map (BlockPool.cached_block_hash_to_block)"
        table = getattr(pool.cached_block_hash_to_block, "_cache", None)
        dups = getattr(pool.cached_block_hash_to_block, "_dup_ids", None)
        if not isinstance(table, dict) or not (dups is None or isinstance(dups, dict)):
            raise CannotRead(self.version, what, "it has no dict `_cache`")
        block_cls = self.ku.KVCacheBlock
        for key, entry in table.items():
            if isinstance(entry, int) and not isinstance(entry, bool) and dups is not None:
                yield key, tuple(int(i) for i in dups[key]) if key in dups else (entry,)
            elif isinstance(entry, block_cls):
                yield key, (int(entry.block_id),)
            elif isinstance(entry, dict) and all(isinstance(b, block_cls) for b in entry.values()):
                yield key, tuple(int(b.block_id) for b in entry.values())
            else:
                raise CannotRead(self.version, what, f"an entry is a {type(entry).__name__}")

    def check_readable(self, manager: Any) -> None:
        """Read once every internal :mod:`.view` reads, on a fresh manager.

        Raises:
            CannotRead: Naming the first one this release does not have.
        """
        reads: list[tuple[str, Callable[[], object]]] = [
            ("KVCacheManager.block_pool", lambda: self.block_pool(manager)),
            ("KVCacheManager.coordinator.single_type_managers", lambda: self.single_type_managers(manager)),
            ("BlockPool.blocks", lambda: self.pool_blocks(self.block_pool(manager))[0].block_id),
            ("BlockPool.free_block_queue.get_all_free_blocks()", lambda: self.free_queue(self.block_pool(manager))),
            ("SingleTypeKVCacheManager.req_to_blocks",
             lambda: [self.req_to_blocks(m).get("") for m in self.single_type_managers(manager)]),
            ("SingleTypeKVCacheManager.num_cached_block",
             lambda: [self.num_cached_block(m).get("") for m in self.single_type_managers(manager)]),
            ("KVCacheBlock.block_hash", lambda: self.pool_blocks(self.block_pool(manager))[0].block_hash),
            ("the prefix-cache map", lambda: list(self.cached_entries(self.block_pool(manager)))),
        ]  # fmt: skip
        for what, read in reads:
            try:
                read()
            except CannotRead:
                raise
            except (AttributeError, TypeError, KeyError, IndexError) as exc:
                raise CannotRead(self.version, what, f"{type(exc).__name__}: {exc}") from exc

    def pool_usage(self, pool: Any) -> float:
        """``BlockPool.get_usage()``."""
        return float(pool.get_usage())

    def block_id(self, block: Any) -> int:
        """``KVCacheBlock.block_id``."""
        return int(block.block_id)

    def ref_cnt(self, block: Any) -> int:
        """``KVCacheBlock.ref_cnt``."""
        return int(block.ref_cnt)

    def block_hash(self, block: Any) -> Any:
        """``KVCacheBlock.block_hash``: its prefix-cache key, or None."""
        return block.block_hash

    def block_groups(self, blocks: Any) -> tuple[Any, ...]:
        """``KVCacheBlocks.blocks``: the blocks per group."""
        return tuple(blocks.blocks)

    def kv_cache_blocks(self, groups: Iterable[list[Any]]) -> Any:
        """A ``KVCacheBlocks`` of the given block lists (one per group)."""
        return self.kcm.KVCacheBlocks(tuple(groups))

    # ------------------------------------------------------------ requests

    def new_request(
        self,
        request_id: str,
        prompt_token_ids: list[int] | None,
        prompt_embeds: Any,
        lora: tuple[str, int, str] | None,
        mm_features: Sequence[tuple[str, int, int]],
        cache_salt: str | None,
        skip_reading_prefix_cache: bool,
        max_tokens: int,
        block_hasher: Any,
        prompt_logprobs: bool = False,
        prompt_logprob_start: int | None = None,
        report_mode: str = "incremental",
    ) -> Any:
        """``vllm.v1.request.Request`` hashed by ``block_hasher``.

        Args:
            request_id: The request id.
            prompt_token_ids: The prompt (None with ``prompt_embeds``).
            prompt_embeds: A tensor of prompt embeddings, or None.
            lora: ``(lora_name, lora_int_id, lora_path)`` of a LoRA adapter, or None
                (the path is part of the block hash from vLLM 0.31.0 on).
            mm_features: ``(identifier, offset, length)`` per image placeholder.
            cache_salt: The cache salt, or None.
            skip_reading_prefix_cache: The sampling parameter of that name.
            max_tokens: The sampling parameter of that name.
            block_hasher: From :meth:`request_block_hasher`.
            prompt_logprobs: Ask for one prompt logprob per row (``prompt_logprobs=1``).
            prompt_logprob_start: The sampling parameter of that name (sent
                where :attr:`sampling_logprob_start`).
            report_mode: ``kv_cache_report_mode`` of the sampling parameters'
                ``extra_args`` (sent only when "full"; read from vLLM 0.26.0 on).
        """
        lora_request = None
        if lora is not None:
            lora_request = self.lora.LoRARequest(lora_name=lora[0], lora_int_id=lora[1], lora_path=lora[2])
        features = [
            self.mm.MultiModalFeatureSpec(
                data=None,
                modality="image",
                identifier=identifier,
                mm_position=self.mm.PlaceholderRange(offset=offset, length=length),
            )
            for identifier, offset, length in mm_features
        ]
        params: dict[str, Any] = {"prompt_logprobs": 1} if prompt_logprobs else {}
        if prompt_logprob_start is not None and self.sampling_logprob_start:
            params["prompt_logprob_start"] = prompt_logprob_start
        if report_mode != "incremental":
            params["extra_args"] = {"kv_cache_report_mode": report_mode}
        sampling = self.sampling.SamplingParams(
            max_tokens=max_tokens, skip_reading_prefix_cache=skip_reading_prefix_cache, **params
        )
        return self.request.Request(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            sampling_params=sampling,
            pooling_params=None,
            prompt_embeds=prompt_embeds,
            mm_features=features or None,
            lora_request=lora_request,
            cache_salt=cache_salt,
            block_hasher=block_hasher,
            **self.request_args,
        )

    def status(self, name: str) -> Any:
        """``vllm.v1.request.RequestStatus.<name>``.

        Raises:
            Unsupported: If the release has no status of that name.
        """
        member = getattr(self.request.RequestStatus, name, None)
        if member is None:
            raise self.unsupported(f"RequestStatus.{name}", "the release has no such status")
        return member

    def append_output_token(self, vreq: Any, token: int) -> None:
        """``Request.append_output_token_ids`` (runs the block hasher)."""
        vreq.append_output_token_ids(token)

    def set_request_state(
        self,
        vreq: Any,
        num_computed_tokens: int,
        status: Any,
        num_preemptions: int,
        skip_reading_prefix_cache: bool,
        num_in_flight_tokens: int = 0,
    ) -> None:
        """Set the scheduler-owned fields of a ``Request`` (``num_in_flight_tokens``
        where the release's request has it: :attr:`request_in_flight`; before,
        nothing reads it)."""
        vreq.num_computed_tokens = num_computed_tokens
        vreq.status = status
        vreq.num_preemptions = num_preemptions
        if self.request_skip_attribute is not None:
            setattr(vreq, self.request_skip_attribute, skip_reading_prefix_cache)
        if self.request_in_flight:
            vreq.num_in_flight_tokens = num_in_flight_tokens

    def num_tokens(self, vreq: Any) -> int:
        """``Request.num_tokens``."""
        return int(vreq.num_tokens)

    def block_hashes(self, vreq: Any, hash_block_size: int, block_size: int) -> list[Any]:
        """``Request.block_hashes`` at ``block_size``, as vLLM's coordinators see them.

        At a coarser block size this is vLLM's own
        ``kv_cache_utils.BlockHashListWithBlockSize`` over the fine hashes.
        """
        fine = list(vreq.block_hashes)
        if block_size == hash_block_size:
            return fine
        return list(self.ku.BlockHashListWithBlockSize(fine, hash_block_size, block_size))

    def embeds_tensor(self, data: bytearray, rows: int, width: int) -> Any:
        """A float16 ``(rows, width // 2)`` tensor over ``data`` (uint8 if ``width`` is odd)."""
        torch = self.torch
        if width % 2 == 0 and width > 0:
            return torch.frombuffer(data, dtype=torch.float16).reshape(rows, width // 2).clone()
        return torch.frombuffer(data, dtype=torch.uint8).reshape(rows, width).clone()

    # ------------------------------------------------------------ facade

    def _check_method(self, name: str) -> None:
        if name in self.missing_methods:
            raise self.unsupported(f"KVCacheManager.{name}")

    def method(self, manager: Any, name: str) -> Any:
        """``manager``'s facade method ``name``; a release newer than this era
        that dropped it gives :class:`.Unsupported` (a skip the lockstep
        reports as the class ``<name>/absent``), never an ``AttributeError``."""
        found = getattr(manager, name, None)
        if not callable(found):
            raise self.unsupported(f"KVCacheManager.{name}", "the release has no such method")
        return found

    def get_computed_blocks(self, manager: Any, vreq: Any, bound: int | None = None) -> tuple[Any, int]:
        """``get_computed_blocks(request[, max_cache_hit_length])`` ->
        ``(KVCacheBlocks, num_computed_tokens)``.

        Where the release also returns the shared-prefix boundary, it is stored
        on the request, as vLLM's scheduler does.

        Raises:
            Unsupported: A ``bound`` on a release without the argument.
        """
        if bound is not None and not self.hit_length_bound:
            raise self.unsupported("KVCacheManager.get_computed_blocks(max_cache_hit_length=...)", f"asked for {bound}")
        lookup = self.method(manager, "get_computed_blocks")
        out = lookup(vreq) if bound is None else lookup(vreq, bound)
        if self.lookup_returns_boundary:
            blocks, num_tokens, boundary = out
            vreq.shared_prefix_boundary = boundary
            return blocks, int(num_tokens)
        blocks, num_tokens = out
        return blocks, int(num_tokens)

    def prefix_hint(self, manager: Any, vreq: Any) -> int:
        """The prefix hint the scheduler reads after ``vreq``'s lookup: the
        coordinator's ``num_uncached_common_prefix_tokens`` (read as vLLM
        0.25.1's scheduler does, ``getattr(coordinator, ..., 0)``), or from
        the 0.26 era the ``shared_prefix_boundary`` the lookup stored on the
        request.

        Raises:
            Unsupported: A release without the hint.
        """
        if not self.has_prefix_hint:
            raise self.unsupported("KVCacheCoordinator.num_uncached_common_prefix_tokens")
        if self.lookup_returns_boundary:
            return int(getattr(vreq, "shared_prefix_boundary", 0))
        return int(getattr(manager.coordinator, "num_uncached_common_prefix_tokens", 0))

    def record_prefix_cache_stats(self, manager: Any, vreq: Any, num_hits: int) -> None:
        """``record_prefix_cache_stats(request, num_hits)`` (the scheduler's call at admission).

        Raises:
            Unsupported: Before the 0.27 era (the lookup itself records them).
        """
        if not self.caller_records_stats:
            raise self.unsupported(
                "KVCacheManager.record_prefix_cache_stats", "get_computed_blocks records the statistics itself"
            )
        self.method(manager, "record_prefix_cache_stats")(vreq, num_hits)

    def allocate_slots(self, manager: Any, vreq: Any, num_new_tokens: int, kwargs: Mapping[str, Any]) -> Any:
        """``allocate_slots(request, num_new_tokens, **kwargs)``.

        Raises:
            Unsupported: For a keyword the release lacks, given a value other than "not used".
        """
        accepted = self.allocate_args
        passed: dict[str, Any] = {}
        for name, value in kwargs.items():
            if name in accepted:
                passed[name] = value
            elif value != VllmApi.allocate_args.get(name, ()):  # (): skip_zeroing_group_ids, new in 0.32.0
                raise self.unsupported(f"KVCacheManager.allocate_slots({name}=...)", f"asked for {name}={value!r}")
        return self.method(manager, "allocate_slots")(vreq, num_new_tokens, **passed)

    def free(self, manager: Any, vreq: Any) -> None:
        """``free(request)``."""
        self.method(manager, "free")(vreq)

    def pop_blocks_for_free(self, manager: Any, vreq: Any) -> list[Any]:
        """``pop_blocks_for_free(request)``: the blocks, groups concatenated."""
        self._check_method("pop_blocks_for_free")
        result: list[Any] = list(self.method(manager, "pop_blocks_for_free")(vreq))
        return result

    def free_pool_blocks(self, pool: Any, blocks: list[Any]) -> None:
        """``BlockPool.free_blocks(ordered_blocks)``."""
        pool.free_blocks(blocks)

    def remove_skipped_blocks(
        self, manager: Any, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None
    ) -> None:
        """``remove_skipped_blocks(request_id, total_computed_tokens, num_prompt_tokens)``."""
        self.method(manager, "remove_skipped_blocks")(request_id, total_computed_tokens, num_prompt_tokens)

    def evict_blocks(self, manager: Any, block_ids: set[int]) -> None:
        """``evict_blocks(block_ids)``."""
        self.method(manager, "evict_blocks")(block_ids)

    def reset_prefix_cache(self, manager: Any) -> bool:
        """``reset_prefix_cache()``."""
        return bool(self.method(manager, "reset_prefix_cache")())

    def get_num_common_prefix_blocks(self, manager: Any, request_id: str) -> tuple[int, ...]:
        """``get_num_common_prefix_blocks(running_request_id)``, one count per group."""
        self._check_method("get_num_common_prefix_blocks")
        return tuple(int(x) for x in self.method(manager, "get_num_common_prefix_blocks")(request_id))

    def take_events(self, manager: Any) -> list[Any]:
        """``take_events()``."""
        result: list[Any] = list(self.method(manager, "take_events")())
        return result

    def event_type(self, event: Any) -> str:
        """``"stored"``, ``"removed"``, ``"cleared"`` or ``"other"`` for a vLLM KV-cache event."""
        ev = self.events
        if isinstance(event, ev.BlockStored):
            return "stored"
        if isinstance(event, ev.BlockRemoved):
            return "removed"
        if isinstance(event, ev.AllBlocksCleared):
            return "cleared"
        return "other"

    def cache_blocks(self, manager: Any, vreq: Any, num_computed_tokens: int) -> None:
        """``cache_blocks(request, num_computed_tokens)``."""
        self.method(manager, "cache_blocks")(vreq, num_computed_tokens)

    def take_kv_cache_block_copies(self, manager: Any) -> tuple[list[tuple[int, int]], list[int]]:
        """``take_kv_cache_block_copies()``: (source, copy) ids and the retained ids.

        Raises:
            Unsupported: Before the 0.26 era.
        """
        if not self.has_block_copies:
            raise self.unsupported("KVCacheManager.take_kv_cache_block_copies")
        copies, retained = self.method(manager, "take_kv_cache_block_copies")()
        pairs = [(int(c.src_block_id), int(c.dst_block_id)) for c in copies]
        return pairs, [int(b.block_id) for b in retained]

    def block_keys(self, pool: Any, block: Any) -> list[Any]:
        """Every prefix-cache key of a block: ``block_hash``, then (0.26 era on)
        its ``BlockPool.cached_block_hashes_by_block`` entries."""
        primary = block.block_hash
        if primary is None:
            return []
        return [primary, *getattr(pool, "cached_block_hashes_by_block", {}).get(int(block.block_id), ())]

    def take_new_block_ids(self, manager: Any) -> list[int]:
        """``take_new_block_ids()``."""
        self._check_method("take_new_block_ids")
        return [int(i) for i in self.method(manager, "take_new_block_ids")()]

    def get_zeroing_block_ids_in_range(self, manager: Any, request_id: str, start: int, end: int) -> list[int]:
        """``get_zeroing_block_ids_in_range(request_id, start_token, end_token)`` (0.26.0 to 0.31.0)."""
        self._check_method("get_zeroing_block_ids_in_range")
        return [int(i) for i in self.method(manager, "get_zeroing_block_ids_in_range")(request_id, start, end)]

    def record_blocks_for_zeroing(self, manager: Any, request_id: str, start_token: int) -> None:
        """``record_blocks_for_zeroing(request_id, start_token)`` (the 0.26 era on)."""
        self._check_method("record_blocks_for_zeroing")
        self.method(manager, "record_blocks_for_zeroing")(request_id, start_token)

    def new_step_starts(self, manager: Any) -> None:
        """``new_step_starts()``."""
        self._check_method("new_step_starts")
        self.method(manager, "new_step_starts")()

    def get_block_ids(self, manager: Any, request_id: str) -> tuple[tuple[int, ...], ...]:
        """``get_block_ids(request_id)``, one tuple per group."""
        return tuple(tuple(int(i) for i in g) for g in self.method(manager, "get_block_ids")(request_id))

    def get_block_ids_for_computed_tokens(
        self, manager: Any, request_id: str, num_computed_tokens: int
    ) -> tuple[tuple[int, ...], ...]:
        """``get_block_ids_for_computed_tokens(request_id, num_computed_tokens)``, one tuple per group."""
        self._check_method("get_block_ids_for_computed_tokens")
        out = self.method(manager, "get_block_ids_for_computed_tokens")(request_id, num_computed_tokens)
        return tuple(tuple(int(i) for i in g) for g in out)

    def get_computed_blocks_for_connector(
        self, manager: Any, vreq: Any, bound: int | None = None
    ) -> tuple[Any, int, bool]:
        """``get_computed_blocks_for_connector(request[, max_cache_hit_length])``
        (the 0.27 era on) -> ``(KVCacheBlocks, num_computed_tokens, hit_diverged)``;
        the shared-prefix boundary it returns is stored on the request, as the
        scheduler does.

        Raises:
            Unsupported: Before the 0.27 era, or a ``bound`` before the 0.33 era.
        """
        if not self.has_connector_lookup:
            raise self.unsupported("KVCacheManager.get_computed_blocks_for_connector")
        if bound is not None and not self.hit_length_bound:
            raise self.unsupported(
                "KVCacheManager.get_computed_blocks_for_connector(max_cache_hit_length=...)", f"asked for {bound}"
            )
        lookup = self.method(manager, "get_computed_blocks_for_connector")
        blocks, num_tokens, boundary, diverged = lookup(vreq) if bound is None else lookup(vreq, bound)
        vreq.shared_prefix_boundary = boundary
        return blocks, int(num_tokens), bool(diverged)

    def truncate_computed_blocks(self, manager: Any, blocks: Any, num_computed_tokens: int) -> Any:
        """``truncate_computed_blocks(blocks, num_computed_tokens)`` (the 0.27 era on).

        Raises:
            Unsupported: Before the 0.27 era.
        """
        if not self.has_connector_lookup:
            raise self.unsupported("KVCacheManager.truncate_computed_blocks")
        return self.method(manager, "truncate_computed_blocks")(blocks, num_computed_tokens)

    def get_num_cached_tokens(self, manager: Any, vreq: Any) -> int:
        """``get_num_cached_tokens(request)`` (the 0.34 era on).

        Raises:
            Unsupported: Before the 0.34 era.
        """
        if not self.has_num_cached_tokens:
            raise self.unsupported("KVCacheManager.get_num_cached_tokens")
        return int(self.method(manager, "get_num_cached_tokens")(vreq))

    def estimate_cached_tokens(self, manager: Any, vreq: Any) -> int:
        """``estimate_cached_tokens(request)`` (the 0.26 era on)."""
        self._check_method("estimate_cached_tokens")
        return int(self.method(manager, "estimate_cached_tokens")(vreq))

    def usage(self, manager: Any) -> float:
        """``KVCacheManager.usage``."""
        return float(manager.usage)

    def make_prefix_cache_stats(self, manager: Any) -> dict[str, Any] | None:
        """``make_prefix_cache_stats()`` as a dict of :attr:`stats_fields`, or None."""
        stats = self.method(manager, "make_prefix_cache_stats")()
        if stats is None:
            return None
        return {name: getattr(stats, name) for name in self.stats_fields}


# --------------------------------------------------------------------------
# The other eras: each overrides only what its releases changed
# --------------------------------------------------------------------------


class VllmApi016(VllmApi):
    """vLLM 0.16 era (0.16.0 and 0.16.x).

    Against the 0.25 era: ``KVCacheManager`` has no ``scheduler_block_size``,
    ``max_num_batched_tokens`` or ``watermark``; ``allocate_slots`` has no
    ``full_sequence_must_fit``, ``reserved_blocks`` or ``has_scheduled_reqs``;
    ``remove_skipped_blocks`` has no ``num_prompt_tokens``; there is no
    ``pop_blocks_for_free``, ``take_new_block_ids``, ``new_step_starts`` or
    ``get_block_ids_for_computed_tokens``;
    ``KVCacheGroupSpec`` has no ``is_eagle_group``; ``Request`` requires
    ``eos_token_id``; events carry no ``extra_keys``, ``group_idx`` or spec kind;
    no retention-interval variable; ``SinkFullAttentionManager`` constructs unaided;
    the coordinator keeps no ``num_uncached_common_prefix_tokens`` (no prefix hint).
    """

    era = "0.16"
    since = (0, 16, 0)
    verified: ClassVar[tuple[str, ...]] = ("0.16.0",)
    env = EnvNames(
        int_block_hashes="VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES",
        hash_seed="PYTHONHASHSEED",
        retention_interval=None,
        logging_level="VLLM_LOGGING_LEVEL",
    )
    manager_args = _frozen(
        {**VllmApi.manager_args, "scheduler_block_size": None, "max_num_batched_tokens": None, "watermark": None}
    )
    allocate_args = _frozen(
        {
            k: v
            for k, v in VllmApi.allocate_args.items()
            if k not in ("full_sequence_must_fit", "reserved_blocks", "has_scheduled_reqs")
        }
    )
    missing_methods = frozenset(
        {
            "pop_blocks_for_free",
            "take_new_block_ids",
            "new_step_starts",
            "get_block_ids_for_computed_tokens",
            "estimate_cached_tokens",
            "record_blocks_for_zeroing",
            "get_zeroing_block_ids_in_range",
        }
    )
    group_spec_fields = _frozen({**VllmApi.group_spec_fields, "is_eagle_group": None})
    request_args = _frozen({"eos_token_id": None})
    block_stored_fields: ClassVar[tuple[str, ...]] = VllmApi.block_stored_fields[:7]
    block_removed_fields: ClassVar[tuple[str, ...]] = ("block_hashes", "medium")
    sinkfull_ctor_defect: ClassVar[str | None] = None
    has_prefix_hint = False

    def remove_skipped_blocks(
        self, manager: Any, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None
    ) -> None:
        """``remove_skipped_blocks(request_id, total_computed_tokens)``.

        Raises:
            Unsupported: If ``num_prompt_tokens`` is given.
        """
        if num_prompt_tokens is not None:
            raise self.unsupported(
                "KVCacheManager.remove_skipped_blocks(num_prompt_tokens=...)",
                f"asked for num_prompt_tokens={num_prompt_tokens}",
            )
        self.method(manager, "remove_skipped_blocks")(request_id, total_computed_tokens)


class VllmApi017(VllmApi016):
    """vLLM 0.17 era (0.17.0): ``Request`` no longer takes ``eos_token_id``;
    ``BlockStored`` gains ``extra_keys``; ``new_step_starts`` exists."""

    era = "0.17"
    since = (0, 17, 0)
    verified: ClassVar[tuple[str, ...]] = ("0.17.0",)
    request_args = _frozen({})
    block_stored_fields: ClassVar[tuple[str, ...]] = VllmApi.block_stored_fields[:8]
    missing_methods = VllmApi016.missing_methods - {"new_step_starts"}


class VllmApi0171(VllmApi017):
    """vLLM 0.17.1 era (0.17.1 to 0.19.x): ``take_new_block_ids`` exists."""

    era = "0.17.1"
    since = (0, 17, 1)
    verified: ClassVar[tuple[str, ...]] = ("0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1")
    missing_methods = VllmApi017.missing_methods - {"take_new_block_ids"}


class VllmApi020(VllmApi0171):
    """vLLM 0.20 era (0.20.x): ``KVCacheManager`` takes ``max_num_batched_tokens``;
    ``KVCacheGroupSpec`` has ``is_eagle_group``; both events carry ``group_idx``."""

    era = "0.20"
    since = (0, 20, 0)
    verified: ClassVar[tuple[str, ...]] = ("0.20.0", "0.20.1", "0.20.2")
    manager_args = _frozen({**VllmApi016.manager_args, "max_num_batched_tokens": "max_num_batched_tokens"})
    group_spec_fields = VllmApi.group_spec_fields
    block_stored_fields: ClassVar[tuple[str, ...]] = VllmApi.block_stored_fields[:9]
    block_removed_fields: ClassVar[tuple[str, ...]] = VllmApi.block_removed_fields


class VllmApi021(VllmApi020):
    """vLLM 0.21 era (0.21.0): ``allocate_slots(full_sequence_must_fit=...)``."""

    era = "0.21"
    since = (0, 21, 0)
    verified: ClassVar[tuple[str, ...]] = ("0.21.0",)
    allocate_args = _frozen({**VllmApi016.allocate_args, "full_sequence_must_fit": False})


class VllmApi022(VllmApi021):
    """vLLM 0.22 era (0.22.x): ``BlockStored`` carries the group's spec kind and window."""

    era = "0.22"
    since = (0, 22, 0)
    verified: ClassVar[tuple[str, ...]] = ("0.22.0", "0.22.1")
    block_stored_fields: ClassVar[tuple[str, ...]] = VllmApi.block_stored_fields


class VllmApi023(VllmApi022):
    """vLLM 0.23 era (0.23.0): ``KVCacheManager`` takes ``scheduler_block_size``;
    ``allocate_slots(reserved_blocks=...)``; the prefix-cache retention
    interval variable; ``SinkFullAttentionManager.__init__`` refuses the
    factory's ``scheduler_block_size`` (the ``sinkfull-ctor`` defect)."""

    era = "0.23"
    since = (0, 23, 0)
    verified: ClassVar[tuple[str, ...]] = ("0.23.0",)
    manager_args = _frozen({**VllmApi020.manager_args, "scheduler_block_size": "scheduler_block_size"})
    allocate_args = _frozen({**VllmApi021.allocate_args, "reserved_blocks": 0})
    env = VllmApi.env
    sinkfull_ctor_defect = VllmApi.sinkfull_ctor_defect


class VllmApi024(VllmApi023):
    """vLLM 0.24 era (0.24.0): ``pop_blocks_for_free``; the watermark and
    ``allocate_slots(has_scheduled_reqs=...)``; the hybrid coordinator keeps
    ``num_uncached_common_prefix_tokens`` (the scheduler's prefix hint)."""

    era = "0.24"
    since = (0, 24, 0)
    verified: ClassVar[tuple[str, ...]] = ("0.24.0",)
    manager_args = VllmApi.manager_args
    allocate_args = VllmApi.allocate_args
    missing_methods = frozenset(
        {
            "get_block_ids_for_computed_tokens", "estimate_cached_tokens", "record_blocks_for_zeroing",
            "get_zeroing_block_ids_in_range",
        }
    )  # fmt: skip
    has_prefix_hint = True


class VllmApi026(VllmApi):
    """vLLM 0.26 era: ``max_num_batched_tokens`` is renamed ``max_in_flight_tokens``;
    ``get_computed_blocks`` also returns the shared-prefix boundary; requests
    carry ``num_in_flight_tokens``; the SinkFull
    constructor defect now names ``needs_kv_cache_zeroing``; fine-grained hits
    queue copies (``take_kv_cache_block_copies``) and a block may hold several
    keys (``cached_block_hashes_by_block``)."""

    era = "0.26"
    since = (0, 26, 0)
    verified: ClassVar[tuple[str, ...]] = ("0.26.0",)
    missing_methods: ClassVar[frozenset[str]] = frozenset()
    manager_args = _frozen({**VllmApi.manager_args, "max_num_batched_tokens": "max_in_flight_tokens"})
    lookup_returns_boundary = True
    has_block_copies = True
    sinkfull_ctor_defect = "needs_kv_cache_zeroing"
    request_in_flight = True


class VllmApi027(VllmApi026):
    """vLLM 0.27 era (0.27.x): the lookup no longer records prefix-cache
    statistics; the caller records them with ``record_prefix_cache_stats``; a
    KV connector's lookup (``get_computed_blocks_for_connector``) and
    ``truncate_computed_blocks`` are new."""

    era = "0.27"
    since = (0, 27, 0)
    verified: ClassVar[tuple[str, ...]] = ("0.27.1",)
    caller_records_stats = True
    has_connector_lookup = True


class VllmApi028(VllmApi027):
    """vLLM 0.28 era (0.28.x): multi-module MTP inputs, ``KVCacheManager``'s
    ``num_prefill_lookahead`` and ``SlidingWindowSpec.extra_retained_tokens``."""

    era = "0.28"
    since = (0, 28, 0)
    verified: ClassVar[tuple[str, ...]] = ("0.28.0",)
    manager_args = _frozen({**VllmApi026.manager_args, "num_prefill_lookahead": "num_prefill_lookahead"})
    spec_fields = _frozen({**VllmApi.spec_fields, "extra_retained_tokens": "extra_retained_tokens"})


class VllmApi029(VllmApi028):
    """vLLM 0.29 era: the retention interval is a ``KVCacheConfig`` field; no
    environment variable is read for it any more; the ring kind
    ``CircularBufferSpec``; ``MambaSpec.num_prefill_checkpoint_blocks``."""

    era = "0.29"
    since = (0, 29, 0)
    verified: ClassVar[tuple[str, ...]] = ("0.29.0",)
    spec_classes = _frozen({**VllmApi.spec_classes, "CircularBuffer": "CircularBufferSpec"})
    spec_fields = _frozen(
        {**VllmApi028.spec_fields, "num_prefill_checkpoint_blocks": "num_prefill_checkpoint_blocks"}
    )
    env = EnvNames(
        int_block_hashes="VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES",
        hash_seed="PYTHONHASHSEED",
        retention_interval=None,
        logging_level="VLLM_LOGGING_LEVEL",
    )
    retention_field = True


class VllmApi030(VllmApi029):
    """vLLM 0.30 era (0.30.0 and 0.31.x): ``SinkFullAttentionManager.__init__``
    no longer reserves sink blocks (its signature defect remains); the ring
    kind ``KpoolTailSpec``; ``MambaSpec.prefill_checkpoint_alignment``."""

    era = "0.30"
    since = (0, 30, 0)
    verified: ClassVar[tuple[str, ...]] = ("0.30.0", "0.31.0")
    spec_classes = _frozen({**VllmApi029.spec_classes, "KpoolTail": "KpoolTailSpec"})
    spec_fields = _frozen(
        {**VllmApi029.spec_fields, "prefill_checkpoint_alignment": "prefill_checkpoint_alignment"}
    )
    sinkfull_reserves_sink_blocks = False


class VllmApi032(VllmApi030):
    """vLLM 0.32 era: ``get_zeroing_block_ids_in_range`` is gone;
    ``allocate_slots`` takes ``skip_zeroing_group_ids``."""

    era = "0.32"
    since = (0, 32, 0)
    verified: ClassVar[tuple[str, ...]] = ("0.32.0",)
    missing_methods: ClassVar[frozenset[str]] = frozenset({"get_zeroing_block_ids_in_range"})
    allocate_args = _frozen({**VllmApi.allocate_args, "skip_zeroing_group_ids": ()})


class VllmApi033(VllmApi032):
    """vLLM 0.33 era: constructing a cached Mamba group in a mode other than
    ``align`` fails an assertion, reported here as :class:`kvspec.errors.ConfigError`;
    ``KpoolTailSpec`` is gone (since 0.32.0, where kvspec's profile refuses it);
    ``get_computed_blocks`` takes ``max_cache_hit_length``; look-ahead block
    hashes (``KVCacheManager(num_hash_lookahead_tokens=...)``, the request
    hasher's third argument, ``BlockStored.lookahead_token_ids``)."""

    era = "0.33"
    since = (0, 33, 0)
    verified: ClassVar[tuple[str, ...]] = ("0.33.0",)
    spec_classes = _frozen({k: v for k, v in VllmApi032.spec_classes.items() if k != "KpoolTail"})
    hit_length_bound = True
    manager_args = _frozen({**VllmApi028.manager_args, "num_hash_lookahead_tokens": "num_hash_lookahead_tokens"})
    block_stored_fields: ClassVar[tuple[str, ...]] = (*VllmApi.block_stored_fields, "lookahead_token_ids")

    def check_config(self, config: KVCacheConfig) -> None:
        """Reject a cached Mamba group whose mode is not ``align`` (vLLM asserts)."""
        super().check_config(config)
        if not config.enable_caching:
            return
        for g, kind in enumerate(config.groups):
            if isinstance(kind, Mamba) and kind.mode != "align":
                raise ConfigError(
                    f"group {g}: vLLM {self.version} caches Mamba state only in mode 'align', "
                    f"not {kind.mode!r} (turn prefix caching off or use 'align')"
                )


class VllmApi034(VllmApi033):
    """vLLM 0.34 era: ``get_num_common_prefix_blocks`` is gone and
    ``get_num_cached_tokens`` is new; a request reads the prefix cache by its
    ``prefix_cache_hit_limit``, set once from its sampling parameters
    (``skip_reading_prefix_cache``, ``prompt_logprobs``,
    ``prompt_logprob_start``): the ``Request`` attribute
    ``skip_reading_prefix_cache`` is gone; the prefix-cache map keeps block ids
    (read by :meth:`VllmApi.cached_entries`); token ids are 32-bit (a larger
    one raises ``OverflowError`` where the request is made)."""

    era = "0.34"
    since = (0, 34, 0)
    verified: ClassVar[tuple[str, ...]] = ("0.34.0",)
    missing_methods: ClassVar[frozenset[str]] = frozenset(
        {"get_num_common_prefix_blocks", "get_zeroing_block_ids_in_range"}
    )
    has_num_cached_tokens = True
    request_skip_attribute = None
    sampling_logprob_start = True


ERAS: tuple[type[VllmApi], ...] = (
    VllmApi016,
    VllmApi017,
    VllmApi0171,
    VllmApi020,
    VllmApi021,
    VllmApi022,
    VllmApi023,
    VllmApi024,
    VllmApi,
    VllmApi026,
    VllmApi027,
    VllmApi028,
    VllmApi029,
    VllmApi030,
    VllmApi032,
    VllmApi033,
    VllmApi034,
)
"""Every era, oldest first."""
