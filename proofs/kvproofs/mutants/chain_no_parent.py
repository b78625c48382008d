"""Mutant: extend_block_hashes hashes every block with the seed as its
parent, so a block's hash no longer depends on the tokens before it."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.hashing import BlockHash, ExtraKeySource, HashFunction, block_extra_keys, hash_block_tokens

OWN_CONTRACT = True
HARNESSES = ("chain.chain_prefix_sensitive", "chain.chain_parent_link")


def extend_block_hashes(
    fn: HashFunction,
    seed_hash: BlockHash,
    hash_block_size: int,
    existing: tuple[BlockHash, ...],
    token_ids: Sequence[int],
    src: ExtraKeySource,
) -> tuple[BlockHash, ...]:
    """Mutant of the spec function (same contract).

    pre: hash_block_size > 0
    post: len(__return__) == len(token_ids) // hash_block_size
    """
    # crosshair: max_iterations=40
    hashes = list(existing)
    start = len(hashes) * hash_block_size
    cursor = 0 if start == 0 else -1
    while start + hash_block_size <= len(token_ids):
        end = start + hash_block_size
        extra, cursor = block_extra_keys(src, start, end, cursor)
        hashes.append(hash_block_tokens(fn, seed_hash, token_ids[start:end], extra))
        start = end
    return tuple(hashes)
