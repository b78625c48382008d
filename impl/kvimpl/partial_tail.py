"""Partial-tail cache entries (vLLM 0.26.0 on).

kvimpl's copy of :mod:`kvspec.partial_tail` (duplicated on purpose: a shared
helper is a shared bug). A group whose block is coarser than the hash block
can only be hit on its own block boundaries, but the prompt's last hash
boundary usually falls inside a block. From vLLM 0.26.0 on such a group also
caches the block that holds that boundary under the request's hash *at* the
boundary: a *partial-tail entry*. On a block that already has a key it is a
secondary key; on a block without one it is the primary key, which makes the
block count as hashed (a freed one goes to the free-queue tail). When the
block later becomes full, :meth:`kvimpl.block_pool.TailBlockPool.cache_full_blocks`
promotes it (every key removed, the full key first, the partial one added
again by the next registration). Eviction removes every key of a block, one
``BlockRemoved`` each, primary first.

Each partial entry has its own ``BlockStored`` of one hash unit
(:func:`partial_stored_event`). A partial key stands for a prefix that is
not a multiple of the group's block size, so the group's own lookups (block
boundaries only) never find it; only fine-grained hits do
(:mod:`kvimpl.partial_hits`, feature ``partial-hash-hits``). Without them
the entries still show in the cache map, the view and the event stream, and
they change the free order and the eviction events.

Full-attention kinds (FullAttention, MLA, SinkFull) register a partial tail
in every ``cache_blocks`` call (:func:`cache_partial_tail_block`);
:mod:`kvimpl.mamba_tail` is the Mamba variant.

Upstream: ``FullAttentionManager._cache_partial_tail_block`` and
``BlockPool.cache_partial_block`` (``vllm/v1/core/single_type_kv_cache_manager.py``
and ``block_pool.py``, 0.26.0 on).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvimpl.block_pool import NULL_BLOCK, TailBlockPool
from kvimpl.config_rules import FULL_TYPE_KINDS
from kvspec.block_pool import BlockId
from kvspec.config import AttentionKind
from kvspec.events import MEDIUM_GPU, BlockStored
from kvspec.hashing import BlockHashWithGroupId, block_extra_keys, external_block_hash, lookahead_window_keys, make_key
from kvspec.profiles import SemanticsProfile
from kvspec.request import Request

if TYPE_CHECKING:
    from kvimpl.single_type_kv_cache_manager import SingleTypeKVCacheManager


def registers_partial_tail(kind: AttentionKind, profile: SemanticsProfile, hash_block_size: int) -> bool:
    """Whether a group of ``kind`` registers partial-tail entries: a
    full-attention kind whose block is not the hash block, from vLLM 0.26.0
    on (profile switch ``partial_tail_entries``).

    pre: hash_block_size >= 1
    """
    if not profile.partial_tail_entries or not isinstance(kind, FULL_TYPE_KINDS):
        return False
    return kind.block_size != hash_block_size


def fa_tail_boundary(num_prompt_tokens: int, hash_block_size: int, use_eagle: bool, below_last: bool) -> int:
    """The prefix length of a full-attention group's partial tail: the
    prompt's last hash boundary; from vLLM 0.32.0 on (``below_last``,
    profile switch ``fa_tail_below_last_token``) the last one at or below
    ``num_prompt_tokens - 1``, since a resend hits at most that many, except
    for an EAGLE group, whose lookups read the whole prompt first.

    pre: num_prompt_tokens >= 0 and hash_block_size >= 1
    post: 0 <= __return__ <= num_prompt_tokens
    post: __return__ % hash_block_size == 0
    """
    limit = num_prompt_tokens
    if below_last and not use_eagle and limit > 0:
        limit -= 1
    return limit - limit % hash_block_size


def cache_partial_tail_block(manager: SingleTypeKVCacheManager, request: Request, num_tokens: int) -> None:
    """After a full-attention group cached up to ``num_tokens``: register the
    prompt's tail boundary ``B`` (from vLLM 0.33.0 on at most the hashed
    tokens) on the table block holding it, unless ``B`` is 0, beyond
    ``num_tokens``, on a block boundary of the group, or past the table."""
    pool = manager.pool
    assert isinstance(pool, TailBlockPool), "a group with partial tails needs a TailBlockPool"
    bs = manager.block_size
    boundary = fa_tail_boundary(request.num_prompt_tokens, pool.hash_block_size, manager.use_eagle,
                                manager.fa_tail_below_last)  # fmt: skip
    if manager.cache_hashed_only:  # vLLM 0.33.0 on: never past the hashed tokens (look-ahead hashes lag)
        boundary = min(boundary, len(request.block_hashes) * pool.hash_block_size)
    if boundary == 0 or boundary > num_tokens or boundary % bs == 0:
        return
    table = manager.req_to_blocks.get(request.request_id)
    idx = boundary // bs
    if table is not None and idx < len(table):
        cache_partial_block(pool, request, table[idx], boundary, manager.group_id)


def cache_partial_block(
    pool: TailBlockPool, request: Request, b: BlockId, num_tokens: int, group_id: int
) -> BlockHashWithGroupId | None:
    """Cache block ``b`` under the request's hash at ``num_tokens`` (a
    multiple of the hash block size); return the key, or None for the null
    block (upstream ``BlockPool.cache_partial_block``).

    A block already cached under that key is left alone (no event). A block
    whose primary key stands for fewer tokens first loses every key (one
    BlockRemoved each): its contents now reach further. The key then becomes
    the block's primary key if it has none, else a secondary one, with one
    BlockStored.
    """
    if b == NULL_BLOCK:
        return None
    key = make_key(request.block_hashes[num_tokens // pool.hash_block_size - 1], group_id)
    if key in pool.keys_of(b):
        return key
    primary_tokens = pool.hash_num_tokens[b]
    if primary_tokens is not None and primary_tokens < num_tokens:
        pool._evict(b)
    pool.insert_key(b, key, num_tokens)
    if pool.enable_kv_cache_events:
        pool.events.append(partial_stored_event(pool, request, num_tokens, group_id))
    return key


def partial_stored_event(pool: TailBlockPool, request: Request, num_tokens: int, group_id: int) -> BlockStored:
    """The BlockStored of a partial entry at ``num_tokens``: one hash (the
    last hash unit's), that unit's tokens, ``block_size`` the hash block
    size, the parent the previous unit's hash, the extra keys as a
    one-element list, with the group index. The multimodal cursor starts at
    the first feature for the prompt's first unit or from vLLM 0.31.0 on,
    else at the last feature (profile switch ``mm_resume_from_first_feature``,
    kept by the pool as ``mm_resume_from_first``)."""
    hbs, as_int = pool.hash_block_size, pool.int_block_hashes
    unit = num_tokens // hbs
    start = num_tokens - hbs
    hashes = request.block_hashes
    cursor = 0 if start == 0 or pool.mm_resume_from_first else -1
    ahead = pool.num_hash_lookahead_tokens
    if ahead:
        keys, _ = lookahead_window_keys(request.extra, start, num_tokens, ahead, cursor)
    else:
        keys, _ = block_extra_keys(request.extra, start, num_tokens, cursor)
    lora = request.extra.lora
    return BlockStored(
        block_hashes=(external_block_hash(hashes[unit - 1], as_int),),
        parent_block_hash=None if unit == 1 else external_block_hash(hashes[unit - 2], as_int),
        token_ids=request.all_token_ids[start:num_tokens],
        block_size=hbs,
        lora_id=lora.adapter_id if lora else None,
        medium=MEDIUM_GPU,
        lora_name=lora.name if lora else None,
        extra_keys=(keys,),
        group_idx=group_id,
        lookahead_token_ids=(request.all_token_ids[num_tokens : num_tokens + ahead],) if ahead else None,
    )
