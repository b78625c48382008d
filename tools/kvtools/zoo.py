"""The upstream bug zoo: faults that really happened in vLLM's KV-cache code,
re-planted one at a time into kvimpl.

Every entry of :data:`ZOO` is a module-level adapter factory of the same name,
so each one is a valid target::

    kvref check --target kvtools.zoo:touch_before_capacity_check --against spec

A mutant is kvimpl's ``KVCacheManager`` with *one* method replaced on the
instance (impl/ is never edited). Faults that lived in request hashing are
planted on the caller side: the mutant re-hashes the requests it receives
before delegating. ``python -m kvtools.zoo`` (or ``ci/mutation.sh``) runs the
kit against every entry and writes ``docs/reports/bug-zoo.md`` and ``docs/reports/zoo.json``.

Upstream numbers are vLLM pull requests / issues / advisories; where the
number could not be matched to the described fault it says "unconfirmed".
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvimpl.block_pool import NULL_BLOCK, BlockId, BlockPool, _stored_event
from kvimpl.kv_cache_coordinator import HybridCoordinator, UnitaryCoordinator, hybrid_hit_search
from kvimpl.single_type_kv_cache_manager import (
    MambaManager,
    SingleTypeKVCacheManager,
    cdiv,
    find_longest_cache_hit,
)
from kvref.adapters import load_factory
from kvref.adapters.impl import ImplAdapter
from kvref.check import run_lockstep
from kvref.hypothesis_compat import set_shrink_time_limit, shrink_time_limit
from kvref.lockstep import RunStats
from kvref.settings import load_profile
from kvref.stateful import MachineSetup
from kvspec.config import FULL_TYPE_KINDS, KVCacheConfig, Mamba, SlidingWindow
from kvspec.events import MEDIUM_GPU, BlockRemoved
from kvspec.hashing import (
    BlockHash,
    ExtraKeySource,
    HashFunction,
    MultiModalFeature,
    block_extra_keys,
    external_block_hash,
    get_hash_fn_by_name,
    hash_block_tokens,
    make_key,
    none_hash,
    split_key,
)
from kvspec.profiles import VLLM_0_25_1
from kvspec.request import Request

Factory = Callable[[KVCacheConfig], ImplAdapter]


@dataclass(frozen=True)
class ZooEntry:
    """One re-planted upstream fault."""

    name: str
    upstream: str
    description: str
    factory: Factory
    catch: str
    """Which comparison is expected to see it (or why it survives)."""
    unreachable: bool = False
    """True when the fault cannot be reached through the public API (argued in ``catch``)."""


ZOO: dict[str, ZooEntry] = {}


def _entry(upstream: str, description: str, catch: str, unreachable: bool = False) -> Callable[[Factory], Factory]:
    def register(factory: Factory) -> Factory:
        ZOO[factory.__name__] = ZooEntry(factory.__name__, upstream, description, factory, catch, unreachable)
        return factory

    return register


def _mutant(config: KVCacheConfig, name: str) -> ImplAdapter:
    adapter = ImplAdapter(config)
    adapter.name = name
    return adapter


def _patch(obj: object, attr: str, fn: object) -> None:
    """Replace one method on one instance (the single planted fault)."""
    setattr(obj, attr, fn)


def _bound_args(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


# --- pool and allocation faults -------------------------------------------------------------------


@_entry(
    "vllm#11565",
    "allocate_slots touches the prefix-hit blocks before checking capacity, so a request that does not fit "
    "returns None but keeps its hits referenced (leaked, out of the free queue)",
    "view diff (ref counts / free queue) after a failed allocate_slots with hits",
)
def touch_before_capacity_check(config: KVCacheConfig) -> ImplAdapter:
    """Hits are touched before the capacity check and never released on failure."""
    m = _mutant(config, "touch_before_capacity_check")
    orig = m.allocate_slots

    def allocate_slots(*args: Any, **kwargs: Any) -> Any:
        out = orig(*args, **kwargs)
        hits = _bound_args(orig, args, kwargs)["new_computed_blocks"]
        if out is None and hits and m.enable_caching:
            # Touching first then failing == failing then touching: the check
            # sees the same free-minus-needed balance either way.
            m.block_pool.touch([BlockId(b) for group in hits for b in group])
        return out

    _patch(m, "allocate_slots", allocate_slots)
    return m


@_entry(
    "vllm#24228 (unconfirmed)",
    "the free-block count is decremented before the 'enough free blocks' assert, so an allocation that "
    "runs out half-way leaves blocks that are neither free nor owned",
    "equivalent/unreachable through the public API: kvimpl calls get_new_blocks only inside allocate_slots, after "
    "the capacity check has counted exactly the blocks it then takes (all or nothing, reference 5.3 step 11), so "
    "the mutant's branch (more blocks asked than free) never runs; were it reachable, unmutated kvimpl would raise "
    "PoolExhaustedError there, which no impl-vs-spec run has shown. The same fault is reachable in vLLM 0.25.1, "
    "whose Mamba align + connector-token estimate misses a block (docs/divergences.md, "
    "mamba-align-external-estimate), but not in an implementation with exact estimates",
    unreachable=True,
)
def free_count_before_assert(config: KVCacheConfig) -> ImplAdapter:
    """get_new_blocks takes what is there before failing its check."""
    m = _mutant(config, "free_count_before_assert")
    pool = m.block_pool
    orig = pool.get_new_blocks

    def get_new_blocks(num_blocks: int) -> list[BlockId]:
        if num_blocks > len(pool.free_queue):
            pool.free_queue.popleft_n(len(pool.free_queue))
        return orig(num_blocks)

    _patch(pool, "get_new_blocks", get_new_blocks)
    return m


@_entry(
    "vllm#42615 (unconfirmed)",
    "Mamba align-mode remove_skipped_blocks frees the previous state block after the base class already "
    "freed it in the same call (one block freed twice)",
    "crash (DoubleFreeError) or ref-count/free-queue view diff on a Mamba align shape",
)
def double_free_in_call(config: KVCacheConfig) -> ImplAdapter:
    """The align-mode state block is freed without re-checking the table."""
    m = _mutant(config, "double_free_in_call")
    for mgr in m.coordinator.managers:
        if isinstance(mgr, MambaManager) and mgr.mamba.mode == "align":
            _patch(mgr, "remove_skipped_blocks", _double_free_remove(mgr))
    return m


def _double_free_remove(mgr: MambaManager) -> Callable[[str, int], None]:
    def remove_skipped_blocks(request_id: str, total_computed_tokens: int) -> None:
        total = max(0, total_computed_tokens - mgr.mamba.num_speculative_blocks)
        idx = mgr.last_state_block_idx.get(request_id)
        table = mgr.req_to_blocks.get(request_id, [])
        stale = None
        if idx is not None and idx < cdiv(total, mgr.block_size) - 1 and table[idx] != NULL_BLOCK:
            stale = table[idx]  # read before the base call, not re-checked after it (the bug)
        SingleTypeKVCacheManager.remove_skipped_blocks(mgr, request_id, total)
        if stale is not None and idx is not None:
            mgr.pool.free_blocks([stale])
            table[idx] = NULL_BLOCK

    return remove_skipped_blocks


@_entry(
    "vllm#14073",
    "a new request's num_cached_blocks starts at 0 instead of its prefix-hit count, so cache_full_blocks "
    "re-walks the hit blocks (skipping those already hashed) and emits events from the wrong parent",
    "view diff (num_cached) / kvimpl invariant 'hashed block past num_cached_block' / event comparison",
)
def wrong_num_cached_blocks(config: KVCacheConfig) -> ImplAdapter:
    """num_cached_block is reset to 0 after the hits are added; hashing skips hashed blocks."""
    m = _mutant(config, "wrong_num_cached_blocks")
    for mgr in m.coordinator.managers:
        _patch(mgr, "add_local_computed_blocks", _zero_cached(mgr))
    _patch(m.block_pool, "cache_full_blocks", _cache_skipping_hashed(m.block_pool))
    return m


def _zero_cached(mgr: SingleTypeKVCacheManager) -> Callable[[str, Sequence[BlockId], int, int], None]:
    orig = mgr.add_local_computed_blocks

    def add_local_computed_blocks(
        request_id: str, new_computed_blocks: Sequence[BlockId], num_local: int, num_external: int
    ) -> None:
        orig(request_id, new_computed_blocks, num_local, num_external)
        if request_id in mgr.num_cached_block:
            mgr.num_cached_block[request_id] = 0

    return add_local_computed_blocks


def _cache_skipping_hashed(pool: BlockPool) -> Callable[..., None]:
    def cache_full_blocks(
        request: Request,
        blocks: Sequence[BlockId],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int,
        block_mask: Sequence[bool] | None = None,
    ) -> None:
        if num_cached_blocks >= num_full_blocks:
            return
        k = block_size // pool.hash_block_size
        stored: list[int] = []
        for i in range(num_cached_blocks, num_full_blocks):
            b = blocks[i]
            if b == NULL_BLOCK or (block_mask is not None and not block_mask[i - num_cached_blocks]):
                continue
            if pool.block_hash[b] is not None:  # the "additional check" #14073 removed
                continue
            key = make_key(request.block_hashes[(i + 1) * k - 1], group_id)
            pool.block_hash[b] = key
            pool.cached.setdefault(key, []).append(b)
            stored.append(i)
        if pool.enable_kv_cache_events:
            pool.events.append(
                _stored_event(pool, request, k, stored, num_cached_blocks, num_full_blocks, block_size, group_id)
            )

    return cache_full_blocks


@_entry(
    "vllm#23485",
    "get_num_common_prefix_blocks counts a block as common when its ref_cnt equals the number of requests with "
    "tables, so popped blocks awaiting a deferred free (ref_cnt too high) end the prefix early",
    "get_num_common_prefix_blocks output once a block popped by pop_blocks_for_free and shared with a running "
    "request awaits its deferred free",
)
def common_prefix_by_ref_cnt(config: KVCacheConfig) -> ImplAdapter:
    """Common prefix compared through ref_cnt instead of table membership."""
    m = _mutant(config, "common_prefix_by_ref_cnt")
    for mgr in m.coordinator.managers:
        _patch(mgr, "get_num_common_prefix_blocks", _prefix_by_ref(mgr))
    return m


def _prefix_by_ref(mgr: SingleTypeKVCacheManager) -> Callable[[str], int]:
    def get_num_common_prefix_blocks(request_id: str) -> int:
        if not mgr.track_holders:
            return 0
        tables = mgr.req_to_blocks
        n = 0
        for b in tables.get(request_id, []):
            if b == NULL_BLOCK:
                if not all(NULL_BLOCK in t for t in tables.values()):
                    break
            elif mgr.pool.ref_cnt[b] != len(tables):
                break
            n += 1
        return n

    return get_num_common_prefix_blocks


@_entry(
    "vllm#30772",
    "cross-attention blocks are sized by the step's token budget (max_num_batched_tokens) instead of the "
    "request's own encoder length",
    "allocate_slots output on the cross shape (encoder length differs from the step budget)",
)
def cross_attn_batch_budget(config: KVCacheConfig) -> ImplAdapter:
    """Encoder tokens replaced by the batch budget."""
    m = _mutant(config, "cross_attn_batch_budget")
    orig = m.allocate_slots

    def allocate_slots(*args: Any, **kwargs: Any) -> Any:
        a = _bound_args(orig, args, kwargs)
        if a["num_encoder_tokens"] > 0:
            a["num_encoder_tokens"] = config.batched_tokens()
        return orig(**a)

    _patch(m, "allocate_slots", allocate_slots)
    return m


@_entry(
    "vllm#42656",
    "freed blocks all go to the tail of the free queue, unhashed partial blocks included, so they are "
    "LRU-ordered with real cache entries and evict them early (the behaviour before #42656)",
    "view diff (free-queue order) after a free with unhashed blocks",
)
def unhashed_freed_to_tail(config: KVCacheConfig) -> ImplAdapter:
    """Every freed block is appended, none prepended."""
    m = _mutant(config, "unhashed_freed_to_tail")
    pool = m.block_pool
    orig = pool.free_blocks

    def free_blocks(ordered_blocks: Any) -> None:
        blocks = [BlockId(b) for b in ordered_blocks]
        was_hashed = {b: pool.block_hash[b] for b in blocks}
        orig(blocks)  # validation, ref counts and the correct queue
        freed = [b for b in blocks if b != NULL_BLOCK and pool.ref_cnt[b] == 0 and was_hashed[b] is None]
        for b in dict.fromkeys(freed):
            pool.free_queue.remove(b)
            pool.free_queue.append(b)

    _patch(pool, "free_blocks", free_blocks)
    return m


# --- prefix-cache lookups ------------------------------------------------------------------------


@_entry(
    "vllm#33270 (closed PR; the bug it describes)",
    "the hybrid fixed-point hit search drops the EAGLE look-ahead block on every pass, not once per candidate "
    "length, so hits shrink by a block per iteration",
    "get_computed_blocks output; needs a hybrid hit search that comes back to an EAGLE sliding-window group after "
    "another non-full group shortened the hit (only full+swa+swa-wide has two): the machine draws shapes with two "
    "non-full kinds six times as often since this entry (seed 0 kills it at step 21k, seed 2 at 66k, seed 1 not "
    "within 60 s); the directed trace eagle-repass kills it in one replay",
)
def eagle_drop_every_pass(config: KVCacheConfig) -> ImplAdapter:
    """EAGLE groups drop their extra block on every fixed-point iteration."""
    m = _mutant(config, "eagle_drop_every_pass")
    coord = m.coordinator
    if isinstance(coord, HybridCoordinator):
        _patch(coord, "find_longest_cache_hit", _eagle_every_pass(coord))
    return m


def _eagle_every_pass(coord: HybridCoordinator) -> Callable[..., Any]:
    def find(block_hashes: Sequence[BlockHash], max_len: int) -> tuple[Any, int]:
        hits: list[list[BlockId]] = [[] for _ in coord.managers]
        looked_up: set[int] = set()
        simple = len(coord.spec_groups) == 2 and isinstance(coord.spec_groups[0].kind, FULL_TYPE_KINDS)
        hit = max_len
        while True:
            cur = hit
            for idx, sg in enumerate(coord.spec_groups):
                bs = sg.kind.block_size
                if isinstance(sg.kind, FULL_TYPE_KINDS) and idx in looked_up:
                    cur = cur // bs * bs
                    continue
                drop = sg.use_eagle and not isinstance(sg.kind, Mamba)  # no "verified" memo (the bug)
                limit = min(cur + bs, max_len) if drop else cur
                found = find_longest_cache_hit(
                    sg.kind, coord._hashes_for(sg.kind, block_hashes), limit, sg.group_ids,
                    coord.pool, drop, coord.scheduler_block_size,
                )  # fmt: skip
                cur = len(found[0]) * bs
                looked_up.add(idx)
                for gid, blocks in zip(sg.group_ids, found, strict=True):
                    hits[gid] = blocks
            if cur >= hit or simple:
                hit = min(hit, cur)
                break
            hit = cur
        for sg in coord.spec_groups:
            if isinstance(sg.kind, FULL_TYPE_KINDS):
                for gid in sg.group_ids:
                    del hits[gid][hit // sg.kind.block_size :]
        return tuple(hits), hit

    return find


@_entry(
    "vllm#26296 (unconfirmed; analogue, DCP out of scope)",
    "hashes looked up at the unscaled block size: groups whose block size is a multiple of the hash block "
    "size are searched with the fine hashes instead of their coarse ones",
    "get_computed_blocks output on a shape with a 2x block-size group",
)
def unscaled_hash_block_size(config: KVCacheConfig) -> ImplAdapter:
    """Coarse-hash conversion skipped for lookups."""
    m = _mutant(config, "unscaled_hash_block_size")
    _patch(m.coordinator, "_hashes_for", lambda kind, block_hashes: block_hashes)
    return m


@_entry(
    "vllm#44409 (supersedes #33775)",
    "a hybrid request's prefix hits are touched group by group, interleaved with each group's allocation for "
    "connector tokens, so one group's fresh blocks can evict another group's still-free hit",
    "view diff when one group's connector-token allocation pops another group's still-free hit block. It needs a "
    "pool with no never-used block left, the hit request's blocks at the head of the free queue (freed before "
    "other requests), and a request that extends it with connector tokens: the machine's drain rule (every running "
    "request finishes in one step, oldest first) sets this up; a hand-built 9-step trace in tests/stateful/"
    "test_zoo.py kills it too",
)
def hits_touched_per_group(config: KVCacheConfig) -> ImplAdapter:
    """Touch and external allocation interleaved per group."""
    m = _mutant(config, "hits_touched_per_group")
    coord = m.coordinator

    def allocate_new_computed_blocks(
        request_id: str, new_computed_blocks: Sequence[Sequence[BlockId]], num_local: int, num_external: int
    ) -> None:
        if any(request_id in mgr.num_cached_block for mgr in coord.managers):
            return
        for mgr, hits in zip(coord.managers, new_computed_blocks, strict=True):
            mgr.add_local_computed_blocks(request_id, hits, num_local, num_external)
            if num_external > 0:
                mgr.allocate_external_computed_blocks(request_id, num_local, num_external)

    _patch(coord, "allocate_new_computed_blocks", allocate_new_computed_blocks)
    return m


# --- Mamba --------------------------------------------------------------------------------------


@_entry(
    "vllm#55601 (unconfirmed)",
    "the Mamba align-mode 'state block of two steps ago' index is computed in hash-block units instead of the "
    "Mamba group's own block size",
    "view diff (free queue) on full@2x+mamba-align@2x+swa with EAGLE (one speculative block): after a one-token step"
    " the looser bound frees the block that still holds the running state",
)
def mamba_state_wrong_unit(config: KVCacheConfig) -> ImplAdapter:
    """cdiv(total, hash_block_size) where cdiv(total, mamba block size) is meant."""
    m = _mutant(config, "mamba_state_wrong_unit")
    unit = m.coordinator.hash_block_size
    for mgr in m.coordinator.managers:
        if isinstance(mgr, MambaManager) and mgr.mamba.mode == "align":
            _patch(mgr, "remove_skipped_blocks", _wrong_unit_remove(mgr, unit))
    return m


def _wrong_unit_remove(mgr: MambaManager, unit: int) -> Callable[[str, int], None]:
    def remove_skipped_blocks(request_id: str, total_computed_tokens: int) -> None:
        total = max(0, total_computed_tokens - mgr.mamba.num_speculative_blocks)
        SingleTypeKVCacheManager.remove_skipped_blocks(mgr, request_id, total)
        idx = mgr.last_state_block_idx.get(request_id)
        if idx is not None and idx < cdiv(total, unit) - 1:
            table = mgr.req_to_blocks[request_id]
            if idx < len(table) and table[idx] != NULL_BLOCK:
                mgr.pool.free_blocks([table[idx]])
                table[idx] = NULL_BLOCK

    return remove_skipped_blocks


# --- events --------------------------------------------------------------------------------------


@_entry(
    "vllm#55092 (unconfirmed)",
    "evicting one block whose hash has several physical copies cached emits one BlockRemoved per copy, so a "
    "consumer's index forgets copies that are still cached",
    "event-log consistency after two cached copies of one hash (a fully cached prompt recomputes its last block),"
    " an eviction and a take_events",
)
def removed_event_per_copy(config: KVCacheConfig) -> ImplAdapter:
    """BlockRemoved repeated for every cached copy of the evicted hash."""
    m = _mutant(config, "removed_event_per_copy")
    pool = m.block_pool
    orig = pool._evict

    def _evict(b: BlockId) -> None:
        key = pool.block_hash[b]
        copies = len(pool.cached.get(key, [])) if key is not None else 0
        orig(b)
        if key is not None and pool.enable_kv_cache_events and copies > 1:
            digest, gid = split_key(key)
            ext = external_block_hash(digest, pool.int_block_hashes)
            pool.events += [BlockRemoved((ext,), MEDIUM_GPU, gid) for _ in range(copies - 1)]

    _patch(pool, "_evict", _evict)
    return m


# --- request hashing (caller side) ---------------------------------------------------------------


ExtraKeys = Callable[[ExtraKeySource, int, int, int], tuple[tuple[Any, ...] | None, int]]
"""``block_extra_keys``' signature: (source, start, end, mm cursor) -> (keys, cursor)."""


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

    def get_computed_blocks(self, request: Request) -> Any:
        """Delegate with the faulty hashes."""
        return super().get_computed_blocks(self._faulty(request))

    def allocate_slots(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        """Delegate with the faulty hashes."""
        return super().allocate_slots(self._faulty(request), *args, **kwargs)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Delegate with the faulty hashes."""
        super().cache_blocks(self._faulty(request), num_computed_tokens)


@_entry(
    "GHSA-rm76-4mrf-v9r8",
    "NONE_HASH (the parent of every first block) is a predictable constant that ignores the configured "
    "seed (Python 3.12 made hash(None) constant)",
    "view diff (cache keys) once a block is cached under a seed other than the constant's",
)
def constant_none_hash(config: KVCacheConfig) -> ImplAdapter:
    """The first block's parent is fn('0') whatever hash_seed says."""
    fn = get_hash_fn_by_name(config.hash_function)
    return _RehashingAdapter(config, "constant_none_hash", fn, none_hash(fn, "0"))


@_entry(
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


@_entry(
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


@_entry(
    "vllm#51640 (unconfirmed as to the hasher; upstream the connector's external keys dropped the salt)",
    "the request's cache salt does not reach the block hash, so salted and unsalted requests (different "
    "tenants) share cached blocks and the timing side channel the salt closes is open again",
    "view diff (cache keys) once the first block of a salted request is cached",
)
def cache_salt_dropped(config: KVCacheConfig) -> ImplAdapter:
    """Block hashes computed without the cache salt."""
    return _keys_without(config, "cache_salt_dropped", cache_salt=None)


@_entry(
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


# --- prefix-cache lookups (continued) ------------------------------------------------------------


@_entry(
    "vllm#11186",
    "a prompt whose blocks are all cached keeps every hit block and recomputes only its last token, so the "
    "computed count is not block aligned (the last block is then cached wrongly and the hash chain breaks)",
    "get_computed_blocks output for a fully cached, block-aligned prompt",
)
def full_hit_keeps_last_block(config: KVCacheConfig) -> ImplAdapter:
    """A full hit is reported as num_tokens - 1 tokens over all num_tokens / block_size blocks."""
    m = _mutant(config, "full_hit_keeps_last_block")
    orig = m.get_computed_blocks

    def get_computed_blocks(request: Request) -> Any:
        out = orig(request)
        if not m.enable_caching or request.skip_reading_prefix_cache:
            return out
        blocks, n = m.coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens)
        if n == request.num_tokens:
            return m._ids(blocks), n - 1
        return out

    _patch(m, "get_computed_blocks", get_computed_blocks)
    return m


@_entry(
    "vllm#25787 (issue #25780)",
    "a preempted request's lookup on re-admission is counted in the prefix-cache hit rate, so recomputation "
    "after preemption shows up as cache hits",
    "make_prefix_cache_stats output (requests / queries / hits vs the preempted_* counters) after a preemption",
)
def preempted_counted_in_hit_rate(config: KVCacheConfig) -> ImplAdapter:
    """Lookups record statistics as if the request had never been preempted."""
    m = _mutant(config, "preempted_counted_in_hit_rate")
    orig = m.get_computed_blocks

    def get_computed_blocks(request: Request) -> Any:
        return orig(replace(request, num_preemptions=0))

    _patch(m, "get_computed_blocks", get_computed_blocks)
    return m


@_entry(
    "unconfirmed (a vLLM 0.25.1 fault found by kvref: docs/divergences.md 1.4, second-full-group)",
    "the hybrid hit search trims only the first full-attention spec group to the final hit length, so a second "
    "full-attention kind (MLA next to full attention) keeps a longer list than the hit",
    "get_computed_blocks output on full+mla+swa once the sliding-window group shortens the hit",
)
def second_full_group_untrimmed(config: KVCacheConfig) -> ImplAdapter:
    """Only spec group 0 is trimmed after the fixed point."""
    m = _mutant(config, "second_full_group_untrimmed")
    coord = m.coordinator
    if isinstance(coord, HybridCoordinator):

        def find(block_hashes: Sequence[BlockHash], max_len: int) -> tuple[Any, int]:
            hit, hits = hybrid_hit_search(coord, block_hashes, max_len)
            first = coord.spec_groups[0]
            if isinstance(first.kind, FULL_TYPE_KINDS):
                for gid in first.group_ids:
                    del hits[gid][hit // first.kind.block_size :]
            return tuple(hits), hit

        _patch(coord, "find_longest_cache_hit", find)
    return m


@_entry(
    "vllm#17398",
    "with EAGLE, a sliding-window lookup drops the last matched block afterwards, as full attention does, "
    "instead of asking for one more contiguous block, so the hit no longer covers the window",
    "get_computed_blocks output on a sliding-window shape with EAGLE and a hit",
)
def eagle_window_drops_last(config: KVCacheConfig) -> ImplAdapter:
    """Sliding window + EAGLE: plain window lookup, then the last block popped."""
    m = _mutant(config, "eagle_window_drops_last")
    coord = m.coordinator
    kind = coord.managers[0].kind
    if isinstance(coord, UnitaryCoordinator) and isinstance(kind, SlidingWindow) and 0 in coord.eagle_group_ids:

        def find(block_hashes: Sequence[BlockHash], max_len: int) -> tuple[Any, int]:
            found = find_longest_cache_hit(kind, block_hashes, max_len, [0], coord.pool, False, kind.block_size)[0]
            found = found[:-1]
            return (found,), len(found) * kind.block_size

        _patch(coord, "find_longest_cache_hit", find)
    return m


# --- the runner ----------------------------------------------------------------------------------


HUNT_STEPS = 1_000_000_000
"""The zoo hunts until its time budget runs out (``--min-steps`` far beyond reach), not
only for the profile's step goal (20,000 steps, about 12 s, on ``ci``)."""


def run_entry(
    entry: ZooEntry, budget: float, seed: int, profile: str, module: str = "kvtools.zoo", shrink_cap: bool = True
) -> dict[str, Any]:
    """Hunt one mutant as ``kvref check --target <module>:<name> --against spec
    --profile <profile> --seed <seed> --budget <budget> --min-steps HUNT_STEPS``
    does; return its row of the kill table.

    Hunt time runs from the start to the first unexplained divergence, shrink
    time from there to the end of the run (Hypothesis shrinks the failing
    history before it reports). ``within_budget`` is True only when hunt plus
    shrink took at most ``budget`` seconds.

    With ``shrink_cap`` Hypothesis may shrink only for what is left of the
    budget when the fault is found (its ``MAX_SHRINKING_SECONDS``, 300 by
    default, is lowered for this run), so a late kill reports a longer trace
    instead of overrunning the budget; ``shrink_capped`` says so in the row.
    """
    with tempfile.TemporaryDirectory() as tmp:
        factories = [load_factory("spec"), load_factory(f"{module}:{entry.name}")]
        load_profile(profile)
        setup = MachineSetup(factories, RunStats(), Path(tmp), profile=VLLM_0_25_1)
        start = time.monotonic()
        setup.stats.started = start
        saved, cap = shrink_time_limit(), [shrink_time_limit()]

        def lower_cap() -> None:
            cap[0] = max(1, int(budget - (time.monotonic() - start)))
            set_shrink_time_limit(cap[0])

        setup.stats.on_first_failure = lower_cap if shrink_cap else None
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                killed = run_lockstep(setup, seed, HUNT_STEPS, budget) is not None
        finally:
            set_shrink_time_limit(saved)
        seconds = time.monotonic() - start
        stats = setup.stats
        traces = sorted(Path(tmp).glob("failure-*.jsonl"))
        lines = traces[0].read_text().splitlines() if traces else []
    first = lines[0] if lines else ""
    failure = str(json.loads(first).get("failure", "")) if first.startswith("{") else ""
    hunt = (stats.first_failure_at - start) if killed and stats.first_failure_at is not None else seconds
    return {
        "name": entry.name,
        "target": f"{module}:{entry.name}",
        "upstream": entry.upstream,
        "description": entry.description,
        "killed": killed,
        "exit_code": 1 if killed else 0,
        "seconds": round(seconds, 1),
        "hunt_seconds": round(hunt, 1),
        "shrink_seconds": round(seconds - hunt, 1) if killed else None,
        "within_budget": killed and seconds <= budget,
        "shrink_capped": killed and shrink_cap and seconds - hunt >= cap[0],
        "trace_length": len(lines) - 1 if lines else None,
        "steps": stats.first_failure_steps if killed else stats.steps,
        "steps_total": stats.steps,
        "prefix_hits": stats.prefix_hits,
        "failure": failure,
        "catch": entry.catch,
    }


def _summary(failure: str) -> str:
    """The first divergence, shortened for a table cell."""
    text = " ".join(failure.split()).replace("|", "/").replace("`", "'")
    if text.startswith("views differ") and ": " in text:
        head, rest = text.split(": ", 1)
        return f"{head}: {rest.split(':')[0]}"
    return text if len(text) <= 110 else text[:107] + "..."


NOTES: dict[str, str] = {}
"""Extra Markdown paragraphs for the report's preamble (set by the caller)."""

PREAMBLE = """\
Faults that really happened in vLLM's KV-cache code, re-planted one at a time into kvimpl
(`kvref/zoo.py`) and hunted with
`kvref check --target kvtools.zoo:<name> --against spec --profile {profile} --seed {seed} --budget {budget:g}
--min-steps {hunt}` (the runner calls the same loop in-process; the step goal is out of reach, so the
time budget ends a hunt). Regenerate with `ci/mutation.sh` (or `python -m kvtools.zoo`).

*Hunt* is the time from the start to the first unexplained divergence, *shrink* the time Hypothesis then
spent minimising the failing history (the trace has *trace ops* operations), *steps* the lockstep steps
run before the first divergence (for a survivor: all steps run). **Killed within {budget:g} s counts hunt
plus shrink.** Shrinking may use only what is left of the budget when the fault is found (the runner
lowers Hypothesis' `MAX_SHRINKING_SECONDS` for that run; `--no-shrink-cap` turns this off): "yes (shrink
cut)" marks a kill whose shrinking was stopped there, so its trace is longer than a full shrink would
leave. Steps are the machine-independent measure: the same seed finds a fault at the same step on
any machine, while seconds depend on the CPU and its load."""


def write_markdown(rows: Sequence[dict[str, Any]], path: Path, budget: float, seed: int, profile: str) -> None:
    """The kill table as Markdown."""
    real = [r for r in rows if str(r.get("target", "")).startswith("kvtools.zoo_vllm:")]
    rows = [r for r in rows if r not in real]
    killed = [r for r in rows if r["killed"]]
    fast = [r for r in killed if r.get("within_budget", r["seconds"] <= budget)]
    unreachable = [r for r in rows if ZOO.get(r["name"]) is not None and ZOO[r["name"]].unreachable]
    lines = ["# The upstream bug zoo", "", PREAMBLE.format(profile=profile, seed=seed, budget=budget, hunt=HUNT_STEPS)]
    lines += ["", *NOTES.values()] if NOTES else []
    lines += [
        "",
        f"**{len(killed)} of {len(rows)} killed; {len(fast)} of {len(rows)} within {budget:g} s (hunt + shrink)"
        + (
            f"; {len(killed)} of the {len(rows) - len(unreachable)} entries reachable through the public API.** "
            f"{len(unreachable)} entr{'y is' if len(unreachable) == 1 else 'ies are'} classified "
            "equivalent/unreachable (argued in its row). "
            if unreachable
            else ".** "
        )
        + '"unconfirmed" marks an upstream number that could not be matched to the described fault.',
        "",
        "| mutant | upstream | fault | killed | hunt s | shrink s | steps | trace ops | caught by / why it survives |",
        "|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(_row(r, budget))
    if real:
        lines += [
            "",
            "## Real vLLM 0.25.1, re-broken",
            "",
            "`kvref/zoo_vllm.py` patches ONE method of the installed vLLM's `BlockPool` or `KVCacheManager`",
            "instance inside an adapter factory; the same check (`--target kvtools.zoo_vllm:<name> --against spec`)",
            "must catch it.",
            "",
            "| mutant | patched method | fault | killed | hunt s | shrink s | steps | trace ops | first divergence |",
            "|---|---|---|---|---:|---:|---:|---:|---|",
        ]
        for r in real:
            status = _status(r, budget)
            lines.append(
                f"| `{r['name']}` | {r['upstream']} | {r['description']} | {status} | {r.get('hunt_seconds', '')} "
                f"| {_cell(r.get('shrink_seconds'))} | {_cell(r.get('steps'))} | {_cell(r['trace_length'])} "
                f"| {_summary(r['failure'])} |"
            )
    survivors = [r for r in rows if not r["killed"]]
    if survivors:
        lines += ["", "## Survivors", ""]
        lines += [f"- `{r['name']}`: {r['catch']}." for r in survivors]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def _cell(value: object) -> str:
    return "" if value is None else str(value)


def _status(r: dict[str, Any], budget: float) -> str:
    if not r["killed"]:
        return "**survived**" if r["exit_code"] == 0 else f"error ({r['exit_code']})"
    if r.get("within_budget", r["seconds"] <= budget):
        return "yes (shrink cut)" if r.get("shrink_capped") else "yes"
    return f"yes, in {r['seconds']} s (over {budget:g} s)"


def _row(r: dict[str, Any], budget: float) -> str:
    how = _summary(r["failure"]) if r["killed"] and r["failure"] else r["catch"]
    desc = r["description"].replace("|", "\\|")
    cells = [
        f"`{r['name']}`", r["upstream"], desc, _status(r, budget), _cell(r.get("hunt_seconds", r["seconds"])),
        _cell(r.get("shrink_seconds")), _cell(r.get("steps")), _cell(r["trace_length"]), how,
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def _progress(row: dict[str, Any]) -> str:
    if not row["killed"]:
        return f"zoo: {row['name']}: SURVIVED {row['steps']} steps in {row['seconds']}s"
    return (
        f"zoo: {row['name']}: killed at step {row['steps']} (hunt {row['hunt_seconds']}s, shrink "
        f"{row['shrink_seconds']}s, trace {row['trace_length']} ops)"
    )


def _no_factory(config: KVCacheConfig) -> ImplAdapter:
    raise NotImplementedError("vLLM zoo rows are run through their own module")


ZOO_NO_FACTORY: Factory = _no_factory


def _refresh(row: dict[str, Any]) -> dict[str, Any]:
    """A stored row with the registry's current upstream, description and catch text."""
    e = ZOO[row["name"]]
    return {**row, "upstream": e.upstream, "description": e.description, "catch": e.catch}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvtools.zoo``: run every (or the named) mutant, write the reports."""
    parser = argparse.ArgumentParser(prog="python -m kvtools.zoo", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="entries to run (default: all)")
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", default="ci")
    parser.add_argument("--json", type=Path, default=Path("docs/reports/zoo.json"))
    parser.add_argument("--markdown", type=Path, default=Path("docs/reports/bug-zoo.md"))
    parser.add_argument("--list", action="store_true", help="print the registry and exit")
    parser.add_argument("--update", action="store_true", help="rerun only the named entries, keep the other rows")
    parser.add_argument("--vllm", action="store_true", help="run the kvtools.zoo_vllm faults (needs vLLM 0.25.1)")
    parser.add_argument("--rewrite", action="store_true", help="only re-render the Markdown from the JSON")
    parser.add_argument("--note", action="append", default=[], help="a paragraph for the report's preamble")
    parser.add_argument(
        "--no-shrink-cap", action="store_true", help="let Hypothesis shrink for as long as it likes (up to 300 s)"
    )
    args = parser.parse_args(argv)
    NOTES.update({f"note{i}": text for i, text in enumerate(args.note)})
    if args.list:
        for e in ZOO.values():
            print(f"{e.name:32} {e.upstream:40} {e.description}")
        return 0
    unknown = [n for n in args.names if n not in ZOO]
    if unknown:
        print(f"unknown zoo entries: {', '.join(unknown)}", file=sys.stderr)
        return 2
    if args.rewrite:
        rows = [_refresh(r) if r["name"] in ZOO else r for r in json.loads(args.json.read_text())]
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
        write_markdown(rows, args.markdown, args.budget, args.seed, args.profile)
        return 0
    rows = []
    for name in args.names or ([] if args.vllm else list(ZOO)):
        row = run_entry(ZOO[name], args.budget, args.seed, args.profile, shrink_cap=not args.no_shrink_cap)
        print(_progress(row), file=sys.stderr)
        rows.append(row)
    if args.vllm:
        from kvtools.zoo_vllm import VLLM_ZOO  # noqa: PLC0415 - vLLM is optional

        for v in VLLM_ZOO.values():
            entry = ZooEntry(v.name, v.method, v.description, ZOO_NO_FACTORY, "")
            row = run_entry(
                entry, args.budget, args.seed, args.profile, module="kvtools.zoo_vllm",
                shrink_cap=not args.no_shrink_cap,
            )  # fmt: skip
            print(_progress(row), file=sys.stderr)
            rows.append(row)
    if args.update and args.json.exists():
        fresh = {r["name"]: r for r in rows}
        old = {r["name"]: r for r in json.loads(args.json.read_text())}
        order = [*ZOO, *(n for n in old if n not in ZOO), *(n for n in fresh if n not in ZOO and n not in old)]
        rows = [fresh.get(n) or old[n] for n in order if n in fresh or n in old]
    args.json.write_text(json.dumps(rows, indent=2) + "\n")
    write_markdown(rows, args.markdown, args.budget, args.seed, args.profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
