"""The unseen fault set: faults planted into kvimpl that the generator was not tuned against.

The bug zoo (:data:`kvtools.zoo.ZOO`) and the fresh set
(:data:`kvtools.zoo.fresh.FRESH`) were both written while, or right after,
the generator was being built; the machine's rules were tuned while the zoo
was hunted. These faults were written separately from the generator work
(by an engineer who worked on neither the machine nor its rules, while
those were being finished), were never run under the machine while it was
changed, and were hunted only once the generator was frozen: so their kill
rate is a measurement, not a target. Each is either a
fault that vLLM's KV-cache manager really had (or a sibling project had in
the same code: the entry names the upstream number) re-planted into kvimpl,
or a classic mutation operator (a bound off by one, a comparison flipped, an
argument dropped or swapped, a wrong unit, a wrong end of a queue, a missing
reset) at a decision point found by reading kvimpl's pure-Python modules
against their kvspec mirrors. Most sit inside the objects the facade holds
(the coordinator, the per-group managers, the block pool), not at the facade.

Every fault is live: ``tests/tools/test_unseen_live.py`` drives a
hand-written history through kvspec, unmutated kvimpl and the mutant, and
shows the mutant differ where kvimpl agrees with kvspec. Those tests prove
liveness only; the measurement is ``python -m kvtools zoo --unseen``, which
hunts each entry under its release (:data:`PROFILE_OF`) and writes
docs/reports/zoo-unseen.json and docs/reports/bug-zoo-unseen.md.

Each factory replaces one method on one object of a kvimpl adapter instance
(the adapter, its coordinator, one kind of its managers, or its pool), as
the zoo's do (:func:`kvtools.zoo.base.patch`); impl/ is never edited. A
configuration without the patched decision point gets plain kvimpl.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from kvimpl.block_pool import NULL_BLOCK, BlockId
from kvimpl.kv_cache_coordinator import HybridCoordinator, KVCacheCoordinator, UnitaryCoordinator
from kvimpl.kv_cache_manager import table_cached_tokens
from kvimpl.single_type_kv_cache_manager import (
    CrossAttentionManager,
    MambaManager,
    SingleTypeKVCacheManager,
    cdiv,
    find_longest_cache_hit,
    sliding_window_hit,
)
from kvref.adapters.impl import ImplAdapter
from kvref.capabilities import declare
from kvspec.config import (
    FULL_TYPE_KINDS,
    ChunkedLocal,
    KVCacheConfig,
    Mamba,
    SinkFullAttention,
    SlidingWindow,
)
from kvspec.events import AllBlocksCleared, BlockStored
from kvspec.request import Request, RequestStatus
from kvtools.zoo.base import ZooEntry, bound_args, mutant, patch

Factory = Callable[[KVCacheConfig], ImplAdapter]

UNSEEN: dict[str, ZooEntry] = {}
"""The unseen set by name, in the order written."""

DEFAULT_PROFILE = "vllm-0.25.1"
"""The release an entry is hunted under unless :data:`PROFILE_OF` names another."""

PROFILE_OF: dict[str, str] = {}
"""Per entry, the semantics profile to hunt it under (``python -m kvtools zoo --unseen``
uses it when ``--semantics`` is not given): the release where the fault is live."""


def unseen(operator: str, description: str, profile: str = DEFAULT_PROFILE) -> Callable[[Factory], Factory]:
    """Register the decorated factory in :data:`UNSEEN` and :data:`PROFILE_OF`.

    Args:
        operator: The mutation's kind, with the upstream number where it re-plants one.
        description: The fault, in one sentence.
        profile: The semantics profile it is live under (and hunted under).
    """

    def register(factory: Factory) -> Factory:
        name = factory.__name__
        UNSEEN[name] = ZooEntry(name, operator, description, factory, "")
        PROFILE_OF[name] = profile
        return factory

    return register


# -- the block pool: free-queue order, references, cache keys, events --------------------------------


@unseen(
    "wrong end",
    "get_new_blocks takes blocks from the tail of the free queue (the most recently freed, freshest cache "
    "entries) instead of the head, so the LRU order is inverted",
)
def lru_takes_tail(config: KVCacheConfig) -> ImplAdapter:
    """Fresh blocks come off the tail of the free queue, tail first."""
    m = mutant(config, "lru_takes_tail")
    pool = m.block_pool
    orig = pool.get_new_blocks

    def get_new_blocks(num_blocks: int) -> list[BlockId]:
        if num_blocks < 0 or num_blocks > len(pool.free_queue):
            return orig(num_blocks)  # the same errors
        order = pool.free_queue.to_list()
        taken = [BlockId(b) for b in reversed(order[len(order) - num_blocks :])]
        for b in taken:
            pool.free_queue.remove(b)
            if pool.enable_caching and pool.block_hash[b] is not None:
                pool._evict(b)
            pool.ref_cnt[b] = 1
        return taken

    patch(pool, "get_new_blocks", get_new_blocks)
    return m


@unseen(
    "wrong end",
    "free_blocks puts every block that reaches 0 references at the head of the free queue, hashed ones too, "
    "so the cache entries a request just finished with are the first to be evicted",
)
def hashed_freed_to_head(config: KVCacheConfig) -> ImplAdapter:
    """Freed hashed blocks are prepended like unhashed ones (in the given order)."""
    m = mutant(config, "hashed_freed_to_head")
    pool = m.block_pool
    orig = pool.free_blocks

    def free_blocks(ordered_blocks: Any, skipped: bool = False) -> None:
        blocks = [BlockId(b) for b in ordered_blocks]
        orig(blocks, skipped)  # validation, references and the correct queue
        freed = [b for b in dict.fromkeys(blocks) if b != NULL_BLOCK and pool.ref_cnt[b] == 0]
        hashed = [b for b in freed if pool.block_hash[b] is not None]
        if not hashed:
            return
        for b in freed:
            pool.free_queue.remove(b)
        for b in reversed(freed):
            pool.free_queue.prepend(b)

    patch(pool, "free_blocks", free_blocks)
    return m


@unseen(
    "condition added",
    "touch adds a reference only to hit blocks it takes off the free queue, not to those another request "
    "already holds, so a shared prefix block is counted once however many requests hold it",
)
def touch_skips_shared_ref(config: KVCacheConfig) -> ImplAdapter:
    """Only free hit blocks (ref_cnt 0) are touched."""
    m = mutant(config, "touch_skips_shared_ref")
    pool = m.block_pool
    orig = pool.touch

    def touch(blocks: Sequence[BlockId]) -> None:
        orig([b for b in blocks if pool.ref_cnt[b] == 0])

    patch(pool, "touch", touch)
    return m


@unseen(
    "wrong index",
    "a block coarser than the hash block is cached under the first fine hash inside it instead of the last "
    "(which chains the whole prefix), so lookups, which use the last, never find it (hybrids with two block "
    "sizes)",
)
def coarse_key_first_fine_hash(config: KVCacheConfig) -> ImplAdapter:
    """cache_full_blocks keys block i by fine hash i*k instead of (i+1)*k - 1."""
    m = mutant(config, "coarse_key_first_fine_hash")
    pool = m.block_pool
    orig = pool.cache_full_blocks

    def cache_full_blocks(request: Request, blocks: Sequence[BlockId], *args: Any, **kwargs: Any) -> None:
        block_size = bound_args(orig, (request, blocks, *args), kwargs)["block_size"]
        k = block_size // pool.hash_block_size
        if k > 1:
            fine = list(request.block_hashes)
            for i in range(len(fine) // k):
                fine[(i + 1) * k - 1] = request.block_hashes[i * k]
            request = replace(request, block_hashes=tuple(fine))
        orig(request, blocks, *args, **kwargs)

    patch(pool, "cache_full_blocks", cache_full_blocks)
    return m


@unseen(
    "re-plant: vllm-ascend#12012 (the same fault in the Ascend store's events)",
    "a BlockStored event's parent hash is tracked over the blocks stored in the same call only, so a call "
    "that continues an already cached prefix reports no parent and the consumer cannot chain it",
)
def stored_event_parent_none(config: KVCacheConfig) -> ImplAdapter:
    """The parent of a continuing BlockStored is None."""
    m = mutant(config, "stored_event_parent_none")
    pool = m.block_pool
    orig = pool.cache_full_blocks

    def cache_full_blocks(*args: Any, **kwargs: Any) -> None:
        before = len(pool.events)
        orig(*args, **kwargs)
        for i in range(before, len(pool.events)):
            ev = pool.events[i]
            if isinstance(ev, BlockStored) and ev.parent_block_hash is not None:
                pool.events[i] = replace(ev, parent_block_hash=None)

    patch(pool, "cache_full_blocks", cache_full_blocks)
    return m


@unseen(
    "missing reset",
    "reset_prefix_cache forgets every block's hash but keeps the hash-to-block map, so lookups after a reset "
    "still hit blocks whose contents are no longer trusted",
)
def reset_keeps_cache_map(config: KVCacheConfig) -> ImplAdapter:
    """The cache map survives a successful reset."""
    m = mutant(config, "reset_keeps_cache_map")
    pool = m.block_pool
    orig = pool.reset_prefix_cache

    def reset_prefix_cache() -> bool:
        cached = pool.cached
        done = orig()
        if done:
            pool.cached = cached
        return done

    patch(pool, "reset_prefix_cache", reset_prefix_cache)
    return m


@unseen(
    "statement deleted",
    "a successful reset_prefix_cache sends no AllBlocksCleared event, so an event consumer keeps indexing "
    "blocks the engine has forgotten",
)
def reset_emits_no_clear_event(config: KVCacheConfig) -> ImplAdapter:
    """The AllBlocksCleared of a reset is dropped."""
    m = mutant(config, "reset_emits_no_clear_event")
    pool = m.block_pool
    orig = pool.reset_prefix_cache

    def reset_prefix_cache() -> bool:
        done = orig()
        if done and pool.events and isinstance(pool.events[-1], AllBlocksCleared):
            pool.events.pop()
        return done

    patch(pool, "reset_prefix_cache", reset_prefix_cache)
    return m


# -- the single-type managers: skips, hit rules, cache cursors, estimates -----------------------------


def _managers(m: ImplAdapter, *kinds: type) -> list[SingleTypeKVCacheManager]:
    """The adapter's managers whose kind is one of ``kinds`` (exact manager class not implied)."""
    return [mgr for mgr in m.coordinator.managers if isinstance(mgr.kind, kinds)]


@unseen(
    "constant dropped (the -1 of vllm#14097's contiguous-block count)",
    "a sliding-window hit needs cdiv(window, block_size) contiguous cached blocks instead of "
    "cdiv(window - 1, block_size): the token being computed was counted as part of the window it reads, so "
    "hits need one block more than they do (one sliding-window group)",
)
def window_run_counts_own_token(config: KVCacheConfig) -> ImplAdapter:
    """The unitary sliding-window lookup asks for one contiguous block too many when window - 1 is aligned."""
    m = mutant(config, "window_run_counts_own_token")
    coord = m.coordinator
    kind = coord.managers[0].kind
    if isinstance(coord, UnitaryCoordinator) and isinstance(kind, SlidingWindow):
        patch(coord, "find_longest_cache_hit", _window_lookup(coord, kind))
    return m


def _window_lookup(coord: UnitaryCoordinator, kind: SlidingWindow) -> Callable[[Sequence[Any], int], Any]:
    bs = kind.block_size
    eagle = 0 in coord.eagle_group_ids

    def find(block_hashes: Sequence[Any], max_len: int) -> tuple[Any, int]:
        looked_up = [coord.pool.get_cached_block(h, [0]) for h in block_hashes[: max(max_len, 0) // bs]]
        need = cdiv(kind.window, bs) + (1 if eagle else 0)  # the fault: window, not window - 1
        first, length = sliding_window_hit([f is not None for f in looked_up], need, eagle, bs, bs)
        blocks = [NULL_BLOCK if i < first else BlockId((looked_up[i] or [NULL_BLOCK])[0]) for i in range(length)]
        return (blocks,), length * bs

    return find


@unseen(
    "off by one",
    "chunked local attention skips (n - 1) // chunk * chunk tokens instead of n // chunk * chunk, so the "
    "blocks of a finished chunk are freed one token late (when the next chunk's first token is computed, "
    "they are still held)",
)
def chunk_skip_one_late(config: KVCacheConfig) -> ImplAdapter:
    """Chunked-local managers count skipped tokens from n - 1."""
    m = mutant(config, "chunk_skip_one_late")
    for mgr in _managers(m, ChunkedLocal):
        kind = mgr.kind
        assert isinstance(kind, ChunkedLocal)
        chunk = kind.chunk
        patch(mgr, "get_num_skipped_tokens", lambda n, c=chunk: max(n - 1, 0) // c * c)
    return m


@unseen(
    "rounding up (ceil for floor)",
    "cache_blocks moves a full-attention group's cache cursor to cdiv(num_tokens, block_size), past the "
    "partially filled last block, so that block is never hashed once it fills up",
)
def partial_block_marked_cached(config: KVCacheConfig) -> ImplAdapter:
    """Full-attention managers count the partial block as cached."""
    m = mutant(config, "partial_block_marked_cached")
    for mgr in _managers(m, *FULL_TYPE_KINDS):
        patch(mgr, "cache_blocks", _cursor_rounded_up(mgr))
    return m


def _cursor_rounded_up(mgr: SingleTypeKVCacheManager) -> Callable[[Request, int], None]:
    orig = mgr.cache_blocks

    def cache_blocks(request: Request, num_tokens: int) -> None:
        orig(request, num_tokens)
        rid = request.request_id
        table = mgr.req_to_blocks.get(rid, [])
        if rid in mgr.num_cached_block:
            mgr.num_cached_block[rid] = max(
                mgr.num_cached_block[rid], min(cdiv(num_tokens, mgr.block_size), len(table))
            )

    return cache_blocks


@unseen(
    "wrong list",
    "add_local_computed_blocks also records the prefix-hit blocks as fresh blocks for take_new_block_ids, so "
    "the worker zeroes blocks that hold cached KV (groups that record fresh blocks)",
)
def hits_recorded_as_new(config: KVCacheConfig) -> ImplAdapter:
    """Hit blocks join the fresh-block list of the groups that keep one."""
    m = mutant(config, "hits_recorded_as_new")
    for mgr in m.coordinator.managers:
        if mgr.records_new_ids:
            patch(mgr, "add_local_computed_blocks", _hits_as_new(mgr))
    return m


def _hits_as_new(mgr: SingleTypeKVCacheManager) -> Callable[[str, Sequence[BlockId], int, int], None]:
    orig = mgr.add_local_computed_blocks

    def add_local_computed_blocks(request_id: str, hits: Sequence[BlockId], num_local: int, num_external: int) -> None:
        before = len(mgr.req_to_blocks.get(request_id, ()))
        orig(request_id, hits, num_local, num_external)
        mgr.new_block_ids += [b for b in mgr.req_to_blocks.get(request_id, [])[before:] if b != NULL_BLOCK]

    return add_local_computed_blocks


@unseen(
    "re-plant: vllm#11310 (its removal of num_evictable_computed_blocks, where touching follows the check)",
    "a full-attention group's admission estimate leaves out the hit blocks that are still free, which the "
    "touch takes off the free queue, so an admission that does not fit passes the check and runs the pool "
    "dry half-way",
)
def free_hits_not_counted(config: KVCacheConfig) -> ImplAdapter:
    """Free (evictable) hit blocks cost nothing in the estimate."""
    m = mutant(config, "free_hits_not_counted")
    for mgr in _managers(m, *FULL_TYPE_KINDS):
        patch(mgr, "get_num_blocks_to_allocate", _without_free_hits(mgr))
    return m


def _without_free_hits(mgr: SingleTypeKVCacheManager) -> Callable[..., int]:
    orig = mgr.get_num_blocks_to_allocate

    def get_num_blocks_to_allocate(request_id: str, num_tokens: int, hits: Sequence[BlockId], *a: Any, **k: Any) -> int:
        need = orig(request_id, num_tokens, hits, *a, **k)
        if request_id in mgr.num_cached_block:
            return need
        return need - sum(1 for b in hits if b != NULL_BLOCK and mgr.pool.ref_cnt[b] == 0)

    return get_num_blocks_to_allocate


@unseen(
    "argument dropped",
    "a Mamba group outside align mode allocates its table for the tokens only, without the speculative "
    "blocks its admission estimate counted, so draft tokens have no state slots",
)
def mamba_spec_blocks_dropped(config: KVCacheConfig) -> ImplAdapter:
    """Non-align Mamba allocations leave out num_speculative_blocks."""
    m = mutant(config, "mamba_spec_blocks_dropped")
    for mgr in m.coordinator.managers:
        if isinstance(mgr, MambaManager) and mgr.mamba.mode != "align" and mgr.mamba.num_speculative_blocks:
            patch(mgr, "allocate_new_blocks", _base_allocate(mgr))
    return m


def _base_allocate(mgr: MambaManager) -> Callable[[str, int, int], list[BlockId]]:
    def allocate_new_blocks(request_id: str, num_tokens: int, num_tokens_main_model: int) -> list[BlockId]:
        return SingleTypeKVCacheManager.allocate_new_blocks(mgr, request_id, num_tokens, num_tokens_main_model)

    return allocate_new_blocks


@unseen(
    "loop bound off by one",
    "the hit search of a lone Mamba group scans the cached states from the second-to-last candidate down, "
    "so the newest state is never reused and every hit is at least one block short",
)
def mamba_hit_skips_newest(config: KVCacheConfig) -> ImplAdapter:
    """A unitary Mamba lookup ignores its last candidate block."""
    m = mutant(config, "mamba_hit_skips_newest")
    coord = m.coordinator
    kind = coord.managers[0].kind
    if isinstance(coord, UnitaryCoordinator) and isinstance(kind, Mamba):
        orig = coord.find_longest_cache_hit
        bs = kind.block_size

        def find(block_hashes: Sequence[Any], max_len: int) -> tuple[Any, int]:
            return orig(block_hashes, max(max_len, 0) // bs * bs - bs)

        patch(coord, "find_longest_cache_hit", find)
    return m


@unseen(
    "wrong element (at the step guard of vllm#29387)",
    "Mamba's this-step guard tests the first block of a hit (a null block, before the state) instead of the "
    "last, so a state cached earlier in the same scheduler step is reused before it is written",
)
def step_guard_reads_first_hit(config: KVCacheConfig) -> ImplAdapter:
    """The step guard looks at hits[0]."""
    m = mutant(config, "step_guard_reads_first_hit")
    for mgr in m.coordinator.managers:
        if isinstance(mgr, MambaManager) and mgr.step_guard:
            patch(mgr, "get_num_blocks_to_allocate", _guard_first(mgr))
    return m


def _guard_first(mgr: MambaManager) -> Callable[..., int]:
    orig = mgr.get_num_blocks_to_allocate

    def get_num_blocks_to_allocate(request_id: str, num_tokens: int, hits: Sequence[BlockId], *a: Any, **k: Any) -> int:
        first = bool(hits) and mgr.pool.block_hash[hits[0]] in mgr.cached_blocks_this_step
        saved, mgr.cached_blocks_this_step = mgr.cached_blocks_this_step, set()
        try:
            need = orig(request_id, num_tokens, hits, *a, **k)
        finally:
            mgr.cached_blocks_this_step = saved
        return mgr.pool.num_gpu_blocks + 1 if first else need

    return get_num_blocks_to_allocate


@unseen(
    "null check dropped",
    "Mamba align's admission estimate counts the null entries in front of a hit's state block as evictable "
    "hit blocks (the null block has no references), so a hit admission asks for blocks it never takes and "
    "is refused in a tight pool",
)
def mamba_nulls_counted_evictable(config: KVCacheConfig) -> ImplAdapter:
    """Null hit entries count as free blocks in Mamba align's estimate."""
    m = mutant(config, "mamba_nulls_counted_evictable")
    for mgr in m.coordinator.managers:
        if isinstance(mgr, MambaManager) and mgr.mamba.mode == "align":
            ref = mgr.pool.ref_cnt
            patch(mgr, "_num_evictable", lambda blocks, ref=ref: sum(1 for b in blocks if ref[b] == 0))
    return m


@unseen(
    "re-plant: vllm#30166 (before it, connector tokens outside the window got blocks)",
    "a sliding-window group computes the positions a new request skips from its local (computed plus hit) "
    "tokens only, leaving the connector's external tokens out, so external tokens outside the window get "
    "real blocks instead of null ones",
)
def external_tokens_not_skipped(config: KVCacheConfig) -> ImplAdapter:
    """Sliding-window managers skip by num_local, not num_local + num_external."""
    m = mutant(config, "external_tokens_not_skipped")
    for mgr in _managers(m, SlidingWindow):
        orig = mgr.add_local_computed_blocks
        patch(mgr, "add_local_computed_blocks", lambda rid, hits, local, ext, orig=orig: orig(rid, hits, local, 0))
    return m


@unseen(
    "off by one (the scheduler's running count taken before the request joins)",
    "the common prefix counts a block as shared when all tables but one hold it, so cascade attention is "
    "told a prefix is common that one running request does not have",
)
def common_prefix_one_table_short(config: KVCacheConfig) -> ImplAdapter:
    """A block held by len(tables) - 1 tables counts as common."""
    m = mutant(config, "common_prefix_one_table_short")
    for mgr in _managers(m, *FULL_TYPE_KINDS):
        patch(mgr, "get_num_common_prefix_blocks", _prefix_short(mgr))
    return m


def _prefix_short(mgr: SingleTypeKVCacheManager) -> Callable[[str], int]:
    def get_num_common_prefix_blocks(request_id: str) -> int:
        tables = mgr.req_to_blocks
        n = 0
        for b in tables.get(request_id, []):
            if b == NULL_BLOCK or mgr.holders[b] < len(tables) - 1:
                break
            n += 1
        return n

    return get_num_common_prefix_blocks


@unseen(
    "exact type for isinstance",
    "a SinkFull group records its fresh blocks for take_new_block_ids as full attention does (a subclass "
    "check where vLLM tests the exact spec type), so its blocks are zeroed too",
)
def sink_records_new_ids(config: KVCacheConfig) -> ImplAdapter:
    """SinkFull managers append their fresh blocks to the fresh-block list."""
    m = mutant(config, "sink_records_new_ids")
    for mgr in _managers(m, SinkFullAttention):
        if not mgr.records_new_ids:
            patch(mgr, "_extend", _recording_extend(mgr))
    return m


def _recording_extend(mgr: SingleTypeKVCacheManager) -> Callable[[list[BlockId], int], list[BlockId]]:
    orig = mgr._extend

    def _extend(table: list[BlockId], n: int) -> list[BlockId]:
        new = orig(table, n)
        mgr.new_block_ids += new
        return new

    return _extend


@unseen(
    "loop stops early",
    "pop_blocks_for_free drops only the first of a table's leading null blocks, not all of them, so the "
    "scheduler is handed null blocks to free (vLLM 0.33.0, where pop_blocks_for_free drops leading nulls)",
    profile="vllm-0.33.0",
)
def pop_trims_one_null(config: KVCacheConfig) -> ImplAdapter:
    """Only table[0] is trimmed when it is null."""
    m = mutant(config, "pop_trims_one_null")
    for mgr in m.coordinator.managers:
        if mgr.pop_trims_nulls:
            patch(mgr, "pop_blocks_for_free", _trim_one(mgr))
    return m


def _trim_one(mgr: SingleTypeKVCacheManager) -> Callable[[str], list[BlockId]]:
    def pop_blocks_for_free(request_id: str) -> list[BlockId]:
        table = mgr._forget(request_id)
        return table[1:] if table and table[0] == NULL_BLOCK else table

    return pop_blocks_for_free


@unseen(
    "condition dropped (vLLM 0.32.0's tail rule)",
    "a full-attention group coarser than the hash block registers its partial tail at the prompt's last hash "
    "boundary instead of the last one below the prompt's last token, so a prompt that ends on a hash "
    "boundary keys a block no resend can hit (vLLM 0.33.0; hybrids with partial tails)",
    profile="vllm-0.33.0",
)
def tail_at_prompt_end(config: KVCacheConfig) -> ImplAdapter:
    """Partial tails are registered as before vLLM 0.32.0."""
    m = mutant(config, "tail_at_prompt_end")
    for mgr in m.coordinator.managers:
        if mgr.partial_tail and mgr.fa_tail_below_last:
            patch(mgr, "cache_blocks", _tail_rule_off(mgr))
    return m


def _tail_rule_off(mgr: SingleTypeKVCacheManager) -> Callable[[Request, int], None]:
    orig = mgr.cache_blocks

    def cache_blocks(request: Request, num_tokens: int) -> None:
        mgr.fa_tail_below_last = False
        try:
            orig(request, num_tokens)
        finally:
            mgr.fa_tail_below_last = True

    return cache_blocks


# -- the coordinator: EAGLE, the hybrid caching bound, cross attention, the prefix hint --------------


@unseen(
    "re-plant: vllm#17137 (before it, an EAGLE hit kept its last block)",
    "with EAGLE, a full-attention lookup keeps the last matched block instead of dropping it, so the draft "
    "model never recomputes the hidden states that block's KV came with (one full-attention group)",
)
def eagle_hit_keeps_last_block(config: KVCacheConfig) -> ImplAdapter:
    """The unitary lookup of an EAGLE full-attention group does not drop a block."""
    m = mutant(config, "eagle_hit_keeps_last_block")
    coord = m.coordinator
    kind = coord.managers[0].kind
    if isinstance(coord, UnitaryCoordinator) and isinstance(kind, FULL_TYPE_KINDS) and 0 in coord.eagle_group_ids:

        def find(block_hashes: Sequence[Any], max_len: int) -> tuple[Any, int]:
            found = find_longest_cache_hit(kind, block_hashes, max_len, [0], coord.pool, False, kind.block_size)[0]
            return (found,), len(found) * kind.block_size

        patch(coord, "find_longest_cache_hit", find)
    return m


@unseen(
    "wrong unit (the hash block for the scheduler block, the LCM of vllm#29143)",
    "a hybrid caches its blocks up to a hash-block boundary instead of a scheduler-block boundary (the LCM "
    "of the block sizes), so full-attention groups cache blocks past any length a hit can have",
)
def cache_aligned_to_hash_block(config: KVCacheConfig) -> ImplAdapter:
    """HybridCoordinator.cache_blocks aligns to hash_block_size."""
    m = mutant(config, "cache_aligned_to_hash_block")
    coord = m.coordinator
    if isinstance(coord, HybridCoordinator) and coord.cache_reachable_only and not coord.partial_hash_hits:

        def cache_blocks(request: Request, num_tokens: int) -> None:
            unit = coord.hash_block_size  # the fault: the scheduler block is meant
            aligned = num_tokens // unit * unit
            for mgr in coord.managers:
                n = aligned
                if mgr.use_eagle and aligned > 0:
                    n = min(num_tokens, aligned + mgr.block_size)
                mgr.cache_blocks(request, n)

        patch(coord, "cache_blocks", cache_blocks)
    return m


@unseen(
    "arguments swapped",
    "the coordinator sizes cross-attention tables by the decoder's slot count instead of the encoder "
    "tokens (the estimate still uses the encoder), so encoder-decoder requests get too few or too many "
    "cross blocks and keep growing them every step",
)
def cross_sized_by_decoder(config: KVCacheConfig) -> ImplAdapter:
    """Cross-attention managers grow with num_tokens."""
    m = mutant(config, "cross_sized_by_decoder")
    coord = m.coordinator
    if any(isinstance(mgr, CrossAttentionManager) for mgr in coord.managers):
        patch(coord, "allocate_new_blocks", _cross_by_decoder(coord))
    return m


def _cross_by_decoder(coord: KVCacheCoordinator) -> Callable[[str, int, int, int], Any]:
    def allocate_new_blocks(request_id: str, num_tokens: int, num_tokens_main_model: int, num_encoder: int) -> Any:
        return tuple(mgr.allocate_new_blocks(request_id, num_tokens, num_tokens_main_model) for mgr in coord.managers)

    return allocate_new_blocks


@unseen(
    "wrong operand",
    "a hybrid lookup reports as the uncached common prefix the longest single-kind hit itself instead of how "
    "far it reaches past the reconciled hit, so the scheduler's prefix hint counts the hit twice "
    "(vLLM 0.25.1, where the hint is the coordinator's)",
)
def prefix_hint_counts_hit(config: KVCacheConfig) -> ImplAdapter:
    """num_uncached_common_prefix_tokens = longest instead of longest - hit."""
    m = mutant(config, "prefix_hint_counts_hit")
    coord = m.coordinator
    if isinstance(coord, HybridCoordinator) and coord.eagle_lookahead:
        orig = coord.find_longest_cache_hit

        def find(block_hashes: Sequence[Any], max_len: int) -> tuple[Any, int]:
            blocks, hit = orig(block_hashes, max_len)
            coord.num_uncached_common_prefix_tokens += hit
            return blocks, hit

        patch(coord, "find_longest_cache_hit", find)
    return m


# -- the facade: the deferred free, statistics, lookups, the connector's calls ------------------------


@unseen(
    "re-plant: vllm#45357 (the race it fixed: blocks returned before in-flight steps finish)",
    "pop_blocks_for_free drops the request's references at once instead of leaving them pending, so its "
    "blocks can be reallocated while an in-flight step still writes them (and the later deferred free "
    "fails)",
)
def popped_freed_at_once(config: KVCacheConfig) -> ImplAdapter:
    """The popped blocks are freed right away (last first) and still counted pending."""
    m = mutant(config, "popped_freed_at_once")
    orig = m.pop_blocks_for_free

    def pop_blocks_for_free(request_id: str) -> tuple[BlockId, ...]:
        blocks = orig(request_id)
        m.block_pool.free_blocks(reversed(blocks))
        return blocks

    patch(m, "pop_blocks_for_free", pop_blocks_for_free)
    return m


@unseen(
    "missing reset",
    "a successful reset_prefix_cache does not set the statistics' reset flag, so the hit rate over the "
    "reset is averaged with the old cache's",
)
def stats_reset_flag_lost(config: KVCacheConfig) -> ImplAdapter:
    """The reset flag of the statistics is left as it was."""
    m = mutant(config, "stats_reset_flag_lost")
    orig = m.reset_prefix_cache

    def reset_prefix_cache() -> bool:
        stats = m.prefix_cache_stats
        flag = stats.reset if stats is not None else False
        done = orig()
        if stats is not None:
            stats.reset = flag
        return done

    patch(m, "reset_prefix_cache", reset_prefix_cache)
    return m


@unseen(
    "re-plant: vllm#57596 (issue; there the connector's counters)",
    "record_prefix_cache_stats counts a request that skipped reading the prefix cache (prompt logprobs, "
    "some pooling tasks) as a lookup with no hit, so those requests drag the hit rate down (vLLM 0.27.0 on, "
    "where the scheduler records at admission)",
    profile="vllm-0.33.0",
)
def skip_reading_counted(config: KVCacheConfig) -> ImplAdapter:
    """record_prefix_cache_stats ignores skip_reading_prefix_cache."""
    m = mutant(config, "skip_reading_counted")
    orig = m.record_prefix_cache_stats

    def record_prefix_cache_stats(request: Request, num_hits: int) -> None:
        orig(replace(request, skip_reading_prefix_cache=False) if isinstance(request, Request) else request, num_hits)

    patch(m, "record_prefix_cache_stats", record_prefix_cache_stats)
    return m


@unseen(
    "re-plant: vllm#57269 (the connector side of the same fault)",
    "get_computed_blocks looks up a request that asked to skip reading the prefix cache, so a "
    "prompt-logprobs request gets a hit and its logprobs for the cached tokens are never computed",
)
def skip_reading_ignored(config: KVCacheConfig) -> ImplAdapter:
    """Lookups ignore skip_reading_prefix_cache."""
    m = mutant(config, "skip_reading_ignored")
    orig = m.get_computed_blocks

    def get_computed_blocks(request: Request) -> Any:
        return orig(replace(request, skip_reading_prefix_cache=False) if isinstance(request, Request) else request)

    patch(m, "get_computed_blocks", get_computed_blocks)
    return m


@unseen(
    "rounding down (floor for ceil)",
    "get_block_ids_for_computed_tokens cuts each table to num_computed // block_size blocks, leaving out "
    "the partially computed last block the connector must also save",
)
def computed_ids_round_down(config: KVCacheConfig) -> ImplAdapter:
    """The cut of get_block_ids_for_computed_tokens rounds down."""
    m = mutant(config, "computed_ids_round_down")
    orig = m.get_block_ids_for_computed_tokens

    def get_block_ids_for_computed_tokens(request_id: str, num_computed_tokens: int) -> Any:
        tables = orig(request_id, num_computed_tokens)  # the checks, and the tables where nothing is cut
        whole = m.get_blocks(request_id)
        return tuple(
            t[: num_computed_tokens // bs] if bs else cut
            for t, cut, bs in zip(whole, tables, m.clip_sizes, strict=True)
        )

    patch(m, "get_block_ids_for_computed_tokens", get_block_ids_for_computed_tokens)
    return m


@unseen(
    "wrong unit (the scaled manager block for the configured one)",
    "under decode context parallelism get_block_ids_for_computed_tokens cuts the tables by the scaled "
    "manager block size instead of the group's configured one, as vLLM reads it from the group's spec, so "
    "the connector gets fewer blocks",
)
@declare(features=("context-parallelism",))  # else the lockstep refuses every configuration it is planted in
def cp_cut_by_scaled_block(config: KVCacheConfig) -> ImplAdapter:
    """get_block_ids_for_computed_tokens with the managers' (scaled) block sizes."""
    m = mutant(config, "cp_cut_by_scaled_block")
    orig = m.get_block_ids_for_computed_tokens
    scaled = tuple(k.block_size if bs else 0 for k, bs in zip(m.kinds, m.clip_sizes, strict=True))

    def get_block_ids_for_computed_tokens(request_id: str, num_computed_tokens: int) -> Any:
        tables = orig(request_id, num_computed_tokens)
        whole = m.get_blocks(request_id)
        return tuple(
            t[: cdiv(num_computed_tokens, bs)] if bs else cut for t, cut, bs in zip(whole, tables, scaled, strict=True)
        )

    patch(m, "get_block_ids_for_computed_tokens", get_block_ids_for_computed_tokens)
    return m


@unseen(
    "min for max",
    "estimate_cached_tokens takes the largest count over the groups instead of the smallest, so a hybrid "
    "whose sliding-window group already freed its blocks reports its full-attention prefix as cached "
    "(vLLM 0.26.0 on)",
    profile="vllm-0.33.0",
)
def estimate_max_over_groups(config: KVCacheConfig) -> ImplAdapter:
    """The per-group counts are combined with max."""
    m = mutant(config, "estimate_max_over_groups")
    orig = m.estimate_cached_tokens

    def estimate_cached_tokens(request: Request) -> int:
        orig(request)  # the checks
        rid, managers, pool = request.request_id, m.coordinator.managers, m.block_pool
        counts: list[int | None] | None = getattr(pool, "hash_num_tokens", None)
        found = [
            table_cached_tokens(managers[g].req_to_blocks.get(rid, ()), pool.block_hash, counts, m.kinds[g].block_size)
            for g in m.estimate_groups
        ]
        return max(found, default=0)

    patch(m, "estimate_cached_tokens", estimate_cached_tokens)
    return m


@unseen(
    "condition dropped",
    "the watermark applies to running requests too, not only to waiting and preempted ones, so a running "
    "request's next block is refused while blocks are free and the scheduler preempts needlessly",
)
def watermark_on_running(config: KVCacheConfig) -> ImplAdapter:
    """allocate_slots treats every request as waiting for the watermark."""
    m = mutant(config, "watermark_on_running")
    orig = m.allocate_slots

    def allocate_slots(request: Request, *args: Any, **kwargs: Any) -> Any:
        if isinstance(request, Request) and request.status == RequestStatus.RUNNING:
            request = replace(request, status=RequestStatus.WAITING)
        return orig(request, *args, **kwargs)

    patch(m, "allocate_slots", allocate_slots)
    return m


@unseen(
    "statement misplaced",
    "an allocation with delay_cache_blocks does not hash its blocks but still moves the cache cursor over "
    "them, so the cache_blocks call after the connector's load hashes nothing",
)
def delay_moves_cursor(config: KVCacheConfig) -> ImplAdapter:
    """A delayed allocation advances num_cached_block as if it had cached."""
    m = mutant(config, "delay_moves_cursor")
    orig = m.allocate_slots

    def allocate_slots(*args: Any, **kwargs: Any) -> Any:
        out = orig(*args, **kwargs)
        a = bound_args(orig, args, kwargs)
        request = a["request"]
        if out is None or not a["delay_cache_blocks"] or not m.enable_caching:
            return out
        tokens = request.num_computed_tokens + a["num_new_computed_tokens"] + a["num_external_computed_tokens"]
        upto = min(tokens + a["num_new_tokens"], request.num_tokens)
        for mgr in m.coordinator.managers:
            table = mgr.req_to_blocks.get(request.request_id)
            if table and not isinstance(mgr, CrossAttentionManager) and isinstance(mgr.kind, _CACHED_KINDS):
                have = mgr.num_cached_block.get(request.request_id, 0)
                mgr.num_cached_block[request.request_id] = max(have, min(upto // mgr.block_size, len(table)))
        return out

    patch(m, "allocate_slots", allocate_slots)
    return m


_CACHED_KINDS = (*FULL_TYPE_KINDS, SlidingWindow, ChunkedLocal, Mamba)
"""Kinds whose managers keep a cache cursor (all but cross attention and the rings)."""
