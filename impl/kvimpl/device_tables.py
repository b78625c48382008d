"""Device block tables: a host table updated in place, copied to the device once per step.

The only kvimpl module that touches torch, and only when a manager (either
build) is built with a ``device`` (imported lazily). One
``int32`` host tensor of shape ``(groups, rows, cols)`` holds every live
request's tables, row ``r`` the request in row ``r``, padded with the null
block 0; it is pinned when the device is CUDA. Live requests occupy rows
``0 .. live - 1`` (a freed row is filled by moving the last live row into
it, as vLLM's input batch condenses). The device tensor has the same shape;
:meth:`BlockTable.sync` copies the live rows of every group in one
non-blocking copy, only when something changed. On the CPU the host tensor
*is* the device tensor: nothing is copied.

Who writes the host rows: with the native core, the core itself, in C, as
it changes a table (only the entries that changed; see
``impl/kvimpl/_native/hosttab.c``); with the Python manager,
:meth:`BlockTable.update` and :meth:`BlockTable.remove`, called by the
manager after each operation that changes a request's tables, write the
changed suffix of the row through a ``memoryview`` of the host tensor.

NOTE: the earlier tables wrote each changed row to the device with one small
synchronous ``torch.tensor(list)`` per row (about 5 µs each); updating the
host in place and copying once per step costs about 70 µs per 256-request
step in all (measured before this module, on the CPU build of torch).

:meth:`BlockTable.slot_mapping_for_step` maps a whole step's positions
(rows, first positions, token counts as tensors or int32 buffers) to slots
with a few tensor operations, without per-request Python work.

Upstream: ``vllm/v1/worker/block_table.py`` (``BlockTable``, ``compute_slot_mapping``).
"""

from __future__ import annotations

import ctypes
from array import array
from collections.abc import Sequence
from typing import Any

from kvimpl.checks import check_request_id, is_int
from kvimpl.config_rules import manager_kinds
from kvimpl.invariants import require
from kvspec.config import KVCacheConfig, Mamba, SinkFullAttention
from kvspec.errors import GroupCountError, InvalidTokenCountError, UnknownRequestError, UnsupportedOperationError

DEFAULT_MAX_REQUESTS = 256
"""Initial rows (vLLM's default ``max_num_seqs``); grows on demand."""


class BlockTable:
    """Per-group device block tables with one row per live request.

    inv: rows[row_ids[r]] == r for every live row r
    inv: host[g, r, :len(tables of row r in g)] == those tables and the rest of the row is 0
    inv: after sync(), the device tensor's live rows equal the host's
    """

    def __init__(
        self,
        block_sizes: Sequence[int],
        max_blocks_per_request: Sequence[int],
        max_requests: int,
        device: str,
        core: Any = None,
    ) -> None:
        """Zeroed tables; with ``core`` (a native manager) the core writes the rows.

        Raises:
            ImportError: If torch is not installed.
        """
        import torch  # noqa: PLC0415 - torch is optional; only a manager with a device needs it

        self._torch: Any = torch
        self.device: Any = torch.device(device)
        self.block_sizes = tuple(block_sizes)
        self.cols = [max(c, 1) for c in max_blocks_per_request]
        self._core = core
        self._rows: dict[str, int] = {}
        self._row_ids: list[str] = []
        self._mirrors: list[list[list[int]]] = []
        self._dirty = False
        self._allocate(max(max_requests, 1), max(self.cols))

    @classmethod
    def for_config(
        cls, config: KVCacheConfig, device: str, max_requests: int = DEFAULT_MAX_REQUESTS, core: Any = None
    ) -> BlockTable:
        """Tables sized for ``config``: ``max_model_len`` tokens per request."""
        kinds = manager_kinds(config)  # block sizes as the managers run them (context parallelism)
        cols = []
        for kind in kinds:
            n = -(config.max_model_len // -kind.block_size)
            if isinstance(kind, Mamba):
                n += kind.num_speculative_blocks
            if isinstance(kind, SinkFullAttention):
                n += kind.sink_len // kind.block_size
            cols.append(n)
        return cls([k.block_size for k in kinds], cols, max_requests, device, core)

    # -- rows -----------------------------------------------------------------

    @property
    def rows(self) -> dict[str, int]:
        """Row of each live request."""
        if self._core is None:
            return self._rows
        return {rid: r for r, rid in enumerate(self._core._host_rows()[0])}

    @property
    def row_ids(self) -> list[str]:
        """The request of each live row."""
        return self._row_ids if self._core is None else list(self._core._host_rows()[0])

    @property
    def num_live(self) -> int:
        """Requests that currently have a row."""
        return len(self._row_ids) if self._core is None else int(self._core._host_state()[0])

    @property
    def mirrors(self) -> list[list[list[int]]]:
        """Per live row, per group: what the host row holds (without the padding)."""
        if self._core is None:
            return self._mirrors
        return [[list(g) for g in self._core.get_blocks(rid)] for rid in self.row_ids]

    def row_of(self, request_id: str) -> int:
        """The row of a live request.

        Raises:
            UnknownRequestError: If the request has no row.
        """
        row = self.rows.get(request_id)
        if row is None:
            raise UnknownRequestError(f"block_table: request {request_id!r} holds no blocks, so it has no row")
        return row

    # -- the step's copy ---------------------------------------------------------

    def sync(self) -> None:
        """Copy the live rows to the device when something changed (one
        non-blocking copy of every group; nothing on the CPU)."""
        if self._core is not None:
            live, dirty = self._core._host_state()
            self._dirty = self._dirty or bool(dirty)
        else:
            live = len(self._row_ids)
        if self._dirty and self.dev is not self.host:
            self.dev[:, :live].copy_(self.host[:, :live], non_blocking=True)
        self._dirty = False

    def block_table(self, group: int) -> Any:
        """``int32[num_live, max_blocks]`` of ``group``, up to date (synced first)."""
        self.sync()
        return self.dev[group, : self.num_live, : self.cols[group]]

    # -- slots -----------------------------------------------------------------

    def slot_mapping(self, request_ids: Sequence[str], positions: Sequence[int], group: int = 0) -> Any:
        """``int64`` slots, one per ``(request_ids[i], positions[i])`` pair:
        ``block_id * block_size + position % block_size`` for the table entry
        holding the position (a nulled entry maps into the null block).

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
        mirrors = self.mirrors
        row_list = []
        for rid, pos in zip(request_ids, positions, strict=True):
            row = rows.get(rid)
            if row is None:
                raise UnknownRequestError(f"block_table: request {rid!r} holds no blocks, so it has no row")
            held = len(mirrors[row][group])
            if not 0 <= pos < held * bs:
                raise InvalidTokenCountError(
                    f"slot_mapping: position {pos} of request {rid!r} is outside its {held} blocks of group "
                    f"{group} ({held * bs} slots); allocate the slots first"
                )
            row_list.append(row)
        torch = self._torch
        self.sync()
        row_t = torch.tensor(row_list, dtype=torch.int64, device=self.device)
        pos_t = torch.tensor(list(positions), dtype=torch.int64, device=self.device)
        ids = self.dev[group][row_t, pos_t // bs].to(torch.int64)
        return ids * bs + pos_t % bs

    def slot_mapping_for_step(self, rows: Any, starts: Any, counts: Any, group: int = 0) -> Any:
        """The slots of a whole step: request ``i`` (host row ``rows[i]``)
        computes ``counts[i]`` tokens from position ``starts[i]`` on; the
        result lists their slots request by request (``int64``). Tensor
        operations only (inputs: tensors, int32 buffers or lists); positions
        must be allocated (unchecked, as in vLLM's ``compute_slot_mapping``).
        """
        torch = self._torch
        self.sync()
        as_t = self._as_tensor
        row_t, start_t, count_t = as_t(rows), as_t(starts), as_t(counts)
        bs = self.block_sizes[group]
        req = torch.repeat_interleave(torch.arange(len(count_t), device=self.device), count_t)
        first = torch.cumsum(count_t, 0) - count_t
        pos = start_t[req] + (torch.arange(len(req), device=self.device) - first[req])
        ids = self.dev[group][row_t[req], pos // bs].to(torch.int64)
        return ids * bs + pos % bs

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
        """Drop the request's row (no-op if it has none); the last live row moves into it."""
        row = self._rows.pop(request_id, None)
        if row is None:
            return
        last = len(self._row_ids) - 1
        if row != last:
            moved = self._row_ids[last]
            self.host[:, row].copy_(self.host[:, last])
            self._row_ids[row], self._mirrors[row] = moved, self._mirrors[last]
            self._rows[moved] = row
        self.host[:, last].zero_()
        self._row_ids.pop()
        self._mirrors.pop()
        self._dirty = True

    def check_invariants(self) -> None:
        """Raise InvariantViolation if a row differs from its request's tables (copies to the host)."""
        row_ids = self.row_ids
        rows = self.rows
        require(all(rows.get(rid) == r for r, rid in enumerate(row_ids)), "row index disagrees with row ids")
        require(len(rows) == len(row_ids), "row bookkeeping lengths differ")
        self.sync()
        mirrors = self.mirrors
        host = self.host.tolist()
        dev = self.dev.cpu().tolist() if self.dev is not self.host else host
        for g in range(len(self.block_sizes)):
            for r in range(len(row_ids)):
                want = list(mirrors[r][g])
                row = host[g][r]
                require(row == want + [0] * (len(row) - len(want)), f"group {g} row {r}: {row} != {want}")
                require(dev[g][r] == row, f"group {g} row {r}: the device row differs from the host row")

    # -- internals ---------------------------------------------------------------

    def _allocate(self, rows: int, width: int) -> None:
        """Host and device tensors of ``rows`` rows and ``width`` columns (live rows kept)."""
        torch = self._torch
        pin = self.device.type == "cuda"
        groups = len(self.block_sizes)
        host = torch.zeros((groups, rows, width), dtype=torch.int32, pin_memory=pin)
        old = getattr(self, "host", None)
        if old is not None:
            live = min(old.shape[1], rows)
            host[:, :live, : old.shape[2]] = old[:, :live]
        self.host = host
        self.dev = host if self.device.type == "cpu" else torch.zeros_like(host, device=self.device)
        self._flat = memoryview((ctypes.c_int32 * host.numel()).from_address(host.data_ptr())).cast("B").cast("i")
        self._dirty = True
        if self._core is not None:
            self._core._bind_host_tables(host.data_ptr(), rows, width, host, self._grow)

    def _grow(self, rows: int) -> None:
        """Called by the native core when a new row does not fit."""
        n = self.host.shape[1]
        while n < rows:
            n *= 2
        self._allocate(n, self.host.shape[2])

    def _new_row(self, request_id: str) -> int:
        row = len(self._row_ids)
        if row >= self.host.shape[1]:
            self._grow(row + 1)
        self._rows[request_id] = row
        self._row_ids.append(request_id)
        self._mirrors.append([[] for _ in self.block_sizes])
        return row

    def _write(self, group: int, row: int, first: int, table: Sequence[int], old_len: int) -> None:
        """Write ``table[first:]`` at ``first`` and zero what the old row held beyond it."""
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
