"""``--target impl-batch``: kvimpl's per-request calls routed through its batch API.

kvimpl's pure-Python ``KVCacheManager`` adds what vLLM's manager does not
have: a batched step API (``allocate_slots_batch``, ``free_batch``) and
device block tables (``block_table``, ``slot_mapping``; see
:mod:`kvimpl.step_api`). The lockstep speaks vLLM's per-request protocol, so
this adapter turns the machine's per-request calls into batches: every
``allocate_slots`` the batch API accepts (no prefix hits, no external or
encoder tokens, no reserve, caching not delayed, the default
``has_scheduled_reqs`` and full-sequence gate) and every ``free`` go through
``allocate_slots_batch`` / ``free_batch``, in one of several forms chosen
per call from a counter (so a trace replays the same forms):

* the plain one-item batch (a scalar lookahead count, or one per item);
* an empty batch first (it must return ``[]`` and change nothing);
* the item with a malformed one after it (in turn: zero tokens, a count
  that is not an int, a request that is not one, one count too many; a
  request id that is not a str for ``free_batch``): the batch must raise a
  typed error and change nothing, and then the item runs alone;
* the item twice (a duplicate request): the second run of a step the first
  already ran must take nothing (empty per group, or None where the first
  did not fit) and leave the state as the one call did, which the lockstep
  then compares with the reference's single call.

Everything else goes to the per-request call unchanged, so invalid calls still
raise through the batch validator when they are batchable, and through
``allocate_slots`` otherwise. The outcome the lockstep compares with the
reference is the item's own.

The device tables (built on the CPU, one row and one column per group to
start with, so that they grow as the run goes) are checked after every change, by
:meth:`BatchImplAdapter.check_invariants`: the manager's own invariants (host
rows equal the tables), then ``block_table(g)`` row by row against
``get_blocks``, ``slot_mapping`` of the first and last slot of each table
against ``block_id * block_size + offset``, and the typed errors of a group
out of range, a request without a row, a position past the table, a
non-int position and unequal lengths; ``row_of`` and
``slot_mapping_for_step`` (every input form) against the same slots.

NOTE: the adapter derives from :class:`kvref.adapters.impl.ImplAdapter`, so
the kit still imports kvimpl in one module only.

An :class:`AssertionError` from this adapter is a batch entry point or a
device table disagreeing with the per-request calls: the lockstep reports it
as an invariant failure of ``impl-batch``.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kvref.adapters.impl import ImplAdapter, make_impl_python_adapter
from kvref.capabilities import OPT_IN_FEATURES, declare
from kvspec.config import KVCacheConfig
from kvspec.errors import (
    GroupCountError,
    InvalidRequestError,
    InvalidTokenCountError,
    KVCacheError,
    UnknownRequestError,
)
from kvspec.request import Request
from kvspec.view import BlockIds

FORMS = ("plain", "listed", "empty_first", "zero_tail", "twice", "plain")
"""The batch forms, in the order the call counter walks them (``plain`` twice: the common case)."""


class BatchImplAdapter(ImplAdapter):
    """kvimpl's pure-Python manager with device tables, driven through its batch API."""

    name = "impl-batch"

    def __init__(self, config: KVCacheConfig) -> None:
        """A manager keeping device tables on the CPU (needs torch)."""
        super().__init__(config, device="cpu")
        # Tables of one row and one column per group, so that every growth path (more live
        # requests than rows, a table wider than the tensor) runs at the machine's small scale.
        bt = self.device_tables
        if bt is not None:
            self.device_tables = type(bt)(bt.block_sizes, [1] * len(bt.block_sizes), 1, "cpu")
        self._calls = 0
        self._inside = False
        """True while a batch entry point runs: its own per-request calls go straight through."""

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
    ) -> BlockIds | None:
        """The per-request call, through ``allocate_slots_batch`` where it accepts it."""
        no_hits = new_computed_blocks is None or (
            len(new_computed_blocks) == len(self.config.groups) and not any(new_computed_blocks)
        )
        zeros = (num_new_computed_tokens, num_external_computed_tokens, num_encoder_tokens, reserved_blocks)
        # Exact types: a caller error in these arguments must reach allocate_slots' own validation.
        batchable = (
            no_hits and all(type(v) is int and v == 0 for v in zeros) and delay_cache_blocks is False
            and full_sequence_must_fit is False and has_scheduled_reqs is True
        )  # fmt: skip
        if not batchable or self._inside:
            return super().allocate_slots(
                request, num_new_tokens, num_new_computed_tokens, new_computed_blocks, num_lookahead_tokens,
                num_external_computed_tokens, delay_cache_blocks, num_encoder_tokens, full_sequence_must_fit,
                reserved_blocks, has_scheduled_reqs,
            )  # fmt: skip
        with self._batch():
            return self._allocate(request, num_new_tokens, num_lookahead_tokens)

    def _allocate(self, request: Request, num_new_tokens: int, k: int) -> BlockIds | None:
        form = self._form()
        if form == "empty_first":
            self._unchanged_by(
                lambda: _expect(self.allocate_slots_batch([], []) == [], "an empty batch returned items")
            )
        elif form == "zero_tail":
            self._refused(lambda: self.allocate_slots_batch(*self._malformed(request, num_new_tokens), k))
        if form == "listed":
            return self.allocate_slots_batch([request], [num_new_tokens], [k])[0]
        if form != "twice":
            return self.allocate_slots_batch([request], [num_new_tokens], k)[0]
        first, again = self.allocate_slots_batch([request, request], [num_new_tokens, num_new_tokens], [k, k])
        # The repeat may not fit where the first did (the watermark still applies), but it takes nothing.
        _expect(again is None or not any(again), f"a repeated step took {again}")
        return first

    def free(self, request_id: str) -> None:
        """The per-request call, through ``free_batch``."""
        if self._inside:
            super().free(request_id)
            return
        with self._batch():
            self._free(request_id)

    def _free(self, request_id: str) -> None:
        form = self._form()
        if form == "empty_first":
            self._unchanged_by(lambda: self.free_batch([]))
        elif form == "zero_tail" and isinstance(request_id, str):
            self._refused(lambda: self.free_batch([request_id, 7]))  # type: ignore[list-item]  # a malformed id on purpose
        if form == "twice" and isinstance(request_id, str):
            self.free_batch([request_id, request_id])  # the second finds nothing to free
            return
        self.free_batch([request_id])

    def check_invariants(self) -> None:
        """The manager's invariants, then the device tables against the tables."""
        super().check_invariants()
        check_device_tables(self)

    def _malformed(self, request: Request, n: int) -> tuple[list[Any], list[Any]]:
        """A batch whose last item (or shape) allocate_slots_batch must refuse, in turn: a
        zero-token item, a count that is not an int, a request that is not one, one count too many."""
        which = self._calls // len(FORMS) % 4
        if which == 0:
            return [request, request], [n, 0]
        if which == 1:
            return [request, request], [n, 1.5]
        if which == 2:
            return [request, "not a request"], [n, n]
        return [request], [n, n]

    @contextmanager
    def _batch(self) -> Iterator[None]:
        self._inside = True
        try:
            yield
        finally:
            self._inside = False

    def _form(self) -> str:
        self._calls += 1
        return FORMS[self._calls % len(FORMS)]

    def _unchanged_by(self, call: Any) -> None:
        """Run ``call``; the view must not move."""
        before = self.to_view()
        call()
        _expect(self.to_view() == before, "a batch that should change nothing changed the state")

    def _refused(self, call: Any) -> None:
        """``call`` must raise a typed error and change nothing."""
        before = self.to_view()
        try:
            call()
        except KVCacheError:
            # The malformed item's error, or (an invalid call) the item's own, which the real
            # call after this raises again for the lockstep to compare.
            _expect(self.to_view() == before, "a refused batch changed the state")
            return
        raise AssertionError("a batch with a malformed item was accepted")


def check_device_tables(mgr: ImplAdapter) -> None:
    """``block_table`` and ``slot_mapping`` agree with ``get_blocks`` (see the module docstring).

    Raises:
        AssertionError: On the first disagreement.
    """
    groups = len(mgr.config.groups)
    # A table entry covers the manager's block size: the context-parallel
    # scaled one (kvspec's manager_groups), as the tables are counted in it.
    sizes = [k.block_size for k in mgr.config.manager_groups()]
    holders = sorted({r for m in mgr.coordinator.managers for r in m.req_to_blocks})
    rows = mgr.device_tables.rows if mgr.device_tables is not None else {}
    _expect(sorted(rows) == holders, f"device rows {sorted(rows)} but requests holding tables {holders}")
    for g in range(groups):
        bs = sizes[g]
        table = mgr.block_table(g).tolist()
        _expect(len(table) == len(holders), f"group {g}: {len(table)} device rows for {len(holders)} requests")
        rids, positions, want = [], [], []
        for rid in holders:
            ids: list[int] = list(mgr.get_blocks(rid)[g])
            row = table[rows[rid]]
            _expect(row[: len(ids)] == ids and not any(row[len(ids) :]), f"group {g} row of {rid!r}: {row} != {ids}")
            if ids:
                for pos in (0, len(ids) * bs - 1):
                    rids.append(rid)
                    positions.append(pos)
                    want.append(ids[pos // bs] * bs + pos % bs)
        got = mgr.slot_mapping(rids, positions, g).tolist() if rids else []
        _expect(got == want, f"group {g}: slot_mapping {got} != {want}")
    _check_step_slots(mgr, holders, rows)
    _raises(GroupCountError, lambda: mgr.block_table(groups))
    _raises(GroupCountError, lambda: mgr.slot_mapping([], [], -1))
    _raises(UnknownRequestError, lambda: mgr.slot_mapping(["no such request"], [0]))
    _raises(InvalidRequestError, lambda: mgr.slot_mapping([3], [0]))  # type: ignore[list-item]  # a bad id on purpose
    _raises(InvalidTokenCountError, lambda: mgr.slot_mapping([], [0.5]))  # type: ignore[list-item]  # on purpose
    _raises(InvalidTokenCountError, lambda: mgr.slot_mapping(["a"], []))
    if holders:
        rid = holders[0]
        held = len(mgr.get_blocks(rid)[0])
        _raises(InvalidTokenCountError, lambda: mgr.slot_mapping([rid], [held * sizes[0]]))


def _check_step_slots(mgr: ImplAdapter, holders: list[str], rows: dict[str, int]) -> None:
    """``slot_mapping_for_step`` (rows, starts, counts as a tensor, an int32 buffer or a list)
    equals ``slot_mapping`` of the same positions; ``row_of`` agrees with ``rows``."""
    bt = mgr.device_tables
    if bt is None:
        return
    for rid in holders:
        _expect(bt.row_of(rid) == rows[rid], f"row_of({rid!r}) != {rows[rid]}")
    _raises(UnknownRequestError, lambda: bt.row_of("no such request"))
    bs = mgr.config.manager_groups()[0].block_size
    spans = [(rid, len(mgr.get_blocks(rid)[0]) * bs) for rid in holders]
    spans = [(rid, n) for rid, n in spans if n]
    if not spans:
        return
    starts, counts = [n // 2 for _, n in spans], [n - n // 2 for _, n in spans]
    step_rows = [rows[rid] for rid, _ in spans]
    rids = [rid for (rid, _), c in zip(spans, counts, strict=True) for _ in range(c)]
    positions = [s + i for s, c in zip(starts, counts, strict=True) for i in range(c)]
    want = mgr.slot_mapping(rids, positions, 0).tolist()
    torch = bt._torch
    forms = (
        (torch.tensor(step_rows), torch.tensor(starts), torch.tensor(counts)),
        (array("i", step_rows), array("i", starts), array("i", counts)),
        (step_rows, starts, counts),
    )
    for form in forms:
        got = bt.slot_mapping_for_step(form[0], form[1], form[2], 0).tolist()
        _expect(got == want, f"slot_mapping_for_step {got} != slot_mapping {want}")


@declare(features=OPT_IN_FEATURES)
def make_impl_batch_adapter(config: KVCacheConfig) -> BatchImplAdapter:
    """Factory for ``--target impl-batch`` (the pure-Python build, device tables on the CPU).

    Raises:
        UnsupportedByProfileError: As ``--target impl-python``.
    """
    make_impl_python_adapter(config)  # the same refusals
    return BatchImplAdapter(config)


def _raises(error: type[Exception], call: Any) -> None:
    try:
        call()
    except error:
        return
    except Exception as exc:
        raise AssertionError(f"expected {error.__name__}, got {type(exc).__name__}: {exc}") from exc
    raise AssertionError(f"expected {error.__name__}, nothing was raised")


def _expect(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(message)
