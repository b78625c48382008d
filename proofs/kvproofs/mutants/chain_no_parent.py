"""Mutant: extend_block_hashes hashes every block with the seed as its
parent, so a block's hash no longer depends on the tokens before it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvspec.hashing import (
    BlockHash,
    ExtraKeySource,
    HashFunction,
    block_extra_keys,
    hash_block_tokens,
    lookahead_extra_keys,
)

OWN_CONTRACT = True
HARNESSES = (
    "bounded:search.chain_prefix_sensitive",
    "bounded:search.incremental_hashing",
    "bounded:contract:hashing.extend_block_hashes",
)


def extend_block_hashes(
    fn: HashFunction,
    seed_hash: BlockHash,
    hash_block_size: int,
    existing: tuple[BlockHash, ...],
    token_ids: Sequence[int],
    src: ExtraKeySource,
    tagged: bool = False,
    resume_from_first: bool = False,
    v025_forms: bool = True,
    embeds_digest: bool | None = None,
    lookahead: int = 0,
) -> tuple[BlockHash, ...]:
    """Mutant of the spec function (same contract).

    pre: hash_block_size > 0 and lookahead >= 0
    post: len(__return__) == max(len(token_ids) - lookahead, 0) // hash_block_size
    """
    # crosshair: max_iterations=40
    hashes = list(existing)
    start = len(hashes) * hash_block_size
    cursor = 0 if start == 0 or resume_from_first else -1
    while start + hash_block_size + lookahead <= len(token_ids):
        end = start + hash_block_size
        extra: tuple[Any, ...] | None
        if lookahead:
            extra, cursor = lookahead_extra_keys(
                src, token_ids, start, end, lookahead, cursor, tagged, v025_forms, embeds_digest
            )
        else:
            extra, cursor = block_extra_keys(src, start, end, cursor, tagged, v025_forms, embeds_digest)
        hashes.append(hash_block_tokens(fn, seed_hash, token_ids[start:end], extra))
        start = end
    return tuple(hashes)
