"""Real vLLM's ``BlockPool`` behind :class:`kvref.layers.pool.BlockPoolAdapter`.

The pool layer checked against vLLM itself: ``kvref check --layer pool
--target spec --against vllm`` drives kvspec's pool and vLLM's
``vllm.v1.core.block_pool.BlockPool`` in lockstep.

NOTE: vLLM's pool reads a request only for its block hashes, token ids and
LoRA (events); the adapter hands it a stand-in carrying the kvspec request's
hashes (equal to vLLM's, as the hash vectors check), so this layer checks the
pool's bookkeeping and the facade layer checks hashing. Caller errors are
checked first, as in the facade adapter: vLLM's pool lets a reference count
go negative and raises ``ValueError`` for an exhausted pool.
"""

from __future__ import annotations

import importlib
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvref.adapters import DeclaredSemantics
from kvspec.config import KVCacheConfig
from kvspec.errors import DoubleFreeError, InvalidBlockIdError, InvalidTokenCountError, PoolExhaustedError
from kvspec.events import KVCacheEvent
from kvspec.request import Request
from kvspec.view import KVView

from .eras import VllmApi
from .view import convert_event, ids_of, to_view


class VllmPoolAdapter:
    """A fresh vLLM ``BlockPool`` of ``config.num_blocks`` blocks.

    Attributes:
        pool: The vLLM ``BlockPool`` (for debugging; do not mutate).
    """

    def __init__(self, config: KVCacheConfig, api: VllmApi, name: str = "vllm") -> None:
        """Build the pool through the era ``api`` (its package, e.g. ``vllm`` or a fork's)."""
        self.name = name
        self.api = api
        self.semantics = DeclaredSemantics(profile=f"vllm-{api.version}", upstream=True)
        self.config = config
        self._int_flag = "1" if config.int_block_hashes else "0"
        module = importlib.import_module(api.modules["kcm"].rsplit(".", 1)[0] + ".block_pool")
        self._apply()
        self.pool: Any = module.BlockPool(
            config.num_blocks, config.enable_caching, config.groups[0].block_size, config.enable_kv_cache_events
        )

    def _apply(self) -> None:
        os.environ[self.api.env.int_block_hashes] = self._int_flag

    def _blocks(self, ids: Iterable[int]) -> list[Any]:
        blocks = self.api.pool_blocks(self.pool)
        out = []
        for b in ids:
            if not isinstance(b, int) or not 0 <= b < len(blocks):
                raise InvalidBlockIdError(f"block id {b!r} is outside 0..{len(blocks) - 1}")
            out.append(blocks[b])
        return out

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """``BlockPool.get_new_blocks``."""
        if num_blocks < 0:
            raise InvalidTokenCountError(f"get_new_blocks: num_blocks {num_blocks} < 0")
        if num_blocks > self.pool.get_num_free_blocks():
            raise PoolExhaustedError(f"Cannot get {num_blocks} free blocks from the pool")
        self._apply()
        return list(ids_of(self.api, self.pool.get_new_blocks(num_blocks)))

    def free_blocks(self, block_ids: Sequence[int]) -> None:
        """``BlockPool.free_blocks`` (a double free is refused first)."""
        blocks = self._blocks(block_ids)
        for bid, times in Counter(b for b in block_ids if b != 0).items():
            if self.api.ref_cnt(blocks[list(block_ids).index(bid)]) < times:
                raise DoubleFreeError(f"free_blocks: block {bid} is freed {times} time(s) below zero references")
        self.pool.free_blocks(blocks)

    def touch(self, block_ids: Sequence[int]) -> None:
        """``BlockPool.touch``."""
        self.pool.touch(self._blocks(block_ids))

    def cache_full_blocks(
        self,
        request: Request,
        block_ids: Sequence[int],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int,
    ) -> None:
        """``BlockPool.cache_full_blocks`` with a request stand-in."""
        self._apply()
        self.pool.cache_full_blocks(
            _Request(request.request_id, list(request.block_hashes), list(request.all_token_ids)),
            self._blocks(block_ids), num_cached_blocks, num_full_blocks, block_size, group_id,
        )  # fmt: skip

    def get_cached_block(self, block_hash: bytes, group_ids: Sequence[int]) -> list[int] | None:
        """``BlockPool.get_cached_block``."""
        found = self.pool.get_cached_block(block_hash, list(group_ids))
        return None if found is None else list(ids_of(self.api, found))

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """``BlockPool.evict_blocks``, one block at a time in ascending order."""
        ids = sorted(set(block_ids))
        self._blocks(ids)
        self._apply()
        for bid in ids:
            self.pool.evict_blocks({bid})

    def reset_prefix_cache(self) -> bool:
        """``BlockPool.reset_prefix_cache``."""
        self._apply()
        return bool(self.pool.reset_prefix_cache())

    def get_num_free_blocks(self) -> int:
        """``BlockPool.get_num_free_blocks``."""
        return int(self.pool.get_num_free_blocks())

    def get_usage(self) -> float:
        """``BlockPool.get_usage``."""
        return float(self.pool.get_usage())

    def take_events(self) -> list[KVCacheEvent]:
        """``BlockPool.take_events`` as kvspec events."""
        return [convert_event(self.api, e) for e in self.pool.take_events()]

    def to_view(self) -> KVView:
        """The pool's view (no tables)."""
        return to_view(self.api, self.pool, ())


def make_vllm_pool(config: KVCacheConfig) -> VllmPoolAdapter:
    """Factory for ``--layer pool --target vllm`` (the installed vLLM).

    Raises:
        VllmUnavailable: If no supported vLLM is installed.
    """
    from . import loaded_api  # noqa: PLC0415 - the package imports this module

    return VllmPoolAdapter(config, loaded_api())


@dataclass(slots=True)
class _Request:
    """What vLLM's ``BlockPool`` reads of a request."""

    request_id: str
    block_hashes: list[bytes]
    all_token_ids: list[int]
    lora_request: Any = None
    mm_features: list[Any] = field(default_factory=list)
    cache_salt: str | None = None
    prompt_embeds: Any = None
    session_id: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)
