"""A frozen, comparable picture of a KV-cache manager's observable state.

Every implementation (the spec, kvimpl, an adapter around real vLLM or another
engine) can produce one; two managers driven through the same operations must
produce equal views after every operation.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

BlockIds = tuple[tuple[int, ...], ...]
"""Block ids per KV-cache group (outer index = group)."""


@dataclass(frozen=True, slots=True)
class KVView:
    """Observable state.

    Attributes:
        free_queue: Free block ids, eviction order first (head) to last.
        ref_cnt: ``(block_id, ref_cnt)`` of every non-null block with ref_cnt > 0,
            ascending by id. The null block's counter is not part of the view
            (vLLM does not maintain it).
        cached: ``(key, block ids)`` per prefix-cache key, ascending by key; the
            ids are in insertion order, the first one is returned on lookup.
        tables: ``(request_id, block ids per group)`` of every request that
            holds at least one table entry, ascending by request id.
        usage: ``1 - free / (num_blocks - 1)``.
    """

    free_queue: tuple[int, ...]
    ref_cnt: tuple[tuple[int, int], ...]
    cached: tuple[tuple[bytes, tuple[int, ...]], ...]
    tables: tuple[tuple[str, BlockIds], ...]
    usage: float

    def to_json(self) -> dict[str, object]:
        """A language-neutral form: keys as hex strings, tuples as lists."""
        return {
            "free_queue": list(self.free_queue),
            "ref_cnt": [list(p) for p in self.ref_cnt],
            "cached": [[k.hex(), list(ids)] for k, ids in self.cached],
            "tables": [[rid, [list(g) for g in groups]] for rid, groups in self.tables],
            "usage": round(self.usage, 9),
        }

    def digest(self) -> str:
        """SHA-256 (hex) of the canonical JSON of :meth:`to_json`."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def diff_views(a: KVView, b: KVView) -> list[str]:
    """Human-readable differences between two views (empty when equal).

    post: (__return__ == []) == (a == b)
    post: len(__return__) <= 5
    """
    out: list[str] = []
    for name in ("free_queue", "ref_cnt", "cached", "tables", "usage"):
        va, vb = getattr(a, name), getattr(b, name)
        if va != vb:
            out.append(f"{name}: {va!r} != {vb!r}")
    return out
