"""Mutant: copy-on-write replaces the shared block but takes no extra
reference on the copy, so the copy can be reused before the worker copied
into it."""

from __future__ import annotations

from kvspec.block_pool import NULL_BLOCK, BlockId
from kvspec.single_type_kv_cache_manager import SingleTypeKVCacheManager

OWN_CONTRACT = False
HARNESSES = ("bounded:contract:partial_hits.apply_cow",)


def apply_cow(manager: SingleTypeKVCacheManager, request_id: str, idx: int, src: BlockId, cow: BlockId) -> None:
    """Mutant of the spec function (same contract).

    pre: 0 <= idx < len(manager.req_to_blocks[request_id]) and src != cow
    post: manager.req_to_blocks[request_id][idx] == cow and manager.pending_copies[-1] == (src, cow)
    post: manager.pool.ref_cnt[cow] == __old__.manager.pool.ref_cnt[cow] + 1 and manager.pool.ref_cnt[src] == __old__.manager.pool.ref_cnt[src]
    post: all(a == b for i, (a, b) in enumerate(zip(manager.req_to_blocks[request_id], __old__.manager.req_to_blocks[request_id], strict=True)) if i != idx)
    """  # noqa: E501 - a PEP 316 condition is one line
    table = manager.req_to_blocks[request_id]
    assert table[idx] == src and src != NULL_BLOCK, f"request {request_id}: entry {idx} is not {src}"
    table[idx] = cow
    manager.pending_copies.append((src, cow))
