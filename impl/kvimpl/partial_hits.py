"""Fine-grained prefix hits with copy-on-write (vLLM 0.26.0 on).

kvimpl's copy of :mod:`kvspec.partial_hits` (duplicated on purpose: a shared
helper is a shared bug). When a hybrid model has a Mamba ``align`` group
coarser than the hash block, a prefix hit may end on any hash boundary
instead of only on scheduler-block boundaries
(:func:`partial_hash_hits_enabled`). Full-attention kinds then also probe the
hash boundaries inside the first block past their full-block hit
(:func:`fine_full_attention_hit`), and Mamba looks for the rightmost cached
state at any hash boundary (:func:`fine_mamba_hit`). The partial entries
those lookups find are registered by :mod:`kvimpl.partial_tail` and
:mod:`kvimpl.mamba_tail`.

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

What kvimpl adds to the spec's rules: :func:`apply_cow` keeps the per-block
holder counts of a full-type group (``SingleTypeKVCacheManager.holders``) in
step with the table entry it replaces.

Upstream: ``HybridKVCacheCoordinator`` (``enable_partial_hash_hits``),
``FullAttentionManager`` / ``MambaManager.find_longest_cache_hit``,
``SingleTypeKVCacheManager._apply_cow``, ``BlockPool.move_block_hashes``
(``vllm/v1/core/``, 0.26.0 on).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvimpl.block_pool import NULL_BLOCK, BlockPool, TailBlockPool
from kvimpl.config_rules import FULL_TYPE_KINDS, hash_block_size
from kvspec.block_pool import BlockId
from kvspec.config import AttentionKind, KVCacheConfig, Mamba
from kvspec.hashing import BlockHash

if TYPE_CHECKING:
    from kvimpl.single_type_kv_cache_manager import SingleTypeKVCacheManager

GroupHits = list[list[BlockId]]


def partial_hash_hits_enabled(config: KVCacheConfig) -> bool:
    """Whether hits may end on any hash boundary: a cached hybrid with a
    Mamba align group coarser than the hash block; from vLLM 0.28.0 on not
    when another group that cannot do fine-grained lookups (anything but
    full-attention kinds and Mamba) is coarser than the hash block (profile
    switches ``partial_hash_hits``, ``partial_hits_gated``).

    NOTE: vLLM 0.26.x and 0.27.x keep the feature on in that case and fail an
    assertion at the first lookup; kvspec refuses such configurations for
    those profiles, so kvimpl never meets them.
    """
    p = config.profile
    if not p.partial_hash_hits or not config.enable_caching or len(config.groups) < 2:
        return False
    hbs = hash_block_size(config)
    coarse_align = False
    for k in config.groups:
        if isinstance(k, Mamba) and k.mode == "align" and k.block_size > hbs:
            coarse_align = True
            break
    if not coarse_align:
        return False
    if not p.partial_hits_gated:
        return True
    return not any(blocks_fine_hits(k, hbs) for k in config.groups)


def blocks_fine_hits(kind: AttentionKind, hash_block_size: int) -> bool:
    """A group of ``kind`` cannot take part in fine-grained hits: it is not a
    full-attention kind or Mamba, and its block is not the hash block."""
    if isinstance(kind, (*FULL_TYPE_KINDS, Mamba)):
        return False
    return kind.block_size != hash_block_size


def fine_grained(kind: AttentionKind, alignment: int) -> bool:
    """Whether a group of ``kind`` looks up hash boundaries inside its blocks:
    a full-attention kind or Mamba whose block is a multiple of the hit
    alignment above it (the alignment is the hash block size when
    fine-grained hits are on)."""
    if not isinstance(kind, (*FULL_TYPE_KINDS, Mamba)):
        return False
    bs = kind.block_size
    return bs > alignment and bs % alignment == 0


def eagle_margin(kind: AttentionKind, hash_block_size: int, enabled: bool) -> int:
    """How far past the candidate length an EAGLE group looks before it drops:
    one hash unit for a fine-grained full-attention kind (``enabled``: hits
    are fine-grained), else one block (upstream ``eagle_proof_margin``).

    pre: hash_block_size >= 1
    post: __return__ in (hash_block_size, kind.block_size)
    """
    fine = enabled and isinstance(kind, FULL_TYPE_KINDS) and kind.block_size > hash_block_size
    return hash_block_size if fine else kind.block_size


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
    the next block (probed from the top down), minus one hash unit under
    EAGLE. Returns the blocks per group (``cdiv(length, bs)`` each; the last
    may be partly covered) and the length in tokens.
    """
    bs = kind.block_size
    k = bs // alignment
    found: GroupHits = [[] for _ in group_ids]
    num_full = 0
    for j in range(min(max_length // bs, len(fine) // k)):
        blocks = pool.get_cached_block(fine[(j + 1) * k - 1], group_ids)
        if blocks is None:
            break
        for hits, b in zip(found, blocks, strict=True):
            hits.append(b)
        num_full += 1
    length = num_full * bs
    first = num_full * k
    top = min(first + k - 1, max_length // alignment, len(fine))
    f = top - 1
    while f >= first:
        blocks = pool.get_cached_block(fine[f], group_ids)
        if blocks is not None:
            for hits, b in zip(found, blocks, strict=True):
                hits.append(b)
            length = (f + 1) * alignment
            break
        f -= 1
    if drop_eagle and length > 0:
        length -= alignment if alignment < bs else bs
    length -= length % alignment
    keep = -(-length // bs)
    return [hits[:keep] for hits in found], length


def fine_mamba_hit(
    kind: Mamba, fine: Sequence[BlockHash], max_length: int, group_ids: Sequence[int], pool: BlockPool, alignment: int
) -> tuple[GroupHits, int]:
    """A Mamba hit at hash granularity ``alignment``: the rightmost cached
    state at any hash boundary, full block or partial entry; earlier
    positions are null. No EAGLE drop (draft models have no Mamba layers)."""
    k = kind.block_size // alignment
    f = min(max_length // alignment, len(fine)) - 1
    while f >= 0:
        blocks = pool.get_cached_block(fine[f], group_ids)
        if blocks is not None:
            nulls = [NULL_BLOCK] * (f // k)
            return [[*nulls, b] for b in blocks], (f + 1) * alignment
        f -= 1
    return [[] for _ in group_ids], 0


def has_partial_local_hit(hits: Sequence[BlockId], num_local: int, block_size: int) -> bool:
    """Whether a new request's local hit ends inside one of the group's
    blocks (its last hit block must be privatised).

    pre: block_size >= 1
    """
    return bool(hits) and num_local % block_size != 0


def record_partial_hit(manager: SingleTypeKVCacheManager, request_id: str, idx: int, block: BlockId) -> None:
    """Remember that table entry ``idx`` (``block``) is shared and must be
    privatised at the next allocation; until then it does not count as
    cached, so the private copy is hashed once it is full."""
    manager.partial_hit[request_id] = (idx, block)
    manager.num_cached_block[request_id] = idx


def apply_cow(manager: SingleTypeKVCacheManager, request_id: str, idx: int, src: BlockId, cow: BlockId) -> None:
    """Replace the shared block ``src`` at table entry ``idx`` by the fresh
    block ``cow`` and queue the copy. ``src`` keeps the reference its hit
    took, ``cow`` takes one more than the table's: both are retained until
    the copy has run. A full-type group's holder counts follow the entry."""
    table = manager.req_to_blocks[request_id]
    assert table[idx] == src and src != NULL_BLOCK, f"request {request_id}: entry {idx} is not {src}"
    table[idx] = cow
    if manager.track_holders:
        manager.holders[src] -= 1
        manager.holders[cow] += 1
    manager.pending_copies.append((src, cow))
    manager.pool.ref_cnt[cow] += 1


def move_block_hashes(pool: BlockPool, src: BlockId, dst: BlockId) -> None:
    """Re-point every key of ``src`` to the unhashed block ``dst``, silently
    (no events): the first becomes ``dst``'s primary key with ``src``'s
    prefix length, the others its secondary keys; each goes to the end of
    its key's block list."""
    assert isinstance(pool, TailBlockPool), "a moved tail entry needs a TailBlockPool"
    assert pool.block_hash[dst] is None, f"block {dst} is already hashed"
    num_tokens = pool.hash_num_tokens[src] or 0
    for key in pool.remove_keys(src):
        pool.insert_key(dst, key, num_tokens)
