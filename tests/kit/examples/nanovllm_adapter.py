"""kvref adapter for upstream nano-vllm's block manager, unmodified.

The package ``nano-vllm-npu`` 0.0.2 ships nano-vllm's ``BlockManager``
(``nanovllmnpu/engine/block_manager.py``) unchanged. This adapter drives that
class and nano's ``Sequence`` exactly as nano's scheduler does: ``allocate``
at admission (the prefix lookup and the allocation of the whole prompt in
one call), ``can_append`` / ``may_append`` before each decode step,
``deallocate`` at a finish or a preemption. Only the two modules are loaded,
not the package's ``__init__`` (which imports the model runner and torch).

``kvref check --level safety --target nanovllm_adapter:make`` finds nano's
wrong-prefix defect: a block reused for another prefix keeps its stale entry
in nano's hash map, and a later lookup serves it because its tokens match
(docs/safety.md). Its policy differs from vLLM's in ways that a conformance
check reports at once (declared in :data:`KNOWN`): it serves every block of
a fully cached prompt (this adapter reports one block less as the hit, and
the step recomputes that block in place, as vLLM does), keeps one block per
hash, frees every block to the tail of its free queue, and admits a prompt
only when every one of its blocks could be taken from the free queue.

kvref block ids are nano's plus one (kvref's id 0 is the null block).
"""

from __future__ import annotations

import copy
import importlib.util
import sys
import types
from collections.abc import Iterable, Sequence
from typing import Any

from kvref import DeclaredSemantics, Divergence, Unsupported, declare
from kvspec.config import FullAttention, KVCacheConfig
from kvspec.errors import (
    ExceedsMaxModelLenError,
    GroupCountError,
    InvalidBlockIdError,
    InvalidTokenCountError,
    StaleHitError,
    UnexpectedPrefixHitError,
    UnknownRequestError,
)
from kvspec.events import KVCacheEvent
from kvspec.request import Request
from kvspec.stats import PrefixCacheStats
from kvspec.view import BlockIds, KVView

GROUP = (0).to_bytes(4, "big")


def _nano() -> tuple[Any, Any]:
    """nano's ``BlockManager`` and ``Sequence``, without importing the package's model code."""
    if "nanovllmnpu" not in sys.modules:
        found = importlib.util.find_spec("nanovllmnpu")
        if found is None or found.submodule_search_locations is None:
            raise Unsupported("nano-vllm-npu is not installed (pip install --no-deps nano-vllm-npu==0.0.2)", "config")
        package = types.ModuleType("nanovllmnpu")
        package.__path__ = list(found.submodule_search_locations)
        sys.modules["nanovllmnpu"] = package
    # nano-vllm ships no type information (and may be absent: then the import above refused)
    from nanovllmnpu.engine.block_manager import (  # type: ignore[import-untyped,import-not-found,unused-ignore]  # noqa: PLC0415
        BlockManager,
    )
    from nanovllmnpu.engine.sequence import (  # type: ignore[import-untyped,import-not-found,unused-ignore]  # noqa: PLC0415
        Sequence as NanoSequence,
    )

    return BlockManager, NanoSequence


KNOWN = tuple(
    Divergence(f"nano-{name}", title, op, "", "", True, aspect=aspect)
    for name, title, op, aspect in (
        ("lookup", "a fully cached prompt is served whole, and one block per hash", "get_computed_blocks", "*"),
        ("admission", "a prompt is admitted only when all its blocks could come from the free queue",
         "allocate_slots", "*"),
        ("free-order", "every freed block goes to the tail of the free queue", "free", "*"),
        ("cache", "one block per hash; a block reused for another hash keeps its old map entry", "*", "view:cached"),
    )
)
"""nano's policy differences from vLLM, declared for a conformance check
(each ends the run where it first shows; the safety level runs regardless)."""


def supports(config: KVCacheConfig) -> str | None:
    """nano-vllm runs one full-attention group with prefix caching, nothing else."""
    if len(config.groups) != 1 or type(config.groups[0]) is not FullAttention:
        return "nano-vllm has exactly one full-attention group"
    if not config.enable_caching:
        return "nano-vllm always caches prefixes"
    if config.use_eagle or config.enable_kv_cache_events or config.log_stats or config.watermark:
        return "nano-vllm has no EAGLE, events, statistics or watermark"
    if config.dcp_world_size > 1 or config.pcp_world_size > 1:
        return "nano-vllm has no context parallelism"
    return None


@declare(supports=supports, unsupported={
    "external", "delay_cache_blocks", "lookahead", "chunked-prefill", "lora", "mm", "cache_salt", "prompt_embeds",
    "skip_reading_prefix_cache", "op:pop_blocks_for_free", "op:free_blocks", "op:cache_blocks",
    "op:record_prefix_cache_stats", "op:get_prefix_hint", "op:get_block_ids_for_computed_tokens",
    "op:estimate_cached_tokens", "op:evict_blocks", "op:reset_prefix_cache", "op:take_new_block_ids",
    "op:get_num_common_prefix_blocks", "full_sequence_must_fit", "reserved_blocks",
})  # fmt: skip
def make(config: KVCacheConfig) -> NanoVllmAdapter:
    """Factory: ``kvref check --level safety --target nanovllm_adapter:make``."""
    return NanoVllmAdapter(config)


class NanoVllmAdapter:
    """nano-vllm's block manager behind kvref's facade (protocol 2)."""

    name = "nano-vllm"
    protocol_version = 2

    def __init__(self, config: KVCacheConfig) -> None:
        block_manager, self.sequence = _nano()
        self.config = config
        self.bs = config.groups[0].block_size
        self.sequence.block_size = self.bs  # nano's block size is a class attribute of its Sequence
        self.m = block_manager(config.num_blocks - 1, self.bs)
        self.seqs: dict[str, Any] = {}
        self.semantics = DeclaredSemantics(config.profile.name, upstream=False, known=())  # TMP

    # -- nano's scheduler moves ---------------------------------------------------

    def _new_seq(self, request: Request) -> Any:
        self.sequence.block_size = self.bs
        return self.sequence(list(request.all_token_ids))

    def get_computed_blocks(self, request: Request) -> tuple[BlockIds, int]:
        """What nano's ``allocate`` would serve from its cache, found by running it on a copy."""
        self._request(request)
        seq = self._new_seq(request)
        probe = copy.deepcopy(self.m)
        if not probe.can_allocate(seq):
            return ((),), 0
        probe.allocate(seq)
        # nano serves a fully cached prompt whole; the scheduler recomputes its last block in place
        cached = min(seq.num_cached_tokens // self.bs, (request.num_tokens - 1) // self.bs)
        return (tuple(b + 1 for b in seq.block_table[:cached]),), cached * self.bs

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: BlockIds | None = None, num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0, delay_cache_blocks: bool = False,
                       num_encoder_tokens: int = 0, full_sequence_must_fit: bool = False,
                       reserved_blocks: int = 0, has_scheduled_reqs: bool = True) -> BlockIds | None:
        if num_external_computed_tokens or delay_cache_blocks or num_encoder_tokens:
            raise Unsupported("nano-vllm has no KV connector or encoder", "external")
        self._check(request, num_new_tokens, num_new_computed_tokens, new_computed_blocks, num_lookahead_tokens,
                    reserved_blocks)
        rid = request.request_id
        seq = self.seqs.get(rid)
        if seq is None:  # admission: nano looks up and allocates the whole sequence at once
            seq = self._new_seq(request)
            if not self.m.can_allocate(seq):
                return None
            self.m.allocate(seq)
            self.seqs[rid] = seq
            hit = len(new_computed_blocks[0]) if new_computed_blocks else 0
            return (tuple(b + 1 for b in seq.block_table[hit:]),)
        for token in request.all_token_ids[len(seq):]:
            seq.append_token(token)
        slots = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        if slots != len(seq):  # not a decode step (nano prefills a prompt in one step)
            return ((),) if slots <= len(seq.block_table) * self.bs else None
        if not self.m.can_append(seq):
            return None
        before = len(seq.block_table)
        self.m.may_append(seq)
        return (tuple(b + 1 for b in seq.block_table[before:]),)

    def free(self, request: Request) -> None:
        seq = self.seqs.pop(request.request_id, None)
        if seq is not None:
            self.m.deallocate(seq)

    # -- reads -------------------------------------------------------------------------

    def get_block_ids(self, request_id: str) -> BlockIds:
        seq = self.seqs.get(request_id)
        return (tuple(b + 1 for b in seq.block_table) if seq else (),)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.m.free_block_ids) / len(self.m.blocks) if self.m.blocks else 0.0

    def to_view(self) -> KVView:
        m = self.m
        return KVView(
            free_queue=tuple(b + 1 for b in m.free_block_ids),
            ref_cnt=tuple((b.block_id + 1, b.ref_count) for b in m.blocks if b.block_id in m.used_block_ids),
            cached=tuple(sorted((h.to_bytes(8, "big") + GROUP, (b + 1,)) for h, b in m.hash_to_block_id.items())),
            tables=tuple((rid, (tuple(b + 1 for b in s.block_table),)) for rid, s in sorted(self.seqs.items())
                         if s.block_table),
            usage=self.usage,
        )

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        if total_computed_tokens < 0:
            raise InvalidTokenCountError("total_computed_tokens is negative")

    def take_events(self) -> list[KVCacheEvent]:
        return []

    def new_step_starts(self) -> None:
        pass

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        return None

    # -- what nano lacks ---------------------------------------------------------------

    def pop_blocks_for_free(self, request: Request) -> tuple[int, ...]:
        raise Unsupported("nano-vllm frees at once", "op:pop_blocks_for_free")

    def free_blocks(self, block_ids: Sequence[int]) -> None:
        raise Unsupported("nano-vllm frees at once", "op:free_blocks")

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        raise Unsupported("nano-vllm caches inside allocate and may_append", "op:cache_blocks")

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        raise Unsupported("nano-vllm has no eviction call", "op:evict_blocks")

    def reset_prefix_cache(self) -> bool:
        raise Unsupported("nano-vllm has no prefix-cache reset", "op:reset_prefix_cache")

    def take_new_block_ids(self) -> list[int]:
        raise Unsupported("nano-vllm zeroes nothing", "op:take_new_block_ids")

    def get_num_common_prefix_blocks(self, request_id: str) -> tuple[int, ...]:
        raise Unsupported("nano-vllm has no cascade attention", "op:get_num_common_prefix_blocks")

    # -- caller errors (kvspec's classes, before anything changes) -------------------------

    def _request(self, request: Request) -> None:
        if request.extra.lora or request.extra.mm_features or request.extra.cache_salt or request.extra.prompt_embeds:
            raise Unsupported("nano-vllm hashes token ids only", "mm")

    def _check(self, request: Request, n: int, h: int, hits: BlockIds | None, k: int, reserved: int) -> None:
        rid = request.request_id
        if min(n, h, k, reserved, request.num_computed_tokens) < 0:
            raise InvalidTokenCountError("a count is negative")
        if n == 0:
            raise InvalidTokenCountError("num_new_tokens must be greater than 0")
        if hits is not None and len(hits) != 1:
            raise GroupCountError(f"new_computed_blocks has {len(hits)} groups, nano-vllm has 1")
        if request.num_computed_tokens + h + n > self.config.max_model_len:
            raise ExceedsMaxModelLenError(f"request {rid!r} would exceed max_model_len")
        ids = list(hits[0]) if hits else []
        if ids and rid in self.seqs:
            raise UnexpectedPrefixHitError(f"request {rid!r} already holds blocks")
        for b in ids:
            if not 0 < b < self.config.num_blocks:
                raise InvalidBlockIdError(f"block id {b} is outside the pool")
        if ids and len(ids) != -(-h // self.bs):
            raise StaleHitError(f"{len(ids)} hit blocks for {h} hit tokens: no lookup returns that")
        if rid not in self.seqs and request.num_computed_tokens:
            raise UnknownRequestError(f"request {rid!r} has computed tokens but holds no blocks")
