"""Mamba align tail entries (vLLM 0.32.0 on).

A Mamba group in ``align`` mode caches the state block of every step end
that lands on a block boundary. From vLLM 0.32.0 on it also keys the state
block at the prompt's *tail boundary*: the prefill checkpoint position a
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

Upstream: ``MambaManager._cache_partial_tail_block``
(``vllm/v1/core/single_type_kv_cache_manager.py``) and
``get_mamba_prefill_checkpoint_position`` (``vllm/v1/kv_cache_interface.py``),
0.32.0 and 0.33.0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvspec.block_pool import NULL_BLOCK
from kvspec.config import Mamba
from kvspec.hashing import BlockHashWithGroupId
from kvspec.partial_tail import cache_partial_block
from kvspec.profiles import SemanticsProfile
from kvspec.request import Request

if TYPE_CHECKING:
    from kvspec.single_type_kv_cache_manager import MambaManager


def registers_mamba_tail(kind: Mamba, profile: SemanticsProfile) -> bool:
    """Whether a Mamba group keys its state at the prompt's tail boundary:
    ``align`` mode, from vLLM 0.32.0 on (profile switch ``mamba_tail_entries``)."""
    return profile.mamba_tail_entries and kind.mode == "align"


def mamba_tail_boundary(num_prompt_tokens: int, hash_block_size: int, drop_eagle: bool) -> int:
    """The prompt's tail boundary for Mamba: the last hash boundary at or
    below ``num_prompt_tokens - 1`` (a resend recomputes the last token);
    under EAGLE (``drop_eagle``: the model's ``use_eagle``) the last one at or
    below the prompt's end, one hash unit lower (EAGLE recomputes that
    unit). Never negative.

    pre: num_prompt_tokens >= 0 and hash_block_size >= 1
    post: 0 <= __return__ <= num_prompt_tokens
    post: __return__ % hash_block_size == 0
    """
    limit = num_prompt_tokens if drop_eagle else num_prompt_tokens - 1
    boundary = max(limit, 0) // hash_block_size * hash_block_size
    return max(boundary - hash_block_size, 0) if drop_eagle else boundary


def cache_mamba_tail_block(manager: MambaManager, request: Request, num_tokens: int) -> BlockHashWithGroupId | None:
    """After an align-mode group cached up to ``num_tokens``: if that is the
    tail boundary, key the state block holding it there; return the key
    (None if nothing was keyed)."""
    pool = manager.pool
    hbs = pool.hash_block_size
    boundary = mamba_tail_boundary(request.num_prompt_tokens, hbs, manager.drop_eagle_checkpoint)
    if num_tokens <= 0 or num_tokens % hbs or num_tokens != boundary:
        return None
    table = manager.req_to_blocks.get(request.request_id, [])
    idx = -(-num_tokens // manager.block_size) - 1
    if idx >= len(table) or table[idx] == NULL_BLOCK:
        return None
    b = table[idx]
    if manager.profile.mamba_tail_skip_keyed and pool.hash_num_tokens[b] == num_tokens:
        return None
    return cache_partial_block(pool, request, b, num_tokens, manager.group_id)
