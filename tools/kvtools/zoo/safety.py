"""Zoo entries the safety oracles must kill on their own: KV served for another prefix, loads raced.

Each entry is planted into kvimpl like the others (one method replaced on one
instance, or a request re-hashed on the caller side) and is hunted at the
safety level (``level="safety"``): the mutant runs *alone* under
:mod:`kvref.safety`, with no reference to compare with, so only the content
and in-flight oracles can kill it (and the mutant's own invariants, which
these faults keep). Upstream numbers name the defect each one re-plants, or
the class it belongs to.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from kvimpl.block_pool import NULL_BLOCK
from kvimpl.single_type_kv_cache_manager import MambaManager
from kvref.adapters.impl import ImplAdapter
from kvspec.config import ChunkedLocal, CrossAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.hashing import get_hash_fn_by_name, none_hash
from kvspec.request import Request
from kvtools.zoo.base import bound_args, entry, mutant, patch
from kvtools.zoo.hashing import _RehashingAdapter

SAFETY = "safety"


def _frees_one_block_early(config: KVCacheConfig, name: str, kind: type) -> ImplAdapter:
    m = mutant(config, name)
    for mgr, k in zip(m.coordinator.managers, config.manager_groups(), strict=True):
        if isinstance(k, kind):
            orig = mgr.remove_skipped_blocks

            def remove_skipped_blocks(rid: str, total: int, orig: Any = orig, bs: int = k.block_size) -> None:
                orig(rid, total + bs)

            patch(mgr, "remove_skipped_blocks", remove_skipped_blocks)
    return m


@entry(
    "vllm#47728 (class)",
    "a sliding-window group frees the block its window still reads (counted one block ahead of the computed "
    "tokens, as an optimistic count does)",
    "safety (content): the next step reads the null block inside its window",
    level=SAFETY,
)
def swa_frees_in_window(config: KVCacheConfig) -> ImplAdapter:
    """Sliding-window skipping counted one block ahead."""
    return _frees_one_block_early(config, "swa_frees_in_window", SlidingWindow)


@entry(
    "vllm#47728 (class)",
    "a chunked-local group frees blocks of the chunk its next token still reads",
    "safety (content): the next step reads the null block inside its chunk",
    level=SAFETY,
)
def chunked_frees_current_chunk(config: KVCacheConfig) -> ImplAdapter:
    """Chunked-local skipping counted one block ahead."""
    return _frees_one_block_early(config, "chunked_frees_current_chunk", ChunkedLocal)


@entry(
    "nano-vllm block_manager (class)",
    "the cache caches every full block its table covers, the tokens the step has not computed yet too, so a "
    "chunked prefill publishes blocks before their KV is written",
    "safety (content): another request's hit reads a slot never written",
    level=SAFETY,
)
def cache_beyond_computed(config: KVCacheConfig) -> ImplAdapter:
    """allocate_slots caches as far as the table reaches."""
    m = mutant(config, "cache_beyond_computed")
    orig = m.allocate_slots

    def allocate_slots(*args: Any, **kwargs: Any) -> Any:
        out = orig(*args, **kwargs)
        a = bound_args(orig, args, kwargs)
        request: Request = a["request"]
        if out is not None and m.enable_caching and not a["delay_cache_blocks"] and len(config.groups) == 1:
            reach = len(m.get_block_ids(request.request_id)[0]) * config.manager_groups()[0].block_size
            m.cache_blocks(request, min(request.num_tokens, reach))
        return out

    patch(m, "allocate_slots", allocate_slots)
    return m


@entry(
    "vllm#32255 (class)",
    "delay_cache_blocks is ignored: the destinations of an asynchronous connector load are cached at admission, "
    "before the load has filled them",
    "safety (inflight): another request's lookup hits a block the load still fills",
    level=SAFETY,
)
def cache_before_load(config: KVCacheConfig) -> ImplAdapter:
    """Loaded blocks cached before their load ends."""
    m = mutant(config, "cache_before_load")
    orig = m.allocate_slots

    def allocate_slots(*args: Any, **kwargs: Any) -> Any:
        a = bound_args(orig, args, kwargs)
        a["delay_cache_blocks"] = False
        return orig(**a)

    patch(m, "allocate_slots", allocate_slots)
    return m


@entry(
    "vllm#47373 (class)",
    "the zeroing list also names the prefix-hit blocks an admission adopted, so the worker zeroes cached KV "
    "another request still reads",
    "safety (content): a later step or hit reads zeroed slots (configurations with a Mamba group zero)",
    level=SAFETY,
)
def hit_blocks_listed_for_zeroing(config: KVCacheConfig) -> ImplAdapter:
    """Adopted hit blocks join the zeroing list."""
    m = mutant(config, "hit_blocks_listed_for_zeroing")
    orig_alloc, orig_take = m.allocate_slots, m.take_new_block_ids
    adopted: list[int] = []

    def allocate_slots(*args: Any, **kwargs: Any) -> Any:
        out = orig_alloc(*args, **kwargs)
        hits = bound_args(orig_alloc, args, kwargs)["new_computed_blocks"]
        if out is not None and hits:
            adopted.extend(b for group in hits for b in group if b)
        return out

    def take_new_block_ids() -> Any:
        out = list(orig_take()) + adopted
        adopted.clear()
        return out

    patch(m, "allocate_slots", allocate_slots)
    patch(m, "take_new_block_ids", take_new_block_ids)
    return m


@entry(
    "nano-vllm block_manager (class)",
    "a block's hash leaves out its parent's (each block is keyed by its own tokens and extra keys), so equal "
    "blocks after different prefixes share a cache entry",
    "safety (content): a hit serves a block computed after another prefix",
    level=SAFETY,
)
def unchained_block_hash(config: KVCacheConfig) -> ImplAdapter:
    """Every block hashed as if it were the first."""
    base = get_hash_fn_by_name(config.hash_function)
    root = none_hash(base, config.hash_seed)

    def fn(obj: Any) -> bytes:
        if isinstance(obj, tuple) and len(obj) == 3:
            obj = (root, obj[1], obj[2])
        return base(obj)

    return _RehashingAdapter(config, "unchained_block_hash", fn, root)


@entry(
    "vllm#34616",
    "after a connector load the computed tokens are counted in whole blocks: the blocks up to the next block "
    "boundary past the loaded tokens are cached too, before their last positions are computed",
    "safety (content): another request's hit reads slots never written",
    level=SAFETY,
)
def load_caches_whole_blocks(config: KVCacheConfig) -> ImplAdapter:
    """``cache_blocks`` rounds the computed tokens up to a block."""
    m = mutant(config, "load_caches_whole_blocks")
    orig = m.cache_blocks
    bs = config.manager_groups()[0].block_size

    def cache_blocks(request: Request, num_computed_tokens: int) -> None:
        reach = len(m.get_block_ids(request.request_id)[0]) * bs
        orig(request, min(-(-num_computed_tokens // bs) * bs, request.num_tokens, reach))

    patch(m, "cache_blocks", cache_blocks)
    return m


@entry(
    "vllm#47728 (class)",
    "a sliding-window hit comes back with its last block replaced by the null block, which the first step then "
    "reads inside its window",
    "safety (content): the step reads the null block inside its window",
    level=SAFETY,
)
def swa_hit_nulls_window_block(config: KVCacheConfig) -> ImplAdapter:
    """The last block of every sliding-window hit list nulled."""
    m = mutant(config, "swa_hit_nulls_window_block")
    orig = m.get_computed_blocks

    def get_computed_blocks(request: Request) -> Any:
        blocks, n = orig(request)
        kinds = config.manager_groups()
        out = tuple(
            (*g[:-1], 0) if isinstance(k, SlidingWindow) and g and g[-1] else g
            for k, g in zip(kinds, blocks, strict=True)
        )
        return out, n

    patch(m, "get_computed_blocks", get_computed_blocks)
    return m


@entry(
    "vllm#47373 (class)",
    "after a connector load failed part-way, the blocks listed for zeroing again start one block before the "
    "first token the load did not deliver, so the worker zeroes the last valid block, which is cached",
    "safety (content): the request's next step, or a hit of another request, reads zeroed slots (configurations "
    "with a Mamba group zero; vLLM 0.26.0 on)",
    level=SAFETY,
    semantics="vllm-0.34.0",
)
def failed_load_zeroes_valid_block(config: KVCacheConfig) -> ImplAdapter:
    """record_blocks_for_zeroing starts one block early."""
    m = mutant(config, "failed_load_zeroes_valid_block")
    orig = m.record_blocks_for_zeroing
    bs = math.lcm(*(k.block_size for k in config.manager_groups() if not isinstance(k, Mamba)))

    def record_blocks_for_zeroing(request_id: str, start_token: int) -> None:
        orig(request_id, max(0, start_token - bs) if start_token % bs == 0 else start_token)

    patch(m, "record_blocks_for_zeroing", record_blocks_for_zeroing)
    return m


@entry(
    "vllm#23664 (class: cross-attention KV is written by the first step and read by every later one)",
    "a cross-attention group frees its encoder blocks once the request's first step has run, as if the encoder "
    "output were read by that step alone",
    "safety (content): a step of the request writes or reads the null block at an encoder position",
    level=SAFETY,
)
def cross_frees_encoder_blocks(config: KVCacheConfig) -> ImplAdapter:
    """Every allocation first frees the request's encoder blocks once tokens are computed."""
    m = mutant(config, "cross_frees_encoder_blocks")
    orig = m.allocate_slots
    cross = [mgr for mgr, k in zip(m.coordinator.managers, config.manager_groups(), strict=True)
             if isinstance(k, CrossAttention)]  # fmt: skip

    def allocate_slots(*args: Any, **kwargs: Any) -> Any:
        a = bound_args(orig, args, kwargs)
        request: Request = a["request"]
        if request.num_computed_tokens + a["num_new_computed_tokens"] + a["num_external_computed_tokens"] > 0:
            for mgr in cross:  # as a skipping group frees below its window, before the allocation
                mgr._remove_blocks_in_range(request.request_id, 0, len(mgr.req_to_blocks.get(request.request_id, ())))
        return orig(**a)

    patch(m, "allocate_slots", allocate_slots)
    return m


@entry(
    "TensorRT-LLM#19514 (class: the cross-attention cache sized short of the encoder's positions)",
    "cross-attention blocks are counted in whole blocks of encoder tokens, rounded down, so the encoder's last "
    "positions get no block",
    "safety (content): the first step writes an encoder position past the request's cross-attention table",
    level=SAFETY,
)
def cross_blocks_rounded_down(config: KVCacheConfig) -> ImplAdapter:
    """allocate_slots rounds the encoder tokens down to whole cross-attention blocks."""
    m = mutant(config, "cross_blocks_rounded_down")
    orig = m.allocate_slots
    sizes = [k.block_size for k in config.manager_groups() if isinstance(k, CrossAttention)]

    def allocate_slots(*args: Any, **kwargs: Any) -> Any:
        a = bound_args(orig, args, kwargs)
        if sizes:
            a["num_encoder_tokens"] = a["num_encoder_tokens"] // sizes[0] * sizes[0]
        return orig(**a)

    patch(m, "allocate_slots", allocate_slots)
    return m


@entry(
    "vLLM 0.29.0 prefill checkpoints (class: a checkpoint kept where the worker writes none)",
    "a Mamba align chunk that starts on a block boundary and ends on one also keeps the slot below its running "
    "state as a prefill checkpoint (the rule's test of an end inside a block dropped); the worker writes no "
    "checkpoint there, yet the ordinary caching keys the block as the state at that boundary",
    "safety (content): a later hit serves that block for a state it never held (vLLM 0.29.0 configurations "
    "with prefill checkpoints)",
    level=SAFETY,
    semantics="vllm-0.29.0",
)
def checkpoint_on_block_end(config: KVCacheConfig) -> ImplAdapter:
    """get_num_blocks_to_allocate keeps a checkpoint slot for a chunk that ends on a block boundary."""
    m = mutant(config, "checkpoint_on_block_end")
    for mgr in m.coordinator.managers:
        if isinstance(mgr, MambaManager) and mgr.checkpoints:
            orig = mgr.get_num_blocks_to_allocate

            def estimate(*args: Any, mgr: MambaManager = mgr, orig: Any = orig, **kwargs: Any) -> Any:
                a = bound_args(orig, args, kwargs)
                rid, bs = a["request_id"], mgr.block_size
                end, start = a["num_tokens_main_model"], a["total_computed_tokens"]
                table = mgr.req_to_blocks.get(rid, [])
                out = orig(**a)
                col = end // bs - 2
                if out > 0 and end % bs == 0 and start % bs == 0 and col >= start // bs and (
                    col >= len(table) or table[col] == NULL_BLOCK
                ):
                    if not a["apply_admission_cap"]:
                        mgr.num_checkpoint_blocks[rid] = 1
                    return out + 1
                return out

            patch(mgr, "get_num_blocks_to_allocate", estimate)
    return m


def _positional_managers(m: ImplAdapter) -> list[MambaManager]:
    """The mutant's Mamba managers with positional prefill checkpoints (vLLM 0.30.0 on)."""
    return [mgr for mgr in m.coordinator.managers if isinstance(mgr, MambaManager) and mgr.positional]


@entry(
    "vLLM 0.30.0 prefill checkpoints (class: the manager and the worker judge a checkpoint by different rules)",
    "a Mamba align group's manager keeps and keys prefill checkpoints as if the kernel could export a state "
    "at any offset (the group's prefill_checkpoint_alignment read as 1); the worker writes a checkpoint only "
    "a multiple of the alignment past the chunk's start, so some kept blocks never get their state",
    "safety (content): a hit serves a checkpoint block that holds no state, or another one (vLLM 0.34.0 "
    "configurations with an alignment other than 1)",
    level=SAFETY,
    semantics="vllm-0.34.0",
)
def checkpoint_ignores_alignment(config: KVCacheConfig) -> ImplAdapter:
    """The manager's checkpoint rule reads the alignment as 1."""
    m = mutant(config, "checkpoint_ignores_alignment")
    for mgr in _positional_managers(m):
        patch(mgr, "mamba", replace(mgr.mamba, prefill_checkpoint_alignment=1))
    return m


@entry(
    "vLLM 0.30.0 prefill checkpoints (class: EAGLE's one-unit step back applied without EAGLE)",
    "a Mamba align group's manager places prefill checkpoints one hash unit lower, as under EAGLE, in a "
    "model without it; the worker writes the state at the unshifted position into the same block, which the "
    "manager keys one unit too low",
    "safety (content): a hit at the lower position serves a later state (vLLM 0.34.0 configurations with "
    "prefill checkpoints)",
    level=SAFETY,
    semantics="vllm-0.34.0",
)
def checkpoint_eagle_shift_without_eagle(config: KVCacheConfig) -> ImplAdapter:
    """The manager's checkpoint positions step back one unit although the model has no EAGLE."""
    m = mutant(config, "checkpoint_eagle_shift_without_eagle")
    for mgr in _positional_managers(m):
        if not config.use_eagle:
            patch(mgr, "drop_eagle_checkpoint", True)
    return m
