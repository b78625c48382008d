"""The adapter proper: kvref's facade over a real vLLM ``KVCacheManager``.

What the adapter adds on top of vLLM, and nothing more:

* **Request mirroring.** kvref passes immutable :class:`kvspec.request.Request`
  values; the adapter keeps one vLLM ``Request`` per request id, created from
  the prompt and advanced by appending output tokens one at a time (exactly
  like vLLM's scheduler), so vLLM computes every block hash itself. The
  kvspec ``block_hashes`` are never handed to vLLM.
* **Caller-error pre-validation.** kvref's contract is that a caller error
  raises the named :mod:`kvspec.errors` class before any state change. vLLM
  sometimes asserts half-way through an operation or silently corrupts its
  bookkeeping, so the adapter checks the documented caller errors against
  vLLM's own state first (the ``_check_*`` methods). Everything vLLM raises
  that is not a documented caller error propagates unchanged.
* **Process globals.** vLLM derives ``NONE_HASH`` from a process environment
  variable and reads the event hash format from another; the adapter
  re-applies its own values before each operation that may hash or emit
  events (:meth:`VllmAdapter.apply_globals`), so adapters with different seeds
  can coexist in one process. The variable names belong to the era.

Every vLLM internal is reached through the era object (:mod:`.eras`).

NOTE: The module is above the usual length because the pre-validation needs
the adapter's mirrors and tables; split off, it would reach into them.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from kvref.adapters import DeclaredSemantics
from kvspec.config import FULL_TYPE_KINDS, KVCacheConfig, cacheable_blocks, prefix_cacheable
from kvspec.errors import (
    CacheBeyondAllocationError,
    ContextParallelLookupError,
    DoubleFreeError,
    EagleAlignmentLookupError,
    ExceedsMaxModelLenError,
    GroupCountError,
    InvalidBlockIdError,
    InvalidRequestError,
    InvalidTokenCountError,
    StaleHitError,
    UnexpectedPrefixHitError,
    UnknownRequestError,
)
from kvspec.events import KVCacheEvent
from kvspec.hashing import ExtraKeySource
from kvspec.kv_cache_manager import hit_list_fits, lagging_hits_allowed
from kvspec.request import Request, RequestStatus
from kvspec.stats import PrefixCacheStats
from kvspec.view import BlockIds, KVView

from .construct import build_manager
from .eras import VllmApi
from .view import convert_event, convert_stats, group_ids, ids_of, to_view

_MAX_TOKENS: Final = 1_000_000

_STATUS_NAMES: Final[dict[RequestStatus, str]] = {
    **{status: status.name for status in RequestStatus},
    RequestStatus.FINISHED: "FINISHED_STOPPED",
}
"""kvspec request status -> vLLM ``RequestStatus`` member name."""


class _InsertionOrderedKeys(dict[Any, None]):
    """A set of cache keys that iterates in insertion order (what vLLM's
    block pool calls on a block's set of secondary keys: ``add``, iteration,
    ``in``, ``len``)."""

    def add(self, key: Any) -> None:
        self[key] = None

    def discard(self, key: Any) -> None:
        self.pop(key, None)


class _SecondaryKeysByBlock(dict[int, _InsertionOrderedKeys]):
    """vLLM's ``BlockPool.cached_block_hashes_by_block`` with insertion-ordered sets."""

    def setdefault(self, key: int, default: object = None) -> _InsertionOrderedKeys:
        if key not in self:
            self[key] = _InsertionOrderedKeys()
        return self[key]


def pin_secondary_key_order(pool: Any) -> None:
    """Give the real pool's secondary keys insertion order.

    From vLLM 0.26.0 a block's keys besides its primary one (partial-tail
    entries) live in a ``set`` per block (``cached_block_hashes_by_block``),
    and evicting, promoting or moving the block walks that set: with two
    secondary keys or more, the order of the ``BlockRemoved`` events (and of
    the keys a copy receives) follows the set's iteration order, which for
    keys of hash bytes changes with ``PYTHONHASHSEED`` from one process to
    the next. kvspec specifies insertion order, one of the orders vLLM can
    produce; so that a run against vLLM is reproducible, the adapter replaces
    that empty map by one whose sets keep insertion order (nothing else of
    the pool changes). A release without the map is left alone.
    """
    keys = getattr(pool, "cached_block_hashes_by_block", None)
    if isinstance(keys, dict) and not keys:
        pool.cached_block_hashes_by_block = _SecondaryKeysByBlock()


class VllmAdapter:
    """:class:`kvref.adapters.KVCacheAdapter` over a real vLLM ``KVCacheManager``.

    Attributes:
        name: ``"vllm"`` (a :class:`~kvref.adapters.vllm.lineage.VllmLineage` names it after its package).
        protocol_version: 2: ``free`` and ``pop_blocks_for_free`` take the request.
        config: The kvspec configuration.
        api: The era object through which every vLLM internal is reached.
        semantics: ``vllm-<installed version>``, upstream (its known defects included).
        manager: The real vLLM ``KVCacheManager`` (for debugging; do not mutate).
        construction_workaround: ``"sinkfull-ctor"`` if the SinkFull shim was
            needed to construct the manager, else None.
    """

    name: str = "vllm"
    protocol_version: int = 2

    def __init__(self, config: KVCacheConfig, api: VllmApi) -> None:
        """Build a fresh vLLM manager for ``config`` with the era ``api``.

        Raises:
            Unsupported: If ``config`` needs a parameter the release lacks.
        """
        self.config = config
        self.api = api
        self.semantics = DeclaredSemantics(profile=f"vllm-{api.version}", upstream=True)
        self._seed = config.hash_seed
        self._int_flag = "1" if config.int_block_hashes else "0"
        self._hash_fn: Any = api.hash_fn(config.hash_function)
        self._hbs = config.resolved_hash_block_size()
        self._num_blocks = config.num_blocks
        self._num_groups = len(config.groups)

        env = api.env
        os.environ[env.int_block_hashes] = self._int_flag
        os.environ[env.hash_seed] = self._seed
        api.init_none_hash(self._hash_fn)
        self._none_hash: Any = api.none_hash()
        self._hasher: Any = api.request_block_hasher(self._hbs, self._hash_fn, config.num_hash_lookahead_tokens)

        self.manager: Any
        self.construction_workaround: str | None
        self.manager, self.construction_workaround = build_manager(api, config, self._hbs)
        api.check_readable(self.manager)
        self._pool: Any = api.block_pool(self.manager)
        pin_secondary_key_order(self._pool)
        self._managers: tuple[Any, ...] = api.single_type_managers(self.manager)
        self._block_sizes: tuple[int, ...] = tuple(api.manager_block_size(m) for m in self._managers)
        self._is_cross: tuple[bool, ...] = tuple(api.is_cross_attention(m) for m in self._managers)

        self._fine_hits = self.api.partial_hash_hits(self.manager)
        """Hits may end inside a block (fine-grained hits)."""
        self._mirrors: dict[str, _Mirror] = {}
        self._last_hits: dict[str, tuple[BlockIds, Any]] = {}
        self._pending: Counter[int] = Counter()

    # ------------------------------------------------------------ driving vLLM directly

    def apply_globals(self) -> None:
        """Re-install this adapter's ``NONE_HASH`` and event-hash format.

        Call it before driving :attr:`manager` directly (as the bench does) in a
        process that may hold other vLLM adapters; the facade methods call it
        themselves.
        """
        env = os.environ
        names = self.api.env
        if env.get(names.int_block_hashes) != self._int_flag:
            env[names.int_block_hashes] = self._int_flag
        if env.get(names.hash_seed) != self._seed or self.api.none_hash() != self._none_hash:
            env[names.hash_seed] = self._seed
            self.api.init_none_hash(self._hash_fn)

    def new_vllm_request(self, request: Request) -> Any:
        """A new vLLM ``Request`` for ``request``'s prompt, hashed by vLLM's own hasher.

        The result is not mirrored: the caller owns it and advances it itself
        (output tokens, ``num_computed_tokens``, status). Call
        :meth:`apply_globals` first.

        Raises:
            ValueError: If ``request.extra.prompt_embeds`` rows are empty or ragged.
        """
        extra = request.extra
        prompt_ids: list[int] | None = list(request.all_token_ids[: request.num_prompt_tokens])
        embeds: Any = None
        if extra.prompt_embeds is not None:
            embeds = self._embeds_tensor(extra.prompt_embeds)
            prompt_ids = None
        lora = None
        if extra.lora is not None:
            # vLLM refuses an empty path; before 0.31.0 it is not hashed, so a placeholder is faithful.
            lora = (extra.lora.name, extra.lora.adapter_id, extra.lora.path or "/nonexistent")
        return self.api.new_request(
            request_id=request.request_id,
            prompt_token_ids=prompt_ids,
            prompt_embeds=embeds,
            lora=lora,
            mm_features=[(f.identifier, f.offset, f.length) for f in extra.mm_features],
            cache_salt=extra.cache_salt,
            # the sampling parameter as the request was made (its limit says it: 0 exactly when it
            # skipped reads, or, from 0.34.0 on, asked for prompt logprobs from row 0); a later
            # change of the flag is the scheduler's, applied by _sync where the release reads it
            skip_reading_prefix_cache=request.prefix_cache_hit_limit == 0,
            max_tokens=_MAX_TOKENS,
            block_hasher=self._hasher,
            prompt_logprobs=request.prompt_logprobs,
            prompt_logprob_start=request.prompt_logprob_start,
            report_mode=request.kv_cache_report_mode,
        )

    def vllm_status(self, name: str) -> Any:
        """vLLM's ``RequestStatus`` member ``name`` (e.g. ``"RUNNING"``)."""
        return self.api.status(name)

    # ------------------------------------------------------------ requests

    def _embeds_tensor(self, rows: tuple[bytes, ...]) -> Any:
        """A float16 ``(n, len(row) // 2)`` tensor whose bytes are the rows'."""
        if not rows:
            raise ValueError("prompt_embeds has no rows")
        width = len(rows[0])
        if any(len(r) != width for r in rows):
            raise ValueError("prompt_embeds rows must all have the same length")
        # An odd row length cannot be float16; the era falls back to uint8 (same bytes).
        return self.api.embeds_tensor(bytearray(b"".join(rows)), len(rows), width)

    def _sync(self, request: Request) -> Any:
        """The vLLM request for ``request``, advanced to match it."""
        rid = request.request_id
        tokens = request.all_token_ids
        mirror = self._mirrors.get(rid)
        if mirror is not None and mirror.tokens is not tokens:
            have = len(mirror.tokens)
            if (
                mirror.num_prompt_tokens != request.num_prompt_tokens
                or len(tokens) < have
                or tokens[:have] != mirror.tokens
                or (mirror.extra is not request.extra and mirror.extra != request.extra)
                or getattr(mirror.vreq, "kv_cache_report_mode", "incremental") != request.kv_cache_report_mode
            ):
                mirror = None  # a different request reusing the id
                self._last_hits.pop(rid, None)
        if mirror is None:
            mirror = _Mirror(
                vreq=self.new_vllm_request(request),
                tokens=tokens[: request.num_prompt_tokens],
                num_prompt_tokens=request.num_prompt_tokens,
                extra=request.extra,
            )
            self._mirrors[rid] = mirror
        vreq = mirror.vreq
        if mirror.tokens is not tokens:
            # One token at a time, like the scheduler: each call runs the hasher.
            for tok in tokens[len(mirror.tokens) :]:
                self.api.append_output_token(vreq, tok)
            mirror.tokens = tokens
        self.api.set_request_state(
            vreq,
            num_computed_tokens=request.num_computed_tokens,
            status=self.api.status(_STATUS_NAMES[request.status]),
            num_preemptions=request.num_preemptions,
            skip_reading_prefix_cache=request.skip_reading_prefix_cache,
            num_in_flight_tokens=request.num_in_flight_tokens,
        )
        return vreq

    def _ref(self, request_id: str) -> Any:
        mirror = self._mirrors.get(request_id)
        return mirror.vreq if mirror is not None else _RidOnly(request_id)

    def _forget(self, request_id: str) -> None:
        self._mirrors.pop(request_id, None)
        self._last_hits.pop(request_id, None)

    # ------------------------------------------------------------ state queries

    def _table_len(self, group: int, request_id: str) -> int:
        table = self.api.req_to_blocks(self._managers[group]).get(request_id)
        return 0 if table is None else len(table)

    def _has_table(self, request_id: str) -> bool:
        return any(self._table_len(g, request_id) for g in range(self._num_groups))

    def _is_allocated(self, request_id: str) -> bool:
        return self._has_table(request_id) or any(request_id in self.api.num_cached_block(m) for m in self._managers)

    def _group_hashes(self, vreq: Any, group: int) -> list[Any]:
        """The request's block hashes at group ``group``'s block size."""
        return self.api.block_hashes(vreq, self._hbs, self._block_sizes[group])

    def _check_block_ids(self, ids: Iterable[int]) -> None:
        for i in ids:
            if not 0 <= i < self._num_blocks:
                raise InvalidBlockIdError(f"block id {i} is outside 0 .. {self._num_blocks - 1}")

    # ------------------------------------------------------------ facade

    def get_computed_blocks(self, request: Request, max_cache_hit_length: int | None = None) -> tuple[BlockIds, int]:
        """Longest prefix-cache hit (no state change), at most
        ``max_cache_hit_length`` tokens where the release takes that bound.

        Raises:
            Unsupported: ``max_cache_hit_length`` on a release without it.
            InvalidTokenCountError: ``max_cache_hit_length`` is not None or an
                int >= 0 (checked before vLLM is called, which would take it).
            ContextParallelLookupError: Where vLLM's lookup asserts that the
                kind does not support DCP or PCP (it asserts before any change).
            EagleAlignmentLookupError: Where vLLM 0.16.0's sliding-window
                lookup asserts that an EAGLE hit's group has the scheduler
                block size (before any change).
        """
        bound = max_cache_hit_length
        ids, (num_tokens,) = self._look_up(
            "get_computed_blocks", request, bound, lambda vreq: self.api.get_computed_blocks(self.manager, vreq, bound)
        )
        return ids, int(num_tokens)

    def _look_up(
        self, op: str, request: Request, bound: int | None, call: Callable[[Any], tuple[Any, ...]]
    ) -> tuple[BlockIds, tuple[Any, ...]]:
        """One of vLLM's lookups (``call`` on the request's vLLM request, which
        answers its blocks first): the bound checked before vLLM is called (a
        release that takes one would take a bad one), vLLM's assertions of a
        lookup it refuses turned into the protocol's errors, the hit blocks
        kept for the allocation that takes them. The hit's block ids and the
        rest of vLLM's answer.

        Raises:
            InvalidTokenCountError: ``bound`` is not None or an int >= 0.
            EagleAlignmentLookupError, ContextParallelLookupError: As :meth:`get_computed_blocks`.
        """
        bad_bound = not isinstance(bound, int) or isinstance(bound, bool) or bound < 0
        if bound is not None and self.api.hit_length_bound and bad_bound:
            raise InvalidTokenCountError(f"{op}: max_cache_hit_length {bound!r} is not an int >= 0")
        self.apply_globals()
        try:
            blocks, *rest = call(self._sync(request))
        except AssertionError as exc:
            if str(exc).startswith("aligned_length is not compatible with eagle"):
                raise EagleAlignmentLookupError(f"{op}: {exc}") from exc
            if not str(exc).startswith(("DCP not support", "PCP not support")):
                raise
            raise ContextParallelLookupError(f"{op}: {exc}") from exc
        ids = group_ids(self.api, blocks)
        self._last_hits[request.request_id] = (ids, blocks)
        return ids, tuple(rest)

    def get_computed_blocks_for_connector(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[BlockIds, int, bool]:
        """A KV connector's local lookup (the 0.27 era on; no state change):
        the hit lists, the hit length and whether a group lags behind it.

        Raises:
            Unsupported: Before the 0.27 era; a bound on a release without it.
            InvalidTokenCountError, ContextParallelLookupError: As :meth:`get_computed_blocks`.
        """
        bound = max_cache_hit_length
        ids, (num_tokens, diverged) = self._look_up(
            "get_computed_blocks_for_connector", request, bound,
            lambda vreq: self.api.get_computed_blocks_for_connector(self.manager, vreq, bound),
        )  # fmt: skip
        return ids, int(num_tokens), bool(diverged)

    def truncate_computed_blocks(self, blocks: Sequence[Sequence[int]], num_computed_tokens: int) -> BlockIds:
        """vLLM's slicing of a lookup's result (the 0.27 era on), given block
        ids per group. Caller errors are raised before vLLM is called; where
        vLLM asserts that the length does not fit a group (a length that is
        not a multiple of its block size, or past its list), the assertion
        becomes InvalidTokenCountError.

        Raises:
            Unsupported: Before the 0.27 era.
            InvalidTokenCountError, GroupCountError, InvalidBlockIdError, StaleHitError:
                As kvspec's ``truncate_computed_blocks``.
        """
        n = num_computed_tokens
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise InvalidTokenCountError(f"truncate_computed_blocks: num_computed_tokens {n!r} is not an int >= 0")
        if len(blocks) != self._num_groups:
            raise GroupCountError(f"truncate_computed_blocks: {len(blocks)} groups, the config has {self._num_groups}")
        for group in blocks:
            self._check_block_ids(group)
        for g, kind in enumerate(self.config.groups):
            if not prefix_cacheable(kind) and blocks[g]:
                raise StaleHitError(f"truncate_computed_blocks: blocks for group {g}, a ring group (never cached)")
        pool_blocks = self.api.pool_blocks(self._pool)
        given = self.api.kv_cache_blocks([pool_blocks[i] for i in g] for g in blocks)
        try:
            out = self.api.truncate_computed_blocks(self.manager, given, n)
        except AssertionError as exc:
            raise InvalidTokenCountError(f"truncate_computed_blocks: {n} tokens do not fit a group ({exc})") from exc
        return group_ids(self.api, out)

    def get_prefix_hint(self, request: Request) -> int:
        """The scheduler's prefix hint after ``request``'s lookup (:meth:`VllmApi.prefix_hint`).

        Raises:
            Unsupported: On releases without the hint.
        """
        vreq = self._sync(request)
        return self.api.prefix_hint(self.manager, vreq)

    def get_num_cached_tokens(self, request: Request) -> int:
        """How many leading tokens a lookup would hit now (vLLM 0.34.0 on).

        Raises:
            Unsupported: On releases without the method.
            ContextParallelLookupError: As :meth:`get_computed_blocks`.
        """
        self.apply_globals()
        vreq = self._sync(request)
        try:
            return self.api.get_num_cached_tokens(self.manager, vreq)
        except AssertionError as exc:
            if not str(exc).startswith(("DCP not support", "PCP not support")):
                raise
            raise ContextParallelLookupError(f"get_num_cached_tokens: {exc}") from exc

    def estimate_cached_tokens(self, request: Request) -> int:
        """The prefix length ``request``'s cached blocks stand for.

        Raises:
            Unsupported: Before the 0.26 era.
        """
        if "estimate_cached_tokens" in self.api.missing_methods:
            raise self.api.unsupported("KVCacheManager.estimate_cached_tokens")
        return self.api.estimate_cached_tokens(self.manager, self._sync(request))

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        """Record a lookup in the prefix-cache statistics, as vLLM's scheduler does at admission.

        Raises:
            Unsupported: On releases whose lookup records the statistics itself.
            InvalidTokenCountError: ``num_hits`` is not an int >= 0 (checked before vLLM is called).
        """
        if self.api.caller_records_stats and (
            not isinstance(num_hits, int) or isinstance(num_hits, bool) or num_hits < 0
        ):
            raise InvalidTokenCountError(f"num_hits {num_hits!r} is not an int >= 0")
        vreq = self._sync(request)
        self.api.record_prefix_cache_stats(self.manager, vreq, num_hits)

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: BlockIds | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: Sequence[int] = (),
    ) -> BlockIds | None:
        """Blocks newly allocated per group, or None if they do not fit.

        Raises:
            Unsupported: A keyword the release lacks, given a value other than
                "not used" (checked first, as kvspec does).
            GroupCountError: ``skip_zeroing_group_ids`` is not a collection of
                the model's group ids (vLLM would ignore an unknown id).
        """
        self.apply_globals()
        if not isinstance(skip_zeroing_group_ids, list | tuple):
            shown = skip_zeroing_group_ids
            raise GroupCountError(f"allocate_slots: skip_zeroing_group_ids {shown!r} is not a collection of group ids")
        skip = tuple(skip_zeroing_group_ids)
        if skip and "skip_zeroing_group_ids" not in self.api.allocate_args:
            raise self.api.unsupported("KVCacheManager.allocate_slots(skip_zeroing_group_ids=...)", f"asked for {skip}")
        for g in skip:
            if isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < self._num_groups:
                raise GroupCountError(f"allocate_slots: skip_zeroing_group_ids names {g!r}, not a group of this model")
        vreq = self._sync(request)
        rid = request.request_id
        hits: BlockIds | None = None if new_computed_blocks is None else tuple(tuple(g) for g in new_computed_blocks)
        self._check_allocate(
            request,
            num_new_tokens,
            num_new_computed_tokens,
            hits,
            num_lookahead_tokens,
            num_external_computed_tokens,
            num_encoder_tokens,
            reserved_blocks,
        )
        self._check_allocate_hits(vreq, rid, hits, num_new_computed_tokens)
        ncb: Any = None
        if hits is not None and any(hits):
            last = self._last_hits.get(rid)
            if last is not None and last[0] == hits:
                ncb = last[1]  # the very object vLLM returned (identity matters)
            else:
                pool_blocks = self.api.pool_blocks(self._pool)
                ncb = self.api.kv_cache_blocks([pool_blocks[i] for i in g] for g in hits)
        result = self.api.allocate_slots(
            self.manager,
            vreq,
            num_new_tokens,
            {
                "num_new_computed_tokens": num_new_computed_tokens,
                "new_computed_blocks": ncb,
                "num_lookahead_tokens": num_lookahead_tokens,
                "num_external_computed_tokens": num_external_computed_tokens,
                "delay_cache_blocks": delay_cache_blocks,
                "num_encoder_tokens": num_encoder_tokens,
                "full_sequence_must_fit": full_sequence_must_fit,
                "reserved_blocks": reserved_blocks,
                "has_scheduled_reqs": has_scheduled_reqs,
                "skip_zeroing_group_ids": skip,
            },
        )
        if result is None:
            return None
        self._last_hits.pop(rid, None)
        return group_ids(self.api, result)

    def _check_allocate(
        self,
        request: Request,
        n: int,
        h: int,
        hits: BlockIds | None,
        k: int,
        e: int,
        enc: int,
        reserved: int,
    ) -> None:
        """Caller errors of ``allocate_slots`` that need no hit lookup, in kvref's precedence order."""
        c = request.num_computed_tokens
        counts = {
            "num_new_tokens": n,
            "num_new_computed_tokens": h,
            "num_lookahead_tokens": k,
            "num_external_computed_tokens": e,
            "num_encoder_tokens": enc,
            "reserved_blocks": reserved,
            "request.num_computed_tokens": c,
            "request.num_in_flight_tokens": request.num_in_flight_tokens,
        }
        for what, value in counts.items():
            if value < 0:
                raise InvalidTokenCountError(f"{what} is negative ({value})")
        if n == 0 and e == 0:
            raise InvalidTokenCountError(
                "num_new_tokens must be greater than 0 when there are no external computed tokens"
            )
        if hits is not None and len(hits) != self._num_groups:
            raise GroupCountError(f"new_computed_blocks has {len(hits)} groups, the config has {self._num_groups}")
        max_len = self.config.max_model_len
        rid = request.request_id
        if c + h + e + n > max_len:
            raise ExceedsMaxModelLenError(
                f"request {rid!r}: {c} computed + {h} hit + {e} external + "
                f"{n} new tokens exceed max_model_len {max_len}"
            )
        has_hits = hits is not None and any(hits)
        if (has_hits or e > 0) and self._is_allocated(rid):
            raise UnexpectedPrefixHitError(
                f"request {rid!r} already holds blocks; prefix hits and external tokens "
                "are only accepted on its first allocation"
            )

    def _check_allocate_hits(self, vreq: Any, rid: str, hits: BlockIds | None, n_hit: int) -> None:
        """Caller errors of the hits passed to ``allocate_slots`` (after :meth:`_check_allocate`)."""
        if hits is None or not any(hits):
            return
        for group in hits:
            self._check_block_ids(group)
        # vLLM asserts on hits with caching off and accepts a null block in a
        # full-attention hit (leaving a table no hit search could produce): both are
        # caller errors in the protocol (kvspec's _validate_hits).
        if not self.config.enable_caching:
            raise StaleHitError(f"request {rid!r}: prefix caching is off, so it can have no hit")
        for g, kind in enumerate(self.config.groups):
            if not prefix_cacheable(kind) and hits[g]:
                raise StaleHitError(f"request {rid!r}: a hit in group {g}, a ring group, which is never cached")
            if isinstance(kind, FULL_TYPE_KINDS) and 0 in hits[g]:
                raise StaleHitError(f"request {rid!r}: the null block in group {g}'s full-attention hit")
        # vLLM accepts hit lists that do not cover the hit tokens (it then counts tokens no block
        # holds as computed); no lookup returns one, so the protocol makes it a caller error.
        lagging = lagging_hits_allowed(self.config)
        for g, (kind, bs) in enumerate(zip(self.config.groups, self._block_sizes, strict=True)):
            need = -(-n_hit // bs)
            if prefix_cacheable(kind) and not hit_list_fits(kind, len(hits[g]), need, lagging):
                raise StaleHitError(
                    f"request {rid!r}: group {g}'s hit has {len(hits[g])} blocks, but {n_hit} hit tokens take {need} "
                    f"(block size {bs}): get_computed_blocks never returns such a hit"
                )
        blocks = self.api.pool_blocks(self._pool)
        fine = list(self.api.block_hashes(vreq, self._hbs, self._hbs))
        for g, group in enumerate(hits):
            if not any(group):
                continue
            hashes = self._group_hashes(vreq, g)
            per = self._block_sizes[g] // self._hbs
            for i, bid in enumerate(group):
                if bid == 0:
                    continue
                expected = [hashes[i]] if i < len(hashes) else []
                if self._fine_hits and i == len(group) - 1:
                    # The last block of a fine-grained hit may be cached at a hash boundary inside it.
                    expected += fine[i * per : min((i + 1) * per - 1, len(fine))]
                keys = self.api.block_keys(self._pool, blocks[bid])
                if not any(self.api.block_key(h, g) in keys for h in expected):
                    raise StaleHitError(
                        f"request {rid!r}: block {bid} (group {g}, index {i}) is no longer "
                        "cached under the hash the request expects"
                    )

    def free(self, request: Request | str) -> None:
        """Free every block of the request, each group's table reversed
        (protocol 2: the request, as vLLM's ``free(request)``; an id works too)."""
        request_id = request if isinstance(request, str) else request.request_id
        self.api.free(self.manager, self._ref(request_id))
        self._forget(request_id)

    def pop_blocks_for_free(self, request: Request | str) -> tuple[int, ...]:
        """Drop the request's bookkeeping; return its blocks, groups concatenated
        (the request or its id, as for :meth:`free`)."""
        request_id = request if isinstance(request, str) else request.request_id
        ids = ids_of(self.api, self.api.pop_blocks_for_free(self.manager, self._ref(request_id)))
        self._pending.update(i for i in ids if i != 0)
        self._forget(request_id)
        return ids

    def free_blocks(self, block_ids: Sequence[int]) -> None:
        """Deferred free of popped blocks (upstream: ``block_pool.free_blocks``)."""
        ids = list(block_ids)
        self._check_block_ids(ids)
        wanted = Counter(i for i in ids if i != 0)
        for bid, times in sorted(wanted.items()):
            if self._pending[bid] < times:
                raise DoubleFreeError(
                    f"block {bid} freed {times} time(s) but only {self._pending[bid]} "
                    "pending reference(s) came from pop_blocks_for_free"
                )
        blocks = self.api.pool_blocks(self._pool)
        self.api.free_pool_blocks(self._pool, [blocks[i] for i in ids])
        self._pending.subtract(wanted)
        for bid in wanted:
            if self._pending[bid] <= 0:
                del self._pending[bid]

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Free blocks no longer needed by attention (outside the window)."""
        if total_computed_tokens < 0:
            raise InvalidTokenCountError(f"total_computed_tokens is negative ({total_computed_tokens})")
        self.api.remove_skipped_blocks(self.manager, request_id, total_computed_tokens, num_prompt_tokens)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the given blocks from the prefix cache, ascending id order."""
        ids = sorted(set(block_ids))
        self._check_block_ids(ids)
        self.apply_globals()
        for bid in ids:
            # vLLM iterates a set (undefined order); kvref fixes ascending order.
            self.api.evict_blocks(self.manager, {bid})

    def reset_prefix_cache(self) -> bool:
        """Clear the prefix cache if only the null block is in use."""
        self.apply_globals()
        return self.api.reset_prefix_cache(self.manager)

    def get_num_common_prefix_blocks(self, request_id: str) -> tuple[int, ...]:
        """Common-prefix block count per group.

        Raises:
            Unsupported: On releases without the method (0.34.0 on).
        """
        if "get_num_common_prefix_blocks" in self.api.missing_methods:
            raise self.api.unsupported("KVCacheManager.get_num_common_prefix_blocks")
        if not self._has_table(request_id):
            # vLLM would create a phantom (empty) table that skews later answers.
            raise UnknownRequestError(f"request {request_id!r} holds no blocks")
        return self.api.get_num_common_prefix_blocks(self.manager, request_id)

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the event queue (BlockStored annotated with kind and window)."""
        return [convert_event(self.api, ev) for ev in self.api.take_events(self.manager)]

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Hash the request's full blocks up to ``num_computed_tokens``."""
        if not self.config.enable_caching:
            return  # vLLM ignores the call
        self.apply_globals()
        vreq = self._sync(request)
        n = num_computed_tokens
        if n < 0:
            raise InvalidTokenCountError(f"num_computed_tokens is negative ({n})")
        num_tokens = self.api.num_tokens(vreq)
        if n > num_tokens:
            raise CacheBeyondAllocationError(
                f"request {request.request_id!r}: cannot cache {n} tokens, it has {num_tokens}"
            )
        for g in range(self._num_groups):
            # vLLM would cache a Mamba group's speculative blocks as states no token filled;
            # ring and cross groups cache nothing (vLLM's cache_blocks is a no-op there)
            have = cacheable_blocks(self.config.groups[g], self._table_len(g, request.request_id))
            if have is not None and n // self._block_sizes[g] > have:
                raise CacheBeyondAllocationError(
                    f"request {request.request_id!r}: {n} tokens need "
                    f"{n // self._block_sizes[g]} blocks in group {g}, it holds {have} for tokens"
                )
        self.api.cache_blocks(self.manager, vreq, n)

    def take_new_block_ids(self) -> list[int]:
        """Drain the ids of fresh full-attention blocks."""
        return self.api.take_new_block_ids(self.manager)

    def take_kv_cache_block_copies(self) -> tuple[list[tuple[int, int]], list[int]]:
        """Drain the copy-on-write copies; the retained ids are pending until
        passed to :meth:`free_blocks` (as the scheduler releases them).

        Raises:
            Unsupported: Before vLLM 0.26.0.
        """
        copies, retained = self.api.take_kv_cache_block_copies(self.manager)
        self._pending.update(b for b in retained if b != 0)
        return copies, retained

    def new_step_starts(self) -> None:
        """A scheduler step begins."""
        self.api.new_step_starts(self.manager)

    def get_block_ids(self, request_id: str) -> BlockIds:
        """The request's tables (empty per group if unknown)."""
        return self.api.get_block_ids(self.manager, request_id)

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """List the request's blocks from ``start_token`` on for zeroing again.

        Raises:
            Unsupported: Before the 0.26 era.
            InvalidRequestError: ``request_id`` is not a str.
            InvalidTokenCountError: ``start_token`` is not an int >= 0, or not a
                multiple of the block size of a group that lists fresh blocks
                (checked before vLLM is called: vLLM asserts the alignment group
                by group, after listing the blocks of the groups before).
        """
        if "record_blocks_for_zeroing" in self.api.missing_methods:
            raise self.api.unsupported("KVCacheManager.record_blocks_for_zeroing")
        if not isinstance(request_id, str):
            raise InvalidRequestError(f"record_blocks_for_zeroing: request_id must be a str, got {request_id!r}")
        n = start_token
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidTokenCountError(f"record_blocks_for_zeroing: start_token {n!r} is not an int >= 0")
        for g, mgr in enumerate(self._managers):
            if getattr(mgr, "records_new_block_ids", False) and n % self._block_sizes[g]:
                raise InvalidTokenCountError(
                    f"record_blocks_for_zeroing: start_token {n} is not a multiple of group {g}'s block size "
                    f"{self._block_sizes[g]}"
                )
        self.api.record_blocks_for_zeroing(self.manager, request_id, n)

    def get_zeroing_block_ids_in_range(self, request_id: str, start_token: int, end_token: int) -> list[int]:
        """The request's block ids over ``[start_token, end_token)`` in the
        groups that list fresh blocks.

        NOTE: vLLM reads the request's tables through a defaultdict, so asking
        for an unknown request would add an empty entry for it; the adapter
        answers that case (an empty list) without calling vLLM.

        Raises:
            Unsupported: Outside the 0.26 to 0.31 releases.
            InvalidRequestError: ``request_id`` is not a str.
            InvalidTokenCountError: ``start_token`` is not an int >= 0, or
                ``end_token`` not an int >= ``start_token``.
        """
        op = "get_zeroing_block_ids_in_range"
        if op in self.api.missing_methods:
            raise self.api.unsupported(f"KVCacheManager.{op}")
        if not isinstance(request_id, str):
            raise InvalidRequestError(f"{op}: request_id must be a str, got {request_id!r}")
        s, e = start_token, end_token
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise InvalidTokenCountError(f"{op}: start_token {s!r} is not an int >= 0")
        if isinstance(e, bool) or not isinstance(e, int) or e < s:
            raise InvalidTokenCountError(f"{op}: end_token {e!r} is not an int >= start_token {s}")
        if not any(request_id in getattr(mgr, "req_to_blocks", {}) for mgr in self._managers):
            return []
        return self.api.get_zeroing_block_ids_in_range(self.manager, request_id, s, e)

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int) -> BlockIds:
        """The request's tables cut to its computed tokens.

        Raises:
            Unsupported: Before the 0.25 era.
            InvalidTokenCountError: ``num_computed_tokens`` is not an int >= 0
                (vLLM's slice would count a negative one from the end).
        """
        n = num_computed_tokens
        if "get_block_ids_for_computed_tokens" in self.api.missing_methods:
            raise self.api.unsupported("KVCacheManager.get_block_ids_for_computed_tokens")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidTokenCountError(
                f"get_block_ids_for_computed_tokens: num_computed_tokens {n!r} is not an int >= 0"
            )
        return self.api.get_block_ids_for_computed_tokens(self.manager, request_id, n)

    @property
    def usage(self) -> float:
        """Fraction of non-null blocks in use."""
        return self.api.usage(self.manager)

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Take the prefix-cache statistics (None unless ``log_stats``)."""
        return convert_stats(self.api.make_prefix_cache_stats(self.manager))

    def to_view(self) -> KVView:
        """The normalized observable state."""
        return to_view(self.api, self._pool, self._managers)


@dataclass(slots=True)
class _RidOnly:
    """Stand-in for a vLLM ``Request`` where vLLM only reads ``request_id``."""

    request_id: str


@dataclass(slots=True)
class _Mirror:
    """The vLLM request mirroring one kvspec request id."""

    vreq: Any
    tokens: tuple[int, ...]  # the kvspec all_token_ids last synced
    num_prompt_tokens: int
    extra: ExtraKeySource
