"""Free-queue order: :func:`kvspec.block_pool.requeue`, the reordering that
``BlockPool.free_blocks`` applies to the blocks whose ref_cnt reaches 0.

The spec's own contract only fixes the length. These harnesses state the
order rules over plain ints: unhashed blocks go to the front, hashed blocks to
the tail, each part in the given order, and the old queue keeps its order in
the middle. That ``free_blocks`` and the managers' ``free`` (last table entry
first) use it this way is checked on the real classes by
``proofs/bounded/pool.py``.
"""

from __future__ import annotations

from kvproofs.holds import unenforced
from kvspec.block_pool import requeue


def requeue_order(queue: list[int], released: list[int], hashed: list[bool]) -> list[int]:
    """Unhashed released blocks first (given order), then the old queue, then
    the hashed released blocks (given order); nothing lost or duplicated.

    pre: len(queue) <= 3 and len(released) <= 4 and len(hashed) == len(released)
    post: sorted(__return__) == sorted(queue + released)
    post: __return__[: len(released) - sum(hashed)] == [b for b, h in zip(released, hashed) if not h]
    post: __return__[len(__return__) - sum(hashed) :] == [b for b, h in zip(released, hashed) if h]
    post: __return__[len(released) - sum(hashed) : len(released) - sum(hashed) + len(queue)] == queue
    """
    # crosshair: max_iterations=60
    return unenforced(requeue)(queue, released, hashed)


def requeue_eviction(queue: list[int], released: list[int], hashed: list[bool], i: int, j: int) -> list[int]:
    """Eviction takes the queue from the front: a freed unhashed block is
    reused before any block that was free already, and a freed hashed block
    only after all of them; among freed blocks of one kind, earlier in
    ``released`` means evicted earlier.

    pre: len(queue) <= 2 and len(released) <= 3 and len(hashed) == len(released)
    pre: len(set(queue + released)) == len(queue) + len(released)
    pre: 0 <= i < len(released) and 0 <= j < len(released) and i < j
    post: hashed[i] or all(__return__.index(released[i]) < __return__.index(q) for q in queue)
    post: not hashed[i] or all(__return__.index(released[i]) > __return__.index(q) for q in queue)
    post: hashed[i] != hashed[j] or __return__.index(released[i]) < __return__.index(released[j])
    """
    # crosshair: max_iterations=60
    return unenforced(requeue)(queue, released, hashed)
