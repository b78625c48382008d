"""Mamba align tail entries (vLLM 0.26.0 on for groups coarser than the
hash block, 0.32.0 on for every align group).

A Mamba group in ``align`` mode caches the state block of every step end
that lands on a block boundary. It also keys the state block at the
prompt's *tail boundary*: the prefill checkpoint position a
resend of the prompt can resume at (:func:`mamba_tail_boundary`). Whenever a
``cache_blocks`` call of the group covers exactly that many tokens, the block
holding the boundary's state is cached under the request's hash at the
boundary (:func:`kvspec.partial_tail.cache_partial_block`), and the key
counts as cached in this step (a same-step hit on it must wait,
:meth:`kvspec.single_type_kv_cache_manager.MambaManager.get_num_blocks_to_allocate`).

Two consequences a port must reproduce:

* a state block that ``evict_blocks`` uncached while a request held it is
  cached again (with a ``BlockStored``) at its owner's next call that covers
  the boundary: eviction does not keep a held Mamba state unhittable;
* in vLLM 0.32.0 a state block already keyed at the boundary (a prefix hit,
  an earlier step) is marked cached in this step again, so every other
  request that hits it in the same step is refused; 0.33.0 skips such a
  block (profile switch ``mamba_tail_skip_keyed``).

Before vLLM 0.32.0 only a group coarser than the hash block has tail entries,
and only for a boundary inside a block; such an entry is a partial one, and
the request that registered it privatises it at its next allocation
(:mod:`kvspec.partial_hits`).

Upstream: ``MambaManager._cache_partial_tail_block``
(``vllm/v1/core/single_type_kv_cache_manager.py``) and
``get_mamba_prefill_checkpoint_position`` (``vllm/v1/kv_cache_interface.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvspec.block_pool import NULL_BLOCK
from kvspec.config import Mamba
from kvspec.hashing import BlockHashWithGroupId
from kvspec.partial_hits import record_partial_hit
from kvspec.partial_tail import cache_partial_block
from kvspec.profiles import SemanticsProfile
from kvspec.request import Request

if TYPE_CHECKING:
    from kvspec.single_type_kv_cache_manager import MambaManager


def registers_mamba_tail(kind: Mamba, profile: SemanticsProfile, hash_block_size: int) -> bool:
    """Whether a Mamba group keys its state at the prompt's tail boundary:
    ``align`` mode, from vLLM 0.32.0 on (profile switch
    ``mamba_tail_entries``); from 0.26.0 on already a group coarser than the
    hash block (with fine-grained hits, :mod:`kvspec.partial_hits`; switch
    ``partial_hash_hits``).

    post: not __return__ or kind.mode == "align"
    post: not __return__ or profile.mamba_tail_entries or profile.partial_hash_hits
    post: __return__ or kind.mode != "align" or not profile.mamba_tail_entries
    post: __return__ == (kind.mode == "align" and (profile.mamba_tail_entries or kind.block_size > hash_block_size)) or not profile.partial_hash_hits
    """  # noqa: E501 - a PEP 316 condition is one line
    if kind.mode != "align":
        return False
    return profile.mamba_tail_entries or (profile.partial_hash_hits and kind.block_size > hash_block_size)


def mamba_tail_boundary(
    num_prompt_tokens: int, hash_block_size: int, drop_eagle: bool, below_last: bool, lookahead: int = 0
) -> int:
    """The prompt's tail boundary for Mamba: its last hash boundary, one
    hash unit lower under EAGLE (EAGLE recomputes that unit); from vLLM
    0.32.0 on (``below_last``, profile switch ``mamba_tail_entries``) without
    EAGLE the last one at or below ``num_prompt_tokens - 1`` (a resend
    recomputes the last token), and under look-ahead block hashes of
    ``lookahead`` tokens (vLLM 0.33.0 on) at or below ``num_prompt_tokens -
    lookahead`` (the boundary's hash needs them). Never negative.

    pre: num_prompt_tokens >= 0 and hash_block_size >= 1 and lookahead >= 0
    post: 0 <= __return__ <= num_prompt_tokens
    post: __return__ % hash_block_size == 0
    post: drop_eagle or below_last or __return__ + hash_block_size > num_prompt_tokens
    post: drop_eagle or not below_last or __return__ <= max(num_prompt_tokens - max(lookahead, 1), 0)
    post: drop_eagle or not below_last or lookahead > 1 or __return__ + hash_block_size >= num_prompt_tokens > __return__ or __return__ == 0
    post: not drop_eagle or __return__ == max(mamba_tail_boundary(num_prompt_tokens, hash_block_size, False, False) - hash_block_size, 0)
    """  # noqa: E501 - a PEP 316 condition is one line
    limit = num_prompt_tokens - max(lookahead, 1) if below_last and not drop_eagle else num_prompt_tokens
    boundary = max(limit, 0) // hash_block_size * hash_block_size
    return max(boundary - hash_block_size, 0) if drop_eagle else boundary


def tail_eagle_shift(manager: MambaManager) -> bool:
    """Whether EAGLE lowers the tail boundary: never before vLLM 0.30.0, in
    0.30.x when the group itself is an EAGLE group, from 0.31.0 on when the
    model uses EAGLE (profile switch ``mamba_tail_eagle``).

    post: manager.profile.mamba_tail_eagle != "none" or not __return__
    post: manager.profile.mamba_tail_eagle != "group" or __return__ == manager.use_eagle
    post: manager.profile.mamba_tail_eagle != "model" or __return__ == manager.drop_eagle_checkpoint
    """
    rule = manager.profile.mamba_tail_eagle
    if rule == "group":
        return manager.use_eagle
    return rule == "model" and manager.drop_eagle_checkpoint


def cache_mamba_tail_block(manager: MambaManager, request: Request, num_tokens: int) -> BlockHashWithGroupId | None:
    """After an align-mode group cached up to ``num_tokens``: if that is the
    tail boundary, key the state block holding it there; return the key
    (None if nothing was keyed). Before vLLM 0.32.0 only a boundary inside a
    block counts. A boundary inside a block leaves a partial-hit record: the
    owner's next allocation moves the entry to a private copy
    (:mod:`kvspec.partial_hits`).

    pre: num_tokens >= 0
    post: __return__ is None or __return__ in manager.pool.keys_of(manager.req_to_blocks[request.request_id][-(-num_tokens // manager.block_size) - 1])
    post: __return__ is None or num_tokens % manager.block_size == 0 or request.request_id in manager.tail_owners
    post: len(set(manager.pool.cached) - set(__old__.manager.pool.cached)) <= 1
    post: manager.req_to_blocks == __old__.manager.req_to_blocks
    """  # noqa: E501 - a PEP 316 condition is one line
    pool, bs, p = manager.pool, manager.block_size, manager.profile
    hbs = pool.hash_block_size
    boundary = mamba_tail_boundary(
        request.num_prompt_tokens, hbs, tail_eagle_shift(manager), p.mamba_tail_entries, pool.num_hash_lookahead_tokens
    )
    rid = request.request_id
    table = manager.req_to_blocks.get(rid, [])
    idx = mamba_tail_index(num_tokens, boundary, hbs, bs, p.mamba_tail_entries)
    if idx is None or idx >= len(table) or table[idx] == NULL_BLOCK:
        return None
    b = table[idx]
    if p.mamba_tail_skip_keyed and pool.hash_num_tokens[b] == num_tokens:
        return None
    key = cache_partial_block(pool, request, b, num_tokens, manager.group_id)
    if key is not None and num_tokens % bs:
        record_partial_hit(manager, rid, idx, b)
        manager.tail_owners.add(rid)
    return key


def mamba_tail_index(
    num_tokens: int, boundary: int, hash_block_size: int, block_size: int, any_boundary: bool
) -> int | None:
    """The table index whose state block a ``cache_blocks`` call up to
    ``num_tokens`` keys at the tail ``boundary``, or None: only a call that
    ends exactly on the boundary (a positive multiple of the hash block) keys
    it, on the block holding the boundary's last token; before vLLM 0.32.0
    (``any_boundary`` off, profile switch ``mamba_tail_entries``) only a
    boundary inside a block.

    pre: num_tokens >= 0 and hash_block_size >= 1 and block_size >= 1
    post: __return__ is None or num_tokens == boundary > 0 and num_tokens % hash_block_size == 0
    post: __return__ is None or __return__ * block_size < num_tokens <= (__return__ + 1) * block_size
    post: __return__ is None or any_boundary or num_tokens % block_size != 0
    post: __return__ is not None or num_tokens != boundary or num_tokens == 0 or num_tokens % hash_block_size != 0 or not any_boundary and num_tokens % block_size == 0
    """  # noqa: E501 - a PEP 316 condition is one line
    if num_tokens <= 0 or num_tokens % hash_block_size or num_tokens != boundary:
        return None
    if not any_boundary and num_tokens % block_size == 0:
        return None
    return -(-num_tokens // block_size) - 1
