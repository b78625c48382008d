"""Readable differences between two views: the first differing field, each
side's value under its name, prefix-cache keys decoded.

A prefix-cache key is the block hash followed by the group id as 4 bytes,
big-endian (vLLM's ``make_block_hash_with_group_id``); it is printed as
``hash 3f2a…9c01 group 0``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvspec.view import KVView

FIELDS = ("free_queue", "ref_cnt", "cached", "tables", "usage")
"""The view's fields, in the order they are compared."""


def decode_key(key: bytes) -> str:
    """``hash <first 4 bytes>…<last 2 bytes> group <id>`` for a prefix-cache key."""
    digest, group = key[:-4], int.from_bytes(key[-4:], "big")
    short = digest.hex() if len(digest) <= 8 else f"{digest[:4].hex()}…{digest[-2:].hex()}"
    return f"hash {short} group {group}"


def first_difference(a: KVView, b: KVView, a_name: str, b_name: str) -> tuple[str, str] | None:
    """The first field where ``a`` and ``b`` differ and a one-line
    description naming which side holds which value; None if they are equal."""
    for name in FIELDS:
        va, vb = getattr(a, name), getattr(b, name)
        if va != vb:
            return name, f"{name}: {_DESCRIBE[name](va, vb, a_name, b_name)}"
    return None


def describe(a: KVView, b: KVView, a_name: str, b_name: str) -> str:
    """:func:`first_difference`'s description, plus how many other fields differ."""
    first = first_difference(a, b, a_name, b_name)
    if first is None:
        return "the views are equal"
    others = [n for n in FIELDS if n != first[0] and getattr(a, n) != getattr(b, n)]
    return first[1] + (f" (also differ: {', '.join(others)})" if others else "")


def _sequence(va: tuple[Any, ...], vb: tuple[Any, ...], a_name: str, b_name: str) -> str:
    index = next((i for i, (x, y) in enumerate(zip(va, vb, strict=False)) if x != y), min(len(va), len(vb)))
    at_a = repr(va[index]) if index < len(va) else "nothing (shorter)"
    at_b = repr(vb[index]) if index < len(vb) else "nothing (shorter)"
    return (
        f"first difference at position {index}: {a_name} has {at_a}, {b_name} has {at_b} "
        f"({a_name}: {len(va)} entries {_clip(va)}; {b_name}: {len(vb)} entries {_clip(vb)})"
    )


def _mapping(
    da: dict[Any, Any], db: dict[Any, Any], a_name: str, b_name: str, label: Callable[[Any], str]
) -> str:
    keys = sorted(set(da) | set(db))
    key = next(k for k in keys if da.get(k) != db.get(k))
    count = sum(1 for k in keys if da.get(k) != db.get(k))
    more = f" ({count - 1} more entries differ)" if count > 1 else ""
    return f"{label(key)}: {a_name} has {_value(da, key)}, {b_name} has {_value(db, key)}{more}"


def _value(d: dict[Any, Any], key: Any) -> str:
    return repr(d[key]) if key in d else "no entry"


def _ref_cnt(va: Any, vb: Any, a_name: str, b_name: str) -> str:
    return _mapping(dict(va), dict(vb), a_name, b_name, lambda b: f"block {b}")


def _cached(va: Any, vb: Any, a_name: str, b_name: str) -> str:
    da = {k: list(ids) for k, ids in va}
    db = {k: list(ids) for k, ids in vb}
    return _mapping(da, db, a_name, b_name, decode_key)


def _tables(va: Any, vb: Any, a_name: str, b_name: str) -> str:
    da = {rid: [list(g) for g in groups] for rid, groups in va}
    db = {rid: [list(g) for g in groups] for rid, groups in vb}
    return _mapping(da, db, a_name, b_name, lambda rid: f"request {rid!r}")


def _usage(va: Any, vb: Any, a_name: str, b_name: str) -> str:
    return f"{a_name} has {va!r}, {b_name} has {vb!r}"


def _clip(values: tuple[Any, ...], limit: int = 12) -> str:
    shown = list(values[:limit])
    return f"{shown}" if len(values) <= limit else f"{shown[:-1]} + {len(values) - limit + 1} more"


_DESCRIBE: dict[str, Callable[[Any, Any, str, str], str]] = {
    "free_queue": _sequence,
    "ref_cnt": _ref_cnt,
    "cached": _cached,
    "tables": _tables,
    "usage": _usage,
}
