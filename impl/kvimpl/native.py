"""kvimpl's native core: the manager's state and hot paths in C.

``kvimpl._kvnative`` (C sources in ``impl/kvimpl/_native/``, compiled by the
build hook ``hatch_build.py`` at install time) holds the whole state of a
manager in flat arrays: the free queue (int32 links), ref counts, the cache
map (open addressing over the digests), the per-request tables, pending
popped blocks and Mamba's per-step keys, and runs every facade operation on
it, argument checks included, with kvimpl's Python rules written again in C.
:class:`NativeKVCacheManager` derives from that core and adds in Python what
is not on a hot path: the view, the invariant checks, the statistics object,
device block tables and request construction.

Selection (:func:`create_manager`): the native core is used when the
extension is built, ``KVREF_NATIVE`` is not ``0`` and it implements the
configuration (:func:`native_unsupported`); otherwise the pure-Python
:class:`kvimpl.kv_cache_manager.KVCacheManager`, which stays the reference
build (the bug zoo and the mutation tests patch and subclass it). A missing
extension is reported once, on one line, never as an error.

What the core does not implement falls back to Python for the whole
configuration: cross attention, more than 64 groups, any semantics-profile
switch it does not know, and the state-adding features of vLLM 0.26.0 on
(partial-tail and Mamba tail entries, fine-grained hits, the ring kinds;
context parallelism it runs: it only scales the managers' block sizes and
refuses some lookups). KV-cache events are recorded by
the core and built into kvspec events by :mod:`kvimpl.native_events`.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
from collections import Counter
from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

from kvimpl.checks import (
    check_manager_arguments,
    check_request,
    check_skip_zeroing,
    check_zeroing_range,
    check_zeroing_start,
    is_int,
    out_of_memory,
)
from kvimpl.config_rules import (
    clip_block_sizes,
    cp_lookup_refusal,
    estimate_groups,
    features_needed,
    lagging_hits,
    manager_kinds,
    searches_per_group,
)
from kvimpl.device_tables import check_slot_arguments, no_device_tables, valid_group
from kvimpl.hash_functions import hash_function
from kvimpl.kv_cache_coordinator import HybridCoordinator
from kvimpl.kv_cache_manager import (
    check_hit_length_bound,
    lookup_length,
    reads_prefix_cache,
    require_operation,
    table_cached_tokens,
    truncated_lists,
)
from kvimpl.native_checks import native_invariants, native_view
from kvimpl.native_events import events_from_records, reannounced_event, replay_events
from kvimpl.native_hint import CachedMap, cached_map
from kvimpl.request import RequestHasher
from kvspec import errors as kv_errors
from kvspec.config import (
    MLA,
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    KVCacheConfig,
    Mamba,
    SinkFullAttention,
    SlidingWindow,
)
from kvspec.errors import (
    ContextParallelLookupError,
    InvalidTokenCountError,
    UnsupportedByProfileError,
    UnsupportedOperationError,
)
from kvspec.events import KVCacheEvent
from kvspec.hashing import ExtraKeySource, none_hash
from kvspec.invariants import InvariantViolation
from kvspec.request import Request as SpecRequest
from kvspec.request import RequestStatus
from kvspec.stats import PrefixCacheStats
from kvspec.view import BlockIds, KVView

if TYPE_CHECKING:
    from kvimpl.kv_cache_manager import KVCacheManager

_module: ModuleType | None = None
_import_error: str | None = None
try:
    from kvimpl import _kvnative as _loaded
except ImportError as exc:  # not built (no compiler at install time), or built for another interpreter
    _import_error = str(exc)
else:
    _module = _loaded

NATIVE_SWITCHES = frozenset(
    {
        "free_unhashed_first", "free_unhashed_needs_caching", "sink_blocks_reserved", "new_block_ids",
        "mamba_skip_spec_slack", "mamba_align_estimate_capped", "mamba_align_retired_mark",
        "mamba_eagle_counts_verified",
        "eagle_margin_hashed_cap", "eagle_flags_need_use_eagle", "stats_at_lookup", "adopt_hit_without_new_tokens",
        "common_prefix", "pop_drops_leading_nulls", "lookup_returns_boundary", "skip_on_processed_tokens",
        "prefill_lookahead",  # core parameter num_reprefillable_tokens, a group's extra_retained_tokens
        # Look-ahead block hashes: core parameter cache_hashed_only (caching stops at the hashed
        # tokens); a configuration that sets num_hash_lookahead_tokens is declined (native_unsupported).
        "lookahead_block_hashes",
        # The retention interval: its switches act only with one, and a configuration that sets
        # one is declined (native_unsupported).
        "retention_kinds", "retention_boundaries", "retention_zero_any_model",
        # The lookup's entry in Python (NativeKVCacheManager.get_computed_blocks, get_num_cached_tokens):
        # the length of a lookup is computed there and passed to the core's lookup_bounded.
        "num_cached_tokens_op", "hit_limit_at_construction", "hit_length_bound",
        # Applied by the request hasher (kvimpl.request.RequestHasher).
        "prompt_logprobs_hit_cap", "token_ids_int32",
        "computed_block_ids_op",  # NativeKVCacheManager.get_block_ids_for_computed_tokens (in Python)
        "report_mode_full",  # NativeKVCacheManager._announce_hit (in Python)
        "prefix_hint_op",  # NativeKVCacheManager.get_prefix_hint (in Python)
        "estimate_cached_tokens_op", "estimate_skips_uncacheable",  # NativeKVCacheManager.estimate_cached_tokens
        "record_zeroing_op",  # NativeKVCacheManager.record_blocks_for_zeroing (in Python)
        "zeroing_range_op",  # NativeKVCacheManager.get_zeroing_block_ids_in_range (in Python)
        "skip_zeroing_arg",  # the core's allocate_slots calls core parameter skip_zeroing_check
        # NativeKVCacheManager.get_computed_blocks_for_connector and truncate_computed_blocks (in Python);
        # the core takes the lists a connector's lookup returns (core parameter lagging_hits).
        "connector_lookup_op", "truncate_mamba_lagging", "per_group_eagle_margin",
        # Applied before the core sees a value (the request hasher) or by KVCacheConfig's validation.
        "extra_keys_tagged", "mm_resume_from_first_feature", "single_spec_group_hybrid", "mamba_caching_needs_align",
        # The state-adding features: the core models none of them and declines a configuration that
        # needs one (kvimpl.config_rules.features_needed), so their switches never reach the core.
        "partial_tail_entries", "partial_hash_hits", "mamba_tail_entries",
        "fa_tail_below_last_token", "mamba_tail_skip_keyed", "circular_buffer_kind", "kpool_tail_kind",
        "cp_block_scaling", "cp_swa_mask_unscaled",
        "partial_hits_gated", "cache_mask_hit_alignment", "mamba_early_return_allocated", "mamba_tail_eagle",
        "prefill_checkpoints",
    }
)  # fmt: skip
"""Profile switches the native core follows; a profile that sets any other
switch away from its default runs on the Python manager."""

_KIND_CODES: dict[type, int] = {
    FullAttention: 0, MLA: 1, SinkFullAttention: 2, SlidingWindow: 3, ChunkedLocal: 4, Mamba: 5,
}  # fmt: skip
_MAMBA_MODES = {"none": 0, "all": 1, "align": 2}
_FULL_TYPE = (FullAttention, MLA, SinkFullAttention)
_noticed = False


def native_module() -> ModuleType | None:
    """The extension module (set up), or None when it is not built."""
    if _module is not None:
        _module.setup(kv_errors, RequestStatus, SpecRequest, _py_request_type(), InvariantViolation)
    return _module


def native_enabled() -> bool:
    """Whether the native core is selected: built, and ``KVREF_NATIVE`` is not ``0``."""
    return _module is not None and os.environ.get("KVREF_NATIVE", "1") != "0"


def build_description() -> str:
    """One line: which build kvimpl uses here, and why (CI prints it)."""
    if _module is None:
        return f"pure Python (the native core is not built: {_import_error})"
    if not native_enabled():
        return "pure Python (KVREF_NATIVE=0)"
    return "native core (kvimpl._kvnative), pure Python where the core does not implement a configuration"


def native_unsupported(config: KVCacheConfig) -> str | None:
    """Why the native core cannot run ``config`` (then kvimpl uses Python), or None."""
    if _module is None:
        return f"the native extension is not built ({_import_error})"
    needed = features_needed(config)
    if "context-parallelism" in needed:
        # It only scales the managers' block sizes (core_params passes them) and refuses some lookups
        # (get_computed_blocks, in Python): KVCacheConfig refuses it with prefix caching in several
        # groups (the hybrid coordinator's refusal), the one place it would need more.
        needed.remove("context-parallelism")
    if needed:
        return f"the native core does not model {', '.join(needed)}"
    if config.num_hash_lookahead_tokens:
        # Its cache path counts full blocks from the tokens alone; look-ahead hashes lag them.
        return f"look-ahead block hashes (num_hash_lookahead_tokens={config.num_hash_lookahead_tokens})"
    if config.prefix_cache_retention_interval is not None:
        # Its cache path masks with the dense window rule only.
        return f"a prefix-cache retention interval ({config.prefix_cache_retention_interval})"
    if len(config.groups) > 64:
        return f"{len(config.groups)} groups (the native core takes up to 64)"
    for gid, kind in enumerate(config.groups):
        if type(kind) not in _KIND_CODES:
            return f"group {gid}: {type(kind).__name__} is not in the native core"
    defaults = {f.name: f.default for f in dataclasses.fields(config.profile)}
    for name, default in defaults.items():
        if name in ("name", "release") or name in NATIVE_SWITCHES:
            continue
        if getattr(config.profile, name) != default:
            return f"profile switch {name} of {config.profile.name} is not in the native core"
    return None


def create_manager(config: KVCacheConfig, device: str | None = None, native: bool | None = None) -> Any:
    """The best kvimpl manager for ``config``: native when selected and able
    (:func:`native_enabled`, :func:`native_unsupported`), else Python.

    Args:
        config: The cache configuration.
        device: As :class:`kvimpl.kv_cache_manager.KVCacheManager`.
        native: True: native or fall back (with the notice); False: Python;
            None: as ``KVREF_NATIVE`` says (native unless it is ``0``).

    Raises:
        ConfigError: For an argument kvimpl cannot build a manager from
            (:func:`kvimpl.checks.check_manager_arguments`).
    """
    check_manager_arguments(config, native)
    want = native_enabled() if native is None else native and _module is not None
    if native or native is None:
        notice_if_missing()
    reason = native_unsupported(config) if want else "not selected"
    if want and reason is None:
        return NativeKVCacheManager(config, device)
    from kvimpl.kv_cache_manager import KVCacheManager  # noqa: PLC0415 - imports most of kvimpl

    return KVCacheManager(config, device)


def notice_if_missing() -> None:
    """Print the one-line notice (once per process) when the native core is
    wanted (``KVREF_NATIVE`` is not ``0``) but not built."""
    if _module is None and os.environ.get("KVREF_NATIVE", "1") != "0":
        _notice()


def _notice() -> None:
    global _noticed  # noqa: PLW0603 - a once-per-process notice
    if not _noticed:
        _noticed = True
        print(f"kvimpl: native core not built ({_import_error}); using the pure-Python manager", file=sys.stderr)


def _py_request_type() -> type:
    from kvimpl.request import Request  # noqa: PLC0415 - kvimpl.request imports this module lazily

    return Request


def core_params(config: KVCacheConfig) -> dict[str, Any]:
    """The native core's constructor parameters: every rule kvimpl derives
    from the configuration, evaluated here once (kvimpl.config_rules)."""
    from kvimpl.config_rules import admission_cap, batched_tokens, hash_block_size, scheduler_block_size  # noqa: PLC0415

    p = config.profile
    eagle = _eagle_group_ids(config)
    hybrid = config.enable_caching and len(config.groups) > 1
    spec_groups: list[tuple[int, tuple[int, ...], int]] = []
    use_eagle = [False] * len(config.groups)
    if hybrid:
        merged: dict[Any, list[int]] = {}
        for gid, kind in enumerate(config.groups):
            merged.setdefault(kind, []).append(gid)
        sgs = [(ids[0], tuple(ids), any(i in eagle for i in ids)) for ids in merged.values()]
        sgs.sort(key=lambda sg: not isinstance(config.groups[sg[0]], _FULL_TYPE))
        for rep, ids, eg in sgs:
            spec_groups.append((rep, ids, int(eg)))
            for gid in ids:
                use_eagle[gid] = eg
    elif config.enable_caching:
        use_eagle[0] = 0 in eagle
    has_mamba = any(isinstance(k, Mamba) for k in config.groups)
    groups = []
    mnbt, mml = batched_tokens(config), config.max_model_len
    # The managers run each group at its context-parallel block size; the admission cap is the group's own.
    for gid, (kind, scaled) in enumerate(zip(config.groups, manager_kinds(config), strict=True)):
        cap = admission_cap(kind, mnbt, mml) if not isinstance(kind, Mamba | CrossAttention) else None
        mamba = kind if isinstance(kind, Mamba) else None
        groups.append((
            _KIND_CODES[type(kind)], scaled.block_size,
            kind.window if isinstance(kind, SlidingWindow) else 0,
            kind.chunk if isinstance(kind, ChunkedLocal) else 0,
            _MAMBA_MODES[mamba.mode] if mamba else 0, mamba.num_speculative_blocks if mamba else 0,
            int(_records_new_block_ids(kind, p.new_block_ids, has_mamba)), int(use_eagle[gid]),
            -1 if cap is None else cap,
            mamba.num_speculative_blocks if mamba and p.mamba_skip_spec_slack else 0,
            int(p.mamba_align_estimate_capped),
            kind.sink_len // scaled.block_size if isinstance(kind, SinkFullAttention) and p.sink_blocks_reserved else 0,
            int(p.mamba_align_retired_mark),
            kind.extra_retained_tokens if isinstance(kind, SlidingWindow) else 0,
        ))  # fmt: skip
    fn = hash_function(config.hash_function)
    return {
        "num_blocks": config.num_blocks,
        "max_model_len": config.max_model_len,
        "watermark_blocks": int(config.watermark * config.num_blocks),
        "hash_block_size": hash_block_size(config),
        "scheduler_block_size": scheduler_block_size(config),
        "digest_len": len(none_hash(fn, config.hash_seed)),
        "enable_caching": int(config.enable_caching),
        "coordinator": 0 if not config.enable_caching else (2 if hybrid else 1),
        "unhashed_first": int(p.free_unhashed_first and (config.enable_caching or not p.free_unhashed_needs_caching)),
        "pop_trims_nulls": int(p.pop_drops_leading_nulls),
        "common_prefix_zero": int(p.common_prefix == "zero"),
        "adopt_hit_without_new_tokens": int(p.adopt_hit_without_new_tokens),
        "mamba_eagle_counts_verified": int(p.mamba_eagle_counts_verified),
        "eagle_margin_hashed_cap": int(p.eagle_margin_hashed_cap),
        "lagging_hits": int(lagging_hits(config)),
        "stats_at_lookup": int(p.stats_at_lookup),
        "skip_on_processed_tokens": int(p.skip_on_processed_tokens),
        "num_reprefillable_tokens": max(0, config.num_prefill_lookahead - 1),
        "cache_hashed_only": int(p.lookahead_block_hashes),
        "skip_zeroing_check": _skip_zeroing_check(p, len(config.groups)),
        "enable_kv_cache_events": int(config.enable_kv_cache_events),
        "groups": groups,
        "spec_groups": spec_groups,
    }


def _skip_zeroing_check(profile: Any, num_groups: int) -> Any:
    """The core's check of ``allocate_slots(skip_zeroing_group_ids=...)``: the
    ids checked as kvimpl's manager checks them, as a mask of groups."""

    def mask(group_ids: object) -> int:
        return sum(1 << g for g in check_skip_zeroing(profile, num_groups, group_ids))

    return mask


def _eagle_group_ids(config: KVCacheConfig) -> frozenset[int]:
    """Groups that drop the EAGLE block (kvimpl.config_rules.eagle_group_ids)."""
    if config.profile.eagle_flags_need_use_eagle and not config.use_eagle:
        return frozenset()
    if config.eagle_groups:
        return frozenset(config.eagle_groups)
    return frozenset(range(len(config.groups))) if config.use_eagle else frozenset()


def _records_new_block_ids(kind: Any, mode: str, has_mamba: bool) -> bool:
    """kvimpl.single_type_kv_cache_manager.records_new_block_ids."""
    full_or_mla = type(kind) is FullAttention or type(kind) is MLA
    if mode == "full":
        return type(kind) is FullAttention
    if mode == "full-mla":
        return full_or_mla
    if mode == "full-mla-with-mamba":
        return has_mamba and full_or_mla
    return has_mamba and not isinstance(kind, Mamba)


_Base: Any = _module.Core if _module is not None else object


class NativeKVCacheManager(_Base):  # type: ignore[misc]  # the C core's type is known only at run time
    """kvimpl's manager on the native core: the facade of
    :class:`kvimpl.kv_cache_manager.KVCacheManager`, the batched step API
    (``allocate_slots_batch``, ``free_batch``) and the array API
    (``handle``, ``allocate_slots_array``, ``advance_array``).

    inv: every invariant of kvimpl's Python manager (:func:`kvimpl.native_checks.native_invariants`)
    """

    name = "impl-native"

    def __init__(self, config: KVCacheConfig, device: str | None = None) -> None:
        """An empty manager.

        Raises:
            UnsupportedByProfileError: If the extension is not built or cannot
                run ``config`` (:func:`native_unsupported`; :func:`create_manager`
                falls back to the Python manager instead).
        """
        check_manager_arguments(config)
        reason = native_unsupported(config)
        if reason is not None:
            raise UnsupportedByProfileError(f"NativeKVCacheManager: {reason}")
        native_module()
        try:
            super().__init__(core_params(config))
        except MemoryError:
            raise out_of_memory(config) from None
        self.config = config
        self.enable_caching = config.enable_caching
        self.prefix_cache_stats: PrefixCacheStats | None = PrefixCacheStats() if config.log_stats else None
        self._stats = self.prefix_cache_stats
        self.hasher = RequestHasher.for_config(config, native=True)
        self.event_keys: Counter[tuple[object, int | None]] = Counter()
        """Cache keys implied by the events taken so far (the events-replay invariant)."""
        self.reports_hits = config.enable_kv_cache_events and config.profile.report_mode_full
        """A hit of a request in report mode "full" is announced again (built in Python)."""
        self.drained_events: list[KVCacheEvent] = []
        """Events taken from the core early, to put a re-announcement after them (:meth:`_announce_hit`)."""
        self.reannounced: Counter[tuple[object, int | None]] = Counter()
        """(external hash, group) entries re-announced since the last clear."""
        self._hybrid_hint = config.enable_caching and len(config.groups) > 1
        """Whether the prefix hint can be non-zero (a cached hybrid; :mod:`kvimpl.native_hint`)."""
        self.num_uncached_common_prefix_tokens = 0
        """The hybrid coordinator's value of the last lookup that searched (:mod:`kvimpl.native_hint`)."""
        self.shared_prefix_boundary: dict[str, int] = {}
        """Non-zero ``shared_prefix_boundary`` of each request's latest lookup."""
        self._estimate_groups = estimate_groups(config)
        self._kinds = manager_kinds(config)
        """The groups at the block sizes the managers run them (context parallelism scales them)."""
        self._connector_coord: HybridCoordinator | None = None
        """kvimpl's coordinator for a connector's per-group lookup (:meth:`_per_group_coordinator`)."""
        self._cp_refusal = cp_lookup_refusal(config.groups[0], config) if len(config.groups) == 1 else None
        """Why a lookup of the one group is refused under context parallelism (None: it is not)."""
        self._clip_sizes = clip_block_sizes(config)
        """Per group, the cut of :meth:`get_block_ids_for_computed_tokens` (0: whole)."""
        has_mamba = any(isinstance(k, Mamba) for k in config.groups)
        self._zeroing_groups = [
            (g, kind.block_size)
            for g, (group, kind) in enumerate(zip(config.groups, self._kinds, strict=True))
            if _records_new_block_ids(group, config.profile.new_block_ids, has_mamba)
        ]
        """``(group, block size)`` of each group that lists fresh blocks (:meth:`record_blocks_for_zeroing`)."""
        self.device_tables: Any = None
        if device is not None:
            from kvimpl.device_tables import BlockTable  # noqa: PLC0415 - torch is optional

            self.device_tables = BlockTable.for_config(config, device, core=self)

    def new_request(
        self,
        request_id: str,
        prompt_token_ids: Iterable[int],
        extra: ExtraKeySource = ExtraKeySource(),
        skip_reading_prefix_cache: bool | None = None,
        prompt_logprobs: bool = False,
        prompt_logprob_start: int | None = None,
    ) -> Any:
        """A WAITING native request hashing like this manager (see :class:`kvimpl.request.RequestHasher`)."""
        return self.hasher.new_request(
            request_id, list(prompt_token_ids), extra, skip_reading_prefix_cache, prompt_logprobs, prompt_logprob_start
        )

    def get_computed_blocks(self, request: Any, max_cache_hit_length: int | None = None) -> Any:
        """The core's lookup; a cached hybrid also takes the prefix hint here.

        NOTE: the hint's longest length is the core's first spec-group search
        of this lookup (``_first_lookup_tokens``; :mod:`kvimpl.native_hint`
        holds the same computation in Python, which the tests compare). It
        used to be recomputed here in Python over a copy of the core's whole
        cache map: 0.7 ms per lookup with 2,048 blocks, which made native
        admission on the hybrid bench mixes 14-18 µs per request-step, slower
        than vLLM's 3-8 (``kvref bench --mix full+swa``, load 3-4); with the
        core's value it is 0.4-0.7 µs.

        Raises:
            UnsupportedOperationError: As the Python manager's.
        """
        lookup, length = self._lookup_request(request, max_cache_hit_length)  # caller errors first
        reads = self._reads(request)
        if self.enable_caching and reads:
            self._refuse_cp_lookup("get_computed_blocks")
        out = super().get_computed_blocks(lookup) if length is None else self.lookup_bounded(lookup, length)
        if out[1] > 0 and self.reports_hits and getattr(request, "kv_cache_report_mode", "incremental") == "full":
            self._announce_hit(request, out[0])
        self.shared_prefix_boundary.pop(request.request_id, None)
        if self._hybrid_hint and reads:
            hit = out[1]
            self.num_uncached_common_prefix_tokens = uncached = self._first_lookup_tokens - hit
            if uncached:
                self.shared_prefix_boundary[request.request_id] = hit + uncached
        return out

    def _announce_hit(self, request: Any, hit: Any) -> None:
        """Report mode "full": the core's pending events first, then one
        BlockStored per group with hit blocks (``kvimpl.kv_cache_coordinator.
        KVCacheCoordinator.emit_cached_block_events``). Only Python requests
        carry the mode (the hasher makes them for it)."""
        self.drained_events += events_from_records(self.config, self._take_raw_events())
        for gid, ids in enumerate(hit):
            ev = reannounced_event(self.config, request, len(ids), self.config.groups[gid].block_size, gid)
            if ev is not None:
                self.drained_events.append(ev)
                self.reannounced.update((h, ev.group_idx) for h in ev.block_hashes)

    def reset_prefix_cache(self) -> bool:
        """The core's reset; a reset that clears forgets the re-announcements too."""
        cleared = bool(super().reset_prefix_cache())
        if cleared:
            self.reannounced.clear()
        return cleared

    def get_num_cached_tokens(self, request: Any) -> int:
        """How many leading tokens a lookup would hit now (vLLM 0.34.0 on; see
        the Python manager's method): the core's lookup, without the prefix
        hint (the profiles with this operation record no statistics at lookup).

        Raises:
            UnsupportedOperationError: Before vLLM 0.34.0.
            InvalidRequestError: ``request`` is not a request.
        """
        require_operation(self.config.profile, "get_num_cached_tokens")
        check_request(request)
        if not self.enable_caching or not self._reads(request):
            return 0
        self._refuse_cp_lookup("get_num_cached_tokens")
        n: int = super().get_computed_blocks(self._as_reading(request))[1]
        return n

    def get_computed_blocks_for_connector(
        self, request: Any, max_cache_hit_length: int | None = None
    ) -> tuple[BlockIds, int, bool]:
        """A KV connector's local lookup (vLLM 0.27.0 on; see the Python
        manager's method). Changes nothing.

        NOTE: the core has no search of one group alone: in a cached hybrid
        with a Mamba group, the per-group search runs in Python
        (kvimpl's ``HybridCoordinator.find_longest_cache_hit_per_group``) over a
        copy of the core's cache map (:class:`kvimpl.native_hint.CachedMap`),
        one pass over the cached blocks per call; the core's fine-grained
        hits, which that map would not show, are declined configurations.

        Raises:
            UnsupportedOperationError: Before vLLM 0.27.0.
            InvalidTokenCountError, ContextParallelLookupError: As :meth:`get_computed_blocks`.
        """
        p = self.config.profile
        require_operation(p, "get_computed_blocks_for_connector")
        check_request(request)
        check_hit_length_bound(p, max_cache_hit_length)
        coord = self._per_group_coordinator()
        fa = None if coord is None else coord.full_attention_group_id
        if coord is None or fa is None:
            blocks, n = self.get_computed_blocks(request, max_cache_hit_length)
            return blocks, n, False
        self.shared_prefix_boundary.pop(request.request_id, None)
        if not self._reads(request):
            return tuple(() for _ in self.config.groups), 0, False
        coord.pool = cast(Any, CachedMap(cached_map(self)))
        per_group, hits = coord.find_longest_cache_hit_per_group(
            request.block_hashes, lookup_length(p, request, max_cache_hit_length)
        )
        if max(hits) > hits[fa]:
            found, n = self.get_computed_blocks(request, max_cache_hit_length)
            return found, n, False
        return tuple(tuple(g) for g in per_group), hits[fa], min(hits) < hits[fa]

    def _per_group_coordinator(self) -> HybridCoordinator | None:
        """kvimpl's hybrid coordinator for this configuration (built once), where
        a connector's lookup searches per group: a cached hybrid with a Mamba group."""
        if self._connector_coord is None and searches_per_group(self.config):
            self._connector_coord = HybridCoordinator(self.config, True)
        return self._connector_coord

    def truncate_computed_blocks(self, blocks: Any, num_computed_tokens: int) -> BlockIds:
        """A lookup's result cut to its first ``num_computed_tokens`` tokens
        (see the Python manager's method; pure slicing, in Python).

        Raises:
            UnsupportedOperationError, GroupCountError, InvalidBlockIdError,
            InvalidTokenCountError, StaleHitError: As the Python manager's.
        """
        require_operation(self.config.profile, "truncate_computed_blocks")
        return truncated_lists(self.config, self._kinds, blocks, num_computed_tokens)

    def get_num_common_prefix_blocks(self, request_id: str) -> Any:
        """The core's answer (see the Python manager's method).

        Raises:
            UnsupportedOperationError: From vLLM 0.34.0 on (switch ``common_prefix``).
        """
        if self.config.profile.common_prefix == "absent":
            raise UnsupportedOperationError(f"get_num_common_prefix_blocks: not in {self.config.profile.name}")
        return super().get_num_common_prefix_blocks(request_id)

    def _refuse_cp_lookup(self, operation: str) -> None:
        """Raise ContextParallelLookupError where context parallelism rules a lookup out
        (:func:`kvimpl.config_rules.cp_lookup_refusal`, as the Python manager's ``_check_cp_lookup``)."""
        if self._cp_refusal is not None:
            raise ContextParallelLookupError(f"{operation}: {self._cp_refusal}")

    def _reads(self, request: Any) -> bool:
        return reads_prefix_cache(self.config.profile, request)

    def _lookup_request(self, request: Any, bound: int | None) -> tuple[Any, int | None]:
        """``request`` as the core's lookup must see it (its skip flag says
        whether the release reads the prefix cache for it) and the lookup's
        length when it is not ``num_tokens - 1`` (a hit-length bound, a
        prompt-logprob limit: the core's ``lookup_bounded``), else None.

        Raises:
            InvalidTokenCountError: ``bound`` is not None or an int >= 0.
        """
        check_request(request)
        p = self.config.profile
        check_hit_length_bound(p, bound)
        if not self._reads(request):
            return (request if request.skip_reading_prefix_cache else _with_skip(request, True)), None
        length = lookup_length(p, request, bound)
        return self._as_reading(request), (None if length == request.num_tokens - 1 else length)

    @staticmethod
    def _as_reading(request: Any) -> Any:
        return _with_skip(request, False) if request.skip_reading_prefix_cache else request

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int) -> Any:
        """The request's tables cut to its computed tokens (see the Python manager's method).

        Raises:
            UnsupportedOperationError: Before vLLM 0.25.1.
            InvalidTokenCountError: ``num_computed_tokens`` is not an int >= 0.
        """
        if not self.config.profile.computed_block_ids_op:
            raise UnsupportedOperationError(f"get_block_ids_for_computed_tokens: not in {self.config.profile.name}")
        tables = self.get_blocks(request_id)  # raises InvalidRequestError for a non-str id
        if not is_int(num_computed_tokens) or num_computed_tokens < 0:
            raise InvalidTokenCountError(
                f"get_block_ids_for_computed_tokens: num_computed_tokens {num_computed_tokens!r} is not an int >= 0"
            )
        n = num_computed_tokens
        return tuple(t[: -(-n // bs)] if bs else t for t, bs in zip(tables, self._clip_sizes, strict=True))

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """List the request's blocks from ``start_token`` on for zeroing again:
        the rule here, the lists in the core.

        Raises:
            UnsupportedOperationError, InvalidRequestError, InvalidTokenCountError:
                As the Python manager's method (nothing listed then).
        """
        require_operation(self.config.profile, "record_blocks_for_zeroing")
        tables = self.get_blocks(request_id)  # raises InvalidRequestError for a non-str id
        check_zeroing_start(start_token, self._zeroing_groups)
        for g, bs in self._zeroing_groups:
            self.list_new_block_ids(g, list(tables[g][start_token // bs :]))

    def get_zeroing_block_ids_in_range(self, request_id: str, start_token: int, end_token: int) -> list[int]:
        """The request's table entries covering ``[start_token, end_token)`` in
        the groups that list fresh blocks (the Python manager's method).

        Raises:
            UnsupportedOperationError, InvalidRequestError, InvalidTokenCountError:
                As the Python manager's method.
        """
        require_operation(self.config.profile, "get_zeroing_block_ids_in_range")
        tables = self.get_blocks(request_id)  # raises InvalidRequestError for a non-str id
        start, end = check_zeroing_range(start_token, end_token)
        return [b for g, bs in self._zeroing_groups for b in tables[g][start // bs : -(-end // bs)]]

    def estimate_cached_tokens(self, request: Any) -> int:
        """How many leading tokens the request's cached blocks stand for (see
        the Python manager's method; the core runs no tail entries, so a
        key's prefix length is its table position times the block size).

        NOTE: reads every block's key out of the core (a copy of the pool's
        key array): the scheduler asks once per request, when its prefill
        ends, not per step.

        Raises:
            UnsupportedOperationError: Before vLLM 0.26.0.
            InvalidRequestError: ``request`` is not a request.
        """
        if not self.config.profile.estimate_cached_tokens_op:
            raise UnsupportedOperationError(f"estimate_cached_tokens: not in {self.config.profile.name}")
        check_request(request)
        tables = self.get_blocks(request.request_id)
        keys = self._block_keys()
        found = [table_cached_tokens(tables[g], keys, None, self._kinds[g].block_size) for g in self._estimate_groups]
        return min(found, default=0)

    def get_prefix_hint(self, request: Any) -> int:
        """The scheduler's prefix hint (see the Python manager's ``get_prefix_hint``).

        Raises:
            UnsupportedOperationError: In vLLM 0.16.0 (switch ``prefix_hint_op``).
        """
        if not self.config.profile.prefix_hint_op:
            raise UnsupportedOperationError(f"get_prefix_hint: not in {self.config.profile.name}")
        self.get_blocks(request.request_id)  # the request-id check of the Python manager's check_request
        if self.config.profile.lookup_returns_boundary:
            return self.shared_prefix_boundary.get(request.request_id, 0)
        return self.num_uncached_common_prefix_tokens

    def record_prefix_cache_stats(self, request: Any, num_hits: int) -> None:
        """Record an admitted request's lookup (vLLM 0.27.0 on; see the Python manager).

        Raises:
            UnsupportedOperationError: Before vLLM 0.27.0.
            InvalidTokenCountError: A negative ``num_hits``.
        """
        if self.config.profile.stats_at_lookup:
            raise UnsupportedOperationError(
                f"record_prefix_cache_stats: not in {self.config.profile.name} (lookups record the statistics)"
            )
        self.get_blocks(request.request_id)  # the request-id check of the Python manager's check_request
        if not isinstance(num_hits, int) or isinstance(num_hits, bool) or num_hits < 0:
            raise InvalidTokenCountError(f"record_prefix_cache_stats: num_hits {num_hits!r} is not an int >= 0")
        stats = self.prefix_cache_stats
        if stats is None or not self.enable_caching or not self._reads(request):
            return
        stats.record(request.num_tokens, num_hits, request.num_preemptions > 0)

    def take_kv_cache_block_copies(self) -> tuple[list[tuple[int, int]], list[int]]:
        """Drain the copy-on-write copies of fine-grained hits (vLLM 0.26.0 on;
        see the Python manager). The core runs no configuration that makes
        copies (fine-grained hits are a feature it declines: :func:`native_unsupported`),
        so there are never any; the schedulers of 0.29.0 on call this every step.

        Raises:
            UnsupportedOperationError: Before vLLM 0.26.0.
        """
        if not self.config.profile.partial_hash_hits:
            raise UnsupportedOperationError(f"take_kv_cache_block_copies: not in {self.config.profile.name}")
        return [], []

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Take the statistics and start new ones (None unless ``log_stats``)."""
        if self.prefix_cache_stats is None:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        self._stats = self.prefix_cache_stats
        return stats

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the events (none unless ``enable_kv_cache_events``); BlockStored
        carries its group's kind and window, as the Python manager's."""
        events = self.drained_events + events_from_records(self.config, self._take_raw_events())
        self.drained_events = []
        replay_events(self.event_keys, events)
        return events

    def block_table(self, group: int = 0) -> Any:
        """The device block table of ``group`` (see :class:`kvimpl.device_tables.BlockTable`).

        Raises:
            UnsupportedOperationError: If the manager was built without a ``device``.
            GroupCountError: A group that is not one of the configuration's.
        """
        tables = self._device("block_table")
        return tables.block_table(valid_group("block_table", group, len(self.config.groups)))

    def slot_mapping(self, request_ids: Any, positions: Any, group: int = 0) -> Any:
        """Per (request, position) pair, its KV slot in ``group`` as a device tensor.

        Raises:
            UnsupportedOperationError: If the manager was built without a ``device``.
            GroupCountError: A group that is not one of the configuration's.
            InvalidRequestError: A request id that is not a str.
            InvalidTokenCountError: A position that is not an int; see also
                :meth:`kvimpl.device_tables.BlockTable.slot_mapping`.
            UnknownRequestError: A request without a row.
        """
        tables = self._device("slot_mapping")
        group = valid_group("slot_mapping", group, len(self.config.groups))
        check_slot_arguments(request_ids, positions)
        return tables.slot_mapping(request_ids, positions, group)

    def to_view(self) -> KVView:
        """The normalized observable state."""
        return native_view(self)

    def check_invariants(self) -> None:
        """Raise InvariantViolation if any invariant of the manager is broken."""
        native_invariants(self)
        if self.device_tables is not None:
            self.device_tables.check_invariants()

    def _device(self, op: str) -> Any:
        if self.device_tables is None:
            raise no_device_tables(op, "NativeKVCacheManager")
        return self.device_tables

    if TYPE_CHECKING:  # the methods of the C core

        def allocate_slots(self, request: Any, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any: ...
        def get_blocks(self, request_id: str) -> Any: ...

        _first_lookup_tokens: int


def _with_skip(request: Any, skip: bool) -> Any:
    """``request`` with its skip flag set to ``skip`` for the core's lookup
    (kvspec's values are copied; kvimpl's own requests under a profile that
    reads the hit limit are Python ones: a shallow copy with the flag set,
    the request itself unchanged).

    NOTE: only a release that reads the hit limit fixed at construction
    (vLLM 0.34.0) makes the flag differ from what the lookup must read, and
    under it kvimpl makes no C request (:attr:`RequestHasher.c_requests_fit`).
    """
    if isinstance(request, SpecRequest):
        return dataclasses.replace(request, skip_reading_prefix_cache=skip)
    flagged = copy.copy(request)  # kvimpl's Python request
    flagged.skip_reading_prefix_cache = skip
    return flagged


def manager_class(config: KVCacheConfig) -> type[KVCacheManager] | type[NativeKVCacheManager]:
    """The class :func:`create_manager` would build for ``config``."""
    if native_enabled() and native_unsupported(config) is None:
        return NativeKVCacheManager
    from kvimpl.kv_cache_manager import KVCacheManager  # noqa: PLC0415

    return KVCacheManager
