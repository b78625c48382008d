"""The view and the invariants of a native manager, read from the C core's raw state.

The same facts as the Python manager's ``to_view`` and ``check_invariants``
(kvimpl.block_pool, kvimpl.single_type_kv_cache_manager and
kvimpl.kv_cache_manager): this module reads the core's arrays through its
``_free_links``, ``_ref_counts``, ``_block_keys``, ``_cached``, ``_tables``,
``_group_state`` and ``_pending_counts`` methods and states each invariant
as one named predicate. Not on a hot path: every call copies the state out.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from kvimpl.invariants import require
from kvspec.config import MLA, ChunkedLocal, FullAttention, Mamba, SinkFullAttention, SlidingWindow
from kvspec.hashing import (
    BlockHash,
    BlockHashWithGroupId,
    coarse_block_hashes,
    external_block_hash,
    make_key,
    split_key,
)
from kvspec.view import KVView

NULL_BLOCK = 0
_FULL_TYPE = (FullAttention, MLA, SinkFullAttention)


@dataclass(frozen=True)
class GroupTable:
    """One request's state in one group, as the core holds it."""

    present: bool
    blocks: tuple[int, ...]
    num_cached: int
    """The num_cached_block entry, -1 when absent."""
    allocated: int
    last_state: int


@dataclass(frozen=True)
class CoreState:
    """A copy of everything the core holds."""

    nxt: list[int]
    prv: list[int]
    num_free: int
    ref: list[int]
    pending: list[int]
    keys: list[bytes | None]
    cached: dict[bytes, tuple[int, ...]]
    requests: dict[str, tuple[Any, list[GroupTable]]]
    num_tables: list[int]
    holders: list[list[int] | None]
    sink: list[int]


def core_state(mgr: Any) -> CoreState:
    """Copy the core's state out."""
    nxt, prv, num_free = mgr._free_links()
    requests = {
        rid: (req, [GroupTable(bool(p), tuple(ids), n, a, s) for p, ids, n, a, s in groups])
        for rid, req, groups in mgr._tables()
    }
    groups = [mgr._group_state(g) for g in range(len(mgr.config.groups))]
    return CoreState(
        list(nxt), list(prv), num_free, list(mgr._ref_counts()), list(mgr._pending_counts()), mgr._block_keys(),
        dict(mgr._cached()), requests, [n for n, _, _ in groups],
        [None if h is None else list(h) for _, h, _ in groups], [b for _, _, s in groups for b in s],
    )  # fmt: skip


def native_view(mgr: Any) -> KVView:
    """The normalized observable state (kvimpl's ``KVCacheManager.to_view``)."""
    tables = []
    for rid, _, groups in sorted(mgr._tables(), key=lambda row: row[0]):
        ids = tuple(tuple(g[1]) if g[0] else () for g in groups)
        if any(ids):
            tables.append((rid, ids))
    ref = mgr._ref_counts()
    return KVView(
        free_queue=tuple(mgr._free_order()),
        ref_cnt=tuple((b, n) for b, n in enumerate(ref) if b != NULL_BLOCK and n > 0),
        cached=tuple(sorted((k, tuple(ids)) for k, ids in mgr._cached())),
        tables=tuple(tables),
        usage=mgr.usage,
    )


def native_invariants(mgr: Any) -> None:
    """Raise InvariantViolation if an invariant of the native state is broken."""
    st = core_state(mgr)
    kinds = mgr._kinds  # the block sizes the managers run (context parallelism scales them)
    require(inv_free_ring(st), "free queue: the links do not form one ring over the free blocks")
    require(inv_free_set(st), "free queue != {non-null, non-sink, ref 0}")
    require(all(r >= 0 for r in st.ref[1:]) and all(p >= 0 for p in st.pending), "negative ref_cnt or pending count")
    require(st.keys[NULL_BLOCK] is None, "the null block is hashed")
    require(inv_cache_map(st), "cache map and block hashes disagree")
    for g, kind in enumerate(kinds):
        require(inv_uncached_tail(st, g), f"group {g}: hashed block past num_cached_block")
        require(inv_null_shape(st, g, kind), f"group {g}: table has an impossible null pattern")
        require(inv_holders_count(st, g), f"group {g}: holder counts disagree with the tables")
    require(inv_ref_cnt_counts_holders(st), "ref_cnt != table occurrences + pending")
    require(inv_group_exclusive(st), "a block is in the tables of two groups")
    require(inv_hash_content(st, kinds, mgr.config), "a cached block's key is not its prefix hash")
    require(inv_events_replay_to_cache(mgr, st), "the event stream does not rebuild the cache map")


def inv_events_replay_to_cache(mgr: Any, st: CoreState) -> bool:
    """With events on, replaying every event since construction (taken and
    pending) rebuilds the cache map's entries exactly."""
    if not mgr.config.enable_kv_cache_events:
        return True
    from kvimpl.native_events import events_from_records, replay_events  # noqa: PLC0415 - only with events on

    keys = Counter(mgr.event_keys)
    replay_events(keys, [*mgr.drained_events, *events_from_records(mgr.config, mgr._pending_raw_events())])
    keys.subtract(mgr.reannounced)
    as_int = mgr.config.int_block_hashes
    expected: Counter[tuple[object, int | None]] = Counter()
    for key, ids in st.cached.items():
        digest, gid = split_key(BlockHashWithGroupId(key))
        expected[(external_block_hash(digest, as_int), gid)] += len(ids)
    return {k: v for k, v in keys.items() if v} == expected


def inv_free_ring(st: CoreState) -> bool:
    """Walking nxt from the sentinel visits num_free blocks and returns, prv inverting nxt."""
    s = len(st.nxt) - 1
    b, prev, seen = st.nxt[s], s, 0
    while b != s:
        if seen > s or st.prv[b] != prev:
            return False
        seen += 1
        prev, b = b, st.nxt[b]
    return st.prv[s] == prev and seen == st.num_free


def free_order(st: CoreState) -> list[int]:
    """The free queue head to tail."""
    s, out = len(st.nxt) - 1, list[int]()
    b = st.nxt[s]
    while b != s and len(out) <= s:
        out.append(b)
        b = st.nxt[b]
    return out


def inv_free_set(st: CoreState) -> bool:
    """Exactly the non-null, non-sink blocks with ref_cnt 0 are free, once each."""
    order = free_order(st)
    expected = {b for b in range(1, len(st.ref)) if st.ref[b] == 0} - set(st.sink)
    return len(set(order)) == len(order) and set(order) == expected


def inv_cache_map(st: CoreState) -> bool:
    """cached[k] lists exactly the blocks whose key is k, in ascending id order as a set."""
    by_key: dict[bytes, list[int]] = {}
    for b, key in enumerate(st.keys):
        if key is not None:
            by_key.setdefault(key, []).append(b)
    listed = {k: sorted(ids) for k, ids in st.cached.items() if ids}
    return len(listed) == len(st.cached) and listed == by_key


def _tables(st: CoreState, g: int) -> list[tuple[str, Any, GroupTable]]:
    return [(rid, req, groups[g]) for rid, (req, groups) in st.requests.items()]


def inv_uncached_tail(st: CoreState, g: int) -> bool:
    """Table entries at or past num_cached_block carry no hash; the cursor fits the table."""
    for _, _, t in _tables(st, g):
        n = max(t.num_cached, 0)
        if t.num_cached >= 0 and not t.present:
            return False
        if n > len(t.blocks) or any(st.keys[b] is not None for b in t.blocks[n:] if b != NULL_BLOCK):
            return False
    return True


def inv_null_shape(st: CoreState, g: int, kind: Any) -> bool:
    """Full-type tables hold no null; SWA, chunked and non-align Mamba tables are nulls then real blocks."""
    for _, _, t in _tables(st, g):
        if isinstance(kind, _FULL_TYPE) and NULL_BLOCK in t.blocks:
            return False
        leading = isinstance(kind, SlidingWindow | ChunkedLocal) or (isinstance(kind, Mamba) and kind.mode != "align")
        first_real = next((i for i, b in enumerate(t.blocks) if b != NULL_BLOCK), len(t.blocks))
        if leading and NULL_BLOCK in t.blocks[first_real:]:
            return False
    return True


def inv_holders_count(st: CoreState, g: int) -> bool:
    """Full-type groups: holders counts each block's table occurrences; no table holds
    a non-null block twice; num_tables counts the requests present in the group."""
    present = [t for _, _, t in _tables(st, g) if t.present]
    if st.num_tables[g] != len(present):
        return False
    holders = st.holders[g]
    if holders is None:
        return True
    counts = [0] * len(st.ref)
    for t in present:
        real = [b for b in t.blocks if b != NULL_BLOCK]
        if len(set(real)) != len(real):
            return False
        for b in t.blocks:
            counts[b] += 1
    return counts == holders


def inv_ref_cnt_counts_holders(st: CoreState) -> bool:
    """ref_cnt of every non-null block = its occurrences in all tables + its pending references."""
    held: Counter[int] = Counter({b: n for b, n in enumerate(st.pending) if n})
    for _, groups in st.requests.values():
        for t in groups:
            held.update(b for b in t.blocks if b != NULL_BLOCK)
    return all(st.ref[b] == held[b] for b in range(1, len(st.ref)))


def inv_group_exclusive(st: CoreState) -> bool:
    """A non-null block is in the tables of one group at most, and a hashed one
    in a group's table carries that group's id in its key."""
    owner: dict[int, int] = {}
    for _, groups in st.requests.values():
        for g, t in enumerate(groups):
            for b in t.blocks:
                if b == NULL_BLOCK:
                    continue
                key = st.keys[b]
                if owner.setdefault(b, g) != g or (key is not None and int.from_bytes(key[-4:], "big") != g):
                    return False
    return True


def inv_hash_content(st: CoreState, kinds: Any, config: Any) -> bool:
    """A hashed block at table index i of group g is keyed by the request's
    prefix hash at (i+1)*bs tokens and g (for the request's latest value)."""
    from kvimpl.config_rules import hash_block_size  # noqa: PLC0415

    hbs = hash_block_size(config)
    for req, groups in st.requests.values():
        if req is None:
            continue
        fine = [BlockHash(h) for h in req.block_hashes]
        for g, (kind, t) in enumerate(zip(kinds, groups, strict=True)):
            if kind.block_size % hbs:
                continue
            hashes = coarse_block_hashes(fine, hbs, kind.block_size)
            for i, b in enumerate(t.blocks[: max(t.num_cached, 0)]):
                key = st.keys[b]
                if b != NULL_BLOCK and key is not None and (i >= len(hashes) or key != make_key(hashes[i], g)):
                    return False
    return True
