"""KV-cache events, with vLLM 0.25.1's fields.

Upstream: ``vllm/distributed/kv_events.py``. Hashes are in their external
form (see :func:`kvspec.hashing.external_block_hash`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MEDIUM_GPU = "GPU"

ExternalHash = bytes | int


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks newly inserted into the prefix cache by one ``cache_full_blocks`` call.

    ``token_ids`` spans every block of the call's range, including null or
    masked blocks that were not stored; ``extra_keys`` has one entry per
    stored block (None when nothing was stored); under look-ahead hashes an
    entry covers the block and its look-ahead tokens.
    """

    block_hashes: tuple[ExternalHash, ...]
    parent_block_hash: ExternalHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: tuple[tuple[Any, ...] | None, ...] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    lookahead_token_ids: tuple[tuple[int, ...], ...] | None = None
    """Under look-ahead block hashes (vLLM 0.33.0 on): per stored block, the
    tokens after it that its hash covers (None without look-ahead hashes)."""


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """One hash key left the prefix cache (always a one-element list)."""

    block_hashes: tuple[ExternalHash, ...]
    medium: str | None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """``reset_prefix_cache`` succeeded."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
