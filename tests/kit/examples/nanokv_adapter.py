"""kvref adapter for nanokv (written from docs/writing-an-adapter.md, public API only).

nanokv numbers its blocks 0 .. N-2 and has no null block; kvref's view
reserves id 0 for the null block, so engine block ``e`` is kvref block ``e + 1``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from nanokv import BlockManager  # type: ignore[import-not-found]  # the engine sits beside this file

from kvref import Unsupported, declare
from kvspec.config import FullAttention, KVCacheConfig
from kvspec.errors import (
    ExceedsMaxModelLenError,
    GroupCountError,
    InvalidBlockIdError,
    InvalidTokenCountError,
    StaleHitError,
    UnexpectedPrefixHitError,
    UnknownRequestError,
    UnsupportedOperationError,
)
from kvspec.events import KVCacheEvent
from kvspec.request import Request
from kvspec.stats import PrefixCacheStats
from kvspec.view import BlockIds, KVView

GROUP = (0).to_bytes(4, "big")  # cache keys in the view are hash || group id


PROFILES = ("vllm-0.25.1", "vllm-0.33.0", "vllm-0.34.0")
"""The releases whose semantics nanokv follows."""


def supports(config: KVCacheConfig) -> str | None:
    """nanokv runs one full-attention group, vLLM 0.25.1, 0.33.0 or 0.34.0 semantics, no extras."""
    if len(config.groups) != 1 or type(config.groups[0]) is not FullAttention:
        return "nanokv has exactly one full-attention group"
    if config.profile.name not in PROFILES:
        return f"nanokv follows {', '.join(PROFILES)} only"
    if config.use_eagle or config.enable_kv_cache_events or config.log_stats or config.watermark:
        return "nanokv has no EAGLE, events, statistics or watermark"
    return None


@declare(supports=supports, unsupported={"external", "delay_cache_blocks", "op:pop_blocks_for_free",
                                         "op:free_blocks", "op:cache_blocks", "op:record_prefix_cache_stats",
                                         "op:get_prefix_hint", "op:get_block_ids_for_computed_tokens",
                                         "op:estimate_cached_tokens", "op:get_num_cached_tokens",
                                         "op:take_kv_cache_block_copies", "max_cache_hit_length",
                                         "op:record_blocks_for_zeroing"})
def make(config: KVCacheConfig) -> NanoAdapter:
    """Factory: ``kvref check --target nanokv_adapter:make --against spec``."""
    return NanoAdapter(config)


class NanoAdapter:
    """nanokv behind kvref's facade (protocol 2: ``free`` takes the request)."""

    name = "nanokv"
    protocol_version = 2

    def __init__(self, config: KVCacheConfig) -> None:
        self.config = config
        self.bs = config.groups[0].block_size
        self.m = BlockManager(config.num_blocks - 1, self.bs, config.enable_caching)
        self.newer = config.profile.name != "vllm-0.25.1"
        self.common_prefix_gone = config.profile.name == "vllm-0.34.0"
        self.new_ids: list[int] = []  # fresh blocks, reported by take_new_block_ids until 0.26.0

    # -- the operations nanokv has -----------------------------------------------

    def get_computed_blocks(self, request: Request) -> tuple[BlockIds, int]:
        # vLLM 0.34.0 reads the hit limit fixed when the request was made, earlier releases the flag as it is now
        limit = request.prefix_cache_hit_limit if self.common_prefix_gone else None
        skip = limit == 0 if self.common_prefix_gone else request.skip_reading_prefix_cache
        if not self.config.enable_caching or skip:
            return ((),), 0
        length = request.num_tokens - 1 if limit is None else min(request.num_tokens - 1, limit)
        hit = self.m.lookup(list(request.block_hashes[: length // self.bs]))
        return (tuple(b + 1 for b in hit),), len(hit) * self.bs

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: BlockIds | None = None, num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0, delay_cache_blocks: bool = False,
                       num_encoder_tokens: int = 0, full_sequence_must_fit: bool = False,
                       reserved_blocks: int = 0, has_scheduled_reqs: bool = True) -> BlockIds | None:
        if num_external_computed_tokens or delay_cache_blocks or num_encoder_tokens:
            raise Unsupported("nanokv has no KV connector or encoder", "external")
        hits = self._check(request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
                           num_lookahead_tokens, reserved_blocks)
        rid, total = request.request_id, request.num_computed_tokens + num_new_computed_tokens
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.config.max_model_len)
            if self.m.blocks_needed(rid, full, hits) > self.m.num_free:
                return None
        slots = min(total + num_new_tokens + num_lookahead_tokens, self.config.max_model_len)
        if self.m.blocks_needed(rid, slots, hits) > self.m.num_free - reserved_blocks:
            return None
        new = self.m.allocate(rid, slots, hits)
        if not self.newer:
            self.new_ids += [b + 1 for b in new]
        if self.config.enable_caching:
            self.m.cache_full(rid, list(request.block_hashes), min(total + num_new_tokens, request.num_tokens))
        return (tuple(b + 1 for b in new),)

    def free(self, request: Request) -> None:
        self.m.release(request.request_id)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        ids = list(block_ids)
        self._valid(ids)
        self.m.evict([b - 1 for b in ids if b != 0])

    def reset_prefix_cache(self) -> bool:
        return bool(self.m.reset())

    def get_num_common_prefix_blocks(self, request_id: str) -> tuple[int, ...]:
        if self.common_prefix_gone:
            raise UnsupportedOperationError("nanokv: vLLM 0.34.0 has no get_num_common_prefix_blocks")
        table = self.m.tables.get(request_id)
        if not table:
            raise UnknownRequestError(f"request {request_id!r} holds no blocks")
        if self.newer or not self.config.enable_caching:
            return (0,)  # vLLM 0.32.0 on, and without prefix caching: always zero
        n = 0
        while n < len(table) and all(table[n] in t for t in self.m.tables.values()):
            n += 1
        return (n,)

    def get_block_ids(self, request_id: str) -> BlockIds:
        return (tuple(b + 1 for b in self.m.tables.get(request_id, ())),)

    @property
    def usage(self) -> float:
        total = len(self.m.ref)
        return 0.0 if total == 0 else 1.0 - self.m.num_free / total

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        if total_computed_tokens < 0:
            raise InvalidTokenCountError("total_computed_tokens is negative")

    def take_events(self) -> list[KVCacheEvent]:
        return []

    def take_new_block_ids(self) -> list[int]:
        ids, self.new_ids = self.new_ids, []
        return ids

    def new_step_starts(self) -> None:
        pass

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        return None

    def to_view(self) -> KVView:
        m = self.m
        return KVView(
            free_queue=tuple(b + 1 for b in m.free_ids),
            ref_cnt=tuple((b + 1, n) for b, n in enumerate(m.ref) if n > 0),
            cached=tuple(sorted((h + GROUP, tuple(b + 1 for b in ids)) for h, ids in m.cache.items())),
            tables=tuple((rid, (tuple(b + 1 for b in t),)) for rid, t in sorted(m.tables.items()) if t),
            usage=self.usage,
        )

    # -- what nanokv lacks, and caller errors ---------------------------------------

    def pop_blocks_for_free(self, request: Request) -> tuple[int, ...]:
        raise Unsupported("nanokv frees at once (no deferred free)", "op:pop_blocks_for_free")

    def free_blocks(self, block_ids: Sequence[int]) -> None:
        raise Unsupported("nanokv frees at once (no deferred free)", "op:free_blocks")

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        raise Unsupported("nanokv caches inside allocate_slots only", "op:cache_blocks")

    def _valid(self, ids: Iterable[int]) -> None:
        for b in ids:
            if not 0 <= b < self.config.num_blocks:
                raise InvalidBlockIdError(f"block id {b} is outside the pool")

    def _check(self, request: Request, n: int, h: int, hits: BlockIds | None, k: int, reserved: int) -> list[int]:
        """The caller errors of allocate_slots, in kvref's order; the hits as engine ids."""
        rid = request.request_id
        if min(n, h, k, reserved, request.num_computed_tokens) < 0:
            raise InvalidTokenCountError("a count is negative")
        if n == 0 and (h == 0 or not self.newer):  # vLLM 0.31.0 on adopts a hit without new tokens
            raise InvalidTokenCountError("num_new_tokens must be greater than 0")
        if hits is not None and len(hits) != 1:
            raise GroupCountError(f"new_computed_blocks has {len(hits)} groups, nanokv has 1")
        if request.num_computed_tokens + h + n > self.config.max_model_len:
            raise ExceedsMaxModelLenError(f"request {rid!r} would exceed max_model_len")
        ids = list(hits[0]) if hits else []
        if ids and rid in self.m.tables:
            raise UnexpectedPrefixHitError(f"request {rid!r} already holds blocks")
        self._valid(ids)
        if ids and not self.config.enable_caching:
            raise StaleHitError("prefix caching is off")
        if ids and len(ids) != -(-h // self.bs):
            raise StaleHitError(f"{len(ids)} hit blocks for {h} hit tokens: no lookup returns that")
        for i, b in enumerate(ids):
            if b == 0 or i >= len(request.block_hashes) or self.m.hash_of[b - 1] != request.block_hashes[i]:
                raise StaleHitError(f"hit block {b} is no longer cached for request {rid!r}")
        return [b - 1 for b in ids]
