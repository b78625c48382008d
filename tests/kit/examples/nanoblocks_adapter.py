"""kvref adapter for nanoblocks, an engine that trusts its caller, admits
whole prompts and decodes one token per step (public kvref API only).

The walk-through of docs/writing-an-adapter.md, section 2::

    kvref check --target nanoblocks_adapter:make --against spec --keep-going
    kvref check --target nanoblocks_adapter:make --against spec --known nanoblocks-known.toml
    kvref check --safety --target nanoblocks_adapter:make           # nano-vllm's wrong-prefix defect
    kvref check --target nanoblocks_adapter:make_fixed --against spec --known nanoblocks-known.toml

nanoblocks numbers its blocks 0 .. N-2 and has no null block; kvref's view
reserves id 0 for the null block, so engine block ``e`` is kvref block ``e + 1``.
The engine's policies that differ from vLLM's are declared in
``nanoblocks-known.toml`` beside this file, with the matchers below.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from nanoblocks import BlockManager  # type: ignore[import-not-found]  # the engine sits beside this file
from nanoblocks import Sequence as Seq

from kvref import DeclaredSemantics, Unsupported, declare
from kvspec.config import FullAttention, KVCacheConfig
from kvspec.events import KVCacheEvent
from kvspec.request import Request
from kvspec.stats import PrefixCacheStats
from kvspec.view import BlockIds, KVView

GROUP = (0).to_bytes(4, "big")  # cache keys in the view are hash || group id
Json = Any


def supports(config: KVCacheConfig) -> str | None:
    """nanoblocks runs one full-attention group with prefix caching on, nothing else."""
    if len(config.groups) != 1 or type(config.groups[0]) is not FullAttention:
        return "nanoblocks has exactly one full-attention group"
    if not config.enable_caching:
        return "nanoblocks always caches"
    if config.use_eagle or config.enable_kv_cache_events or config.log_stats or config.watermark:
        return "nanoblocks has no EAGLE, events, statistics or watermark"
    return None


LACKS = {
    "external", "delay_cache_blocks", "full_sequence_must_fit", "reserved_blocks", "has_scheduled_reqs",
    "skip_reading_prefix_cache", "op:pop_blocks_for_free", "op:free_blocks", "op:cache_blocks", "op:evict_blocks",
    "op:reset_prefix_cache", "op:get_num_common_prefix_blocks", "op:get_prefix_hint",
    "op:get_block_ids_for_computed_tokens",
}  # fmt: skip
"""What nanoblocks has no counterpart for (besides what the capabilities below leave out)."""


@declare(supports=supports, trusts_caller=True, whole_prompts=True, one_token_decode=True, unsupported=LACKS)
def make(config: KVCacheConfig) -> NanoBlocksAdapter:
    """Factory: ``kvref check --target nanoblocks_adapter:make --against spec``."""
    return NanoBlocksAdapter(config)


@declare(supports=supports, trusts_caller=True, whole_prompts=True, one_token_decode=True, unsupported=LACKS)
def make_fixed(config: KVCacheConfig) -> NanoBlocksAdapter:
    """Factory of nanoblocks with its wrong-prefix defect fixed (its lookup checks the block's hash)."""
    return NanoBlocksAdapter(config, check_hash=True)


# -- matchers of the declared differences (nanoblocks-known.toml names them) ------------------


def whole_prompt_hit(config: KVCacheConfig, op: Json, own: Json, other: Json, pending: bool) -> bool:
    """The lookup hits every block of a fully cached prompt; vLLM stops a block short: the same blocks and
    exactly one more (a hit that differs otherwise, such as a block served for another prefix, is not this)."""
    if not (isinstance(own, dict) and isinstance(other, dict)):
        return False
    mine, theirs = own["blocks"][0], other["blocks"][0]
    one_more = own["num_tokens"] == other["num_tokens"] + config.groups[0].block_size
    return bool(one_more and len(mine) == len(theirs) + 1 and mine[:-1] == theirs)


def whole_prompt_fits(config: KVCacheConfig, op: Json, own: Json, other: Json, pending: bool) -> bool:
    """The admission needs a free block per block of the prompt, hits included: None where vLLM admits."""
    return own is None and isinstance(other, list) and bool(op.get("new_computed_blocks"))


class NanoBlocksAdapter:
    """nanoblocks behind kvref's facade (protocol 2: ``free`` takes the request)."""

    name = "nanoblocks"
    protocol_version = 2
    semantics = DeclaredSemantics("vllm-0.25.1", upstream=False)

    def __init__(self, config: KVCacheConfig, check_hash: bool = False) -> None:
        self.config = config
        self.bs = config.groups[0].block_size
        self.m = BlockManager(config.num_blocks - 1, self.bs, check_hash)
        self.seqs: dict[str, Seq] = {}
        self.new_ids: list[int] = []  # fresh blocks, reported by take_new_block_ids

    def _seq(self, request: Request) -> Seq:
        seq = self.seqs.get(request.request_id)
        if seq is None:
            seq = Seq(request.request_id, [], [], self.bs)
        seq.token_ids = list(request.all_token_ids)
        seq.block_hashes = list(request.block_hashes)
        return seq

    # -- the operations nanoblocks has ----------------------------------------------

    def get_computed_blocks(self, request: Request) -> tuple[BlockIds, int]:
        hit = self.m.cached_prefix(self._seq(request))
        return (tuple(b + 1 for b in hit),), len(hit) * self.bs

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: BlockIds | None = None, num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0, delay_cache_blocks: bool = False,
                       num_encoder_tokens: int = 0, full_sequence_must_fit: bool = False,
                       reserved_blocks: int = 0, has_scheduled_reqs: bool = True) -> BlockIds | None:  # fmt: skip
        seq = self._seq(request)
        if request.request_id not in self.seqs:  # an admission: the whole prompt at once
            if request.num_computed_tokens + num_new_computed_tokens + num_new_tokens != request.num_tokens:
                raise Unsupported("nanoblocks admits whole prompts only", "chunked-prefill")
            if not self.m.can_allocate(seq):
                return None
            self.m.allocate(seq)
            self.seqs[request.request_id] = seq
            fresh = seq.block_table[seq.num_cached_tokens // self.bs :]
        else:  # a decode step: one token
            if num_new_tokens != 1 or request.num_computed_tokens + 1 != request.num_tokens:
                raise Unsupported("nanoblocks decodes one token per step", "chunked-prefill")
            if not self.m.can_append(seq):
                return None
            before = len(seq.block_table)
            self.m.may_append(seq)
            fresh = seq.block_table[before:]
        self.new_ids += [b + 1 for b in fresh]
        return (tuple(b + 1 for b in fresh),)

    def free(self, request: Request) -> None:
        seq = self.seqs.pop(request.request_id, None)
        if seq is not None:
            self.m.deallocate(seq)

    def get_block_ids(self, request_id: str) -> BlockIds:
        seq = self.seqs.get(request_id)
        return (tuple(b + 1 for b in seq.block_table) if seq else (),)

    @property
    def usage(self) -> float:
        total = len(self.m.blocks)
        return 0.0 if total == 0 else 1.0 - len(self.m.free_block_ids) / total

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:  # fmt: skip
        pass  # full attention skips nothing

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
        cached = [(h + GROUP, (b + 1,)) for h, b in m.hash_to_block_id.items() if m.blocks[b].hash == h]
        return KVView(
            free_queue=tuple(b + 1 for b in m.free_block_ids),
            ref_cnt=tuple((b.block_id + 1, b.ref_count) for b in m.blocks if b.ref_count > 0),
            cached=tuple(sorted(cached)),
            tables=tuple((rid, (tuple(b + 1 for b in s.block_table),)) for rid, s in sorted(self.seqs.items())),
            usage=self.usage,
        )

    # -- what nanoblocks lacks (declared on the factory, so never called) ------------------

    def pop_blocks_for_free(self, request: Request) -> tuple[int, ...]:
        raise Unsupported("nanoblocks frees at once", "op:pop_blocks_for_free")

    def free_blocks(self, block_ids: Sequence[int]) -> None:
        raise Unsupported("nanoblocks frees at once", "op:free_blocks")

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        raise Unsupported("nanoblocks caches as it allocates", "op:cache_blocks")

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        raise Unsupported("nanoblocks has no KV connector", "op:evict_blocks")

    def reset_prefix_cache(self) -> bool:
        raise Unsupported("nanoblocks has no cache reset", "op:reset_prefix_cache")

    def get_num_common_prefix_blocks(self, request_id: str) -> tuple[int, ...]:
        raise Unsupported("nanoblocks has no cascade attention", "op:get_num_common_prefix_blocks")
