"""``--target impl-batch`` and ``impl-batch-native``: kvimpl's per-request calls routed through its batch API.

kvimpl's managers add what vLLM's manager does not have: a batched step API
(``allocate_slots_batch``, ``free_batch``) and device block tables
(``block_table``, ``slot_mapping``; see :mod:`kvimpl.step_api` and
:mod:`kvimpl.device_tables`). ``impl-batch`` runs the pure-Python manager
(``create_manager(config, device=TABLES_DEVICE, native=False)``), ``impl-batch-native``
the native core (``NativeKVCacheManager(config, device=TABLES_DEVICE)``, whose host
rows the core writes itself; a configuration it refuses is counted as
unsupported). The lockstep speaks vLLM's per-request protocol, so this
adapter turns the machine's per-request calls into batches: every
``allocate_slots`` the batch API accepts (no prefix hits, no external or
encoder tokens, no reserve, caching not delayed, the default
``has_scheduled_reqs`` and full-sequence gate) and every ``free`` go through
``allocate_slots_batch`` / ``free_batch``, in one of several forms chosen
per call from a counter (so a trace replays the same forms):

* the plain one-item batch (a scalar lookahead count, or one per item);
* an empty batch first (it must return ``[]`` and change nothing);
* a malformed batch first (:meth:`BatchCalls._malformed`, in turn: a zero-token
  item, a count that is not an int, a request that is not one, a request
  whose id is not a str, one count too many; for ``free_batch`` a request id
  that is not a str), in both orders: malformed item first, where the batch
  must raise the error class kvspec's per-request call with that item raises
  (and so must kvimpl's own per-request call), and malformed item after the
  machine's, where it must raise a typed error; neither may change anything;
  then the item runs alone;
* the item twice (a duplicate request): the second run of a step the first
  already ran must take nothing (empty per group, or None where the first
  did not fit) and leave the state as the one call did, which the lockstep
  then compares with the reference's single call;
* the counts given as an ``int`` subclass (a scheduler's own count type):
  the batch's exact-type fast check sends them to the full validation,
  which accepts them as ``allocate_slots`` does.

Everything else goes to the per-request call unchanged, so invalid calls still
raise through the batch validator when they are batchable, and through
``allocate_slots`` otherwise. The outcome the lockstep compares with the
reference is the item's own.

The device tables are built on the CPU with the device copy kept apart as on a
GPU (``kvimpl.device_tables.CPU_COPY``: a missing, partial or racing copy
fails), one row and one column per group to start with, so that they grow as
the run goes. They are checked after every change, by
:meth:`BatchCalls.check_invariants`: the manager's own invariants (host
rows equal the tables, rows not in use zero, and the device rows equal the
host's when nothing changed since the last commit), and every third check the
step's commit (rows condensed as vLLM's input batch condenses them, so that
in between new requests fill the holes freed ones left), then
``block_table(g)`` row by row against ``get_blocks``, ``slot_mapping`` of the
first and last slot of each table against the slot formula (context-parallel
groups included: :func:`expected_slot`), and the typed errors of a group out
of range (either side), a request without a row, a request id that is not a
str, a position past the table, a non-int position and unequal lengths;
``row_of``, ``slot_mapping_for_step`` (every input form),
``slot_mappings_for_step`` and ``compute_slot_mapping`` against the same slots.

NOTE: the adapter derives from the classes of :mod:`kvref.adapters.impl`, so
the kit still imports kvimpl in one module only.

An :class:`AssertionError` from this adapter is a batch entry point or a
device table disagreeing with the per-request calls: the lockstep reports it
as an invariant failure of the adapter.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from kvref.adapters.impl import TABLES_DEVICE, ImplAdapter, NativeImplAdapter, built_adapter, check_config, kvimpl_class
from kvref.adapters.impl_probes import Unrouted, raised
from kvref.capabilities import OPT_IN_FEATURES, declare
from kvspec.config import KVCacheConfig
from kvspec.errors import (
    ConfigError,
    GroupCountError,
    InvalidRequestError,
    InvalidTokenCountError,
    KVCacheError,
    UnknownRequestError,
)
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.request import Request
from kvspec.view import BlockIds

FORMS = ("plain", "listed", "empty_first", "malformed", "twice", "plain", "subclass")
"""The batch forms, in the order the call counter walks them (``plain`` twice: the common case)."""

MALFORMED = ("zero tokens", "count not an int", "not a request", "request id not a str", "one count too many")
"""The malformed batches of the ``malformed`` form, in turn (see :meth:`BatchCalls._malformed`)."""


class Count(int):
    """An ``int`` subclass: a count as a scheduler with its own int type passes it (the ``subclass`` form)."""

    __slots__ = ()


_Manager: Any = object
"""The base of :class:`BatchCalls`: at run time it precedes a manager class in
the adapters' bases, so the type checker is told nothing about ``self``."""


class BatchCalls(_Manager):  # type: ignore[misc]  # a mixin of the manager classes (see _Manager)
    """The batch routing and the device-table checks, mixed into either impl adapter class."""

    name = "impl-batch"
    _calls = 0
    _inside = False
    """True while a batch entry point runs: its own per-request calls go straight through."""
    _spec: SpecManager | None = None
    """A fresh kvspec manager of the same configuration: the per-request reference of a malformed item."""
    device_tables: Any
    """The manager's device tables (an attribute of the manager class mixed in)."""

    def _init_batch(self) -> None:
        """Tables of one row (and, on the Python manager, one column) per group, so that
        every growth path runs at the machine's small scale: more live requests than rows,
        and a table wider than the tensor. The native core grows rows only (through the
        tables' callback): its columns stay ``BlockTable.for_config``'s, which cover
        ``max_model_len``."""
        bt = self.device_tables
        if bt is not None:
            core = bt._core
            cols = bt.cols if core is not None else [1] * len(bt.block_sizes)
            probe_table_arguments(type(bt))
            self.device_tables = type(bt)(
                bt.block_sizes, cols, 1, TABLES_DEVICE, core, cp_world_sizes=bt.cp_world_sizes, cp_rank=bt.cp_rank
            )

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
        skip_zeroing_group_ids: Any = (),
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
            and type(skip_zeroing_group_ids) is tuple and not skip_zeroing_group_ids
        )  # fmt: skip
        if not batchable or self._inside:
            out: BlockIds | None = super().allocate_slots(
                request, num_new_tokens, num_new_computed_tokens, new_computed_blocks, num_lookahead_tokens,
                num_external_computed_tokens, delay_cache_blocks, num_encoder_tokens, full_sequence_must_fit,
                reserved_blocks, has_scheduled_reqs, skip_zeroing_group_ids,
            )  # fmt: skip
            return out
        with self._batch():
            return self._allocate(request, num_new_tokens, num_lookahead_tokens)

    def _allocate(self, request: Request, num_new_tokens: int, k: int) -> BlockIds | None:
        batch = self._manager().allocate_slots_batch
        form = self._form()
        if form == "empty_first":
            self._unchanged_by(lambda: _expect(batch([], []) == [], "an empty batch returned items"))
        elif form == "malformed" and type(request) is Request:  # a machine's own invalid request goes on as sent
            self._malformed(request, num_new_tokens, k)
        if form == "listed":
            got: BlockIds | None = batch([request], [num_new_tokens], [k])[0]
            return got
        if form == "subclass" and type(num_new_tokens) is int and type(k) is int:
            got = batch([request], [Count(num_new_tokens)], [Count(k)])[0]
            return got
        if form != "twice":
            got = batch([request], [num_new_tokens], k)[0]
            return got
        first, again = batch([request, request], [num_new_tokens, num_new_tokens], [k, k])
        # The repeat may not fit where the first did (the watermark still applies), but it takes nothing.
        _expect(again is None or not any(again), f"a repeated step took {again}")
        out: BlockIds | None = first
        return out

    def allocate_slots_batch(self, requests: Any, num_new_tokens: Any, num_lookahead_tokens: Any = 0) -> Any:
        """The machine's own batches (several running requests) go to the manager's
        batch as they are; its per-request calls inside are not routed again."""
        with self._batch():
            return self._manager().allocate_slots_batch(requests, num_new_tokens, num_lookahead_tokens)

    def free(self, request_id: str) -> None:
        """The per-request call, through ``free_batch``."""
        if self._inside:
            super().free(request_id)
            return
        with self._batch():
            self._free(request_id)

    def _free(self, request_id: str) -> None:
        free_batch = self._manager().free_batch
        form = self._form()
        if form == "empty_first":
            self._unchanged_by(lambda: free_batch([]))
        elif form == "malformed" and isinstance(request_id, str):
            # kvspec's free of the malformed id alone is the reference of the malformed-first batch.
            error = self._reference(lambda m: m.free(7))  # type: ignore[arg-type]  # an int id on purpose
            self._refused(lambda: free_batch([7, request_id]), error)
            self._refused(lambda: free_batch([request_id, 7]), KVCacheError)
        if form == "twice" and isinstance(request_id, str):
            free_batch([request_id, request_id])  # the second finds nothing to free
            return
        free_batch([request_id])

    _checks = 0

    def check_invariants(self) -> None:
        """The manager's invariants (and the impl adapter's probes), then, every
        third time, the step's commit and the device tables against the tables."""
        super().check_invariants()
        self._checks += 1
        if self._checks % 3 == 0:
            check_device_tables(self)

    def _malformed(self, request: Request, n: int, k: int) -> None:
        """One malformed batch of :data:`MALFORMED` (in turn), in both orders around the machine's item.

        Raises:
            AssertionError: If a malformed batch is accepted, raises another
                class than kvspec's per-request call with the malformed item
                (malformed item first; kvimpl's own per-request call must
                raise that class too), or changes the state.
        """
        # Turned by the item's token count as well as the form counter: a run makes only a few
        # malformed batches (a new adapter per machine run), so a counter alone would rarely
        # reach the last kinds; the count keeps the choice a function of the calls (a trace replays it).
        which = MALFORMED[(self._calls // len(FORMS) + request.num_tokens) % len(MALFORMED)]
        batch = self._manager().allocate_slots_batch
        if which == "one count too many":
            self._refused(lambda: batch([request], [n, n], k), InvalidTokenCountError)  # no per-request counterpart
            return
        item: tuple[Any, Any] = {
            "zero tokens": (request, 0),
            "count not an int": (request, 1.5),
            "not a request": ("not a request", n),
            "request id not a str": (replace(request, request_id=len(request.request_id)), n),  # type: ignore[arg-type]  # on purpose
        }[which]
        bad, count = item
        error = self._reference(lambda m: m.allocate_slots(bad, count, num_lookahead_tokens=k))
        self._refused(lambda: self._manager().allocate_slots(bad, count, num_lookahead_tokens=k), error)
        self._refused(lambda: batch([bad, request], [count, n], [k, k]), error)
        # A valid item before the malformed one must not be applied either (the whole batch is checked first);
        # its error is the malformed item's or, for an invalid machine call, the item's own.
        self._refused(lambda: batch([request, bad], [n, count], [k, k]), KVCacheError)

    def _reference(self, call: Callable[[SpecManager], object]) -> type[KVCacheError]:
        """The error class kvspec's per-request ``call`` raises (on a fresh manager: a malformed
        item's refusal does not depend on the state).

        Raises:
            AssertionError: If kvspec accepts the call, or raises something that is not a typed error.
        """
        if self._spec is None:
            self._spec = SpecManager(self.config)
        spec = self._spec
        exc = raised(lambda: call(spec))
        if not isinstance(exc, KVCacheError):
            raise AssertionError(f"kvspec's per-request call with a malformed item raised {exc!r}")
        return type(exc)

    def _manager(self) -> Any:
        """The kvimpl manager's own methods (the batch entry points and the per-request calls)."""
        return Unrouted(self, kvimpl_class(self))

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

    def _unchanged_by(self, call: Callable[[], object]) -> None:
        """Run ``call``; the view must not move."""
        before = self.to_view()
        call()
        _expect(self.to_view() == before, "a batch that should change nothing changed the state")

    def _refused(self, call: Callable[[], object], error: type[KVCacheError]) -> None:
        """``call`` must raise ``error`` (exactly; any typed error for :class:`KVCacheError`) and change nothing."""
        before = self.to_view()
        exc = raised(call)
        if exc is None:
            raise AssertionError("a batch with a malformed item was accepted")
        ok = isinstance(exc, KVCacheError) if error is KVCacheError else type(exc) is error
        _expect(ok, f"a malformed batch raised {type(exc).__name__} ({exc}); expected {error.__name__}")
        _expect(self.to_view() == before, "a refused batch changed the state")


class BatchImplAdapter(BatchCalls, ImplAdapter):
    """kvimpl's pure-Python manager with device tables, driven through its batch API."""

    name = "impl-batch"


class BatchNativeImplAdapter(BatchCalls, NativeImplAdapter):
    """kvimpl's native manager with device tables (rows written by the core), driven through its batch API."""

    name = "impl-batch-native"

    def __init__(self, config: KVCacheConfig) -> None:
        """The native manager keeping device tables on the CPU (needs torch).

        Raises:
            UnsupportedByProfileError: The native manager's refusal of a
                configuration the core does not implement (or of every one
                without the build).
        """
        super().__init__(config, TABLES_DEVICE)
        self._init_batch()


def check_device_tables(mgr: Any) -> None:
    """``block_table`` and ``slot_mapping`` agree with ``get_blocks`` (see the module docstring).

    Raises:
        AssertionError: On the first disagreement.
    """
    groups = len(mgr.config.groups)
    # A table entry covers the manager's block size: the context-parallel
    # scaled one (kvspec's manager_groups), as the tables are counted in it.
    sizes = [k.block_size for k in mgr.config.manager_groups()]
    holders = table_holders(mgr)
    bt = mgr.device_tables
    rows = bt.rows if bt is not None else {}
    _expect(sorted(rows) == holders, f"device rows {sorted(rows)} but requests holding tables {holders}")
    if bt is not None:
        bt.sync()  # the step's commit: the holes are filled, rows may move
        rows = bt.rows
        _expect(None not in bt.row_ids, f"holes left after the commit: {bt.row_ids}")
    for g in range(groups):
        bs = sizes[g]
        table = mgr.block_table(g).tolist()
        _expect(len(table) == len(holders), f"group {g}: {len(table)} device rows for {len(holders)} requests")
        rids, positions, want = [], [], []
        k = bt.kernel_factors[g] if bt is not None else 1
        for rid in holders:
            ids: list[int] = list(mgr.get_blocks(rid)[g])
            row = table[rows[rid]]
            # Each block as its kernel blocks (block * k + j); past the table the row is unspecified for k > 1.
            kernel = [b * k + j for b in ids for j in range(k)]
            clean = k > 1 or not any(row[len(kernel) :])
            _expect(row[: len(kernel)] == kernel and clean, f"group {g} row of {rid!r}: {row} != {kernel}")
            if ids:
                for pos in (0, len(ids) * bs - 1):
                    rids.append(rid)
                    positions.append(pos)
                    want.append(expected_slot(bt, g, ids, pos))
        got = mgr.slot_mapping(rids, positions, g).tolist() if rids else []
        _expect(got == want, f"group {g}: slot_mapping {got} != {want}")
    _check_step_slots(mgr, holders, rows)
    _raises(GroupCountError, lambda: mgr.block_table(groups))
    _raises(GroupCountError, lambda: mgr.block_table(-1))
    _raises(GroupCountError, lambda: mgr.slot_mapping([], [], -1))
    _raises(GroupCountError, lambda: mgr.slot_mapping([], [], groups))
    _raises(UnknownRequestError, lambda: mgr.slot_mapping(["no such request"], [0]))
    _raises(InvalidRequestError, lambda: mgr.slot_mapping([3], [0]))
    _raises(InvalidTokenCountError, lambda: mgr.slot_mapping([], [0.5]))
    _raises(InvalidTokenCountError, lambda: mgr.slot_mapping(["a"], []))
    if holders:
        rid = holders[0]
        held = len(mgr.get_blocks(rid)[0])
        _raises(InvalidTokenCountError, lambda: mgr.slot_mapping([rid], [held * sizes[0]]))


def expected_slot(bt: Any, group: int, ids: list[int], pos: int) -> int:
    """The slot of ``pos`` in a table ``ids`` of ``group`` (vLLM's
    ``compute_slot_mapping``, written out in plain integers): the block's id
    times the physical block size plus the offset on this context-parallel
    rank, or -1 where another rank holds the position."""
    vbs = bt.block_sizes[group]
    world, inter = bt.cp_world_sizes[group], bt.cp_interleave
    block, off = ids[pos // vbs], pos % vbs
    if (off // inter) % world != bt.cp_rank % world:
        return -1
    return int(block * (vbs // world) + off // (world * inter) * inter + off % inter)


def probe_table_arguments(table: type) -> None:
    """Device tables refuse what they cannot be: a device that is not one
    (not a name, not a torch device, a device type other than the CPU or CUDA,
    CUDA where torch sees none) and a geometry that does not divide (per-group
    lists of another length, a context-parallel world or kernel block size
    that does not divide the block size, a rank outside its world, an
    interleave below 1): each a ConfigError naming what to pass.

    Raises:
        AssertionError: A probe was accepted, or raised another class.
    """
    torch = __import__("torch")
    bad: list[tuple[str, dict[str, Any]]] = [
        ("a device that is not a name", {"device": 7}),
        ("a name that is not a device", {"device": "nonsense"}),
        ("a device type kvimpl's tables do not run on", {"device": "meta"}),
        ("world sizes of another length", {"cp_world_sizes": [1, 1]}),
        ("a world that does not divide the block size", {"cp_world_sizes": [3]}),
        ("kernel block sizes of another length", {"kernel_block_sizes": [4, 4]}),
        ("a kernel block size that does not divide the block size", {"kernel_block_sizes": [3]}),
        ("an interleave below 1", {"cp_interleave": 0}),
        ("a rank outside its world", {"cp_world_sizes": [2], "cp_rank": 2}),
    ]
    if not torch.cuda.is_available():
        bad.append(("CUDA where torch sees none", {"device": "cuda"}))
    for what, changes in bad:
        args: dict[str, Any] = {"device": "cpu", **changes}
        device = args.pop("device")

        def build(device: Any = device, args: dict[str, Any] = args) -> object:
            return table([8], [2], 1, device, None, **args)

        exc = raised(build)
        if not isinstance(exc, ConfigError):
            raise AssertionError(f"device tables with {what}: expected ConfigError, got {exc!r}")


def table_holders(mgr: Any) -> list[str]:
    """The requests holding a table in some group (each must have a device row), sorted."""
    if isinstance(mgr, NativeImplAdapter):  # the core's slots with a table present in some group
        return sorted(rid for rid, _, tables in mgr._tables() if any(t[0] for t in tables))
    return sorted({r for m in mgr.coordinator.managers for r in m.req_to_blocks})


def _check_step_slots(mgr: Any, holders: list[str], rows: dict[str, int]) -> None:
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
        (torch.tensor(step_rows), array("i", starts), counts),  # mixed: each converted on its own
    )
    for form in forms:
        got = bt.slot_mapping_for_step(form[0], form[1], form[2], 0).tolist()
        _expect(got == want, f"slot_mapping_for_step {got} != slot_mapping {want}")
    every = bt.slot_mappings_for_step(step_rows, starts, counts, (0,))
    _expect(every[0].tolist() == want, f"slot_mappings_for_step group 0 {every[0].tolist()} != {want}")
    # vLLM's form: batch request i is row i, so the step is every row in row order.
    order = sorted(range(len(spans)), key=lambda i: step_rows[i])
    if [step_rows[i] for i in order] == list(range(len(order))):
        qsl = [0]
        for i in order:
            qsl.append(qsl[-1] + counts[i])
        pos_v = [starts[i] + k for i in order for k in range(counts[i])]
        by_row = [w for i in order for w in want[sum(counts[:i]) : sum(counts[: i + 1])]]
        for form_v in ((qsl, pos_v), (torch.tensor(qsl), torch.tensor(pos_v))):
            got_v = bt.compute_slot_mapping(form_v[0], form_v[1], 0).tolist()
            _expect(got_v == by_row, f"compute_slot_mapping {got_v} != {by_row}")


@declare(features=OPT_IN_FEATURES)
def make_impl_batch_adapter(config: KVCacheConfig) -> BatchImplAdapter:
    """Factory for ``--target impl-batch``: the pure-Python manager kvimpl's
    ``create_manager(config, device=TABLES_DEVICE, native=False)`` builds.

    Raises:
        UnsupportedByProfileError: As ``--target impl-python``.
    """
    check_config(config)
    adapter: BatchImplAdapter = built_adapter(
        config, BatchImplAdapter, BatchNativeImplAdapter, TABLES_DEVICE, native=False
    )
    adapter._init_batch()
    return adapter


@declare(features=OPT_IN_FEATURES)
def make_impl_batch_native_adapter(config: KVCacheConfig) -> BatchNativeImplAdapter:
    """Factory for ``--target impl-batch-native``: ``NativeKVCacheManager(config, device=TABLES_DEVICE)``.

    Raises:
        UnsupportedByProfileError: As ``--target impl-native`` (the native
            manager's own refusal of a configuration the core does not implement).
    """
    check_config(config)
    return BatchNativeImplAdapter(config)


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
