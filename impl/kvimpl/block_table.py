"""Device block tables: the manager's per-request tables as int32 tensors.

The only kvimpl module that touches torch, and only when a
:class:`kvimpl.kv_cache_manager.KVCacheManager` is built with a ``device``
(torch is imported lazily, so kvimpl imports and runs without it). Per group
one ``int32`` tensor ``[max_requests, max_blocks_per_request]`` on the device;
row ``r`` holds the table of the request in row ``r``, padded with 0 (the null
block). Live requests occupy rows ``0 .. num_live - 1`` (a freed row is
filled by moving the last live row into it, as vLLM's input batch condenses),
so :meth:`BlockTable.block_table` is a view, not a copy.

NOTE: the manager calls :meth:`BlockTable.update` after each operation that
can change a request's tables (allocation, skipped-block removal) and
:meth:`BlockTable.remove` when it frees or pops them. ``update`` compares the
tables against a host mirror of each row and writes only the changed suffix
(an append writes the new blocks, a null-out the nulled range), so a decode
step that takes no block writes nothing to the device.

Capacities: ``cdiv(max_model_len, block_size)`` columns per group plus the
Mamba speculative blocks and sink blocks; both dimensions double on demand
(a cross-attention table sized by a long encoder input, more live requests
than ``max_requests``).

Upstream: ``vllm/v1/worker/block_table.py`` (``BlockTable``,
``compute_slot_mapping``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvimpl.invariants import require
from kvspec.config import KVCacheConfig, Mamba, SinkFullAttention
from kvspec.errors import InvalidTokenCountError, UnknownRequestError

DEFAULT_MAX_REQUESTS = 256
"""Initial rows per group (vLLM's default ``max_num_seqs``); grows on demand."""


class BlockTable:
    """Per-group device block tables with one row per live request.

    inv: rows[row_ids[r]] == r for every live row r, and len(rows) == len(row_ids)
    inv: tensors[g][r, :len(mirrors[r][g])] == mirrors[r][g] and the rest of the row is 0
    """

    def __init__(
        self,
        block_sizes: Sequence[int],
        max_blocks_per_request: Sequence[int],
        max_requests: int,
        device: str,
    ) -> None:
        """Zeroed tables on ``device``.

        Raises:
            ImportError: If torch is not installed.
        """
        import torch  # noqa: PLC0415 - torch is optional; only a manager with a device needs it

        self._torch: Any = torch
        self.device: Any = torch.device(device)
        self.block_sizes = tuple(block_sizes)
        self.tensors: list[Any] = [
            torch.zeros((max(max_requests, 1), max(cols, 1)), dtype=torch.int32, device=self.device)
            for cols in max_blocks_per_request
        ]
        self.rows: dict[str, int] = {}
        self.row_ids: list[str] = []
        self.mirrors: list[list[list[int]]] = []
        """Per live row, per group: the host copy of what the device row holds."""

    @classmethod
    def for_config(cls, config: KVCacheConfig, device: str, max_requests: int = DEFAULT_MAX_REQUESTS) -> BlockTable:
        """Tables sized for ``config``: ``max_model_len`` tokens per request."""
        cols = []
        for kind in config.groups:
            n = -(config.max_model_len // -kind.block_size)
            if isinstance(kind, Mamba):
                n += kind.num_speculative_blocks
            if isinstance(kind, SinkFullAttention):
                n += kind.sink_len // kind.block_size
            cols.append(n)
        return cls([k.block_size for k in config.groups], cols, max_requests, device)

    @property
    def num_live(self) -> int:
        """Requests that currently have a row."""
        return len(self.row_ids)

    def block_table(self, group: int) -> Any:
        """``int32[num_live, max_blocks]`` view of the live rows of ``group``."""
        return self.tensors[group][: len(self.row_ids)]

    def row_of(self, request_id: str) -> int:
        """The row of a live request.

        Raises:
            UnknownRequestError: If the request has no row.
        """
        row = self.rows.get(request_id)
        if row is None:
            raise UnknownRequestError(f"block_table: request {request_id!r} holds no blocks, so it has no row")
        return row

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
        rows = [self.row_of(rid) for rid in request_ids]
        for rid, row, pos in zip(request_ids, rows, positions, strict=True):
            held = len(self.mirrors[row][group])
            if not 0 <= pos < held * bs:
                raise InvalidTokenCountError(
                    f"slot_mapping: position {pos} of request {rid!r} is outside its {held} blocks of group "
                    f"{group} ({held * bs} slots); allocate the slots first"
                )
        torch = self._torch
        row_t = torch.tensor(rows, dtype=torch.int64, device=self.device)
        pos_t = torch.tensor(list(positions), dtype=torch.int64, device=self.device)
        ids = self.tensors[group][row_t, pos_t // bs].to(torch.int64)
        return ids * bs + pos_t % bs

    def update(self, request_id: str, tables: Sequence[Sequence[int]]) -> None:
        """Make the request's rows equal ``tables`` (one per group), giving it a
        row first if it has none; only the changed suffix of a row is written."""
        row = self.rows.get(request_id)
        if row is None:
            row = self._new_row(request_id)
        mirror = self.mirrors[row]
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
        row = self.rows.pop(request_id, None)
        if row is None:
            return
        last = len(self.row_ids) - 1
        if row != last:
            moved = self.row_ids[last]
            for t in self.tensors:
                t[row].copy_(t[last])
            self.row_ids[row], self.mirrors[row] = moved, self.mirrors[last]
            self.rows[moved] = row
        for t in self.tensors:
            t[last].zero_()
        self.row_ids.pop()
        self.mirrors.pop()

    def check_invariants(self) -> None:
        """Raise InvariantViolation if a device row differs from its mirror (copies to the host)."""
        require(all(self.rows.get(rid) == r for r, rid in enumerate(self.row_ids)), "row index disagrees with row ids")
        require(len(self.rows) == len(self.row_ids) == len(self.mirrors), "row bookkeeping lengths differ")
        for g, t in enumerate(self.tensors):
            host = t.cpu().tolist()
            for r, row in enumerate(host):
                want = self.mirrors[r][g] if r < len(self.mirrors) else []
                require(row == list(want) + [0] * (len(row) - len(want)), f"group {g} row {r}: {row} != {want}")

    def _new_row(self, request_id: str) -> int:
        row = len(self.row_ids)
        if row >= self.tensors[0].shape[0]:
            torch = self._torch
            self.tensors = [torch.cat([t, torch.zeros_like(t)]) for t in self.tensors]
        self.rows[request_id] = row
        self.row_ids.append(request_id)
        self.mirrors.append([[] for _ in self.tensors])
        return row

    def _write(self, group: int, row: int, first: int, table: Sequence[int], old_len: int) -> None:
        """Write ``table[first:]`` at ``first`` and zero what the old row held beyond it."""
        torch = self._torch
        t = self.tensors[group]
        if len(table) > t.shape[1]:
            cols = t.shape[1]
            while cols < len(table):
                cols *= 2
            wider = torch.zeros((t.shape[0], cols), dtype=torch.int32, device=self.device)
            wider[:, : t.shape[1]] = t
            self.tensors[group] = t = wider
        if first < len(table):
            t[row, first : len(table)] = torch.tensor(table[first:], dtype=torch.int32, device=self.device)
        if old_len > len(table):
            t[row, len(table) : old_len] = 0
