"""kvspec with a weak block hash: the safety oracle, not the hash, catches collisions.

The engine is kvspec's manager, but every request it sees carries block
hashes of one bit each (the parity of the previous hash plus the block's token
sum), so blocks of different prefixes share keys all the time. Its cache map
is consistent with those keys, so its own invariants hold; only the content
oracle, which names KV by the input prefix itself, sees that a hit serves the
KV of another prefix: ``kvref check --level safety --target weakhash_adapter:make``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvref import declare
from kvspec.config import KVCacheConfig
from kvspec.hashing import BlockHash
from kvspec.kv_cache_manager import KVCacheManager
from kvspec.request import Request
from kvspec.view import BlockIds


def weak_hashes(request: Request, block_size: int) -> tuple[BlockHash, ...]:
    """One bit per block, chained: the previous bit plus the block's token sum, modulo 2."""
    out: list[BlockHash] = []
    bit = 0
    for i in range(len(request.block_hashes)):
        bit = (bit + sum(request.all_token_ids[i * block_size : (i + 1) * block_size])) % 2
        out.append(BlockHash(bytes([bit]) * 32))
    return tuple(out)


class WeakHashAdapter(KVCacheManager):
    """kvspec's manager behind the weak hash."""

    name = "weakhash"

    def _weak(self, request: Request) -> Request:
        return replace(request, block_hashes=weak_hashes(request, self.config.resolved_hash_block_size()))

    def get_computed_blocks(self, request: Request, max_cache_hit_length: int | None = None) -> tuple[BlockIds, int]:
        return super().get_computed_blocks(self._weak(request), max_cache_hit_length)

    def allocate_slots(self, request: Request, num_new_tokens: int, *args: Any, **kwargs: Any) -> BlockIds | None:
        return super().allocate_slots(self._weak(request), num_new_tokens, *args, **kwargs)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        super().cache_blocks(self._weak(request), num_computed_tokens)


def _one_group(config: KVCacheConfig) -> str | None:
    return None if len(config.groups) == 1 else "the weak hash example keeps to one group"


@declare(supports=_one_group, unsupported={"lora", "mm", "cache_salt", "prompt_embeds"})
def make(config: KVCacheConfig) -> WeakHashAdapter:
    """Factory: ``kvref check --level safety --target weakhash_adapter:make``."""
    return WeakHashAdapter(config)
