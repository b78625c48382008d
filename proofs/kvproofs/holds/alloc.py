"""Block-count arithmetic of ``get_num_blocks_to_allocate``.

The pure part is :func:`kvspec.single_type_kv_cache_manager.blocks_to_allocate`,
which the base manager's ``get_num_blocks_to_allocate`` calls; these
harnesses state its properties over plain ints and bools. That the method
feeds it the right values (the estimate equals the blocks the allocation
really takes) is checked on the real classes by ``proofs/bounded/alloc.py``.
"""

from __future__ import annotations

from kvproofs.contracts import about
from kvproofs.holds import unenforced
from kvspec.single_type_kv_cache_manager import blocks_to_allocate


def _count(required: int, cap: int | None, have: int, skipped: int, hit_free: list[bool], tracked: bool) -> int:
    return unenforced(blocks_to_allocate)(required, cap, have, skipped, hit_free, tracked)


@about(blocks_to_allocate)
def alloc_fast_path(required: int, cap: int | None, have: int, more: int) -> int:
    """A request the manager already tracks only grows its table: the fewest
    blocks that bring it to ``required`` entries (to ``cap`` when capped),
    nothing when it is long enough; monotone in ``required``; a cap never
    adds blocks.

    pre: 0 <= required <= 12 and 0 <= have <= 12 and 0 <= more <= 4 and (cap is None or 1 <= cap <= 12)
    post: __return__ >= 0
    post: have + __return__ >= min(required, cap if cap is not None else required)
    post: __return__ == 0 or have + __return__ - 1 < min(required, cap if cap is not None else required)
    post: __return__ <= _count(required + more, cap, have, 0, [], True)
    post: __return__ <= _count(required, None, have, 0, [], True)
    """
    # crosshair: max_iterations=1000
    return _count(required, cap, have, 0, [], True)


@about(blocks_to_allocate)
def alloc_new_request(required: int, have: int, skipped: int, hit_free: list[bool], i: int) -> int:
    """A new request: each hit still in the free queue costs exactly one block
    if it will be touched (position ``>= skipped - have``) and none if it
    becomes null; hits never cost more than fresh blocks would; and a request
    whose every needed position is skipped needs no fresh block.

    pre: 0 <= required <= 8 and 0 <= have <= 3 and -1 <= skipped <= 8 and len(hit_free) <= 4
    pre: 0 <= i < len(hit_free)
    post: __return__ >= 0
    post: __return__ - _flip(required, have, skipped, hit_free, i) == _touch_cost(hit_free, i, skipped - have)
    post: __return__ <= _count(required, None, have, skipped, [], False) + len(hit_free)
    post: _in_use(required, have, skipped, len(hit_free)) <= _count(required, None, have, skipped, [], False)
    post: skipped < required or __return__ == sum(hit_free[max(0, skipped - have) :])
    """
    # crosshair: max_iterations=1000
    return _count(required, None, have, skipped, hit_free, False)


def _touch_cost(hit_free: list[bool], i: int, first_touched: int) -> int:
    """What hit ``i`` being free costs: 1 if it is touched, 0 if it becomes null
    (so flipping it changes the count by +1 or -1, or not at all)."""
    if i < first_touched:
        return 0
    return 1 if hit_free[i] else -1


def _in_use(required: int, have: int, skipped: int, num_hits: int) -> int:
    return _count(required, None, have, skipped, [False] * num_hits, False)


def _flip(required: int, have: int, skipped: int, hit_free: list[bool], i: int) -> int:
    flipped = [*hit_free[:i], not hit_free[i], *hit_free[i + 1 :]]
    return _count(required, None, have, skipped, flipped, False)


@about(blocks_to_allocate)
def alloc_cap(required: int, cap: int, have: int, skipped: int, hit_free: list[bool], tracked: bool) -> int:
    """The admission cap (``full_sequence_must_fit``) only ever lowers the
    count, and a cap at least ``required`` changes nothing.

    pre: 0 <= required <= 8 and 1 <= cap <= 8 and 0 <= have <= 3 and -1 <= skipped <= 8 and len(hit_free) <= 3
    post: __return__ <= _count(required, None, have, skipped, hit_free, tracked)
    post: cap < required or __return__ == _count(required, None, have, skipped, hit_free, tracked)
    post: __return__ <= _count(required + 1, cap, have, skipped, hit_free, tracked)
    """
    # crosshair: max_iterations=1000
    return _count(required, cap, have, skipped, hit_free, tracked)
