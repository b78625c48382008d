"""``get_num_blocks_to_allocate`` on a real manager and pool: the estimate is
exact.

The admission check compares the estimate with the free-queue length, so an
estimate that is too low lets an allocation fail half-way and one that is too
high refuses requests that fit. Here every case allocates for real and
compares the estimate with the blocks that really left the free queue.
"""

from __future__ import annotations

from itertools import product

from kvproofs.bounded import check, expect
from kvproofs.contracts import about
from kvspec import single_type_kv_cache_manager as stm
from kvspec.block_pool import BlockId, BlockPool
from kvspec.config import (
    MLA,
    AttentionKind,
    ChunkedLocal,
    FullAttention,
    SinkFullAttention,
    SlidingWindow,
    admission_cap,
)
from kvspec.profiles import NEWEST


def _kinds() -> list[AttentionKind]:
    kinds: list[AttentionKind] = []
    for bs in (1, 2):
        kinds += [FullAttention(bs), MLA(bs), SinkFullAttention(bs, bs)]
        kinds += [SlidingWindow(bs, w) for w in (1, 2, 3, 4)] + [ChunkedLocal(bs, c) for c in (1, 2, 3, 4)]
    return kinds


@check
@about(stm.blocks_to_allocate, releases=(NEWEST.release,))
def estimate_is_exact() -> int:
    """A new request with ``h`` hits (each free or held elsewhere) and ``new``
    more tokens, then ``more`` tokens on the next step (the fast path): each
    estimate equals the blocks the allocation then takes from the free queue,
    and the table covers every slot. Base-class kinds, block size 1-2."""
    cases = 0
    for kind in _kinds():
        bs = kind.block_size
        for h in range(4):
            for hit_free, new, more in product(product((False, True), repeat=h), range(5), range(3)):
                case = (kind, hit_free, new, more)
                cases += 1
                pool = BlockPool(24, True, bs)
                manager = stm.make_manager(kind, pool, True, 0, bs, None)
                held = pool.get_new_blocks(h)  # the hits; those not free stay held by another request
                pool.free_blocks(b for b, free in zip(held, hit_free, strict=True) if free)
                hits = [BlockId(b) for b in held]
                computed, slots = h * bs, h * bs + new
                estimate = manager.get_num_blocks_to_allocate("r", slots, hits, computed, slots)
                before = pool.get_num_free_blocks()
                manager.add_local_computed_blocks("r", hits, computed, 0)
                manager.allocate_new_blocks("r", slots, slots)
                expect(estimate == before - pool.get_num_free_blocks(), "new request: estimate == blocks taken", case)
                expect(len(manager.req_to_blocks["r"]) * bs >= slots, "new request: table covers the slots", case)
                manager.remove_skipped_blocks("r", slots)
                estimate = manager.get_num_blocks_to_allocate("r", slots + more, [], slots, slots + more)
                before = pool.get_num_free_blocks()
                manager.allocate_new_blocks("r", slots + more, slots + more)
                expect(estimate == before - pool.get_num_free_blocks(), "next step: estimate == blocks taken", case)
    return cases


@check
@about(admission_cap, releases=(NEWEST.release,))
def admission_cap_bounds() -> int:
    """With the admission cap applied, the estimate never exceeds the cap
    (plus the free hits it touches) nor the uncapped estimate."""
    cases = 0
    for kind, cap in product(_kinds(), (1, 2, 3)):
        bs = kind.block_size
        for h, new in product(range(3), range(7)):
            cases += 1
            case = (kind, cap, h, new)
            pool = BlockPool(24, True, bs)
            manager = stm.make_manager(kind, pool, True, 0, bs, cap)
            hits = [BlockId(b) for b in pool.get_new_blocks(h)]
            pool.free_blocks(hits)
            args = ("r", h * bs + new, hits, h * bs, h * bs + new)
            capped, uncapped = (
                manager.get_num_blocks_to_allocate(*args, True),
                manager.get_num_blocks_to_allocate(*args),
            )
            expect(capped <= uncapped, "capped <= uncapped", case)
            expect(capped <= max(cap, h) + h, "capped <= cap (+ touched hits)", case)
    return cases
