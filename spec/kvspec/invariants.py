"""Support for the named invariant predicates.

Each stateful class of the spec states its invariants as module-level
predicates named ``inv_*`` (pure functions returning bool, each with a
docstring saying what it means) and checks them all in ``check_invariants()``.
A broken invariant is a bug in the implementation under test, never a caller
error, so it raises :class:`InvariantViolation`, an ``AssertionError`` that
is raised even under ``python -O``.
"""

from __future__ import annotations

from kvspec.view import KVView


class InvariantViolation(AssertionError):
    """An internal invariant does not hold (the one class for kvspec and kvimpl alike)."""


def require(holds: bool, message: str) -> None:
    """Raise InvariantViolation(message) unless ``holds``.

    raises: InvariantViolation
    post: holds
    """
    if not holds:
        raise InvariantViolation(message)


def inv_tables_append_only(before: KVView, after: KVView) -> bool:
    """Between two states, a request's table only grows at its end, and an
    entry only changes by becoming null (never back): block tables are
    append-only, and a position that was nulled (outside the attention
    window) stays null. A request that appears or disappears is
    unconstrained.

    post: __return__ or before != after
    post: __return__ or any(t[0] in dict(before.tables) for t in after.tables)
    """
    old = dict(before.tables)
    for rid, groups in after.tables:
        for prev, cur in zip(old.get(rid, ()), groups, strict=False):
            if len(cur) < len(prev):
                return False
            if any(p != c and (p == 0 or c != 0) for p, c in zip(prev, cur, strict=False)):
                return False
    return True


def inv_hash_lifetime(before: KVView, after: KVView, operation: str) -> bool:
    """Hashes survive freeing and touching (a freed block stays hittable until
    it is reused): only
    ``evict_blocks`` and ``reset_prefix_cache`` drop arbitrary entries, and
    ``allocate_slots`` only those of blocks it took from the free queue (so
    they sit in a table afterwards, or, with fine-grained hits, are retained
    for a pending copy; they may have been freed by the same call, which
    first releases blocks outside the attention window) and those it moved
    to another block (a Mamba tail entry moved to its owner's private copy);
    ``cache_blocks`` only the entries of a block it keys anew (a block's
    partial-tail entry gives way to its full key once it fills: vLLM 0.29.0
    does so when an asynchronous scheduler caches after a step's output);
    every other operation drops none.

    post: __return__ or before.cached != after.cached
    post: __return__ or operation not in ("evict_blocks", "reset_prefix_cache")
    """
    now = {(k, b) for k, ids in after.cached for b in ids}
    was = {(k, b) for k, ids in before.cached for b in ids}
    lost = was - now
    if operation in ("evict_blocks", "reset_prefix_cache"):
        return True
    if operation in ("allocate_slots", "allocate_slots_batch"):  # a batch: several allocations in a row
        free = set(after.free_queue)
        taken = set(before.free_queue) - free
        moved = {k for k, _ in now - was}
        # in no free queue afterwards: in a table, or retained for a pending copy (a block the
        # call first released outside the window may be the copy's destination)
        return all(b not in free or b in taken or k in moved for k, b in lost)
    if operation == "cache_blocks":
        rekeyed = {b for _, b in now - was}
        return all(b in rekeyed for _, b in lost)
    return not lost
