"""Partial-tail cache entries (vLLM 0.26.0 on).

A group whose block is coarser than the hash block can only be hit on its
own block boundaries, but the prompt's last hash boundary usually falls
inside a block. From vLLM 0.26.0 on, such a group also caches the block that
holds that boundary under the request's hash *at* the boundary: a
*partial-tail entry*. On a full block it is a second key of the block; on a
block that is not full yet it is the block's only (primary) key, which makes
the block count as hashed (a freed one goes to the free-queue tail). When
the block later becomes full, :meth:`kvspec.block_pool.BlockPool.cache_full_blocks`
promotes it (every key removed, the full key first, the partial one added
again by the next registration). Eviction removes every key of a block with
one ``BlockRemoved`` each.

Each partial entry has its own ``BlockStored`` of one hash unit:
:func:`partial_stored_event`.

Full-attention kinds (FullAttention, MLA, SinkFull) register a partial tail
in every ``cache_blocks`` call (:func:`cache_partial_tail_block`);
:mod:`kvspec.mamba_tail` is the Mamba variant.

Upstream: ``FullAttentionManager._cache_partial_tail_block`` and
``BlockPool.cache_partial_block`` (``vllm/v1/core/single_type_kv_cache_manager.py``
and ``block_pool.py``, 0.26.0 on).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvspec.block_pool import NULL_BLOCK, BlockId, BlockPool
from kvspec.config import FULL_TYPE_KINDS, AttentionKind
from kvspec.events import MEDIUM_GPU, BlockStored
from kvspec.hashing import BlockHashWithGroupId, block_extra_keys, external_block_hash, lookahead_window_keys, make_key
from kvspec.profiles import SemanticsProfile
from kvspec.request import Request

if TYPE_CHECKING:
    from kvspec.single_type_kv_cache_manager import SingleTypeKVCacheManager


def registers_partial_tail(kind: AttentionKind, profile: SemanticsProfile, hash_block_size: int) -> bool:
    """Whether a group of ``kind`` registers partial-tail entries: a
    full-attention kind coarser than the hash block, from vLLM 0.26.0 on
    (profile switch ``partial_tail_entries``).

    pre: hash_block_size >= 1
    post: not __return__ or profile.partial_tail_entries
    post: not __return__ or isinstance(kind, FULL_TYPE_KINDS)
    post: __return__ == (isinstance(kind, FULL_TYPE_KINDS) and kind.block_size != hash_block_size) or not profile.partial_tail_entries
    """  # noqa: E501 - a PEP 316 condition is one line
    return profile.partial_tail_entries and isinstance(kind, FULL_TYPE_KINDS) and kind.block_size != hash_block_size


def fa_tail_boundary(num_prompt_tokens: int, hash_block_size: int, use_eagle: bool, below_last: bool) -> int:
    """The prefix length of a full-attention group's partial tail: the last
    hash boundary of the prompt; from vLLM 0.32.0 on the last one at or
    below ``num_prompt_tokens - 1`` (a resend hits at most that many),
    except for an EAGLE group, whose lookups read the whole prompt first
    (profile switch ``fa_tail_below_last_token``).

    pre: num_prompt_tokens >= 0 and hash_block_size >= 1
    post: 0 <= __return__ <= num_prompt_tokens
    post: __return__ % hash_block_size == 0
    post: __return__ + hash_block_size > num_prompt_tokens - (below_last and not use_eagle)
    post: not below_last or use_eagle or __return__ < num_prompt_tokens or num_prompt_tokens == 0
    post: below_last and not use_eagle or __return__ == fa_tail_boundary(num_prompt_tokens, hash_block_size, True, True)
    """
    limit = num_prompt_tokens - 1 if below_last and not use_eagle else num_prompt_tokens
    return max(limit, 0) // hash_block_size * hash_block_size


def cache_partial_tail_block(manager: SingleTypeKVCacheManager, request: Request, num_tokens: int) -> None:
    """After a full-attention group cached up to ``num_tokens``: register the
    prompt's tail boundary ``B`` on the block holding it, unless ``B`` is 0,
    beyond ``num_tokens``, on a block boundary (:func:`partial_tail_index`), or
    past the table. From vLLM 0.33.0 on ``B`` is at most the request's hashed
    tokens, which lag under look-ahead block hashes (profile switch
    ``lookahead_block_hashes``; before, the hashes always reach ``B``).

    post: partial_tail_index(_tail_boundary(manager, request), num_tokens, manager.block_size) is not None or manager.pool.cached == __old__.manager.pool.cached
    post: len(set(manager.pool.cached) - set(__old__.manager.pool.cached)) <= 1
    post: manager.req_to_blocks == __old__.manager.req_to_blocks
    """  # noqa: E501 - a PEP 316 condition is one line
    pool = manager.pool
    boundary = _tail_boundary(manager, request)
    idx = partial_tail_index(boundary, num_tokens, manager.block_size)
    table = manager.req_to_blocks.get(request.request_id, [])
    if idx is not None and idx < len(table):
        cache_partial_block(pool, request, table[idx], boundary, manager.group_id)


def cache_partial_block(
    pool: BlockPool, request: Request, b: BlockId, num_tokens: int, group_id: int
) -> BlockHashWithGroupId | None:
    """Cache block ``b`` under the request's hash at ``num_tokens`` (a
    multiple of the hash block size); return the key, or None for the null
    block (upstream ``BlockPool.cache_partial_block``).

    A block that is already cached under that key is left alone (no
    event). A block whose primary key stands for fewer tokens first loses
    every key (one BlockRemoved each): its contents now reach further. The
    key then becomes the block's primary key if it has none, else a
    secondary one, with one BlockStored.

    pre: num_tokens > 0 and num_tokens % pool.hash_block_size == 0
    pre: num_tokens // pool.hash_block_size <= len(request.block_hashes)
    post: (__return__ is None) == (b == NULL_BLOCK)
    post: __return__ is None or __return__ == make_key(request.block_hashes[num_tokens // pool.hash_block_size - 1], group_id)
    post: __return__ is None or (__return__ in pool.keys_of(b) and pool.hash_num_tokens[b] >= num_tokens)
    post: __return__ is None or __return__ in __old__.pool.keys_of(b) or not pool.enable_kv_cache_events or pool.events[-1] == partial_stored_event(pool, request, num_tokens, group_id)
    post: __return__ is None or __return__ not in __old__.pool.keys_of(b) or pool.events == __old__.pool.events
    """  # noqa: E501 - a PEP 316 condition is one line
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


def _tail_boundary(manager: SingleTypeKVCacheManager, request: Request) -> int:
    """:func:`fa_tail_boundary` of the request, from vLLM 0.33.0 on at most its hashed tokens."""
    hbs = manager.pool.hash_block_size
    boundary = fa_tail_boundary(
        request.num_prompt_tokens, hbs, manager.use_eagle, manager.profile.fa_tail_below_last_token
    )
    if manager.profile.lookahead_block_hashes:
        return min(boundary, len(request.block_hashes) * hbs)
    return boundary


def partial_stored_event(pool: BlockPool, request: Request, num_tokens: int, group_id: int) -> BlockStored:
    """The BlockStored of a partial entry at ``num_tokens``: one hash, the
    last hash unit's tokens, ``block_size`` the hash block size, the parent
    the previous hash unit's hash, extra keys as a one-element list (the
    multimodal cursor starts at the first feature for the prompt's first
    unit or from vLLM 0.31.0 on, else at the last feature; profile switch
    ``mm_resume_from_first_feature``).

    pre: num_tokens >= pool.hash_block_size and num_tokens % pool.hash_block_size == 0
    post: len(__return__.block_hashes) == 1 and __return__.block_size == pool.hash_block_size
    post: __return__.token_ids == request.all_token_ids[num_tokens - pool.hash_block_size : num_tokens]
    post: (__return__.parent_block_hash is None) == (num_tokens == pool.hash_block_size)
    post: __return__.block_hashes[0] == external_block_hash(request.block_hashes[num_tokens // pool.hash_block_size - 1], pool.int_block_hashes)
    post: __return__.group_idx == group_id and __return__.extra_keys is not None and len(__return__.extra_keys) == 1
    """  # noqa: E501 - a PEP 316 condition is one line
    hbs, as_int = pool.hash_block_size, pool.int_block_hashes
    unit = num_tokens // hbs
    start = num_tokens - hbs
    cursor = 0 if start == 0 or pool.profile.mm_resume_from_first_feature else -1
    ahead = pool.num_hash_lookahead_tokens
    if ahead:
        keys, _ = lookahead_window_keys(request.extra, start, num_tokens, ahead, cursor)
    else:
        keys, _ = block_extra_keys(request.extra, start, num_tokens, cursor)
    lora = request.extra.lora
    return BlockStored(
        block_hashes=(external_block_hash(request.block_hashes[unit - 1], as_int),),
        parent_block_hash=None if unit == 1 else external_block_hash(request.block_hashes[unit - 2], as_int),
        token_ids=request.all_token_ids[start:num_tokens],
        block_size=hbs,
        lora_id=lora.adapter_id if lora else None,
        medium=MEDIUM_GPU,
        lora_name=lora.name if lora else None,
        extra_keys=(keys,),
        group_idx=group_id,
        lookahead_token_ids=(request.all_token_ids[num_tokens : num_tokens + ahead],) if ahead else None,
    )


def partial_tail_index(boundary: int, num_tokens: int, block_size: int) -> int | None:
    """The table index of the block a full-attention group's partial tail at
    ``boundary`` registers on after a ``cache_blocks`` call up to
    ``num_tokens``, or None: the block holding the boundary's last token,
    only for a boundary that is positive, reached by ``num_tokens`` and
    inside a block.

    pre: boundary >= 0 and block_size >= 1
    post: __return__ is None or __return__ * block_size < boundary < (__return__ + 1) * block_size
    post: __return__ is None or boundary <= num_tokens
    post: __return__ is not None or boundary == 0 or boundary > num_tokens or boundary % block_size == 0
    """
    if boundary == 0 or boundary > num_tokens or boundary % block_size == 0:
        return None
    return boundary // block_size
