"""Mutant: a coarse block is keyed by its last fine hash in 0.16.0 too
(profile switch ``coarse_hash_last_fine``: 0.16.0 joins the fine hashes)."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.hashing import BlockHash

OWN_CONTRACT = False
HARNESSES = ("bounded:contract:hashing.coarse_block_hashes", "releases.coarse_forms")


def coarse_block_hashes(
    fine: Sequence[BlockHash], hash_block_size: int, block_size: int, last_fine: bool = True
) -> tuple[BlockHash, ...]:
    """Mutant of the spec function (same contract).

    pre: hash_block_size > 0 and block_size > 0 and block_size % hash_block_size == 0
    post: len(__return__) == len(fine) // (block_size // hash_block_size)
    post: all(h.endswith(fine[(j + 1) * (block_size // hash_block_size) - 1]) for j, h in enumerate(__return__))
    post: not last_fine or all(h == fine[(j + 1) * (block_size // hash_block_size) - 1] for j, h in enumerate(__return__))
    post: last_fine or all(h == b"".join(fine[j * (block_size // hash_block_size) : (j + 1) * (block_size // hash_block_size)]) for j, h in enumerate(__return__))
    """  # noqa: E501 - a PEP 316 condition is one line
    del last_fine
    k = block_size // hash_block_size
    return tuple(fine[(j + 1) * k - 1] for j in range(len(fine) // k))
