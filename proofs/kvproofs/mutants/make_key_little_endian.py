"""Mutant: make_key encodes the group id little-endian (split_key reads it
big-endian)."""

from __future__ import annotations

from kvspec.hashing import BlockHash, BlockHashWithGroupId

OWN_CONTRACT = False  # its posts call split_key, which the contract wrapper (spec namespace) has
HARNESSES = ("contract:hashing.make_key", "contract:hashing.split_key")


def make_key(block_hash: BlockHash, group_id: int) -> BlockHashWithGroupId:
    """Mutant of the spec function (same contract).

    pre: 0 <= group_id < 2 ** 32
    post: len(__return__) == len(block_hash) + 4
    post: split_key(__return__) == (block_hash, group_id)
    """
    # crosshair: max_iterations=40
    return BlockHashWithGroupId(block_hash + group_id.to_bytes(4, "little", signed=False))
