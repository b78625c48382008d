"""Fine-grained prefix hits with copy-on-write (vLLM 0.26.0 on).

When a hybrid model has a Mamba ``align`` group coarser than the hash block,
a prefix hit may end on any hash boundary instead of only on scheduler-block
boundaries (:func:`partial_hash_hits_enabled`). Full-attention kinds then
also probe the hash boundaries inside the first block past their full-block
hit (:func:`fine_full_attention_hit`), and Mamba looks for the rightmost
cached state at any hash boundary (:func:`fine_mamba_hit`). The partial
entries those lookups find are registered by :mod:`kvspec.partial_tail` and
:mod:`kvspec.mamba_tail`.

A hit that ends inside one of a group's blocks shares a block whose tail the
new request must overwrite. The request keeps a *partial-hit record*
(``partial_hit[rid] = (index, shared block)``) and, at its next
``allocate_new_blocks``, privatises the block: a fresh block replaces it in
the table (:func:`apply_cow`) and the pair (source, copy) joins the
manager's pending copies. The owner of a Mamba tail entry cannot change its
table (the worker's block table is append-only), so the *entry* moves to the
fresh block instead (:func:`move_block_hashes`). Both ends of a pending copy
hold one extra reference until the caller has taken the copies
(``KVCacheManager.take_kv_cache_block_copies``) and released the retained
blocks with ``free_blocks``, like popped blocks.

Upstream: ``HybridKVCacheCoordinator`` (``enable_partial_hash_hits``),
``FullAttentionManager`` / ``MambaManager.find_longest_cache_hit``,
``SingleTypeKVCacheManager._apply_cow``, ``BlockPool.move_block_hashes``
(``vllm/v1/core/``, 0.26.0 on).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvspec.block_pool import NULL_BLOCK, BlockId, BlockPool
from kvspec.config import FULL_TYPE_KINDS, AttentionKind, KVCacheConfig, Mamba
from kvspec.hashing import BlockHash

if TYPE_CHECKING:
    from kvspec.single_type_kv_cache_manager import SingleTypeKVCacheManager

GroupHits = list[list[BlockId]]


def partial_hash_hits_enabled(config: KVCacheConfig) -> bool:
    """Whether hits may end on any hash boundary: a cached hybrid with a
    Mamba align group coarser than the hash block; from vLLM 0.28.0 on not
    when another group that cannot do fine-grained lookups (anything but
    full-attention kinds and Mamba) is coarser than the hash block (profile
    switches ``partial_hash_hits``, ``partial_hits_gated``).

    NOTE: vLLM 0.26.x and 0.27.x keep the feature on in that case and fail an
    assertion at the first lookup; kvspec refuses such configurations for
    those profiles (:func:`kvspec.profiles.unsupported_reason`).

    post: not __return__ or (config.profile.partial_hash_hits and config.enable_caching and len(config.groups) > 1)
    post: not __return__ or any(isinstance(k, Mamba) and k.mode == "align" and k.block_size > config.resolved_hash_block_size() for k in config.groups)
    post: not __return__ or not config.profile.partial_hits_gated or not any(blocks_fine_hits(k, config.resolved_hash_block_size()) for k in config.groups)
    """  # noqa: E501 - a PEP 316 condition is one line
    p = config.profile
    if not p.partial_hash_hits or not config.enable_caching or len(config.groups) < 2:
        return False
    hbs = config.resolved_hash_block_size()
    if not any(isinstance(k, Mamba) and k.mode == "align" and k.block_size > hbs for k in config.groups):
        return False
    return not (p.partial_hits_gated and any(blocks_fine_hits(k, hbs) for k in config.groups))


def blocks_fine_hits(kind: AttentionKind, hash_block_size: int) -> bool:
    """A group of ``kind`` cannot take part in fine-grained hits: it is not a
    full-attention kind or Mamba, and coarser than the hash block.

    post: __return__ == (not isinstance(kind, (*FULL_TYPE_KINDS, Mamba)) and kind.block_size != hash_block_size)
    """
    return not isinstance(kind, (*FULL_TYPE_KINDS, Mamba)) and kind.block_size != hash_block_size


def fine_grained(kind: AttentionKind, alignment: int) -> bool:
    """Whether a group of ``kind`` looks up hash boundaries inside its blocks:
    a full-attention kind or Mamba whose block is coarser than the hit
    alignment (which is the hash block size when fine-grained hits are on).

    pre: alignment >= 1
    post: not __return__ or isinstance(kind, (*FULL_TYPE_KINDS, Mamba))
    post: not __return__ or (kind.block_size > alignment and kind.block_size % alignment == 0)
    post: __return__ or not isinstance(kind, (*FULL_TYPE_KINDS, Mamba)) or kind.block_size % alignment or kind.block_size <= alignment
    """  # noqa: E501 - a PEP 316 condition is one line
    bs = kind.block_size
    return isinstance(kind, (*FULL_TYPE_KINDS, Mamba)) and alignment < bs and bs % alignment == 0


def eagle_margin(kind: AttentionKind, hash_block_size: int, enabled: bool) -> int:
    """How far past the candidate length an EAGLE group looks before it drops:
    one hash unit for a fine-grained full-attention kind, else one block
    (upstream ``eagle_proof_margin``).

    pre: hash_block_size >= 1
    post: __return__ in (hash_block_size, kind.block_size)
    post: __return__ == kind.block_size or (enabled and isinstance(kind, FULL_TYPE_KINDS))
    post: not enabled or not isinstance(kind, FULL_TYPE_KINDS) or __return__ == min(kind.block_size, hash_block_size)
    """
    if enabled and isinstance(kind, FULL_TYPE_KINDS) and kind.block_size > hash_block_size:
        return hash_block_size
    return kind.block_size


def fine_full_attention_hit(
    kind: AttentionKind,
    fine: Sequence[BlockHash],
    max_length: int,
    group_ids: Sequence[int],
    pool: BlockPool,
    drop_eagle: bool,
    alignment: int,
) -> tuple[GroupHits, int]:
    """A full-attention hit at hash granularity ``alignment``: the cached
    full blocks from the start, then the highest cached hash boundary inside
    the next block (probed downwards), minus one hash unit under EAGLE.
    Returns the blocks per group (``cdiv(length, bs)`` each; the last may be
    partly covered) and the length in tokens.

    pre: alignment >= 1 and kind.block_size % alignment == 0 and len(group_ids) >= 1
    post: 0 <= __return__[1] <= max(max_length, 0) and __return__[1] % alignment == 0
    post: all(len(h) == -(-__return__[1] // kind.block_size) for h in __return__[0])
    post: all(pool.get_cached_block(fine[(j + 1) * (kind.block_size // alignment) - 1], group_ids) is not None for j in range(__return__[1] // kind.block_size))
    post: all(h[j] == pool.get_cached_block(fine[(j + 1) * (kind.block_size // alignment) - 1], group_ids)[g] for g, h in enumerate(__return__[0]) for j in range(__return__[1] // kind.block_size))
    post: __return__[1] == 0 or pool.get_cached_block(fine[__return__[1] // alignment + drop_eagle - 1], group_ids) is not None
    post: drop_eagle or all(pool.get_cached_block(fine[f], group_ids) is None for f in range(__return__[1] // alignment, min((__return__[1] // kind.block_size + 1) * (kind.block_size // alignment) - 1, max_length // alignment, len(fine))))
    """  # noqa: E501 - a PEP 316 condition is one line
    bs = kind.block_size
    k = bs // alignment
    found: GroupHits = [[] for _ in group_ids]
    for j in range(min(max_length // bs, len(fine) // k)):
        blocks = pool.get_cached_block(fine[(j + 1) * k - 1], group_ids)
        if blocks is None:
            break
        for hits, b in zip(found, blocks, strict=True):
            hits.append(b)
    length = len(found[0]) * bs
    first = len(found[0]) * k
    for f in range(min(first + k - 1, max_length // alignment, len(fine)) - 1, first - 1, -1):
        blocks = pool.get_cached_block(fine[f], group_ids)
        if blocks is not None:
            for hits, b in zip(found, blocks, strict=True):
                hits.append(b)
            length = (f + 1) * alignment
            break
    if drop_eagle and length > 0:
        length -= min(alignment, bs)
    length -= length % alignment
    return [hits[: -(-length // bs)] for hits in found], length


def fine_mamba_hit(
    kind: Mamba, fine: Sequence[BlockHash], max_length: int, group_ids: Sequence[int], pool: BlockPool, alignment: int
) -> tuple[GroupHits, int]:
    """A Mamba hit at hash granularity ``alignment``: the rightmost cached
    state at any hash boundary, full block or partial entry; earlier
    positions are null. No EAGLE drop (draft models have no Mamba layers).

    pre: alignment >= 1 and kind.block_size % alignment == 0 and len(group_ids) >= 1
    post: 0 <= __return__[1] <= max(max_length, 0) and __return__[1] % alignment == 0
    post: all(len(h) == -(-__return__[1] // kind.block_size) and NULL_BLOCK not in h[-1:] and set(h[:-1]) <= {NULL_BLOCK} for h in __return__[0])
    post: __return__[1] == 0 or [h[-1] for h in __return__[0]] == pool.get_cached_block(fine[__return__[1] // alignment - 1], group_ids)
    post: all(pool.get_cached_block(fine[f], group_ids) is None for f in range(__return__[1] // alignment, min(max_length // alignment, len(fine))))
    """  # noqa: E501 - a PEP 316 condition is one line
    k = kind.block_size // alignment
    for f in range(min(max_length // alignment, len(fine)) - 1, -1, -1):
        blocks = pool.get_cached_block(fine[f], group_ids)
        if blocks is not None:
            return [[NULL_BLOCK] * (f // k) + [b] for b in blocks], (f + 1) * alignment
    return [[] for _ in group_ids], 0


def has_partial_local_hit(hits: Sequence[BlockId], num_local: int, block_size: int) -> bool:
    """Whether a new request's local hit ends inside one of the group's
    blocks (its last hit block must be privatised).

    pre: block_size >= 1
    post: __return__ == (len(hits) > 0 and num_local % block_size != 0)
    """
    return len(hits) > 0 and num_local % block_size != 0


def record_partial_hit(manager: SingleTypeKVCacheManager, request_id: str, idx: int, block: BlockId) -> None:
    """Remember that table entry ``idx`` (``block``) is shared and must be
    privatised at the next allocation; until then it does not count as
    cached, so the private copy is hashed once it is full.

    post: manager.partial_hit[request_id] == (idx, block) and manager.num_cached_block[request_id] == idx
    post: manager.req_to_blocks == __old__.manager.req_to_blocks and manager.pool.ref_cnt == __old__.manager.pool.ref_cnt
    """  # noqa: E501 - a PEP 316 condition is one line
    manager.partial_hit[request_id] = (idx, block)
    manager.num_cached_block[request_id] = idx


def apply_cow(manager: SingleTypeKVCacheManager, request_id: str, idx: int, src: BlockId, cow: BlockId) -> None:
    """Replace the shared block ``src`` at table entry ``idx`` by the fresh
    block ``cow`` and queue the copy. ``src`` keeps the reference its hit
    took, ``cow`` takes one more than the table's: both are retained until
    the copy has run.

    pre: 0 <= idx < len(manager.req_to_blocks[request_id]) and src != cow
    post: manager.req_to_blocks[request_id][idx] == cow and manager.pending_copies[-1] == (src, cow)
    post: manager.pool.ref_cnt[cow] == __old__.manager.pool.ref_cnt[cow] + 1 and manager.pool.ref_cnt[src] == __old__.manager.pool.ref_cnt[src]
    post: all(a == b for i, (a, b) in enumerate(zip(manager.req_to_blocks[request_id], __old__.manager.req_to_blocks[request_id], strict=True)) if i != idx)
    """  # noqa: E501 - a PEP 316 condition is one line
    table = manager.req_to_blocks[request_id]
    assert table[idx] == src and src != NULL_BLOCK, f"request {request_id}: entry {idx} is not {src}"
    table[idx] = cow
    manager.pending_copies.append((src, cow))
    manager.pool.ref_cnt[cow] += 1


def move_block_hashes(pool: BlockPool, src: BlockId, dst: BlockId) -> None:
    """Re-point every key of ``src`` to the unhashed block ``dst``, silently
    (no events): the first becomes ``dst``'s primary key with ``src``'s
    prefix length, the others its secondary keys; each goes to the end of
    its key's block list.

    pre: src != dst
    post: pool.keys_of(dst) == __old__.pool.keys_of(src) and not pool.keys_of(src)
    post: pool.hash_num_tokens[dst] == __old__.pool.hash_num_tokens[src]
    post: all(ids[-1] == dst and src not in ids for k, ids in pool.cached.items() if k in __old__.pool.keys_of(src))
    post: pool.events == __old__.pool.events
    """
    assert pool.block_hash[dst] is None, f"block {dst} is already hashed"
    num_tokens = pool.hash_num_tokens[src] or 0
    for key in pool.remove_keys(src):
        pool.insert_key(dst, key, num_tokens)
