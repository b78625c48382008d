"""Zoo entries in request hashing, planted on the caller side.

Faults that lived in request hashing cannot be planted by replacing a method
of the manager: the request's block hashes are computed before the manager
sees it. So the mutant (:class:`_RehashingAdapter`) re-hashes every request it
receives with a faulty hasher before delegating to kvimpl.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from kvref.adapters.impl import ImplAdapter
from kvspec.config import KVCacheConfig
from kvspec.hashing import (
    BlockHash,
    ExtraKeySource,
    HashFunction,
    MultiModalFeature,
    block_extra_keys,
    get_hash_fn_by_name,
    hash_block_tokens,
    none_hash,
)
from kvspec.request import Request
from kvtools.zoo.base import entry

ExtraKeys = Callable[[ExtraKeySource, int, int, int], tuple[tuple[Any, ...] | None, int]]
"""``block_extra_keys``' signature: (source, start, end, mm cursor) -> (keys, cursor)."""


@entry(
    "GHSA-rm76-4mrf-v9r8",
    "NONE_HASH (the parent of every first block) is a predictable constant that ignores the configured "
    "seed (Python 3.12 made hash(None) constant)",
    "view diff (cache keys) once a block is cached under a seed other than the constant's",
)
def constant_none_hash(config: KVCacheConfig) -> ImplAdapter:
    """The first block's parent is fn('0') whatever hash_seed says."""
    fn = get_hash_fn_by_name(config.hash_function)
    return _RehashingAdapter(config, "constant_none_hash", fn, none_hash(fn, "0"))


@entry(
    "vllm#44701 (unconfirmed)",
    "a block's extra keys (LoRA name, mm identifiers and offsets, cache salt, embeds digest) are "
    "concatenated into one string without separators, so different key lists can hash alike",
    "view diff (cache keys) for any request with extra keys",
)
def extra_keys_concatenated(config: KVCacheConfig) -> ImplAdapter:
    """Extra keys joined into one unseparated string before hashing."""
    base = get_hash_fn_by_name(config.hash_function)

    def fn(obj: Any) -> bytes:
        if isinstance(obj, tuple) and len(obj) == 3 and obj[2] is not None:
            obj = (obj[0], obj[1], ("".join(str(k) for k in obj[2]),))
        return base(obj)

    return _RehashingAdapter(config, "extra_keys_concatenated", fn, none_hash(base, config.hash_seed))


@entry(
    "vllm#3263 (issue #3264)",
    "the LoRA adapter is left out of the block hash, so equal tokens under different adapters (or under none) "
    "share cached blocks",
    "view diff (cache keys) once a block of a LoRA request is cached",
)
def lora_missing_from_hash(config: KVCacheConfig) -> ImplAdapter:
    """Block hashes computed as if no request had a LoRA adapter."""
    return _keys_without(config, "lora_missing_from_hash", lora=None)


def _keys_without(config: KVCacheConfig, name: str, **cleared: Any) -> ImplAdapter:
    """kvimpl hashing blocks with the ``cleared`` fields of every request's extra-key source reset."""
    base = get_hash_fn_by_name(config.hash_function)

    def keys(src: ExtraKeySource, start: int, end: int, cursor: int) -> tuple[tuple[Any, ...] | None, int]:
        return block_extra_keys(replace(src, **cleared), start, end, cursor)

    return _RehashingAdapter(config, name, base, none_hash(base, config.hash_seed), keys)


@entry(
    "vllm#51640 (unconfirmed as to the hasher; upstream the connector's external keys dropped the salt)",
    "the request's cache salt does not reach the block hash, so salted and unsalted requests (different "
    "tenants) share cached blocks and the timing side channel the salt closes is open again",
    "view diff (cache keys) once the first block of a salted request is cached",
)
def cache_salt_dropped(config: KVCacheConfig) -> ImplAdapter:
    """Block hashes computed without the cache salt."""
    return _keys_without(config, "cache_salt_dropped", cache_salt=None)


@entry(
    "vllm#36622 (issue #20261)",
    "the multimodal extra keys use an inclusive block end, so an item that starts exactly where a block ends "
    "is also keyed into that block (with an offset equal to the block size)",
    "view diff (cache keys) once a block ending where an mm item starts is cached",
)
def mm_item_at_block_end(config: KVCacheConfig) -> ImplAdapter:
    """Multimodal keys computed with ``end < offset`` where ``end <= offset`` is meant."""
    base = get_hash_fn_by_name(config.hash_function)

    def keys(src: ExtraKeySource, start: int, end: int, cursor: int) -> tuple[tuple[Any, ...] | None, int]:
        rest, _ = block_extra_keys(replace(src, mm_features=()), start, end, cursor)
        mm, cursor = _mm_keys_inclusive_end(src.mm_features, start, end, cursor)
        out = list(rest or ())
        at = 1 if src.lora is not None else 0  # order: LoRA name, mm keys, salt, embeds digest
        out[at:at] = mm
        return (tuple(out) if out else None), cursor

    return _RehashingAdapter(config, "mm_item_at_block_end", base, none_hash(base, config.hash_seed), keys)


def _mm_keys_inclusive_end(
    features: tuple[MultiModalFeature, ...], start: int, end: int, cursor: int
) -> tuple[list[Any], int]:
    if not features or features[-1].offset + features[-1].length <= start:
        return [], cursor
    if cursor < 0:
        cursor += len(features)
    keys: list[Any] = []
    while cursor < len(features):
        feat = features[cursor]
        if end < feat.offset:  # the bug: an item starting at `end` does not end the scan
            break
        if start >= feat.offset + feat.length:
            cursor += 1
            continue
        keys.append((feat.identifier, feat.offset - start))
        if end < feat.offset + feat.length:
            break
        cursor += 1
    return keys, cursor


# --- the caller-side rehashing --------------------------------------------------------------------


def _extend_hashes(
    fn: HashFunction,
    seed_hash: BlockHash,
    hbs: int,
    existing: tuple[BlockHash, ...],
    tokens: Sequence[int],
    src: ExtraKeySource,
    keys: ExtraKeys,
) -> tuple[BlockHash, ...]:
    """The request hasher's loop (kvspec.hashing.extend_block_hashes) with the
    extra-key function injected, so that a mutant can replace only that part."""
    hashes = list(existing)
    start = len(hashes) * hbs
    cursor = 0 if start == 0 else -1
    while start + hbs <= len(tokens):
        extra, cursor = keys(src, start, start + hbs, cursor)
        hashes.append(hash_block_tokens(fn, hashes[-1] if hashes else seed_hash, tokens[start : start + hbs], extra))
        start += hbs
    return tuple(hashes)


class _RehashingAdapter(ImplAdapter):
    """Re-hashes every request it receives with a faulty hasher, then delegates."""

    def __init__(
        self,
        config: KVCacheConfig,
        name: str,
        fn: HashFunction,
        seed_hash: BlockHash,
        keys: ExtraKeys = block_extra_keys,
    ) -> None:
        super().__init__(config)
        self.name = name
        self._fn = fn
        self._seed_hash = seed_hash
        self._keys = keys
        self._hbs = config.resolved_hash_block_size()
        self._hashes: dict[str, tuple[BlockHash, ...]] = {}

    def _faulty(self, request: Request) -> Request:
        rid = request.request_id
        have = self._hashes.get(rid)
        fn, seed, hbs, src, keys = self._fn, self._seed_hash, self._hbs, request.extra, self._keys
        if have is None:
            # Prompt blocks first (mm cursor from 0), later blocks incrementally, as the spec's hasher does.
            have = _extend_hashes(fn, seed, hbs, (), request.all_token_ids[: request.num_prompt_tokens], src, keys)
        if len(have) < len(request.block_hashes):
            have = _extend_hashes(fn, seed, hbs, have, request.all_token_ids, src, keys)
        self._hashes[rid] = have
        return replace(request, block_hashes=have[: len(request.block_hashes)])

    def get_computed_blocks(self, request: Request, max_cache_hit_length: int | None = None) -> Any:
        """Delegate with the faulty hashes."""
        return super().get_computed_blocks(self._faulty(request), max_cache_hit_length)

    def allocate_slots(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        """Delegate with the faulty hashes."""
        return super().allocate_slots(self._faulty(request), *args, **kwargs)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Delegate with the faulty hashes."""
        super().cache_blocks(self._faulty(request), num_computed_tokens)
