"""Mamba prefill checkpoints (vLLM 0.29.0 on; profile switch ``prefill_checkpoints``).

kvspec's :mod:`kvspec.prefill_checkpoints` states the rule; this module is
kvimpl's copy of the one form it models, vLLM 0.29.0's ``block-aligned``
checkpoint: a chunk of an align-mode group with ``num_prefill_checkpoint_blocks``
above 0 that starts on a block boundary and ends inside a block keeps the
table slot ``cdiv(end, block_size) - 2`` (the one just below its running
state) when that slot is past the table's end or null. The slot takes a
fresh block, whose state is the block boundary below the chunk end, so the
ordinary full-block caching keys it.

The native core does not model checkpoints: a configuration with them runs
on the pure-Python manager (:func:`kvimpl.config_rules.features_needed`).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvimpl.block_pool import NULL_BLOCK
from kvspec.config import Mamba


def checkpoint_enabled(kind: Mamba, form: str) -> bool:
    """Whether a group of ``kind`` can take checkpoints under the release's
    form ``form`` of the switch: align mode, a positive count, and the
    block-aligned form (the only one kvimpl models).

    post: not __return__ or (kind.mode == "align" and form == "block-aligned")
    """
    return kind.mode == "align" and kind.num_prefill_checkpoint_blocks > 0 and form == "block-aligned"


def num_checkpoint_blocks(block_size: int, table: Sequence[int], num_tokens: int, num_computed_tokens: int) -> int:
    """1 when a chunk from ``num_computed_tokens`` to ``num_tokens`` of a
    request whose table is ``table`` (before this step's hits) keeps a
    checkpoint slot, else 0 (in a group where :func:`checkpoint_enabled`).

    pre: block_size >= 1 and num_tokens >= 0 and num_computed_tokens >= 0
    post: __return__ in (0, 1)
    """
    if num_tokens % block_size == 0 or num_computed_tokens % block_size != 0:
        return 0
    slot = (num_tokens + block_size - 1) // block_size - 2
    if slot < 0:
        return 0
    return 1 if slot >= len(table) or table[slot] == NULL_BLOCK else 0
