"""Mutant: make_key encodes the group id little-endian (split_key reads it
big-endian)."""

from __future__ import annotations

from kvspec.hashing import BlockHash, BlockHashWithGroupId

OWN_CONTRACT = True
HARNESSES = ("hashing.key_round_trip", "hashing.split_round_trip")


def make_key(block_hash: BlockHash, group_id: int) -> BlockHashWithGroupId:
    """Mutant of the spec function (same contract).

    pre: 0 <= group_id < 2 ** 32
    post: len(__return__) == len(block_hash) + 4
    """
    # crosshair: max_iterations=40
    return BlockHashWithGroupId(block_hash + group_id.to_bytes(4, "little", signed=False))
