"""Hash keys and hash lists.

``coarse_block_hashes`` takes ``Sequence[BlockHash]`` (a ``NewType``), which
CrossHair 0.0.113 cannot realize (``issubclass() arg 1 must be a class``), so
its contract is restated here over ``list[bytes]``.
"""

from __future__ import annotations

from kvproofs.holds import unenforced
from kvspec.hashing import (
    BlockHash,
    BlockHashWithGroupId,
    ExtraKeySource,
    LoRA,
    coarse_block_hashes,
    extend_block_hashes,
    external_block_hash,
    get_hash_fn_by_name,
    make_key,
    none_hash,
    split_key,
)


def key_round_trip(block_hash: bytes, group_id: int) -> tuple[BlockHash, int]:
    """split_key inverts make_key.

    pre: 0 <= group_id < 2 ** 32 and len(block_hash) <= 32
    post: __return__ == (block_hash, group_id)
    """
    # crosshair: max_iterations=100
    return unenforced(split_key)(unenforced(make_key)(BlockHash(block_hash), group_id))


def split_round_trip(key: bytes) -> BlockHashWithGroupId:
    """make_key inverts split_key.

    pre: 4 <= len(key) <= 36
    post: __return__ == key
    """
    # crosshair: max_iterations=100
    return unenforced(make_key)(*unenforced(split_key)(BlockHashWithGroupId(key)))


def external_low64(block_hash: bytes, as_int: bool) -> bytes | int:
    """The event form is the last 8 bytes read big-endian (or the bytes).

    pre: len(block_hash) <= 32
    post: as_int or __return__ == block_hash
    post: not as_int or __return__ == int.from_bytes(block_hash[-8:], "big")
    post: not as_int or 0 <= __return__ < 2 ** 64
    """
    # crosshair: max_iterations=100
    return unenforced(external_block_hash)(BlockHash(block_hash), as_int)


def coarse_props(fine: list[bytes], hash_block_size: int, factor: int, m: int) -> tuple[BlockHash, ...]:
    """The coarse view has one hash per whole coarse block, is the identity at
    factor 1, and commutes with truncation (a prefix's view is a prefix).

    pre: len(fine) <= 6 and 1 <= hash_block_size <= 4 and 1 <= factor <= 3 and 0 <= m <= len(fine)
    post: len(__return__) == len(fine) // factor
    post: factor != 1 or __return__ == tuple(fine)
    post: _coarse(fine[:m], hash_block_size, factor) == __return__[: m // factor]
    """
    # crosshair: max_iterations=60
    return _coarse(fine, hash_block_size, factor)


def _coarse(fine: list[bytes], hash_block_size: int, factor: int) -> tuple[BlockHash, ...]:
    hashes = [BlockHash(h) for h in fine]
    return unenforced(coarse_block_hashes)(hashes, hash_block_size, hash_block_size * factor)


def extend_incremental(tokens: list[int], m: int, hash_block_size: int, salted: bool) -> tuple[BlockHash, ...]:
    """Hashing a prefix first and extending later gives the same hashes as
    hashing everything at once (no multimodal features: with them vLLM's
    cursor restarts at the last feature, which the spec mirrors).

    pre: len(tokens) <= 6 and 0 <= m <= len(tokens) and 1 <= hash_block_size <= 3
    post: len(__return__) == len(tokens) // hash_block_size
    post: __return__ == _extend(_extend((), tokens[:m], hash_block_size, salted), tokens, hash_block_size, salted)
    """
    # crosshair: max_iterations=40
    return _extend((), tokens, hash_block_size, salted)


def _extend(existing: tuple[BlockHash, ...], tokens: list[int], hbs: int, salted: bool) -> tuple[BlockHash, ...]:
    fn = get_hash_fn_by_name("sha256")
    src = ExtraKeySource(lora=LoRA("adapter", 1), cache_salt="salt") if salted else ExtraKeySource()
    return unenforced(extend_block_hashes)(fn, none_hash(fn, "0"), hbs, existing, tokens, src)
