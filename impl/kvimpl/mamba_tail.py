"""Mamba align tail entries (vLLM 0.32.0 on for every align group).

kvimpl's copy of :mod:`kvspec.mamba_tail` (duplicated on purpose: a shared
helper is a shared bug). A Mamba group in ``align`` mode caches the state
block of every step end that lands on a block boundary. It also keys the
state block at the prompt's *tail boundary*, the prefill checkpoint a resend
of the prompt can resume at (:func:`mamba_tail_boundary`): whenever a
``cache_blocks`` call of the group covers exactly that many tokens, the
block holding that state is cached under the request's hash at the boundary
(:func:`kvimpl.partial_tail.cache_partial_block`), and the key counts as
cached in this step (a same-step hit on it waits,
:meth:`kvimpl.single_type_kv_cache_manager.MambaManager.get_num_blocks_to_allocate`).

Two consequences kvimpl reproduces:

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
(:mod:`kvimpl.partial_hits`).

Upstream: ``MambaManager._cache_partial_tail_block``
(``vllm/v1/core/single_type_kv_cache_manager.py``) and
``get_mamba_prefill_checkpoint_position`` (``vllm/v1/kv_cache_interface.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvimpl.block_pool import NULL_BLOCK, TailBlockPool
from kvimpl.partial_hits import record_partial_hit
from kvimpl.partial_tail import cache_partial_block
from kvspec.config import Mamba
from kvspec.hashing import BlockHashWithGroupId
from kvspec.profiles import SemanticsProfile
from kvspec.request import Request

if TYPE_CHECKING:
    from kvimpl.single_type_kv_cache_manager import MambaManager


def registers_mamba_tail(kind: Mamba, profile: SemanticsProfile, hash_block_size: int) -> bool:
    """Whether a Mamba group keys its state at the prompt's tail boundary:
    ``align`` mode, from vLLM 0.32.0 on (profile switch
    ``mamba_tail_entries``); from 0.26.0 on already a group coarser than the
    hash block (with fine-grained hits; switch ``partial_hash_hits``)."""
    if kind.mode != "align":
        return False
    if profile.mamba_tail_entries:
        return True
    return profile.partial_hash_hits and kind.block_size > hash_block_size


def mamba_tail_boundary(
    num_prompt_tokens: int, hash_block_size: int, drop_eagle: bool, below_last: bool, lookahead: int = 0
) -> int:
    """The prompt's tail boundary for Mamba: its last hash boundary, one
    hash unit lower under EAGLE (EAGLE recomputes that unit); from vLLM
    0.32.0 on (``below_last``, profile switch ``mamba_tail_entries``)
    without EAGLE the last one at or below ``num_prompt_tokens - 1`` (a
    resend recomputes the last token), under look-ahead block hashes (vLLM
    0.33.0 on) at or below ``num_prompt_tokens - lookahead``. Never negative.

    pre: num_prompt_tokens >= 0 and hash_block_size >= 1 and lookahead >= 0
    post: 0 <= __return__ <= num_prompt_tokens
    post: __return__ % hash_block_size == 0
    """
    limit = num_prompt_tokens
    if below_last and not drop_eagle and limit > 0:
        limit = max(limit - max(lookahead, 1), 0)
    boundary = limit - limit % hash_block_size
    if drop_eagle:
        return boundary - hash_block_size if boundary > hash_block_size else 0
    return boundary


def tail_eagle_shift(manager: MambaManager) -> bool:
    """Whether EAGLE lowers the tail boundary: never before vLLM 0.30.0, in
    0.30.x when the group itself is an EAGLE group, from 0.31.0 on when the
    model uses EAGLE (profile switch ``mamba_tail_eagle``)."""
    rule = manager.tail_eagle
    if rule == "group":
        return manager.use_eagle
    return rule == "model" and manager.drop_eagle_checkpoint


def cache_mamba_tail_block(manager: MambaManager, request: Request, num_tokens: int) -> BlockHashWithGroupId | None:
    """After an align-mode group cached up to ``num_tokens``: if that is the
    tail boundary, key the state block holding it there; return the key
    (None if nothing was keyed). Before vLLM 0.32.0 only a boundary inside a
    block counts. A boundary inside a block leaves a partial-hit record: the
    owner's next allocation moves the entry to a private copy
    (:mod:`kvimpl.partial_hits`)."""
    pool = manager.pool
    assert isinstance(pool, TailBlockPool), "a group with tail entries needs a TailBlockPool"
    bs, hbs, newer = manager.block_size, pool.hash_block_size, manager.mamba_tail_newer
    boundary = mamba_tail_boundary(
        request.num_prompt_tokens, hbs, tail_eagle_shift(manager), newer, pool.num_hash_lookahead_tokens
    )
    if num_tokens <= 0 or num_tokens % hbs or num_tokens != boundary:
        return None
    inside = num_tokens % bs != 0
    if not newer and not inside:
        return None
    rid = request.request_id
    table = manager.req_to_blocks.get(rid, [])
    idx = -(-num_tokens // bs) - 1
    if idx >= len(table) or table[idx] == NULL_BLOCK:
        return None
    b = table[idx]
    if manager.mamba_tail_skip_keyed and pool.hash_num_tokens[b] == num_tokens:
        return None
    key = cache_partial_block(pool, request, b, num_tokens, manager.group_id)
    if key is not None and inside:
        record_partial_hit(manager, rid, idx, b)
        manager.tail_owners.add(rid)
    return key
