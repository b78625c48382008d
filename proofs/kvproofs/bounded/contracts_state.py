"""Contract domains of the functions that read or change state: the pool's
switch readers, the feature modules' rules on real managers and pools (tail
entries, partial hits, copy-on-write), the facade's helpers, events and views.

Managers and pools are built under each profile (a
:class:`~kvproofs.bounded.pep316.Scenario`), with the requests of a real
:class:`kvspec.request.RequestBlockHasher`; a mutating function gets a fresh
state per case.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from itertools import product

from kvproofs.bounded.domains import KINDS, PROFILE_LIST, configs, subsets
from kvproofs.bounded.pep316 import Case, Scenario, contract
from kvspec.block_pool import BlockId, BlockPool
from kvspec.config import (
    AttentionKind,
    CrossAttention,
    FullAttention,
    KVCacheConfig,
    Mamba,
    SlidingWindow,
    prefix_cacheable,
)
from kvspec.events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvspec.hashing import BlockHash, ExtraKeySource, LoRA, MultiModalFeature, make_key
from kvspec.profiles import SemanticsProfile
from kvspec.request import REPORT_MODES, Request, RequestBlockHasher
from kvspec.single_type_kv_cache_manager import MambaManager, SingleTypeKVCacheManager, make_manager
from kvspec.view import KVView

BP = "kvspec.block_pool"
STM = "kvspec.single_type_kv_cache_manager"
KCM = "kvspec.kv_cache_manager"


def _pool(caching: bool, profile: SemanticsProfile) -> Case:
    return (BlockPool(4, caching, 1, profile=profile),)


def _pool_skipped(caching: bool, skipped: bool, profile: SemanticsProfile) -> Case:
    return BlockPool(4, caching, 1, profile=profile), skipped


@contract(
    f"{BP}.requeue_unhashed_first", "a pool with caching on and off x blocks skipped or not under every profile"
)
def _requeue_unhashed_first() -> Iterator[Scenario]:
    for caching, skipped in product((True, False), (False, True)):
        yield Scenario(partial(_pool_skipped, caching, skipped))


@contract(f"{BP}.annotated_events", "a pool with caching on and off under every profile")
def _annotated_events() -> Iterator[Scenario]:
    for caching in (True, False):
        yield Scenario(partial(_pool, caching))


# --- requests and managers ----------------------------------------------------------

_EXTRAS: tuple[ExtraKeySource, ...] = (
    ExtraKeySource(),
    ExtraKeySource(lora=LoRA("a", 1, "/adapters/a"), cache_salt="s"),
    ExtraKeySource(mm_features=(MultiModalFeature("img", 1, 2), MultiModalFeature("aud", 4, 3))),
)


def _request(
    profile: SemanticsProfile, hbs: int, tokens: int, extra: ExtraKeySource = _EXTRAS[0], rid: str = "r"
) -> Request:
    hasher = RequestBlockHasher("sha256", "0", hbs, profile)
    return hasher.new_request(rid, [t % 7 for t in range(tokens)], extra)


def _mamba_case(
    kind: Mamba,
    hbs: int,
    prompt: int,
    step: int,
    eagle: tuple[bool, ...],
    cache_first: bool,
    profile: SemanticsProfile,
) -> Case:
    """An align-mode Mamba manager whose request is allocated up to ``step``
    tokens (cached there first when ``cache_first``), and the request."""
    pool = BlockPool(32, True, hbs, profile=profile)
    manager = MambaManager(kind, pool, True, 0, kind.block_size, profile)
    manager.use_eagle, manager.drop_eagle_checkpoint = eagle[0], eagle[1]
    request = _request(profile, hbs, prompt)
    manager.allocate_new_blocks(request.request_id, step, step)
    if cache_first:
        manager.cache_blocks(request, step)
    return manager, request, step


@contract(
    "kvspec.mamba_tail.cache_mamba_tail_block",
    "Mamba align groups of 2 and 4 tokens (hash block 2) x prompts of 3-8 tokens x every step 1 to the "
    "prompt, cached first or not x group and model EAGLE flags x every profile",
)
def _mamba_tail() -> Iterator[Scenario]:
    for kind, prompt, eagle, cache_first in product(
        (Mamba(2, "align"), Mamba(4, "align"), Mamba(4, "align", 1)),
        range(3, 9),
        product((False, True), repeat=2),
        (False, True),
    ):
        for step in range(1, prompt + 1):
            yield Scenario(partial(_mamba_case, kind, 2, prompt, step, eagle, cache_first))


def _shift_case(eagle: tuple[bool, ...], profile: SemanticsProfile) -> Case:
    manager = MambaManager(Mamba(4, "align"), BlockPool(4, True, 2, profile=profile), True, 0, 4, profile)
    manager.use_eagle, manager.drop_eagle_checkpoint = eagle[0], eagle[1]
    return (manager,)


@contract(
    "kvspec.mamba_tail.tail_eagle_shift", "a Mamba align manager x its group and model EAGLE flags x every profile"
)
def _tail_eagle_shift() -> Iterator[Scenario]:
    for eagle in product((False, True), repeat=2):
        yield Scenario(partial(_shift_case, eagle))


def _guard_case(hits: int, this_step: tuple[bool, ...], profile: SemanticsProfile) -> Case:
    pool = BlockPool(8, True, 2, profile=profile)
    manager = MambaManager(Mamba(2, "align"), pool, True, 0, 2, profile)
    keys = [make_key(BlockHash(bytes([i + 1])), 0) for i in range(3)]
    for b, key in enumerate(keys, start=1):
        pool.insert_key(BlockId(b), key, 2 * b)
    manager.cached_blocks_this_step = {k for k, on in zip(keys, this_step, strict=True) if on}
    return manager, [BlockId(b) for b in range(1, hits + 1)]


@contract(
    f"{STM}.mamba_step_guarded",
    "a Mamba manager x 0-3 hit blocks x every subset of their keys cached this step x every profile",
)
def _step_guard() -> Iterator[Scenario]:
    for hits, this_step in product(range(4), subsets(3)):
        yield Scenario(partial(_guard_case, hits, this_step))


def _make_manager_case(
    kind: AttentionKind, caching: bool, cap: int | None, has_mamba: bool, profile: SemanticsProfile
) -> Case:
    return kind, BlockPool(16, caching, kind.block_size, profile=profile), caching, 1, 4, cap, profile, has_mamba


@contract(f"{STM}.make_manager", "the kind catalog x caching x admission cap None/3 x has_mamba x every profile")
def _make_manager() -> Iterator[Scenario]:
    for kind, caching, cap, has_mamba in product(KINDS, (True, False), (None, 3), (False, True)):
        yield Scenario(partial(_make_manager_case, kind, caching, cap, has_mamba))


def _fa_case(
    bs: int, hbs: int, prompt: int, step: int, use_eagle: bool, cache_first: bool, profile: SemanticsProfile
) -> Case:
    pool = BlockPool(32, True, hbs, profile=profile)
    manager = SingleTypeKVCacheManager(FullAttention(bs), pool, True, 0, bs, None, profile)
    manager.use_eagle = use_eagle
    request = _request(profile, hbs, prompt)
    manager.allocate_new_blocks(request.request_id, step, step)
    if cache_first:
        manager.cache_blocks(request, step)
    return manager, request, step


@contract(
    "kvspec.partial_tail.cache_partial_tail_block",
    "full-attention blocks of 4 tokens at hash blocks 1 and 2 x prompts of 1-9 tokens x every step to the"
    " prompt, cached first or not x EAGLE x every profile",
)
def _partial_tail() -> Iterator[Scenario]:
    for hbs, prompt, use_eagle, cache_first in product((1, 2), range(1, 10), (False, True), (False, True)):
        for step in range(1, prompt + 1):
            yield Scenario(partial(_fa_case, 4, hbs, prompt, step, use_eagle, cache_first))


def _partial_block_case(state: int, b: int, n: int, events: bool, profile: SemanticsProfile) -> Case:
    """Block ``b`` of a pool (hash block 2) in one of four states: unhashed;
    keyed for 2 tokens; keyed for 4 tokens with a second key for 2; keyed
    by the request's own hash at ``n`` already."""
    pool = BlockPool(8, True, 2, enable_kv_cache_events=events, profile=profile)
    request = _request(profile, 2, 8, _EXTRAS[1])
    block = BlockId(b)
    if state == 1:
        pool.insert_key(block, make_key(request.block_hashes[0], 0), 2)
    elif state == 2:
        pool.insert_key(block, make_key(BlockHash(b"other"), 0), 4)
        pool.insert_key(block, make_key(request.block_hashes[0], 0), 2)
    elif state == 3:
        pool.insert_key(block, make_key(request.block_hashes[n // 2 - 1], 0), n)
    return pool, request, block, n, 0


@contract(
    "kvspec.partial_tail.cache_partial_block",
    "the null block and a block in each of four key states x 2-8 tokens x events on/off x every profile",
)
def _partial_block() -> Iterator[Scenario]:
    for state, b, n, events in product(range(4), (0, 1), (2, 4, 6, 8), (False, True)):
        if b == 0 and state:
            continue
        yield Scenario(partial(_partial_block_case, state, b, n, events))


@contract(
    "kvspec.prefill_checkpoints.rekey_checkpoint_block",
    "the null block and a block in each of four key states x 2-8 tokens x events on/off x every profile",
)
def _rekey_checkpoint_block() -> Iterator[Scenario]:
    for state, b, n, events in product(range(4), (0, 1), (2, 4, 6, 8), (False, True)):
        if b == 0 and state:
            continue
        yield Scenario(partial(_partial_block_case, state, b, n, events))


def _stored_case(extra: int, n: int, as_int: bool, profile: SemanticsProfile) -> Case:
    pool = BlockPool(8, True, 2, int_block_hashes=as_int, profile=profile)
    return pool, _request(profile, 2, 8, _EXTRAS[extra]), n, 1


@contract(
    "kvspec.partial_tail.partial_stored_event",
    "requests without extra keys, with LoRA and salt, with two multimodal features x 2-8 tokens x int or "
    "byte hashes x every profile",
)
def _stored_event() -> Iterator[Scenario]:
    for extra, n, as_int in product(range(len(_EXTRAS)), (2, 4, 6, 8), (False, True)):
        yield Scenario(partial(_stored_case, extra, n, as_int))


def _table_manager(profile: SemanticsProfile, n: int) -> SingleTypeKVCacheManager:
    pool = BlockPool(16, True, 2, profile=profile)
    manager = SingleTypeKVCacheManager(FullAttention(4), pool, True, 0, 4, None, profile)
    manager.allocate_new_blocks("r", 4 * n, 4 * n)
    manager.num_cached_block["r"] = n
    return manager


def _record_case(n: int, idx: int, profile: SemanticsProfile) -> Case:
    manager = _table_manager(profile, n)
    return manager, "r", idx, manager.req_to_blocks["r"][idx]


@contract("kvspec.partial_hits.record_partial_hit", "a table of 1-3 blocks x each index x every profile")
def _record_partial_hit() -> Iterator[Scenario]:
    for n in range(1, 4):
        for idx in range(n):
            yield Scenario(partial(_record_case, n, idx))


def _cow_case(n: int, idx: int, profile: SemanticsProfile) -> Case:
    manager = _table_manager(profile, n)
    cow = manager.pool.get_new_blocks(1)[0]
    return manager, "r", idx, manager.req_to_blocks["r"][idx], cow


@contract(
    "kvspec.partial_hits.apply_cow", "a table of 1-3 blocks x each index, with a fresh copy block x every profile"
)
def _apply_cow() -> Iterator[Scenario]:
    for n in range(1, 4):
        for idx in range(n):
            yield Scenario(partial(_cow_case, n, idx))


def _move_case(keys: int, shared: bool, profile: SemanticsProfile) -> Case:
    pool = BlockPool(8, True, 2, enable_kv_cache_events=True, profile=profile)
    src, dst, other = BlockId(1), BlockId(2), BlockId(3)
    all_keys = [make_key(BlockHash(bytes([i + 1])), 0) for i in range(keys)]
    for i, key in enumerate(all_keys):
        pool.insert_key(src, key, 8 - 2 * i)
        if shared:
            pool.insert_key(other, key, 8 - 2 * i)
    return pool, src, dst


@contract(
    "kvspec.partial_hits.move_block_hashes",
    "a block with 0-3 keys (a primary and secondaries), each shared with another block or not, moved to "
    "an unhashed block x every profile",
)
def _move_block_hashes() -> Iterator[Scenario]:
    for keys, shared in product(range(4), (False, True)):
        yield Scenario(partial(_move_case, keys, shared))


def _peek_case(eagle: bool, profile: SemanticsProfile) -> Case:
    manager = make_manager(FullAttention(2), BlockPool(4, True, 2, profile=profile), True, 0, 2, None, profile)
    manager.use_eagle = eagle
    return (manager,)


@contract(f"{STM}.caches_eagle_peek", "a full-attention manager with EAGLE on and off x every profile")
def _caches_eagle_peek() -> Iterator[Scenario]:
    for eagle in (False, True):
        yield Scenario(partial(_peek_case, eagle))


# --- facade helpers, events, views --------------------------------------------------


def _hit_request(
    tokens: int, skip: bool | None, logprobs: bool, start: int | None, flip: bool, profile: SemanticsProfile
) -> Request:
    hasher = RequestBlockHasher("sha256", "0", 2, profile)
    request = hasher.new_request("r", list(range(tokens)), skip_reading_prefix_cache=skip,
                                 prompt_logprobs=logprobs, prompt_logprob_start=start)  # fmt: skip
    if flip:  # changed after construction (the scheduler may, for a resumed request)
        request = replace(request, skip_reading_prefix_cache=not request.skip_reading_prefix_cache)
    return request


_HIT_REQUESTS = [
    (tokens, skip, logprobs, start, flip)
    for tokens, skip, logprobs, flip in product((1, 4), (None, False, True), (False, True), (False, True))
    for start in ((None, 0, 2) if logprobs else (None,))
]


def _reads_case(args: tuple[int, bool | None, bool, int | None, bool], profile: SemanticsProfile) -> Case:
    return profile, _hit_request(*args, profile)


@contract(
    f"{KCM}.reads_prefix_cache",
    "requests of 1 and 4 tokens x skip None/False/True x prompt logprobs off, or on with start None/0/2 "
    "x skip flipped after construction or not x every profile",
)
def _reads_prefix_cache() -> Iterator[Scenario]:
    for args in _HIT_REQUESTS:
        yield Scenario(partial(_reads_case, args))


@contract(
    f"{KCM}.reports_hits",
    "full attention with events on or off x caching on or off x report mode incremental or full x every profile",
)
def _reports_hits() -> Iterator[Case]:
    for events, caching, mode, profile in product((True, False), (True, False), REPORT_MODES, PROFILE_LIST):
        cfg = KVCacheConfig(
            num_blocks=8, groups=(FullAttention(2),), max_model_len=16, profile=profile,
            enable_kv_cache_events=events, enable_caching=caching,
        )  # fmt: skip
        request = RequestBlockHasher.for_config(cfg).new_request("r", [1, 2, 3], kv_cache_report_mode=mode)
        yield cfg, request


def _length_case(
    args: tuple[int, bool | None, bool, int | None, bool], bound: int | None, profile: SemanticsProfile
) -> Case:
    return profile, _hit_request(*args, profile), bound


@contract(
    f"{KCM}.lookup_length",
    "the requests of reads_prefix_cache's domain x bound None/0/1/5 x every profile",
)
def _lookup_length() -> Iterator[Scenario]:
    for args, bound in product(_HIT_REQUESTS, (None, 0, 1, 5)):
        yield Scenario(partial(_length_case, args, bound))


@contract(f"{KCM}.check_request", "requests with a str id, and an id that is not a str, None, a str and an int")
def _check_request() -> Iterator[Case]:
    request = _request(PROFILE_LIST[-1], 2, 4)
    yield (request,)
    yield (Request(7, (), 0, ()),)  # type: ignore[arg-type]  # a non-str id on purpose
    for other in (None, "r", 3):
        yield (other,)


@contract(
    f"{KCM}.hit_covers_length",
    "every valid cached configuration of the domain x hit lists of 0-3 blocks per group x hit 0-8 tokens "
    "x max_len 0-8 (alignment the hit alignment)",
)
def _hit_covers_length() -> Iterator[Case]:
    seen = set()
    for cfg in configs():
        key = (cfg.groups, cfg.dcp_world_size, cfg.pcp_world_size, cfg.enable_caching)
        if not cfg.enable_caching or key in seen or len(cfg.groups) > 2:
            continue
        seen.add(key)
        for lengths in product(range(4), repeat=len(cfg.groups)):
            blocks = tuple([BlockId(1)] * n for n in lengths)
            for n, max_len, alignment in product(range(0, 9, 2), (0, 3, 8), (2, 4)):
                yield cfg, blocks, n, max_len, alignment


@contract(
    f"{KCM}.estimate_from_tables",
    "one or two groups of the kind catalog x per-block token counts 0/3 for tables of 0-2 blocks x skip_uncacheable",
)
def _estimate() -> Iterator[Case]:
    tables = ((), (0,), (3,), (0, 3), (3, 0))
    for kinds in (
        *((k,) for k in KINDS),
        *product(
            (
                FullAttention(2),
                CrossAttention(2),
                SlidingWindow(2, 3),
                *[k for k in KINDS if not prefix_cacheable(k)][:1],
            ),
            repeat=2,
        ),
    ):
        for counts in product(tables, repeat=len(kinds)):
            for skip in (False, True):
                yield counts, kinds, skip


@contract(
    f"{KCM}.clip_to_computed", "one or two groups of the kind catalog x tables of 0-3 blocks x 0-9 computed tokens"
)
def _clip() -> Iterator[Case]:
    for kinds in (
        *((k,) for k in KINDS),
        *product((FullAttention(2), Mamba(4, "align"), SlidingWindow(4, 5)), repeat=2),
    ):
        for lengths in product(range(4), repeat=len(kinds)):
            tables = tuple(tuple(range(1, n + 1)) for n in lengths)
            for computed in range(10):
                yield tables, kinds, computed


_KEYS = ((b"a", 0), (b"b", 1))


def _events() -> Iterator[tuple[KVCacheEvent, ...]]:
    stored = [BlockStored((k,), None, (), 2, None, "GPU", None, None, g) for k, g in _KEYS]
    removed = [BlockRemoved((k,), "GPU", g) for k, g in _KEYS]
    singles: list[KVCacheEvent] = [*stored, *removed, AllBlocksCleared()]
    yield ()
    for n in (1, 2):
        yield from product(singles, repeat=n)


@contract(
    f"{KCM}.replay_events",
    "an empty, a one-key and a two-key multiset x every sequence of at most two events (stored, removed "
    "of two keys, cleared)",
)
def _replay() -> Iterator[Case]:
    for start in ({}, {(b"a", 0): 1}, {(b"a", 0): 2, (b"b", 1): 1}):
        for events in _events():
            yield Counter(start), list(events)


def _views() -> list[KVView]:
    base = KVView((1, 2), ((3, 1),), ((b"k", (3,)),), (("r", ((3,),)),), 0.25)
    return [
        base,
        KVView((1,), ((2, 1), (3, 1)), ((b"k", (3,)),), (("r", ((3, 2),)),), 0.5),
        KVView((1, 2), ((3, 1),), (), (("r", ((0,),)),), 0.25),
        KVView((1, 2, 3), (), ((b"k", (3,)),), (), 0.0),
        KVView((2, 1), ((3, 1),), ((b"j", (3,)),), (("s", ((3,),)),), 0.25),
    ]


@contract(
    "kvspec.invariants.inv_tables_append_only",
    "every ordered pair of five views (a table that grows, one nulled, one gone, another request)",
)
def _append_only() -> Iterator[Case]:
    yield from product(_views(), repeat=2)


@contract(
    "kvspec.invariants.inv_hash_lifetime",
    "every ordered pair of five views x four operations (eviction, allocation, free, lookup)",
)
def _hash_lifetime() -> Iterator[Case]:
    for before, after in product(_views(), repeat=2):
        for op in ("evict_blocks", "allocate_slots", "free", "get_computed_blocks"):
            yield before, after, op


@contract("kvspec.view.diff_views", "every ordered pair of five views")
def _diff_views() -> Iterator[Case]:
    yield from product(_views(), repeat=2)
