"""What kvimpl's ``KVCacheManager`` offers beyond the spec's facade.

:class:`StepAPI` is the base class of :class:`kvimpl.kv_cache_manager.KVCacheManager`
and holds everything that has no counterpart in
:mod:`kvspec.kv_cache_manager`, so that the facade module reads method for
method like the spec's:

* the batched step API (:meth:`StepAPI.allocate_slots_batch`,
  :meth:`StepAPI.free_batch`), beyond vLLM's API;
* the running-step fast path: the quiet-step limits (:meth:`StepAPI._set_quiet`,
  tested inline by ``allocate_slots``) and the one running-step tail for the
  running steps that are not quiet (:meth:`StepAPI._running_step`);
* the device block tables (:meth:`StepAPI.block_table`,
  :meth:`StepAPI.slot_mapping`, kept in step with the tables), whose tensors
  live in :mod:`kvimpl.device_tables`.

NOTE: where the time goes. With 16-token blocks, 7 in 8 one-token decode
steps change nothing (no block to take, none filling up, none leaving a
window); kvimpl answers those from three integers per request
(:meth:`StepAPI._set_quiet`) without reaching the coordinator, and runs the
other running steps of a config without Mamba or cross attention on its
managers directly, without the coordinator's per-group fan-out. Measured
(timeit, best of 15 passes over 256 running requests re-issuing a no-op
decode step, min of 8 alternating rounds, CPython 3.11 on a shared, loaded
2-core machine): 0.37 µs per ``allocate_slots`` call vs 4.8 µs for vLLM
0.25.1's (9.0 µs with full + sliding window). The block-taking and
block-filling steps (median per call, the next tokens hashed between calls)
cost about what vLLM's do: 9.9 and 10.7 µs vs 9.2 and 10.2 µs with one
full-attention group, 18.5 and 25.6 µs vs 17.2 and 24.3 µs with full +
sliding window. Whole workloads (``kvref bench --repeats 7``, same run):
2.1-2.6x vLLM's speed per allocation with full attention, 2.2-3.2x with
full + sliding window; whole decode steps: ``kvref bench --steady-decode 256``.

NOTE: the type checks every entry owes the spec (exact ``int`` counts, a
kvspec ``Request``) cost the quiet step about 0.09 µs: 0.36 vs 0.45 µs per
call in an A/B run of the harness above (best of 8 runs x 600 repeats, CPU
time, on the same loaded 2-core machine, so both figures sit above the
quieter measurement). The profile's switches cost nothing per call: the
managers read them once, when they are built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvimpl.block_pool import NULL_BLOCK, BlockPool
from kvimpl.checks import REQUEST_TYPES, check_request_id
from kvimpl.config_rules import RING_KINDS
from kvimpl.device_tables import BlockTable, check_slot_arguments, no_device_tables, valid_group
from kvimpl.kv_cache_coordinator import KVCacheCoordinator
from kvimpl.single_type_kv_cache_manager import SingleTypeKVCacheManager
from kvspec.block_pool import BlockId
from kvspec.config import ChunkedLocal, KVCacheConfig, Mamba, SlidingWindow
from kvspec.errors import InvalidTokenCountError
from kvspec.request import Request, RequestStatus
from kvspec.view import BlockIds

WATERMARKED = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
"""Statuses whose allocation must leave ``watermark_blocks`` free."""

QuietGroup = tuple[
    dict[str, list[BlockId]], dict[str, int] | None, int, SlidingWindow | ChunkedLocal | Mamba | None, int, int
]
"""What the quiet-step limits read of one group (see :meth:`StepAPI._set_quiet`): its tables, its
cache cursors (None with caching off), block size, the kind if it skips tokens, the slots its
tables hold beyond the tokens (Mamba's speculative blocks) and the tokens Mamba's skip subtracts
first (``MambaManager.skip_slack``)."""


class StepAPI:
    """The batched step API, the running-step fast path and the device tables.

    Only :class:`kvimpl.kv_cache_manager.KVCacheManager` derives from it: it
    sets the attributes annotated below, then calls ``StepAPI.__init__``.

    inv: _quiet[r] holds for request r the limits :meth:`_set_quiet` computed
         after r's last allocation; every other operation on r removes them
    """

    config: KVCacheConfig
    enable_caching: bool
    coordinator: KVCacheCoordinator
    block_pool: BlockPool
    watermark_blocks: int
    requests: dict[str, Request]

    if TYPE_CHECKING:  # defined by KVCacheManager

        def free(self, request_id: str) -> None: ...

        def allocate_slots(
            self,
            request: Request,
            num_new_tokens: int,
            num_new_computed_tokens: int = 0,
            new_computed_blocks: BlockIds | None = None,
            num_lookahead_tokens: int = 0,
        ) -> BlockIds | None: ...

        def _validate_allocation(
            self,
            request: Request,
            n_new: int,
            n_hit: int,
            hits: BlockIds | None,
            n_lookahead: int,
            n_external: int,
            n_encoder: int,
            reserved: int,
        ) -> tuple[tuple[BlockId, ...], ...]: ...

    def __init__(self, device: str | None) -> None:
        """The fast-path bookkeeping of a manager whose coordinator exists.

        Args:
            device: None keeps no tensors; "cpu" or "cuda" also maintains a
                :class:`kvimpl.device_tables.BlockTable` (needs torch).
        """
        config, coord = self.config, self.coordinator
        self._max_len = config.max_model_len
        self.skip_on_processed = config.profile.skip_on_processed_tokens
        """Profile switch: skipped blocks are freed below the computed tokens less those in flight."""
        self._no_hits: tuple[tuple[BlockId, ...], ...] = tuple(() for _ in config.groups)
        self._quiet: dict[str, tuple[int, int, int]] = {}
        """Per request, the limits below which a running step changes nothing (see :meth:`_set_quiet`)."""
        # Per group what the limits read (QuietGroup), but cross and ring groups: a ring's one
        # block, claimed by the request's first allocation, never grows, fills or leaves a window.
        # None: Mamba align state blocks move forward every step, so a config with a Mamba align
        # group gets no limits at all.
        self._quiet_groups: tuple[QuietGroup, ...] | None = tuple(
            (
                m.req_to_blocks,
                m.num_cached_block if config.enable_caching else None,
                m.block_size,
                m.kind if isinstance(m.kind, SlidingWindow | ChunkedLocal | Mamba) else None,
                m.block_size * m.kind.num_speculative_blocks if isinstance(m.kind, Mamba) else 0,
                getattr(m, "skip_slack", 0),
            )
            for m, cross in zip(coord.managers, coord.is_cross, strict=True)
            if not cross and not isinstance(m.kind, RING_KINDS)
        )
        # A group with partial-tail entries (kvimpl.partial_tail) may key a block in a step that
        # completes none, so its configs get no limits and always reach cache_blocks.
        tails = any(m.partial_tail for m in coord.managers)
        if tails or any(isinstance(kind, Mamba) and kind.mode == "align" for kind in config.groups):
            self._quiet_groups = None
        managers = coord.managers
        # Without Mamba or cross attention, running steps read and grow the managers' tables directly.
        plain = not tails and all(type(m) is SingleTypeKVCacheManager for m in managers)
        self._plain = managers if plain else ()
        self._skipping = coord.skipping
        self.device_tables: BlockTable | None = None
        if device is not None:
            self.device_tables = BlockTable.for_config(config, device)

    def allocate_slots_batch(
        self,
        requests: Sequence[Request],
        num_new_tokens: Sequence[int],
        num_lookahead_tokens: int | Sequence[int] = 0,
    ) -> list[BlockIds | None]:
        """One scheduler step for running requests (beyond vLLM's API).

        Exactly the results and side effects (block ids, free-queue order,
        events, new-block ids, partial effects of a None) of the sequential
        calls ``allocate_slots(requests[i], num_new_tokens[i],
        num_lookahead_tokens=k[i])`` in order, without prefix hits or external
        tokens. The difference: the whole batch is validated first, so a caller
        error changes no request at all.

        Args:
            requests: The requests, in scheduling order (a repeated request is
                allocated twice, as the sequential calls would).
            num_new_tokens: Per request, the tokens scheduled this step.
            num_lookahead_tokens: One lookahead count (EAGLE) for all, or one per request.

        Returns:
            Per request, the newly taken blocks per group, or None where they
            did not fit.

        Raises:
            InvalidTokenCountError: Sequences of different lengths, or a bad
                count (as ``allocate_slots``); InvalidRequestError and
                ExceedsMaxModelLenError as there.

        NOTE: after the validation pass the batch is the sequential calls,
        one after another: an allocation can evict a block another request's
        caching would have hit, so their order is observable, and the one
        quiet-step test stays inline in ``allocate_slots`` (a method call
        costs 40% of a quiet step: 0.49 vs 0.35 µs). The batch therefore buys
        validation before any change, not speed: 256 quiet steps cost 0.46
        µs per request vs 0.35 µs as sequential calls (timeit, best of 15,
        min of 8 rounds), 0.44 µs for an earlier batch with its own copy of
        the test. A version that classified the quiet steps in a NumPy pass
        was slower still (0.35 µs per request for the test alone), because
        reading the fields out of 256 Request objects costs more than the
        comparisons it vectorises.
        """
        n = len(requests)
        ks = list(num_lookahead_tokens) if isinstance(num_lookahead_tokens, Sequence) else [num_lookahead_tokens] * n
        if len(num_new_tokens) != n or len(ks) != n:
            raise InvalidTokenCountError(
                f"allocate_slots_batch: {n} requests but {len(num_new_tokens)} num_new_tokens and "
                f"{len(ks)} num_lookahead_tokens; pass one count per request"
            )
        if not n:
            return []
        # Validate everything before changing anything: the arguments allocate_slots would reject,
        # checked in one plain loop with exact types (as its fast path), then exactly on an error.
        max_len = self._max_len
        bad = False
        for r, nt, k in zip(requests, num_new_tokens, ks, strict=True):
            if type(r) not in REQUEST_TYPES or type(nt) is not int or type(k) is not int:
                bad = True
                break
            c, f = r.num_computed_tokens, r.num_in_flight_tokens
            if (
                type(c) is not int or type(f) is not int or nt <= 0 or k < 0 or c < 0 or f < 0 or c + nt > max_len
                or type(r.request_id) is not str
            ):  # fmt: skip
                bad = True
                break
        if bad:
            for r, nt, k in zip(requests, num_new_tokens, ks, strict=True):
                self._validate_allocation(r, nt, 0, None, k, 0, 0, 0)  # raises what allocate_slots would
        alloc = self.allocate_slots
        if num_lookahead_tokens == 0:  # the common case, with two arguments per call
            return [alloc(r, nt) for r, nt in zip(requests, num_new_tokens, strict=True)]
        return [alloc(r, nt, 0, None, k) for r, nt, k in zip(requests, num_new_tokens, ks, strict=True)]

    def free_batch(self, request_ids: Sequence[str]) -> None:
        """Free several requests; the same as ``free`` for each, in order,
        except that every id is checked first, so a bad one frees none.

        Raises:
            InvalidRequestError: An id that is not a str.
        """
        for rid in request_ids:
            check_request_id("free_batch", rid)
        for rid in request_ids:
            self.free(rid)

    def block_table(self, group: int = 0) -> Any:
        """The device block table of ``group`` (live rows only; see :class:`BlockTable`).

        Raises:
            UnsupportedOperationError: If the manager was built without a ``device``.
            GroupCountError: A group that is not one of the configuration's.
        """
        tables = self._device_tables("block_table")
        return tables.block_table(valid_group("block_table", group, len(self.config.groups)))

    def slot_mapping(self, request_ids: Sequence[str], positions: Sequence[int], group: int = 0) -> Any:
        """Per (request, position) pair, its KV slot in ``group`` as a device tensor.

        Raises:
            UnsupportedOperationError: If the manager was built without a ``device``.
            GroupCountError: A group that is not one of the configuration's.
            InvalidRequestError: A request id that is not a str.
            InvalidTokenCountError: A position that is not an int; see also
                :meth:`BlockTable.slot_mapping`.
            UnknownRequestError: see :meth:`BlockTable.slot_mapping`.
        """
        tables = self._device_tables("slot_mapping")
        group = valid_group("slot_mapping", group, len(self.config.groups))
        check_slot_arguments(request_ids, positions)
        return tables.slot_mapping(request_ids, positions, group)

    def _running_step(
        self,
        request: Request,
        num_new_tokens: int,
        num_lookahead_tokens: int,
        has_scheduled_reqs: bool = True,
        cache: bool = True,
    ) -> BlockIds | None:
        """``allocate_slots(request, num_new_tokens, num_lookahead_tokens=...,
        has_scheduled_reqs=..., delay_cache_blocks=not cache)`` of a running
        step that is not quiet: no hits, no external or encoder tokens, no
        reserve, no full-sequence gate, and valid counts (``num_new_tokens >
        0``, ``num_lookahead_tokens >= 0``, ``0 <= C`` and ``C +
        num_new_tokens <= max_model_len``, so ``C < max_model_len``).

        The spec's allocation with these arguments fixed: free skipped blocks,
        count the blocks to take, check the free queue, grow the tables, cache
        the blocks that filled up, and record the new quiet-step limits.

        NOTE: without Mamba or cross attention (``_plain``) the count, the
        growth test and the fill test read the managers' tables directly
        (``cdiv(slots, bs) - len(table)`` blocks for a request with a cache
        cursor; ``cache_blocks`` is a no-op unless a block fills up), and the
        tables grow without the coordinator; the calls and their order are
        the coordinator's. Otherwise the coordinator counts, grows and caches.
        """
        rid = request.request_id
        self._quiet.pop(rid, None)
        computed = request.num_computed_tokens
        main = computed + num_new_tokens
        wm = self.watermark_blocks if has_scheduled_reqs and request.status in WATERMARKED else 0
        max_len = self._max_len
        slots = main + num_lookahead_tokens
        slots = slots if slots < max_len else max_len  # min() is a call; this is the hot path
        caching, upto = cache and self.enable_caching, 0  # upto: cache up to this many tokens
        if caching:
            upto = request.num_tokens
            upto = main if main < upto else upto
        if self._skipping:
            basis = computed
            if self.skip_on_processed:  # kvimpl.kv_cache_manager.skip_basis
                basis = max(0, computed - request.num_in_flight_tokens)
            for m in self._skipping:
                m.remove_skipped_blocks(rid, basis)
        plain = self._plain
        if plain:
            need, grow, fills = 0, False, False
            for m in plain:
                bs, table = m.block_size, m.req_to_blocks.get(rid)
                have = len(table) if table is not None else 0
                required = -(slots // -bs)
                if table is None or required > have:
                    grow = True
                num_cached = m.num_cached_block.get(rid)
                if num_cached is None:
                    need += m.get_num_blocks_to_allocate(rid, slots, (), computed, main)
                    num_cached = 0
                elif required > have:
                    need += required - have
                if upto // bs > num_cached:
                    fills = True
        else:
            need = self.coordinator.get_num_blocks_to_allocate(
                rid, slots, self._no_hits, 0, computed, main, request=request
            )
            grow, fills = True, caching
        if need + wm > len(self.block_pool.free_queue):
            if self.device_tables is not None:
                self._sync_device_row(rid)
            return None
        if not grow:
            out = self._no_hits
        elif plain:
            grown = []
            for m in plain:
                grown.append(tuple(m.allocate_new_blocks(rid, slots, main)))
            out = tuple(grown)
        else:
            out = tuple([tuple(g) for g in self.coordinator.allocate_new_blocks(rid, slots, main, 0)])
        self.requests[rid] = request
        if fills:
            if len(plain) == 1:
                # the unitary coordinator's cache_blocks, one call less
                plain[0].cache_blocks(request, max(0, upto - self.coordinator.num_reprefillable_tokens))
            else:
                self.coordinator.cache_blocks(request, upto)
        if self.device_tables is not None:
            self._sync_device_row(rid)
        self._set_quiet(rid)
        return out

    def _set_quiet(self, request_id: str) -> None:
        """Record when the request's next running step stops being a no-op.

        A running step (no hits, no external or encoder tokens) with ``c``
        computed tokens, ``e = c + new`` and ``s = min(e + lookahead, L)``
        slots changes no table, no cache entry and no free-queue position when,
        in every non-cross group: ``s`` fits the table (``s <= len * bs``: no
        block to take; always, once the table covers ``L``), ``min(e,
        num_tokens)`` does not complete another block (``< (num_cached + 1) *
        bs``: nothing to cache; hybrids cache even less), and ``c`` does not
        yet skip the first real block (sliding window ``w``: ``c < (a + 1) *
        bs + w - 1`` with ``a`` leading nulls; chunked local ``k``: ``c <
        ceil((a + 1) * bs / k) * k``; Mamba all or none: ``c < (a + 1) * bs +
        1 + slack``, and its tables hold ``s`` plus its speculative blocks'
        slots). The three limits are the minima over
        groups; any other call on the request drops them. The one test of
        the limits is in ``KVCacheManager.allocate_slots``, inline.

        NOTE: the limits are sufficient conditions, not exact ones (a hybrid
        may cache less than ``min(e, num_tokens)``): a step they do not cover
        takes the ordinary path, which is exact. Configs with a Mamba align
        group never get limits (its state blocks move every step). A Mamba
        all or none group took the ordinary path on every running step
        before it had limits: pure-Python running phase on full+mamba-all
        (``kvref bench``, 200 requests, load 6.4-6.7): 37.4 µs per request-step
        against vLLM's 39.9, 15.9 against 43.7 with the limits.
        """
        groups = self._quiet_groups
        if groups is None:
            return
        slot = cache = skip = never = _NEVER
        for tables, cursors, bs, window, spare, slack in groups:
            table = tables.get(request_id)
            if not table:
                return
            n = len(table) * bs - spare
            slot = n if n < slot else slot
            if cursors is not None:
                n = (cursors.get(request_id, 0) + 1) * bs
                cache = n if n < cache else cache
            if window is not None:
                n = _skip_limit(window, bs, table, slack)
                skip = n if n < skip else skip
        self._quiet[request_id] = (slot if slot < self._max_len else never, cache, skip)

    def _forget_quiet(self, request_id: str) -> None:
        """The request's limits are stale (its tables or cache cursor may change)."""
        self._quiet.pop(request_id, None)

    def _forget_request(self, request_id: str) -> None:
        """The request holds no tables any more: no limits, no device row."""
        self._quiet.pop(request_id, None)
        if self.device_tables is not None:
            self.device_tables.remove(request_id)

    def _sync_device_row(self, request_id: str) -> None:
        """Bring the request's device rows up to date with its tables (no-op without device tables)."""
        if self.device_tables is None:
            return
        owned = [m.req_to_blocks.get(request_id) for m in self.coordinator.managers]
        if all(t is None for t in owned):
            self.device_tables.remove(request_id)
        else:
            self.device_tables.update(request_id, [t if t is not None else [] for t in owned])

    def _device_tables(self, op: str) -> BlockTable:
        if self.device_tables is None:
            raise no_device_tables(op, "KVCacheManager")
        return self.device_tables


_NEVER = 1 << 62
"""A limit no token count reaches."""


def _skip_limit(kind: SlidingWindow | ChunkedLocal | Mamba, block_size: int, table: list[BlockId], slack: int) -> int:
    """The least computed-token count at which ``remove_skipped_blocks`` would
    null out the first real block of ``table`` (sliding window, chunked local,
    Mamba all or none; tables are ``null^a real^b``), or :data:`_NEVER`.

    The window skips ``max(0, n - w + 1)`` tokens, the chunk ``n // k * k``,
    Mamba ``max(0, n - slack) - 1`` (``slack``: its speculative block count
    until vLLM 0.26.0); the first real block goes once ``(a + 1) * bs``
    tokens are skipped.
    """
    nulls = table.count(NULL_BLOCK)
    if nulls >= len(table):
        return _NEVER
    first = (nulls + 1) * block_size
    if isinstance(kind, SlidingWindow):
        return first + kind.window - 1
    if isinstance(kind, Mamba):
        return first + 1 + slack
    return -(first // -kind.chunk) * kind.chunk


def inv_device_rows_match(mgr: StepAPI) -> bool:
    """With device tables, exactly the requests holding a table have a row, and
    each row's host mirror equals the request's tables (the tensors equal the
    mirrors by :meth:`BlockTable.check_invariants`)."""
    bt = mgr.device_tables
    if bt is None:
        return True
    coord = mgr.coordinator
    holders = {r for m in coord.managers for r in m.req_to_blocks}
    if set(bt.rows) != holders:
        return False
    return all(bt.mirrors[bt.rows[rid]] == [list(g) for g in coord.get_blocks(rid)] for rid in holders)
