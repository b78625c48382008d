"""Device block tables in the layout of vLLM's worker block tables.

The only kvimpl module that touches torch, and only when a manager (either
build) is built with a ``device`` (imported lazily). One ``int32`` host
tensor of shape ``(groups, rows, cols)`` holds every live request's tables,
row ``r`` the request in row ``r``, padded with the null block 0; it is
pinned when the device is CUDA. The device tensor has the same shape;
:meth:`BlockTable.sync` (the step's commit) copies the rows in use of every
group in one non-blocking copy, only when something changed.

What a GPU model runner gets is vLLM's worker layout
(``vllm/v1/worker/block_table.py`` and ``gpu_input_batch.py``, 0.25.1 to
0.33.0):

* Rows as vLLM's input batch keeps them: a request that stops holding blocks
  leaves a hole; a new request takes the lowest hole, else the next row; the
  commit condenses (while the lowest hole is below the last row in use, the
  last row moves into it). Between two commits ``rows`` shows the holes.
* Kernel block sizes smaller than the manager's (``kernel_block_sizes``):
  :meth:`BlockTable.block_table` returns each manager block as its
  ``physical // kernel`` consecutive kernel blocks, as vLLM 0.25.1's worker
  does (its ``map_to_kernel_blocks``); slots do not depend on it.
* Context parallelism: a group whose manager block size is ``W`` times its
  kind's block size (:func:`kvimpl.config_rules.manager_kinds`) holds, on
  rank ``cp_rank``, the tokens whose offset in the manager block falls in
  that rank's interleaved chunks of ``cp_interleave`` tokens; every other
  position maps to :data:`PAD_SLOT_ID` (vLLM's ``compute_slot_mapping``).
* The slot mapping of a step in one fused operation per group: a Triton
  kernel where CUDA and Triton are present (:mod:`kvimpl.device_kernels`),
  one pass of the native core's ``step_slots`` over a CPU table (the step's
  inputs as int32 buffers or lists), a few vectorized tensor operations
  otherwise (tensor inputs, or the pure-Python build).

The host copy is what the managers write: with the native core, the core
itself, in C, as it changes a table (only the entries that changed; see
``impl/kvimpl/_native/hosttab.c``); with the Python manager,
:meth:`BlockTable.update` and :meth:`BlockTable.remove`. On a GPU the copy
to the device is asynchronous: the next step's writes must wait until it has
read the host rows. :meth:`sync` records an event after the copy, and the
first write after it waits for that event (the *fence*; vLLM's model runner
waits on its ``prepare_inputs_event`` for the same reason).

Devices: ``"cpu"`` (the host tensor *is* the device tensor: nothing is
copied), ``"cuda"`` / ``"cuda:N"``, and :data:`CPU_COPY`, a CPU mode that
keeps the device tensor apart as on a GPU and makes the copy asynchronous by
emulation: it happens when the device is next read or the fence is passed,
and it fails if the host rows changed in between without the fence. Every
device-path defect a GPU would show (a missing or partial copy, a read of
the rows that loses a change, a write racing the copy) fails there too, on a
machine without a GPU.

NOTE: the earlier tables wrote each changed row to the device with one small
synchronous ``torch.tensor(list)`` per row (about 5 µs each); updating the
host in place and copying once per step costs about 70 µs per 256-request
step in all (measured before this module, on the CPU build of torch).

Upstream: ``vllm/v1/worker/block_table.py`` (``BlockTable``,
``MultiGroupBlockTable``, ``compute_slot_mapping``) and
``vllm/v1/worker/gpu_input_batch.py`` (``condense``).
"""

from __future__ import annotations

import ctypes
from array import array
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from kvimpl.checks import check_request_id, is_int
from kvimpl.config_rules import manager_kinds
from kvimpl.invariants import require
from kvspec.config import KVCacheConfig, Mamba, SinkFullAttention
from kvspec.errors import (
    ConfigError,
    GroupCountError,
    InvalidTokenCountError,
    UnknownRequestError,
    UnsupportedOperationError,
)
from kvspec.invariants import InvariantViolation

DEFAULT_MAX_REQUESTS = 256
"""Initial rows (vLLM's default ``max_num_seqs``); grows on demand."""

CPU_COPY = "cpu-copy"
"""The device of CPU tables kept apart from the host copy, with an emulated
asynchronous copy (see the module docstring): what tests use to check the
device path without a GPU."""

PAD_SLOT_ID = -1
"""The slot of a position another context-parallel rank holds (vLLM's ``PAD_SLOT_ID``)."""


class BlockTable:
    """Per-group device block tables with one row per live request, in vLLM's worker layout.

    inv: rows[row_ids[r]] == r for every row r in use that is not a hole
    inv: host[g, r, :len(tables of row r in g)] == those tables and the rest of the row (and every hole) is 0
    inv: after sync(), no row is a hole and the device tensor's rows in use equal the host's
    """

    def __init__(
        self,
        block_sizes: Sequence[int],
        max_blocks_per_request: Sequence[int],
        max_requests: int,
        device: Any,
        core: Any = None,
        *,
        kernel_block_sizes: Sequence[int] | None = None,
        cp_world_sizes: Sequence[int] | None = None,
        cp_rank: int = 0,
        cp_interleave: int = 1,
    ) -> None:
        """Zeroed tables; with ``core`` (a native manager) the core writes the rows.

        Args:
            block_sizes: Per group, the manager's block size (a context-parallel
                group's is ``cp_world_sizes[g]`` times its kind's).
            max_blocks_per_request: Per group, the columns to start with (they grow).
            max_requests: The rows to start with (they grow).
            device: ``"cpu"``, :data:`CPU_COPY`, ``"cuda"`` or ``"cuda:N"`` (or a ``torch.device``).
            core: A native manager, which writes the host rows itself.
            kernel_block_sizes: Per group, the attention kernel's block size, dividing
                the group's physical block size (default: the physical size).
            cp_world_sizes: Per group, the context-parallel ranks its KV is spread over (default 1).
            cp_rank: This worker's rank among them.
            cp_interleave: Consecutive tokens a rank holds before the next rank's.

        Raises:
            ConfigError: A device that is not one of the above (or CUDA without a GPU),
                or a geometry that does not divide (see :func:`table_geometry`).
            ImportError: If torch is not installed.
        """
        import torch  # noqa: PLC0415 - torch is optional; only a manager with a device needs it

        self._torch: Any = torch
        self.device, self._separate = resolve_device(torch, device)
        self._emulated = device == CPU_COPY
        self.block_sizes = tuple(block_sizes)
        self.physical_block_sizes, self.kernel_factors, self.cp_world_sizes = table_geometry(
            self.block_sizes, kernel_block_sizes, cp_world_sizes, cp_rank, cp_interleave
        )
        self.cp_rank = cp_rank
        self.cp_interleave = cp_interleave
        self.cols = [max(c, 1) for c in max_blocks_per_request]
        self._core = core
        self._rows: dict[str, int] = {}
        self._row_ids: list[str | None] = []
        self._mirrors: list[list[list[int]]] = []
        self._holes: list[int] = []
        """Rows freed since the last commit, highest first (the lowest is filled first)."""
        self._dirty = False
        self._in_flight = False
        self._pending: tuple[int, Any] | None = None
        """:data:`CPU_COPY`: the rows in use and the host rows of the copy not yet made."""
        self._fence_error: BaseException | None = None
        self._event: Any = self._torch.cuda.Event() if self.device.type == "cuda" else None
        self._expanded: dict[int, Any] = {}
        """Per group with kernel blocks smaller than its blocks, the expanded table of the last copy."""
        self._kernels: Any = _triton_kernels(self.device)
        self._host_kernel: Any = _host_kernel(self.device)
        """CPU tables: the native module, whose ``step_slots`` maps a step in one pass (None: not built)."""
        self._stage: Any = None
        """CUDA: the pinned buffer a step's inputs are copied from."""
        self._stage_event: Any = None
        self._allocate(max(max_requests, 1), max(self.cols))

    @classmethod
    def for_config(
        cls,
        config: KVCacheConfig,
        device: Any,
        max_requests: int = DEFAULT_MAX_REQUESTS,
        core: Any = None,
        *,
        kernel_block_sizes: Sequence[int] | None = None,
        cp_rank: int = 0,
        cp_interleave: int = 1,
    ) -> BlockTable:
        """Tables sized for ``config``: ``max_model_len`` tokens per request,
        context-parallel groups spread as the managers scale their block sizes."""
        kinds = manager_kinds(config)  # block sizes as the managers run them (context parallelism)
        cols = []
        for kind in kinds:
            n = -(config.max_model_len // -kind.block_size)
            if isinstance(kind, Mamba):
                n += kind.num_speculative_blocks
            if isinstance(kind, SinkFullAttention):
                n += kind.sink_len // kind.block_size
            cols.append(n)
        worlds = [m.block_size // k.block_size for m, k in zip(kinds, config.groups, strict=True)]
        return cls(
            [k.block_size for k in kinds],
            cols,
            max_requests,
            device,
            core,
            kernel_block_sizes=kernel_block_sizes,
            cp_world_sizes=worlds,
            cp_rank=cp_rank,
            cp_interleave=cp_interleave,
        )

    # -- rows -----------------------------------------------------------------

    @property
    def rows(self) -> dict[str, int]:
        """Row of each live request (reading changes nothing)."""
        if self._core is None:
            return dict(self._rows)
        return {rid: r for r, rid in enumerate(self._core._host_rows()[0]) if rid is not None}

    @property
    def row_ids(self) -> list[str | None]:
        """The request of each row in use (None: a hole left since the last commit)."""
        return list(self._row_ids) if self._core is None else list(self._core._host_rows()[0])

    @property
    def num_live(self) -> int:
        """Requests that currently have a row."""
        return len(self._rows) if self._core is None else int(self._core._host_state()[1])

    @property
    def num_rows(self) -> int:
        """Rows in use, holes included (after a commit: :attr:`num_live`)."""
        return len(self._row_ids) if self._core is None else int(self._core._host_state()[0])

    @property
    def mirrors(self) -> list[list[list[int]]]:
        """Per row in use, per group: what the host row holds (without the padding; a hole holds nothing)."""
        if self._core is None:
            return [[list(t) for t in m] for m in self._mirrors]
        empty: list[list[int]] = [[] for _ in self.block_sizes]
        return [
            [list(t) for t in self._core.get_blocks(rid)] if rid is not None else [list(t) for t in empty]
            for rid in self.row_ids
        ]

    def row_of(self, request_id: str) -> int:
        """The row of a live request.

        Raises:
            UnknownRequestError: If the request has no row.
        """
        row = self._rows.get(request_id) if self._core is None else self.rows.get(request_id)
        if row is None:
            raise UnknownRequestError(f"block_table: request {request_id!r} holds no blocks, so it has no row")
        return row

    # -- the step's commit -------------------------------------------------------

    def sync(self) -> None:
        """The step's commit: condense the rows, then copy the rows in use to
        the device when something changed (one non-blocking copy of every
        group; nothing on the CPU).

        Raises:
            InvariantViolation: :data:`CPU_COPY` only: the host rows changed
                while the previous copy was in flight (a write without the fence).
        """
        self._fence()
        self._raise_fence_error()
        if self._core is not None:
            live, dirty = self._core._host_commit()
            self._dirty = self._dirty or bool(dirty)
        else:
            self._condense()
            live = len(self._row_ids)
        if not self._dirty:
            return
        self._dirty = False
        self._expanded.clear()
        if not self._separate:
            return
        if self._emulated:
            self._pending = (live, self.host[:, :live].clone())
        else:
            self.dev[:, :live].copy_(self.host[:, :live], non_blocking=True)
            self._event.record()
        self._in_flight = True
        if self._core is not None:
            self._core._host_copy_started()

    def block_table(self, group: int) -> Any:
        """``int32[num_live, max_blocks]`` of ``group``, up to date (committed
        first); with a kernel block size smaller than the group's, each block as
        its kernel blocks (``[num_live, max_blocks * factor]``)."""
        self.sync()
        self._device_read()
        live = self.num_rows
        table = self.dev[group, :live, : self.cols[group]]
        k = self.kernel_factors[group]
        if k == 1:
            return table
        got = self._expanded.get(group)
        if got is None or got.shape[0] != live or got.shape[1] != table.shape[1] * k:
            offsets = self._torch.arange(k, dtype=self._torch.int32, device=self.device)
            got = (table.unsqueeze(-1) * k + offsets).reshape(live, table.shape[1] * k)
            self._expanded[group] = got
        return got

    # -- slots -----------------------------------------------------------------

    def slot_mapping(self, request_ids: Sequence[str], positions: Sequence[int], group: int = 0) -> Any:
        """``int64`` slots, one per ``(request_ids[i], positions[i])`` pair: the
        slot of the position in its table entry's block (a nulled entry maps into
        the null block; a position another context-parallel rank holds maps to
        :data:`PAD_SLOT_ID`).

        Raises:
            InvalidTokenCountError: Sequences of different lengths, or a
                position outside the request's table.
            UnknownRequestError: A request without a row.
        """
        if len(request_ids) != len(positions):
            raise InvalidTokenCountError(
                f"slot_mapping: {len(request_ids)} request ids but {len(positions)} positions; pass one per token"
            )
        bs = self.block_sizes[group]
        rows = self.rows
        row_list = []
        for rid, pos in zip(request_ids, positions, strict=True):
            row = rows.get(rid)
            if row is None:
                raise UnknownRequestError(f"block_table: request {rid!r} holds no blocks, so it has no row")
            held = self._held(rid, row, group)
            if not 0 <= pos < held * bs:
                raise InvalidTokenCountError(
                    f"slot_mapping: position {pos} of request {rid!r} is outside its {held} blocks of group "
                    f"{group} ({held * bs} slots); allocate the slots first"
                )
            row_list.append(row)
        torch = self._torch
        self.sync()
        rows_now = self.rows  # the commit may have moved rows
        row_list = [rows_now[rid] for rid in request_ids]
        self._device_read()
        row_t = torch.tensor(row_list, dtype=torch.int64, device=self.device)
        pos_t = torch.tensor(list(positions), dtype=torch.int64, device=self.device)
        return self._slots(row_t, pos_t, group)

    def slot_mapping_for_step(self, rows: Any, starts: Any, counts: Any, group: int = 0) -> Any:
        """The slots of a whole step: request ``i`` (row ``rows[i]`` after the
        commit) computes ``counts[i]`` tokens from position ``starts[i]`` on;
        the result lists their slots request by request (``int64``). One
        fused operation (inputs: tensors, int32 buffers or lists); positions
        must be allocated (unchecked, as in vLLM's ``compute_slot_mapping``)."""
        return self.slot_mappings_for_step(rows, starts, counts, (group,))[0]

    def slot_mappings_for_step(
        self, rows: Any, starts: Any, counts: Any, groups: Sequence[int] | None = None
    ) -> list[Any]:
        """:meth:`slot_mapping_for_step` of several groups (default: all), the
        inputs copied to the device once: one kernel per group on CUDA."""
        self.sync()
        self._device_read()
        groups = range(len(self.block_sizes)) if groups is None else groups
        if self._host_kernel is not None and not any(isinstance(x, self._torch.Tensor) for x in (rows, starts, counts)):
            return [self._cpu_slots(rows, starts, counts, None, g) for g in groups]
        row_t, start_t, qsl, total = self._step_inputs(rows, starts, counts)
        if self._kernels is not None:
            return [self._kernels.step_slots(self, row_t, start_t, qsl, None, total, g) for g in groups]
        torch = self._torch
        req = torch.repeat_interleave(
            torch.arange(len(row_t), device=self.device), qsl[1:] - qsl[:-1], output_size=total
        )
        pos = start_t[req] + (torch.arange(total, device=self.device) - qsl[:-1][req])
        tok_rows = row_t[req]
        return [self._slots(tok_rows, pos, g) for g in groups]

    def compute_slot_mapping(self, query_start_loc: Any, positions: Any, group: int = 0) -> Any:
        """vLLM's form: batch request ``i`` is row ``i``; its tokens are
        ``positions[query_start_loc[i]:query_start_loc[i + 1]]``. ``int64``
        slots, one per position (unchecked, as vLLM's)."""
        self.sync()
        self._device_read()
        torch = self._torch
        if self._host_kernel is not None and not any(isinstance(x, torch.Tensor) for x in (query_start_loc, positions)):
            bounds = list(query_start_loc)
            counts = [b - a for a, b in pairwise(bounds)]
            return self._cpu_slots(range(len(counts)), [0] * len(counts), counts, array("q", positions), group)
        qsl = self._as_tensor(query_start_loc)
        pos = self._as_tensor(positions)
        n = len(qsl) - 1
        if self._kernels is not None:
            rows = torch.arange(n, dtype=torch.int64, device=self.device)
            return self._kernels.step_slots(self, rows, None, qsl, pos, len(pos), group)
        req = torch.repeat_interleave(torch.arange(n, device=self.device), qsl[1:] - qsl[:-1], output_size=len(pos))
        return self._slots(req, pos, group)

    # -- Python manager: row writes ---------------------------------------------

    def update(self, request_id: str, tables: Sequence[Sequence[int]]) -> None:
        """Make the request's rows equal ``tables`` (one per group), giving it a
        row first if it has none; only the changed suffix of a row is written."""
        row = self._rows.get(request_id)
        if row is None:
            row = self._new_row(request_id)
        mirror = self._mirrors[row]
        for g, table in enumerate(tables):
            old = mirror[g]
            if len(old) <= len(table) and old == table[: len(old)]:
                if len(old) == len(table):
                    continue
                first = len(old)
            else:
                first = next(
                    (i for i, (a, b) in enumerate(zip(old, table, strict=False)) if a != b), min(len(old), len(table))
                )
            self._write(g, row, first, table, len(old))
            mirror[g] = list(table)

    def remove(self, request_id: str) -> None:
        """Drop the request's row (no-op if it has none): it becomes a hole until the commit."""
        row = self._rows.pop(request_id, None)
        if row is None:
            return
        self._fence()
        self.host[:, row].zero_()
        self._row_ids[row] = None
        self._mirrors[row] = [[] for _ in self.block_sizes]
        self._holes.append(row)
        self._holes.sort(reverse=True)
        self._dirty = True

    def check_invariants(self) -> None:
        """Raise InvariantViolation if a row differs from its request's tables,
        a row not in use is not zero, or (when nothing changed since the last
        commit) a device row differs from the host's. Commits nothing."""
        row_ids = self.row_ids
        rows = self.rows
        require(all(rows.get(rid) == r for r, rid in enumerate(row_ids) if rid is not None), "row index disagrees")
        require(len(rows) == sum(rid is not None for rid in row_ids), "row bookkeeping lengths differ")
        mirrors = self.mirrors
        host = self.host.tolist()
        for g in range(len(self.block_sizes)):
            for r in range(len(row_ids)):
                want = list(mirrors[r][g])
                row = host[g][r]
                require(row == want + [0] * (len(row) - len(want)), f"group {g} row {r}: {row} != {want}")
            for r in range(len(row_ids), self.host.shape[1]):
                require(not any(host[g][r]), f"group {g} row {r}: a row not in use is not zero")
        if self._committed(row_ids):
            self._device_read()
            dev = self.dev.cpu().tolist() if self.dev is not self.host else host
            for g in range(len(self.block_sizes)):
                for r in range(len(row_ids)):
                    require(dev[g][r] == host[g][r], f"group {g} row {r}: the device row differs from the host row")

    # -- internals ---------------------------------------------------------------

    def _committed(self, row_ids: list[str | None]) -> bool:
        """Whether nothing changed since the last commit (then the device rows must equal the host's)."""
        dirty = self._dirty or (self._core is not None and bool(self._core._host_state()[2]))
        return not dirty and None not in row_ids

    def _held(self, request_id: str, row: int, group: int) -> int:
        """The blocks the request holds in ``group``."""
        if self._core is None:
            return len(self._mirrors[row][group])
        return len(self._core.get_blocks(request_id)[group])

    def _slots(self, row_t: Any, pos_t: Any, group: int) -> Any:
        """Slots of per-token rows and positions (vectorized; see the module docstring)."""
        torch = self._torch
        vbs = self.block_sizes[group]
        pbs, world = self.physical_block_sizes[group], self.cp_world_sizes[group]
        idx = pos_t // vbs
        ids = self.dev[group][row_t, idx].to(torch.int64)
        off = pos_t - idx * vbs
        if world == 1:
            return ids * pbs + off
        inter = self.cp_interleave
        local = off // (world * inter) * inter + off % inter
        mine = (off // inter) % world == self.cp_rank
        return torch.where(mine, ids * pbs + local, torch.full_like(local, PAD_SLOT_ID))

    def _cpu_slots(self, rows: Any, starts: Any, counts: Any, positions: Any, group: int) -> Any:
        """The step's slots of ``group`` from a CPU table in one pass of the native
        core's ``step_slots`` (see ``impl/kvimpl/_native/slots.c``): no per-step
        tensor operations, whose thread start-up dominates at decode sizes."""
        as_i32 = [x if isinstance(x, array) and x.typecode == "i" else array("i", x) for x in (rows, starts, counts)]
        total = len(positions) if positions is not None else sum(as_i32[2])
        out = self._torch.empty(total, dtype=self._torch.int64)
        table = self.dev[group]
        world = self.cp_world_sizes[group]
        self._host_kernel.step_slots(
            table.data_ptr(), self.num_rows, table.shape[1], *as_i32, positions, out.data_ptr(), total,
            self.block_sizes[group], self.physical_block_sizes[group], world, self.cp_rank % world, self.cp_interleave,
        )  # fmt: skip
        return out

    def _step_inputs(self, rows: Any, starts: Any, counts: Any) -> tuple[Any, Any, Any, int]:
        """Rows, starts and the query start locations (``[0, c0, c0+c1, ...]``) as
        device tensors, and the step's token count. Host inputs go to a CUDA
        device in one copy (through a pinned staging buffer)."""
        torch = self._torch
        if self.device.type == "cuda" and not any(isinstance(x, torch.Tensor) for x in (rows, starts, counts)):
            return self._staged_inputs(rows, starts, counts)
        row_t, start_t, count_t = self._as_tensor(rows), self._as_tensor(starts), self._as_tensor(counts)
        qsl = torch.zeros(len(count_t) + 1, dtype=torch.int64, device=self.device)
        torch.cumsum(count_t, 0, out=qsl[1:])
        return row_t, start_t, qsl, int(qsl[-1])

    def _staged_inputs(self, rows: Any, starts: Any, counts: Any) -> tuple[Any, Any, Any, int]:
        """Host inputs packed into the pinned staging buffer, copied to the device at once."""
        torch = self._torch
        buf = array("i", rows)
        n = len(buf)
        buf.extend(starts)
        total = 0
        buf.append(0)
        for c in counts:
            total += c
            buf.append(total)
        if self._stage_event is not None:
            self._stage_event.synchronize()  # the previous step's copy has read the staging buffer
        if self._stage is None or self._stage.numel() < len(buf):
            self._stage = torch.empty(max(len(buf), 1024), dtype=torch.int32, pin_memory=True)
            self._stage_event = self._torch.cuda.Event()
        self._stage[: len(buf)] = torch.frombuffer(buf, dtype=torch.int32)
        dev = self._stage[: len(buf)].to(self.device, non_blocking=True)
        self._stage_event.record()
        dev = dev.to(torch.int64)
        return dev[:n], dev[n : 2 * n], dev[2 * n :], total

    def _fence(self) -> None:
        """Wait until the copy of the host rows started by :meth:`sync` has read them
        (before the host rows are written again). Never raises: an error waits in
        ``_fence_error`` for the next :meth:`sync` (the native core calls this)."""
        if not self._in_flight:
            return
        self._in_flight = False
        try:
            if self._emulated:
                self._finish_emulated_copy()
            elif self._event is not None:
                self._event.synchronize()
        except Exception as exc:  # kept for the next sync: the core cannot take an error here
            self._fence_error = exc

    def _raise_fence_error(self) -> None:
        error, self._fence_error = self._fence_error, None
        if error is not None:
            raise error

    def _device_read(self) -> None:
        """The device is about to be read: with :data:`CPU_COPY`, the copy
        happens now (a GPU's stream runs it before the read)."""
        if self._emulated:
            self._finish_emulated_copy()
        self._raise_fence_error()

    def _finish_emulated_copy(self) -> None:
        """:data:`CPU_COPY`'s copy of the last commit, checking that the host rows
        did not change since (on a GPU they would race the copy).

        Raises:
            InvariantViolation: The host rows changed while the copy was in flight.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return
        live, committed = pending
        now = self.host[:, :live]
        self.dev[:, :live].copy_(now)
        if not self._torch.equal(now, committed):
            raise InvariantViolation(
                "device tables: the host rows were written while their copy to the device was in flight "
                "(a write after sync() that did not pass the fence)"
            )

    def _allocate(self, rows: int, width: int) -> None:
        """Host and device tensors of ``rows`` rows and ``width`` columns (rows in use kept)."""
        self._fence()
        torch = self._torch
        pin = self.device.type == "cuda"
        groups = len(self.block_sizes)
        host = torch.zeros((groups, rows, width), dtype=torch.int32, pin_memory=pin)
        old = getattr(self, "host", None)
        if old is not None:
            keep = min(old.shape[1], rows)
            host[:, :keep, : old.shape[2]] = old[:, :keep]
        self.host = host
        self.dev = torch.zeros_like(host, device=self.device) if self._separate else host
        self._expanded.clear()
        self._flat = memoryview((ctypes.c_int32 * host.numel()).from_address(host.data_ptr())).cast("B").cast("i")
        self._dirty = True
        if self._core is not None:
            self._core._bind_host_tables(host.data_ptr(), rows, width, host, self._grow, self._fence)

    def _grow(self, rows: int) -> None:
        """Called by the native core when a new row does not fit."""
        n = self.host.shape[1]
        while n < rows:
            n *= 2
        self._allocate(n, self.host.shape[2])

    def _new_row(self, request_id: str) -> int:
        if self._holes:
            row = self._holes.pop()
            self._row_ids[row] = request_id
        else:
            row = len(self._row_ids)
            if row >= self.host.shape[1]:
                self._grow(row + 1)
            self._row_ids.append(request_id)
            self._mirrors.append([[] for _ in self.block_sizes])
        self._rows[request_id] = row
        self._dirty = True  # a row newly in use is copied even when its tables are empty
        return row

    def _condense(self) -> None:
        """vLLM's input-batch condense (see the module docstring); Python manager only."""
        while self._holes:
            while self._holes and self._holes[0] == len(self._row_ids) - 1:
                self._holes.pop(0)
                self._row_ids.pop()
                self._mirrors.pop()
            if not self._holes:
                break
            self._fence()
            empty, last = self._holes.pop(), len(self._row_ids) - 1
            moved = self._row_ids[last]
            assert moved is not None  # the holes at the end were dropped above
            self.host[:, empty].copy_(self.host[:, last])
            self.host[:, last].zero_()
            self._row_ids[empty], self._mirrors[empty] = moved, self._mirrors[last]
            self._rows[moved] = empty
            self._row_ids.pop()
            self._mirrors.pop()
            self._dirty = True

    def _write(self, group: int, row: int, first: int, table: Sequence[int], old_len: int) -> None:
        """Write ``table[first:]`` at ``first`` and zero what the old row held beyond it."""
        self._fence()
        width = self.host.shape[2]
        if len(table) > width:
            cols = width
            while cols < len(table):
                cols *= 2
            self._allocate(self.host.shape[1], cols)
            self.cols[group] = max(self.cols[group], cols)
            width = cols
        if len(table) > self.cols[group]:
            self.cols[group] = min(width, max(len(table), 2 * self.cols[group]))
        base = (group * self.host.shape[1] + row) * width
        if first < len(table):
            self._flat[base + first : base + len(table)] = array("i", table[first:])
        if old_len > len(table):
            self._flat[base + len(table) : base + old_len] = array("i", bytes(4 * (old_len - len(table))))
        self._dirty = True

    def _as_tensor(self, x: Any) -> Any:
        torch = self._torch
        if isinstance(x, torch.Tensor):
            return x.to(device=self.device, dtype=torch.int64)
        if isinstance(x, array | memoryview | bytes | bytearray):
            return torch.frombuffer(bytearray(x), dtype=torch.int32).to(device=self.device, dtype=torch.int64)
        return torch.tensor(list(x), dtype=torch.int64, device=self.device)


def resolve_device(torch: Any, device: Any) -> tuple[Any, bool]:
    """The torch device of ``device`` and whether the device tensor is kept
    apart from the host tensor (CUDA and :data:`CPU_COPY`).

    Raises:
        ConfigError: Not a device kvimpl's tables run on, or CUDA on a machine without it.
    """
    if device == CPU_COPY:
        return torch.device("cpu"), True
    hint = f"pass 'cpu', {CPU_COPY!r} (CPU tensors with the device copy kept apart, as on a GPU) or 'cuda[:N]'"
    if not isinstance(device, str | torch.device):
        raise ConfigError(f"device {device!r} is not a device name; {hint}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ConfigError(f"device {device!r} is not a torch device ({exc}); {hint}") from None
    if dev.type == "cpu":
        return dev, False
    if dev.type != "cuda":
        raise ConfigError(f"device {device!r}: kvimpl's device tables run on the CPU or CUDA only; {hint}")
    if not torch.cuda.is_available():
        raise ConfigError(f"device {device!r}: torch sees no CUDA device on this machine; pass 'cpu' or {CPU_COPY!r}")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(f"device {device!r}: torch sees {torch.cuda.device_count()} CUDA devices")
    return dev, True


def table_geometry(
    block_sizes: Sequence[int],
    kernel_block_sizes: Sequence[int] | None,
    cp_world_sizes: Sequence[int] | None,
    cp_rank: int,
    cp_interleave: int,
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Per group: the physical block size (the manager's over the group's
    context-parallel world), the kernel blocks per physical block, and the world.

    Raises:
        ConfigError: Lengths that differ from the groups', a world that does not
            divide the manager block size, a kernel block size that does not
            divide the physical one, a rank outside a world, or an interleave
            that does not divide a context-parallel group's physical block size.
    """
    groups = len(block_sizes)
    worlds = tuple(cp_world_sizes) if cp_world_sizes is not None else (1,) * groups
    if len(worlds) != groups:
        raise ConfigError(f"device tables: {len(worlds)} context-parallel world sizes for {groups} groups")
    physical = []
    for g, (bs, w) in enumerate(zip(block_sizes, worlds, strict=True)):
        if not is_int(w) or w < 1 or bs % w:
            raise ConfigError(f"device tables: group {g}: context-parallel world {w!r} does not divide block size {bs}")
        physical.append(bs // w)
    kernels = tuple(kernel_block_sizes) if kernel_block_sizes is not None else tuple(physical)
    if len(kernels) != groups:
        raise ConfigError(f"device tables: {len(kernels)} kernel block sizes for {groups} groups")
    factors = []
    for g, (p, k) in enumerate(zip(physical, kernels, strict=True)):
        if not is_int(k) or k < 1 or p % k:
            raise ConfigError(f"device tables: group {g}: kernel block size {k!r} does not divide block size {p}")
        factors.append(p // k)
    if not is_int(cp_interleave) or cp_interleave < 1:
        raise ConfigError(f"device tables: cp_interleave {cp_interleave!r} is not a positive int")
    for g, (p, w) in enumerate(zip(physical, worlds, strict=True)):
        if w > 1 and (not is_int(cp_rank) or not 0 <= cp_rank < w or p % cp_interleave):
            raise ConfigError(
                f"device tables: group {g}: rank {cp_rank!r} of a context-parallel world of {w} "
                f"with interleave {cp_interleave} over blocks of {p}"
            )
    return tuple(physical), tuple(factors), worlds


def _host_kernel(device: Any) -> Any:
    """The native module for a CPU device when it is built (and ``KVREF_NATIVE`` is not ``0``), else None."""
    if device.type != "cpu":
        return None
    from kvimpl.native import native_enabled, native_module  # noqa: PLC0415 - kvimpl.native imports this module

    return native_module() if native_enabled() else None


def _triton_kernels(device: Any) -> Any:
    """:mod:`kvimpl.device_kernels` when the device is CUDA and Triton imports, else None."""
    if device.type != "cuda":
        return None
    try:
        from kvimpl import device_kernels  # noqa: PLC0415 - Triton is optional
    except ImportError:
        return None
    return device_kernels


# -- the managers' argument checks (both builds) ---------------------------------


def valid_group(op: str, group: object, groups: int) -> int:
    """``group`` when it is one of a configuration's ``groups`` groups.

    Raises:
        GroupCountError: A group that is not an int (or is a bool), or is out
            of range (negative indices are not accepted: -1 is not the last group).
    """
    if not is_int(group) or not 0 <= group < groups:
        raise GroupCountError(f"{op}: group {group!r} is not one of the configuration's groups 0..{groups - 1}")
    return group


def check_slot_arguments(request_ids: Sequence[object], positions: Sequence[object]) -> None:
    """The type checks of ``slot_mapping`` before any lookup.

    Raises:
        InvalidRequestError: A request id that is not a str.
        InvalidTokenCountError: A position that is not an int (or is a bool).
    """
    for rid in request_ids:
        check_request_id("slot_mapping", rid)
    for pos in positions:
        if not is_int(pos):
            raise InvalidTokenCountError(f"slot_mapping: position {pos!r} is not an int")


def no_device_tables(op: str, manager: str) -> UnsupportedOperationError:
    """The error of a device-table call on a manager built without a ``device``."""
    return UnsupportedOperationError(f"{op}: this {manager} keeps no device tables; construct it with device='cpu'")
