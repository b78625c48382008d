"""``BlockPool.free_blocks`` of kvspec and kvimpl: the same state built from
plain ints on each side, the same blocks freed, the resulting free queue and
reference counts compared.

The spec reorders with the pure :func:`kvspec.block_pool.requeue`; kvimpl
relinks its intrusive list in place. A negative block count is outside the
compared domain (both wrappers return the same marker). A caller error is compared by exception
type only (``"DoubleFreeError"`` and so on), since both sides raise the same
classes with messages worded independently.
"""

from __future__ import annotations

from typing import Any

from kvimpl.block_pool import BlockPool as ImplPool
from kvspec.block_pool import BlockPool as SpecPool
from kvspec.errors import KVCacheError
from kvspec.hashing import BlockHash, make_key

NUM_BLOCKS = 6


Outcome = tuple[tuple[int, ...], tuple[int, ...]] | str


def _run(pool: Any, taken: int, hashed: list[bool], shared: list[bool], freed: list[int]) -> str | None:
    """Drive either pool (same method names; their ``BlockId`` NewTypes are
    distinct types, so this shared driver is untyped); the error's class name,
    or None."""
    if taken < 0:
        # Outside the domain: no caller asks for a negative count (each guards
        # n <= 0 first). There the spec's slice takes blocks from the head and
        # kvimpl takes none; see proofs/README.md, Findings.
        return "negative count"
    try:
        blocks = pool.get_new_blocks(taken)
        for b, h, s in zip(blocks, hashed, shared, strict=False):
            if h:
                key = make_key(BlockHash(bytes([b])), 0)
                pool.block_hash[b], pool.cached[key] = key, [b]
            if s:
                pool.touch([b])
        pool.free_blocks(freed)
    except KVCacheError as exc:
        return type(exc).__name__
    return None


def spec_free_blocks(taken: int, hashed: list[bool], shared: list[bool], freed: list[int]) -> Outcome:
    """The spec pool: take ``taken`` blocks, hash and share some, free ``freed``."""
    pool = SpecPool(NUM_BLOCKS, True, 1)
    got = _run(pool, taken, hashed, shared, freed)
    return got if got is not None else (tuple(pool.free_queue), tuple(pool.ref_cnt))


def impl_free_blocks(taken: int, hashed: list[bool], shared: list[bool], freed: list[int]) -> Outcome:
    """The kvimpl pool, driven the same way."""
    pool = ImplPool(NUM_BLOCKS, True, 1)
    got = _run(pool, taken, hashed, shared, freed)
    return got if got is not None else (tuple(pool.free_queue.to_list()), tuple(pool.ref_cnt))
