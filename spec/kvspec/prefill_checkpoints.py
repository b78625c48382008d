"""Mamba prefill checkpoints (vLLM 0.29.0 on; profile switch ``prefill_checkpoints``).

In align mode a Mamba table is indexed by position: slot ``i`` holds the
state after ``(i + 1) * block_size`` tokens, a chunk ending at ``end`` writes
its running state into slot ``cdiv(end, block_size) - 1``, and every slot
before it that no step wrote is the null block. A prompt whose end falls
inside a block therefore leaves no state a later request can resume from,
except the partial one the tail entries key (:mod:`kvspec.mamba_tail`).

A *prefill checkpoint* fixes that: a chunk keeps one more state block, the
slot just below its running state, into which the model writes the state at
a position inside the chunk. The group's ``num_prefill_checkpoint_blocks``
switches it on (any value above 0 means one block per chunk).

* vLLM 0.29.0 ("block-aligned", :func:`block_aligned_checkpoint_slot`): a
  chunk gets a checkpoint when it starts on a block boundary and ends inside
  a block, and the slot ``cdiv(end, block_size) - 2`` is not yet held (past
  the table's end, or null). The slot is simply not nulled and gets a fresh
  block; its state is the block boundary ``floor(end / block_size) *
  block_size``, so the ordinary full-block caching keys it (under the
  ordinary retention mask) and nothing else about it is remembered. The
  admission estimate counts the extra block.

The later forms (a position inside the chunk with an alignment, 0.30.0; the
prompt-end rule, 0.31.0; the reachable-only rule, 0.32.0; the look-ahead,
0.33.0) are refused (:data:`kvspec.profiles.PREFILL_CHECKPOINTS_MODELLED`).

NOTE: vLLM decides in ``get_num_blocks_to_allocate`` (the call that is not
the full-sequence admission check), looking at the request's table *before*
this step's prefix hits are added, and keeps the count per request for the
``allocate_new_blocks`` that follows; kvspec does the same
(``MambaManager.num_checkpoint_blocks``). For a new request whose hit ends in
the checkpoint slot this counts a block the allocation then does not take.

NOTE: the scheduler decides where chunks end, and so where checkpoints can
be; it is not part of kvspec. In 0.29.0 it disables checkpoints under EAGLE,
while the manager alone still keeps the slot, which EAGLE lookups cannot
reach.

Upstream: ``MambaManager._needs_internal_checkpoint`` and
``MambaSpec.num_prefill_checkpoint_blocks`` (vLLM 0.29.0).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.block_pool import NULL_BLOCK
from kvspec.config import Mamba
from kvspec.profiles import SemanticsProfile


def num_checkpoint_blocks(
    kind: Mamba, profile: SemanticsProfile, table: Sequence[int], num_tokens: int, num_computed_tokens: int
) -> int:
    """How many checkpoint blocks (0 or 1) a chunk of an align-mode group
    needs when its request's table is ``table`` (before this step's hits),
    the chunk ends at ``num_tokens`` and starts at ``num_computed_tokens``.

    pre: kind.block_size >= 1 and num_tokens >= 0 and num_computed_tokens >= 0
    post: __return__ in (0, 1)
    post: __return__ == 0 or (kind.mode == "align" and kind.num_prefill_checkpoint_blocks > 0)
    post: __return__ == 0 or profile.prefill_checkpoints == "block-aligned"
    post: profile.prefill_checkpoints != "block-aligned" or kind.mode != "align" or kind.num_prefill_checkpoint_blocks <= 0 or __return__ == (block_aligned_checkpoint_slot(kind.block_size, table, num_tokens, num_computed_tokens) is not None)
    """  # noqa: E501 - a PEP 316 condition is one line
    if kind.mode != "align" or kind.num_prefill_checkpoint_blocks <= 0:
        return 0
    if profile.prefill_checkpoints != "block-aligned":
        return 0
    slot = block_aligned_checkpoint_slot(kind.block_size, table, num_tokens, num_computed_tokens)
    return int(slot is not None)


def block_aligned_checkpoint_slot(
    block_size: int, table: Sequence[int], num_tokens: int, num_computed_tokens: int
) -> int | None:
    """The table slot a vLLM 0.29.0 checkpoint keeps, or None: the slot before
    the running state, ``cdiv(num_tokens, block_size) - 2``, when the chunk
    starts on a block boundary, ends inside a block, and the slot exists
    and is not held yet (past the table's end, or the null block).

    pre: block_size >= 1 and num_tokens >= 0 and num_computed_tokens >= 0
    post: __return__ is None or __return__ == -(-num_tokens // block_size) - 2
    post: __return__ is None or (__return__ >= 0 and num_tokens % block_size != 0 and num_computed_tokens % block_size == 0)
    post: __return__ is None or __return__ >= len(table) or table[__return__] == NULL_BLOCK
    post: __return__ is not None or num_tokens % block_size == 0 or num_computed_tokens % block_size != 0 or num_tokens < block_size or (-(-num_tokens // block_size) - 2 < len(table) and table[-(-num_tokens // block_size) - 2] != NULL_BLOCK)
    """  # noqa: E501 - a PEP 316 condition is one line
    slot = -(-num_tokens // block_size) - 2
    if num_tokens % block_size == 0 or num_computed_tokens % block_size != 0 or slot < 0:
        return None
    if slot < len(table) and table[slot] != NULL_BLOCK:
        return None
    return slot
