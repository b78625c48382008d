"""Chained block hashes, byte-identical to vLLM (per semantics profile).

A request's token sequence is cut into full blocks of ``hash_block_size``
tokens. Block ``j``'s hash is ``fn((parent, tokens_j, extra_keys_j))`` where
``parent`` is block ``j-1``'s hash (``none_hash`` for ``j == 0``), so every
hash fingerprints the whole prefix that ends at its block. Partial trailing
blocks are never hashed.

Upstream: ``vllm/utils/hashing.py`` and ``vllm/v1/core/kv_cache_utils.py``
(``init_none_hash``, ``hash_block_tokens``, ``generate_block_hash_extra_keys``,
``get_request_block_hasher``, ``BlockHashListWithBlockSize``).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NewType

import cbor2

from kvspec.errors import InvalidRequestError, UnknownHashFunctionError

BlockHash = NewType("BlockHash", bytes)
"""Raw digest of one block (32 bytes for SHA-256, 16 for xxh3-128)."""

BlockHashWithGroupId = NewType("BlockHashWithGroupId", bytes)
"""Hash-map key: the digest followed by the group id as 4 big-endian bytes."""

HashFunction = Callable[[Any], bytes]

HASH_FUNCTION_NAMES = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")


@dataclass(frozen=True, slots=True)
class MultiModalFeature:
    """A multimodal item placed at ``[offset, offset + length)`` of the prompt.

    Upstream: ``MultiModalFeatureSpec`` (``identifier`` and ``mm_position``).
    """

    identifier: str
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class LoRA:
    """The LoRA adapter of a request (upstream: ``LoRARequest``; ``path`` is its
    ``lora_path``, part of the hash from vLLM 0.31.0 on)."""

    name: str
    adapter_id: int
    path: str = ""

    def __post_init__(self) -> None:
        if self.adapter_id < 1:
            raise InvalidRequestError(f"LoRA {self.name!r}: adapter_id must be >= 1, got {self.adapter_id}")


@dataclass(frozen=True, slots=True)
class ExtraKeySource:
    """Everything besides token ids that enters a block hash.

    ``prompt_embeds`` holds one raw row of bytes per prompt token; the bytes of
    a block are the concatenation of its rows, exactly the bytes vLLM reads
    from a contiguous embeddings tensor.
    """

    lora: LoRA | None = None
    mm_features: tuple[MultiModalFeature, ...] = ()
    cache_salt: str | None = None
    prompt_embeds: tuple[bytes, ...] | None = None


def get_hash_fn_by_name(name: str) -> HashFunction:
    """Return vLLM's hash function called ``name``.

    Args:
        name: One of ``sha256`` (pickle + SHA-256), ``sha256_cbor`` (canonical
            CBOR + SHA-256, the default), ``xxhash``, ``xxhash_cbor``.

    Raises:
        UnknownHashFunctionError: For any other name.

    pre: isinstance(name, str)
    raises: UnknownHashFunctionError
    post: name in HASH_FUNCTION_NAMES
    """
    if name == "sha256":
        return _sha256
    if name == "sha256_cbor":
        return _sha256_cbor
    if name == "xxhash":
        return _xxhash
    if name == "xxhash_cbor":
        return _xxhash_cbor
    raise UnknownHashFunctionError(f"unknown hash function {name!r}; expected one of {', '.join(HASH_FUNCTION_NAMES)}")


def none_hash(fn: HashFunction, seed: str) -> BlockHash:
    """The parent hash of every first block: ``fn(seed)``.

    NOTE: vLLM uses ``fn(PYTHONHASHSEED)`` when that variable is set and 32
    random bytes otherwise; the spec always takes the seed string, so digests
    are reproducible (set ``PYTHONHASHSEED`` to the same string in vLLM).

    post: __return__ == fn(seed)
    """
    return BlockHash(fn(seed))


def hash_block_tokens(
    fn: HashFunction,
    parent: BlockHash,
    token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None,
) -> BlockHash:
    """Hash one full block: ``fn((parent, tuple(token_ids), extra_keys))``.

    ``extra_keys`` is ``None`` (never an empty tuple) when a block has none.

    pre: extra_keys is None or len(extra_keys) > 0
    post: __return__ == fn((parent, tuple(token_ids), extra_keys))
    """
    return BlockHash(fn((parent, tuple(token_ids), extra_keys)))


def block_extra_keys(
    src: ExtraKeySource,
    start: int,
    end: int,
    mm_cursor: int,
    tagged: bool = False,
    v025_forms: bool = True,
    embeds_digest: bool | None = None,
) -> tuple[tuple[Any, ...] | None, int]:
    """Extra keys of the block ``[start, end)`` and the advanced mm cursor.

    Order: LoRA name (every block), multimodal ``(identifier, offset - start)``
    for each feature overlapping the block, cache salt (block starting at 0
    only, if truthy), SHA-256 digest of the block's prompt-embedding bytes.
    With ``tagged`` (hashes from vLLM 0.31.0 on, profile switch
    ``extra_keys_tagged``) each key names its source: ``("lora", name, path)``,
    ``("mm", identifier, offset)``, ``("cache_salt", salt)``,
    ``("prompt_embeds", digest)``; events always carry the untagged form.
    Without ``v025_forms`` (hashes before vLLM 0.19.0, profile switch
    ``mm_key_with_offset``) a multimodal key is the bare identifier and a
    feature also keys the block that starts exactly at its end; without
    ``embeds_digest`` (None: as ``v025_forms``; before vLLM 0.17.0, profile
    switch ``prompt_embeds_digest``) the prompt-embedding key is the raw bytes.

    Args:
        src: The request's extra-key sources.
        start: First token of the block.
        end: One past the last token of the block.
        mm_cursor: Index of the first feature to consider; ``-1`` means the
            last feature (used for blocks completed after construction).
        tagged: Whether keys carry their source tag.
        v025_forms: Whether multimodal keys have vLLM 0.25.1's form (see above).
        embeds_digest: Whether the prompt-embedding key is a digest (None: ``v025_forms``).

    pre: 0 <= start < end and mm_cursor >= -1
    post: __return__[0] is None or len(__return__[0]) > 0
    post: not tagged or all(isinstance(k, tuple) and k[0] in ("lora", "mm", "cache_salt", "prompt_embeds") for k in __return__[0] or ())
    post: tagged or v025_forms or not any(isinstance(k, tuple) for k in __return__[0] or ())
    post: len(__return__[0] or ()) == len(block_extra_keys(src, start, end, mm_cursor, not tagged, v025_forms)[0] or ())
    post: embeds_digest is not None or __return__ == block_extra_keys(src, start, end, mm_cursor, tagged, v025_forms, v025_forms)
    """  # noqa: E501 - a PEP 316 condition is one line
    mm_keys, cursor = _mm_extra_keys(src.mm_features, start, end, mm_cursor, v025_forms)
    keys: list[Any] = []
    if src.lora is not None:
        keys.append(("lora", src.lora.name, src.lora.path) if tagged else src.lora.name)
    keys += [("mm", *k) for k in mm_keys] if tagged else mm_keys
    if start == 0 and src.cache_salt:
        keys.append(("cache_salt", src.cache_salt) if tagged else src.cache_salt)
    if src.prompt_embeds is not None:
        rows = b"".join(src.prompt_embeds[start:end])
        digested = v025_forms if embeds_digest is None else embeds_digest
        digest = hashlib.sha256(rows).digest() if digested else rows
        keys.append(("prompt_embeds", digest) if tagged else digest)
    return (tuple(keys) if keys else None), cursor


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
    """Return ``existing`` extended with the hashes of every new full block.

    Mirrors vLLM's request hasher, which runs at construction and after every
    appended output token: the mm cursor starts at 0 when hashing starts at
    token 0, and at the last feature otherwise, unless ``resume_from_first``
    (vLLM 0.31.0 on, profile switch ``mm_resume_from_first_feature``), which
    always starts at the first feature. ``tagged``, ``v025_forms``,
    ``embeds_digest``: see :func:`block_extra_keys`.

    With ``lookahead`` ``L`` > 0 (look-ahead block hashes, vLLM 0.33.0 on) a
    block is hashed only once the ``L`` tokens after it exist, and its extra
    keys are those of :func:`lookahead_extra_keys`.

    pre: hash_block_size > 0 and lookahead >= 0
    post: len(__return__) == max(len(token_ids) - lookahead, 0) // hash_block_size
    """
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
        parent = hashes[-1] if hashes else seed_hash
        hashes.append(hash_block_tokens(fn, parent, token_ids[start:end], extra))
        start = end
    return tuple(hashes)


def lookahead_window_keys(
    src: ExtraKeySource,
    start: int,
    end: int,
    lookahead: int,
    mm_cursor: int,
    tagged: bool = False,
    v025_forms: bool = True,
    embeds_digest: bool | None = None,
) -> tuple[tuple[Any, ...] | None, int]:
    """The extra keys of the window ``[start, end + lookahead)`` (a block and
    the tokens its look-ahead hash covers: :func:`block_extra_keys` over the
    window, so a multimodal item or prompt embedding inside the look-ahead
    counts) and the mm cursor moved back to the first feature still open at
    ``end`` (the next block may hold it too). Stored events carry these keys.

    pre: 0 <= start < end and lookahead >= 1 and mm_cursor >= -1
    post: __return__[0] == block_extra_keys(src, start, end + lookahead, mm_cursor, tagged, v025_forms, embeds_digest)[0]
    post: __return__[1] <= block_extra_keys(src, start, end + lookahead, mm_cursor, tagged, v025_forms, embeds_digest)[1]
    """  # noqa: E501 - a PEP 316 condition is one line
    keys, cursor = block_extra_keys(src, start, end + lookahead, mm_cursor, tagged, v025_forms, embeds_digest)
    features = src.mm_features
    while 0 < cursor <= len(features) and features[cursor - 1].offset + features[cursor - 1].length > end:
        cursor -= 1
    return keys, cursor


def lookahead_extra_keys(
    src: ExtraKeySource,
    token_ids: Sequence[int],
    start: int,
    end: int,
    lookahead: int,
    mm_cursor: int,
    tagged: bool = False,
    v025_forms: bool = True,
    embeds_digest: bool | None = None,
) -> tuple[tuple[Any, ...], int]:
    """The extra keys of block ``[start, end)`` under look-ahead hashes of
    ``lookahead`` tokens: ``(E, *t)``, where ``E`` is the window's keys
    (:func:`lookahead_window_keys`, possibly None) and ``t`` the look-ahead
    tokens ``token_ids[end:end + lookahead]``; the block's own tokens stay
    the hashed tokens. Upstream: ``get_request_block_hasher`` and
    ``generate_lookahead_block_hash_extra_keys`` (vLLM 0.33.0).

    pre: 0 <= start < end and lookahead >= 1 and end + lookahead <= len(token_ids)
    post: __return__[0][1:] == tuple(token_ids[end : end + lookahead])
    post: __return__[0][0] == lookahead_window_keys(src, start, end, lookahead, mm_cursor, tagged, v025_forms, embeds_digest)[0]
    """  # noqa: E501 - a PEP 316 condition is one line
    window, cursor = lookahead_window_keys(src, start, end, lookahead, mm_cursor, tagged, v025_forms, embeds_digest)
    return (window, *token_ids[end : end + lookahead]), cursor


def coarse_block_hashes(
    fine: Sequence[BlockHash], hash_block_size: int, block_size: int, last_fine: bool = True
) -> tuple[BlockHash, ...]:
    """View fine hashes at a coarser ``block_size`` (a multiple of the fine size).

    Coarse block ``j`` is the last fine hash inside it, which already chains
    the whole prefix; without ``last_fine`` (vLLM 0.16.0, profile switch
    ``coarse_hash_last_fine``) the concatenation of the fine hashes inside it,
    in order (upstream: ``BlockHashListWithBlockSize``). Either way a 64-bit
    event hash, the key's low 64 bits, is that of the last fine hash.

    pre: hash_block_size > 0 and block_size > 0 and block_size % hash_block_size == 0
    post: len(__return__) == len(fine) // (block_size // hash_block_size)
    post: all(h.endswith(fine[(j + 1) * (block_size // hash_block_size) - 1]) for j, h in enumerate(__return__))
    post: not last_fine or all(h == fine[(j + 1) * (block_size // hash_block_size) - 1] for j, h in enumerate(__return__))
    post: last_fine or all(h == b"".join(fine[j * (block_size // hash_block_size) : (j + 1) * (block_size // hash_block_size)]) for j, h in enumerate(__return__))
    """  # noqa: E501 - a PEP 316 condition is one line
    k = block_size // hash_block_size
    if last_fine:
        return tuple(fine[(j + 1) * k - 1] for j in range(len(fine) // k))
    return tuple(BlockHash(b"".join(fine[j * k : (j + 1) * k])) for j in range(len(fine) // k))


def make_key(block_hash: BlockHash, group_id: int) -> BlockHashWithGroupId:
    """The hash-map key of ``block_hash`` in KV-cache group ``group_id``.

    pre: 0 <= group_id < 2 ** 32
    post: len(__return__) == len(block_hash) + 4
    post: split_key(__return__) == (block_hash, group_id)
    """
    return BlockHashWithGroupId(block_hash + group_id.to_bytes(4, "big", signed=False))


def split_key(key: BlockHashWithGroupId) -> tuple[BlockHash, int]:
    """Inverse of :func:`make_key`.

    pre: len(key) >= 4
    post: make_key(*__return__) == key
    post: 0 <= __return__[1] < 2 ** 32
    """
    return BlockHash(key[:-4]), int.from_bytes(key[-4:], "big", signed=False)


def external_block_hash(block_hash: BlockHash, as_int: bool) -> bytes | int:
    """The form of a hash carried by events.

    vLLM's default (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``) is the low 64
    bits of the digest read as a big-endian integer; otherwise the raw bytes.

    post: as_int or __return__ == block_hash
    post: not as_int or __return__ == int.from_bytes(block_hash[-8:], "big")
    post: not as_int or 0 <= __return__ < 2 ** 64
    """
    if not as_int:
        return block_hash
    return int.from_bytes(block_hash, "big") & ((1 << 64) - 1)


def _mm_extra_keys(
    features: tuple[MultiModalFeature, ...], start: int, end: int, cursor: int, v025_forms: bool = True
) -> tuple[list[Any], int]:
    """Multimodal keys of ``[start, end)``; features are sorted by offset.
    Without ``v025_forms`` (before vLLM 0.25.1) a feature ending exactly at
    ``start`` still counts and the key is its bare identifier."""
    reach = 0 if v025_forms else 1  # 0.16.0 compares the feature's end strictly
    if not features or features[-1].offset + features[-1].length + reach <= start:
        return [], cursor
    if cursor < 0:
        cursor = len(features) + cursor
    keys: list[Any] = []
    while cursor < len(features):
        feat = features[cursor]
        if end <= feat.offset:
            break
        if start >= feat.offset + feat.length + reach:
            cursor += 1
            continue
        keys.append((feat.identifier, feat.offset - start) if v025_forms else feat.identifier)
        if end < feat.offset + feat.length:
            break
        cursor += 1
    return keys, cursor


def _sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _sha256_cbor(obj: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def _xxhash(obj: Any) -> bytes:
    return _xxh3_128(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _xxhash_cbor(obj: Any) -> bytes:
    return _xxh3_128(cbor2.dumps(obj, canonical=True))


def _xxh3_128(data: bytes) -> bytes:
    import xxhash  # noqa: PLC0415 - optional in vLLM; imported only when used

    return xxhash.xxh3_128_digest(data)
