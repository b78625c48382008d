"""The upstream bug zoo: faults that really happened in vLLM's KV-cache code,
re-planted one at a time into kvimpl.

Every entry of :data:`ZOO` is a module-level adapter factory of the same name,
so each one is a valid target::

    kvref check --target kvref.zoo:touch_before_capacity_check --against spec

A mutant is kvimpl's ``KVCacheManager`` with *one* method replaced on the
instance (impl/ is never edited). Faults that lived in request hashing are
planted on the caller side: the mutant re-hashes the requests it receives
before delegating. ``python -m kvref.zoo`` (or ``ci/mutation.sh``) runs the
kit against every entry and writes ``docs/bug-zoo.md`` and ``kvref-zoo.json``.

Upstream numbers are vLLM pull requests / issues / advisories; where the
number could not be matched to the described fault it says "unconfirmed".
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvimpl.block_pool import NULL_BLOCK, BlockId, BlockPool, _stored_event
from kvimpl.kv_cache_coordinator import HybridCoordinator
from kvimpl.single_type_kv_cache_manager import (
    MambaManager,
    SingleTypeKVCacheManager,
    cdiv,
    find_longest_cache_hit,
)
from kvref.adapters.impl_adapter import ImplAdapter
from kvspec.config import FULL_TYPE_KINDS, KVCacheConfig, Mamba
from kvspec.events import MEDIUM_GPU, BlockRemoved
from kvspec.hashing import (
    BlockHash,
    HashFunction,
    extend_block_hashes,
    external_block_hash,
    get_hash_fn_by_name,
    make_key,
    none_hash,
    split_key,
)
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


ZOO: dict[str, ZooEntry] = {}


def _entry(upstream: str, description: str, catch: str) -> Callable[[Factory], Factory]:
    def register(factory: Factory) -> Factory:
        ZOO[factory.__name__] = ZooEntry(factory.__name__, upstream, description, factory, catch)
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
    "unreachable here: only an allocation that passes the capacity estimate and then runs dry hits it, and kvimpl's "
    "estimates are exact (would show as a free-queue view diff); also survived 52k steps with --seed 1",
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
    "get_num_common_prefix_blocks counts a block as common when its ref_cnt equals the number of requests "
    "with tables, so popped blocks awaiting a deferred free (ref_cnt too high) end the prefix early",
    "get_num_common_prefix_blocks output once a popped block shared with a running request awaits its deferred free; "
    "killed by --seed 1 --min-steps 1000000 after 112k steps (11-op trace)",
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
    "allocate_slots output on the cross shape; the ci seed-0 stream misses it, but --seed 1 kills it in 8.7k steps "
    "(3-op trace) and --profile dev --seed 0 kills it too (tests/stateful/test_zoo.py)",
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
    "the hybrid fixed-point hit search drops the EAGLE look-ahead block on every pass, not once per "
    "candidate length, so hits shrink by a block per iteration",
    "get_computed_blocks output; needs a hybrid hit search that iterates (3+ spec groups or a non-full first group) "
    "with EAGLE and a partial hit; survived 52k more steps with --seed 1",
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
    "a hybrid request's prefix hits are touched group by group, interleaved with each group's allocation "
    "for connector tokens, so one group's fresh blocks can evict another group's still-free hit",
    "view diff / crash when one group's connector-token allocation pops another group's still-free hit block: "
    "needs a hybrid shape, prefix hits AND external tokens on one admission, and a nearly full pool; survived 52k "
    "more steps with --seed 1",
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
    "the Mamba align-mode 'state block of two steps ago' index is computed in hash-block units instead of "
    "the Mamba group's own block size",
    "probably equivalent in reachable states: by the time the looser bound fires, the base removal has already "
    "nulled the old state block; survived 56k more steps with --seed 1",
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
    "evicting one block whose hash has several physical copies cached emits one BlockRemoved per copy, "
    "so a consumer's index forgets copies that are still cached",
    "event-log consistency (kvimpl's 'event stream does not rebuild the cache map' / the consumer multiset); needs two "
    "cached copies of one hash, an eviction and a take_events: killed by --seed 1 after 58k steps (11-op trace)",
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


class _RehashingAdapter(ImplAdapter):
    """Re-hashes every request it receives with a faulty hasher, then delegates."""

    def __init__(self, config: KVCacheConfig, name: str, fn: HashFunction, seed_hash: BlockHash) -> None:
        super().__init__(config)
        self.name = name
        self._fn = fn
        self._seed_hash = seed_hash
        self._hbs = config.resolved_hash_block_size()
        self._hashes: dict[str, tuple[BlockHash, ...]] = {}

    def _faulty(self, request: Request) -> Request:
        rid = request.request_id
        have = self._hashes.get(rid)
        if have is None:
            # Prompt blocks first (mm cursor from 0), later blocks incrementally, as the spec's hasher does.
            prompt = request.all_token_ids[: request.num_prompt_tokens]
            have = extend_block_hashes(self._fn, self._seed_hash, self._hbs, (), prompt, request.extra)
        if len(have) < len(request.block_hashes):
            have = extend_block_hashes(self._fn, self._seed_hash, self._hbs, have, request.all_token_ids, request.extra)
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


# --- the runner ----------------------------------------------------------------------------------


def run_entry(entry: ZooEntry, budget: float, seed: int, profile: str, module: str = "kvref.zoo") -> dict[str, Any]:
    """Run ``kvref check`` on one mutant; return its row of the kill table."""
    from kvref.cli import main  # noqa: PLC0415 - the CLI imports the whole kit

    with tempfile.TemporaryDirectory() as tmp:
        old = os.environ.get("KVREF_FAILURE_DIR")
        os.environ["KVREF_FAILURE_DIR"] = tmp
        start = time.monotonic()
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                rc = main(
                    ["check", "--target", f"{module}:{entry.name}", "--against", "spec", "--profile", profile,
                     "--seed", str(seed), "--budget", str(budget)]
                )  # fmt: skip
        finally:
            if old is None:
                os.environ.pop("KVREF_FAILURE_DIR", None)
            else:
                os.environ["KVREF_FAILURE_DIR"] = old
        seconds = time.monotonic() - start
        traces = sorted(Path(tmp).glob("failure-*.jsonl"))
        trace_len = len(traces[0].read_text().splitlines()) - 1 if traces else None
        first = traces[0].read_text().splitlines()[0] if traces else ""
    failure = str(json.loads(first).get("failure", "")) if first.startswith("{") else ""
    return {
        "name": entry.name,
        "target": f"{module}:{entry.name}",
        "upstream": entry.upstream,
        "description": entry.description,
        "killed": rc == 1,
        "exit_code": rc,
        "seconds": round(seconds, 1),
        "trace_length": trace_len,
        "steps": int(steps.group(1)) if (steps := re.search(r"steps run\D*(\d+)", out.getvalue())) else None,
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


def write_markdown(rows: Sequence[dict[str, Any]], path: Path, budget: float, seed: int, profile: str) -> None:
    """The kill table as Markdown."""
    real = [r for r in rows if str(r.get("target", "")).startswith("kvref.zoo_vllm:")]
    rows = [r for r in rows if r not in real]
    killed = sum(1 for r in rows if r["killed"])
    lines = [
        "# The upstream bug zoo",
        "",
        "Faults that really happened in vLLM's KV-cache code, re-planted one at a time into kvimpl",
        "(`kvref/zoo.py`) and hunted with",
        f"`kvref check --target kvref.zoo:<name> --against spec --profile {profile} --seed {seed} "
        f"--budget {budget:g}`.",
        "Regenerate with `ci/mutation.sh` (or `python -m kvref.zoo`). Seconds are wall time including shrinking on",
        "the machine that ran it (a shared 2-CPU box for the committed table, under load for the first rows);",
        "steps are lockstep operations run (recorded for survivors and later reruns).",
        "",
        f'**{killed} of {len(rows)} killed.** "unconfirmed" marks an upstream number that could not be matched',
        "to the described fault; the planted fault is then our reading of the issue title.",
        "",
        "| mutant | upstream | fault | killed | seconds | steps | trace ops | caught by / why it survives |",
        "|---|---|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        status = "yes" if r["killed"] else ("**survived**" if r["exit_code"] == 0 else f"error ({r['exit_code']})")
        how = _summary(r["failure"]) if r["killed"] and r["failure"] else r["catch"]
        trace = "" if r["trace_length"] is None else str(r["trace_length"])
        desc = r["description"].replace("|", "\\|")
        steps = r.get("steps") or ""
        cells = [f"`{r['name']}`", r["upstream"], desc, status, str(r["seconds"]), str(steps), trace, how]
        lines.append("| " + " | ".join(cells) + " |")
    if real:
        lines += [
            "",
            "## Real vLLM 0.25.1, re-broken",
            "",
            "`kvref/zoo_vllm.py` patches ONE method of the installed vLLM's `BlockPool` instance inside an adapter",
            "factory; the same check (`--target kvref.zoo_vllm:<name> --against spec`) must catch it.",
            "",
            "| mutant | patched method | fault | killed | seconds | trace ops | first divergence |",
            "|---|---|---|---|---:|---:|---|",
        ]
        for r in real:
            status = "yes" if r["killed"] else f"**no** (exit {r['exit_code']})"
            how = _summary(r["failure"])
            trace = "" if r["trace_length"] is None else str(r["trace_length"])
            lines.append(
                f"| `{r['name']}` | {r['upstream']} | {r['description']} | {status} | {r['seconds']} "
                f"| {trace} | {how} |"
            )
    survivors = [r for r in rows if not r["killed"]]
    if survivors:
        lines += ["", "## Survivors", ""]
        lines += [f"- `{r['name']}`: {r['catch']}." for r in survivors]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def _no_factory(config: KVCacheConfig) -> ImplAdapter:
    raise NotImplementedError("vLLM zoo rows are run through their own module")


ZOO_NO_FACTORY: Factory = _no_factory


def _refresh(row: dict[str, Any]) -> dict[str, Any]:
    """A stored row with the registry's current upstream, description and catch text."""
    e = ZOO[row["name"]]
    return {**row, "upstream": e.upstream, "description": e.description, "catch": e.catch}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvref.zoo``: run every (or the named) mutant, write the reports."""
    parser = argparse.ArgumentParser(prog="python -m kvref.zoo", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="entries to run (default: all)")
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", default="ci")
    parser.add_argument("--json", type=Path, default=Path("kvref-zoo.json"))
    parser.add_argument("--markdown", type=Path, default=Path("docs/bug-zoo.md"))
    parser.add_argument("--list", action="store_true", help="print the registry and exit")
    parser.add_argument("--update", action="store_true", help="rerun only the named entries, keep the other rows")
    parser.add_argument("--vllm", action="store_true", help="run the kvref.zoo_vllm faults (needs vLLM 0.25.1)")
    parser.add_argument("--rewrite", action="store_true", help="only re-render the Markdown from the JSON")
    args = parser.parse_args(argv)
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
        row = run_entry(ZOO[name], args.budget, args.seed, args.profile)
        verdict = "killed" if row["killed"] else "SURVIVED"
        print(f"zoo: {name}: {verdict} in {row['seconds']}s (trace {row['trace_length']})", file=sys.stderr)
        rows.append(row)
    if args.vllm:
        from kvref.zoo_vllm import VLLM_ZOO  # noqa: PLC0415 - vLLM is optional

        for v in VLLM_ZOO.values():
            entry = ZooEntry(v.name, v.method, v.description, ZOO_NO_FACTORY, "")
            row = run_entry(entry, args.budget, args.seed, args.profile, module="kvref.zoo_vllm")
            print(f"zoo: {v.name}: {'killed' if row['killed'] else 'SURVIVED'} in {row['seconds']}s", file=sys.stderr)
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
