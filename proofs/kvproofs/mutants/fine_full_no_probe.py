"""Mutant: a fine-grained full-attention lookup stops at its whole blocks and
never probes the hash boundaries inside the next block (fine-grained hits
of 0.26.0 on lose their partial last block)."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.block_pool import BlockPool
from kvspec.config import AttentionKind
from kvspec.hashing import BlockHash
from kvspec.partial_hits import GroupHits

OWN_CONTRACT = False
HARNESSES = ("bounded:contract:partial_hits.fine_full_attention_hit",)


def fine_full_attention_hit(
    kind: AttentionKind,
    fine: Sequence[BlockHash],
    max_length: int,
    group_ids: Sequence[int],
    pool: BlockPool,
    drop_eagle: bool,
    alignment: int,
) -> tuple[GroupHits, int]:
    """Mutant of the spec function (same contract).

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
    for f in range(min(first, max_length // alignment, len(fine)) - 1, first - 1, -1):
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
