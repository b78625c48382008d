"""Free-queue order on the real ``BlockPool`` and manager.

``BlockPool.free_blocks`` must reorder exactly as :func:`kvspec.block_pool.requeue`
says (unhashed to the front, hashed to the tail, each in the given order), and
a manager's ``free`` must hand its table over last entry first, so the tail
of a request's prefix is evicted before its head.
"""

from __future__ import annotations

from itertools import permutations, product

from kvproofs.bounded import check, expect
from kvproofs.contracts import about
from kvspec.block_pool import BlockId, BlockPool, requeue
from kvspec.config import FullAttention
from kvspec.hashing import BlockHash, make_key
from kvspec.profiles import NEWEST
from kvspec.request import RequestBlockHasher
from kvspec.single_type_kv_cache_manager import make_manager


@check
@about(requeue, releases=(NEWEST.release,))
def free_order() -> int:
    """``k`` blocks in use, some hashed, some with a second reference, freed
    in every order: ref counts drop by one each; the blocks reaching 0 go to
    the front (unhashed) or the tail (hashed) in the order given, and the
    blocks already free keep their order in the middle."""
    cases = 0
    for k in range(5):
        for hashed, shared in product(product((False, True), repeat=k), repeat=2):
            for order in permutations(range(k)):
                cases += 1
                case = (k, hashed, shared, order)
                pool = BlockPool(8, True, 1)
                blocks = pool.get_new_blocks(k)
                for b, h, s in zip(blocks, hashed, shared, strict=True):
                    if h:
                        key = make_key(BlockHash(bytes([b])), 0)
                        pool.block_hash[b], pool.cached[key] = key, [b]
                    if s:
                        pool.touch([b])
                before, refs = list(pool.free_queue), list(pool.ref_cnt)
                freed = [blocks[i] for i in order]
                pool.free_blocks(freed)
                zeroed = [b for b in freed if refs[b] == 1]
                front = [b for b in zeroed if pool.block_hash[b] is None]
                tail = [b for b in zeroed if pool.block_hash[b] is not None]
                expect(
                    all(pool.ref_cnt[b] == refs[b] - 1 for b in blocks), "each freed block loses one reference", case
                )
                expect(
                    pool.free_queue == front + before + tail, "queue == unhashed freed + old queue + hashed freed", case
                )
                pool.check_invariants()
    return cases


@check
@about(requeue, releases=(NEWEST.release,))
def free_reverse() -> int:
    """A request's table of ``k`` blocks with its first ``c`` cached, freed by
    the manager: the uncached tail comes back first in the queue, last entry
    first, and the cached head goes to the tail, last entry first, so the
    head of the prefix (block 0) is evicted last."""
    cases = 0
    hasher = RequestBlockHasher("sha256", "0", 1)
    for k in range(7):
        for c in range(k + 1):
            cases += 1
            pool = BlockPool(10, True, 1)
            manager = make_manager(FullAttention(1), pool, True, 0, 1, None)
            request = hasher.new_request("r", list(range(100, 100 + max(k, 1))))
            table = manager.allocate_new_blocks("r", k, k)
            manager.cache_blocks(request, c)
            before = list(pool.free_queue)
            manager.free("r")
            head = [BlockId(b) for b in reversed(table[c:])]
            tail = [BlockId(b) for b in reversed(table[:c])]
            expect(
                pool.free_queue == head + before + tail, "free: reversed uncached + old queue + reversed cached", (k, c)
            )
    return cases
