"""The block pool: free queue, reference counts, prefix-cache map and events.

Blocks are integer ids ``0 .. num_gpu_blocks - 1``. Block 0 is the *null
block*: a placeholder for table positions that need no KV (outside a sliding
window, skipped Mamba states); it is never free, never hashed and its
reference count is not tracked.

Upstream: ``vllm/v1/core/block_pool.py`` (``BlockPool``,
``BlockHashToBlockMap``) and ``FreeKVCacheBlockQueue`` of ``kv_cache_utils.py``.
The doubly linked free list becomes a plain list in eviction order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import NewType, TypeVar

from kvspec.errors import DoubleFreeError, InvalidBlockIdError, InvalidTokenCountError, PoolExhaustedError
from kvspec.events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, ExternalHash, KVCacheEvent
from kvspec.hashing import (
    BlockHash,
    BlockHashWithGroupId,
    block_extra_keys,
    coarse_block_hashes,
    external_block_hash,
    lookahead_window_keys,
    make_key,
    split_key,
)
from kvspec.invariants import require
from kvspec.profiles import NEWEST, SemanticsProfile
from kvspec.request import Request

BlockId = NewType("BlockId", int)
NULL_BLOCK = BlockId(0)
T = TypeVar("T")


class BlockPool:
    """Hands out blocks, counts references and caches full blocks by hash.

    A block has at most one *primary* key (``block_hash``, upstream
    ``KVCacheBlock.block_hash``) standing for a prefix of
    ``hash_num_tokens`` tokens, and, from vLLM 0.26.0 on, further
    *secondary* keys (partial-tail entries, :mod:`kvspec.partial_tail`;
    upstream ``cached_block_hashes_by_block``). Every key of a block is an
    entry of ``cached``; eviction removes them all.

    inv: block 0 is never free, never hashed, never a cache-map value
    inv: a block is free <=> it is not null, not a sink block and ref_cnt == 0
    inv: num_gpu_blocks == 1 + len(sink) + len(free_queue) + #{b: ref_cnt[b] > 0}
    inv: cached[k] lists exactly the blocks with primary or secondary key k, oldest first
    inv: a block has secondary keys only if it has a primary key
    """

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        hash_block_size: int,
        enable_kv_cache_events: bool = False,
        int_block_hashes: bool = True,
        profile: SemanticsProfile = NEWEST,
        num_hash_lookahead_tokens: int = 0,
    ) -> None:
        """An empty pool: every block but the null block is free, in id order.
        ``num_hash_lookahead_tokens``: the look-ahead of the requests' block
        hashes, which stored events report (vLLM 0.33.0 on)."""
        self.profile = profile
        self.num_hash_lookahead_tokens = num_hash_lookahead_tokens
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.enable_kv_cache_events = enable_kv_cache_events
        self.int_block_hashes = int_block_hashes
        self.ref_cnt = [0] * num_gpu_blocks
        self.block_hash: list[BlockHashWithGroupId | None] = [None] * num_gpu_blocks
        self.hash_num_tokens: list[int | None] = [None] * num_gpu_blocks
        """Prefix length the primary key stands for (upstream ``block_hash_num_tokens``)."""
        self.secondary: dict[BlockId, list[BlockHashWithGroupId]] = {}
        """Further keys per block, in insertion order (upstream a set)."""
        self.free_queue = [BlockId(i) for i in range(1, num_gpu_blocks)]
        self.cached: dict[BlockHashWithGroupId, list[BlockId]] = {}
        self.sink: list[BlockId] = []
        self.events: list[KVCacheEvent] = []
        self.reannounced: Counter[tuple[ExternalHash, int | None]] = Counter()
        """(external hash, group) entries that :meth:`emit_cached_block_events`
        announced since the last clear: events that store nothing new."""

    def get_num_free_blocks(self) -> int:
        """Free blocks, cached-but-evictable ones included."""
        return len(self.free_queue)

    def get_usage(self) -> float:
        """``1 - free / (num_gpu_blocks - 1)``; 0 for a pool of one block."""
        if self.num_gpu_blocks == 1:
            return 0.0
        return 1.0 - len(self.free_queue) / (self.num_gpu_blocks - 1)

    def get_cached_block(self, block_hash: BlockHash, group_ids: Sequence[int]) -> list[BlockId] | None:
        """The oldest cached block of ``block_hash`` in each group, or None if any
        group misses."""
        found = []
        for gid in group_ids:
            ids = self.cached.get(make_key(block_hash, gid))
            if not ids:
                return None
            found.append(ids[0])
        return found

    def get_new_blocks(self, num_blocks: int) -> list[BlockId]:
        """Take ``num_blocks`` from the head of the free queue, evicting their
        hashes; each gets ref_cnt 1.

        pre: num_blocks >= 0

        Raises:
            InvalidTokenCountError: If ``num_blocks`` is negative.
            PoolExhaustedError: If fewer blocks are free.
        """
        if num_blocks < 0:
            raise InvalidTokenCountError(f"get_new_blocks: num_blocks {num_blocks} < 0")
        if num_blocks > len(self.free_queue):
            raise PoolExhaustedError(f"Cannot get {num_blocks} free blocks from the pool")
        taken, self.free_queue = self.free_queue[:num_blocks], self.free_queue[num_blocks:]
        for b in taken:
            if self.enable_caching:
                self._evict(b)
            self.ref_cnt[b] = 1
        return taken

    def touch(self, blocks: Sequence[BlockId]) -> None:
        """Add a reference to each block (a prefix hit); free ones leave the queue."""
        for b in blocks:
            if b == NULL_BLOCK:
                continue
            if self.ref_cnt[b] == 0:
                self.free_queue.remove(b)
            self.ref_cnt[b] += 1

    def free_blocks(self, ordered_blocks: Iterable[BlockId], skipped: bool = False) -> None:
        """Drop one reference per element; blocks reaching 0 become free.

        ``ordered_blocks`` is in eviction priority order. Of the blocks reaching
        0, unhashed ones go to the *front* of the queue (they can never be hit)
        and hashed ones to the *tail* (least recently used last), each set in
        the given order (:func:`requeue_unhashed_first` says when the profile
        puts every block at the tail instead; ``skipped``: the blocks come from
        ``remove_skipped_blocks`` or a sliding-window group's free, which vLLM
        0.23.0 already requeues unhashed first).

        Raises:
            InvalidBlockIdError: For an id outside the pool.
            DoubleFreeError: If a block would drop below 0 references.
        """
        blocks = [b for b in ordered_blocks if self._valid_id(b, "free_blocks") != NULL_BLOCK]
        for b, n in Counter(blocks).items():
            if self.ref_cnt[b] < n:
                raise DoubleFreeError(
                    f"free_blocks: block {b} has ref_cnt {self.ref_cnt[b]} but is freed {n} "
                    "time(s); it was freed more often than allocated"
                )
        released: list[BlockId] = []
        for b in blocks:
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                released.append(b)
        hashed = [self.block_hash[b] is not None for b in released]
        self.free_queue = requeue(self.free_queue, released, hashed, requeue_unhashed_first(self, skipped))

    def cache_full_blocks(
        self,
        request: Request,
        blocks: Sequence[BlockId],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int,
        block_mask: Sequence[bool] | None = None,
    ) -> None:
        """Insert ``blocks[num_cached_blocks:num_full_blocks]`` into the prefix cache.

        Null blocks and blocks whose mask entry is False are skipped. Block i
        gets key ``hash_i ‖ group_id`` where ``hash_i`` is the request's hash at
        this group's block size. Duplicates of an existing key are kept (block
        tables are append-only); lookups return the oldest. A block that
        already carries a partial entry (a key for fewer tokens) is promoted:
        it loses every key first, one BlockRemoved each, then gets the full
        key. With events on, exactly one BlockStored is emitted per call, even
        if nothing was stored, after those BlockRemoved.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        hashes = self._hashes_at(request, block_size)
        stored: list[int] = []
        for i in range(num_cached_blocks, num_full_blocks):
            b = blocks[i]
            if b == NULL_BLOCK or (block_mask is not None and not block_mask[i - num_cached_blocks]):
                continue
            num_tokens = (i + 1) * block_size
            if self.block_hash[b] is not None:
                assert (self.hash_num_tokens[b] or 0) < num_tokens, f"block {b} is hashed twice"
                self._evict(b)
            self.insert_key(b, make_key(hashes[i], group_id), num_tokens)
            stored.append(i)
        if self.enable_kv_cache_events:
            self.events.append(
                _stored_event(self, request, hashes, stored, num_cached_blocks, num_full_blocks, block_size, group_id)
            )

    def emit_cached_block_events(self, request: Request, num_blocks: int, block_size: int, group_id: int) -> None:
        """Announce the first ``num_blocks`` blocks of ``request`` (at
        ``block_size``) in group ``group_id`` again, as one BlockStored with no
        parent, for a request in report mode "full" (vLLM 0.26.0 on). Nothing
        is cached: the event names the request's own hashes and tokens, for
        every position of the hit, null entries of a window or Mamba group
        included. No event with events off or ``num_blocks`` 0.

        NOTE: at most the request's hashed blocks at ``block_size`` are named
        (past them vLLM raises IndexError: the divergence
        ``report-mode-partial-hit-crash``). A block size that is not a
        multiple of the hash block (a group's configured size under context
        parallelism, where the hash block is the scaled one) names none (vLLM
        asserts there: ``report-mode-cp-crash``).
        """
        named = self.enable_kv_cache_events and block_size % self.hash_block_size == 0
        hashes = self._hashes_at(request, block_size) if named else ()
        n = min(num_blocks, len(hashes))
        if n == 0:
            return
        ev = _stored_event(self, request, hashes, list(range(n)), 0, n, block_size, group_id)
        self.events.append(ev)
        self.reannounced.update((h, ev.group_idx) for h in ev.block_hashes)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Remove the given blocks from the prefix cache, in ascending id order.

        Reference counts and queue positions do not change: an in-use block
        just stops being hittable. Unhashed blocks are ignored.

        NOTE: vLLM takes a set and walks it in CPython's set order; kvref fixes
        ascending order so the BlockRemoved sequence is defined.

        Raises:
            InvalidBlockIdError: For any id outside the pool (checked first).
        """
        ids = sorted({self._valid_id(b, "evict_blocks") for b in block_ids})
        for b in ids:
            self._evict(b)

    def reset_prefix_cache(self) -> bool:
        """Forget every hash if no block but the null block is in use.

        Returns:
            False (and changes nothing) if any other block is in use or held as a
            sink block; True after clearing, with one AllBlocksCleared event.
        """
        if self.num_gpu_blocks - len(self.free_queue) != 1:
            return False
        self.cached = {}
        self.block_hash = [None] * self.num_gpu_blocks
        self.hash_num_tokens = [None] * self.num_gpu_blocks
        self.secondary = {}
        if self.enable_kv_cache_events:
            self.events.append(AllBlocksCleared())
            self.reannounced.clear()
        return True

    def take_sink_blocks(self, num_blocks: int) -> list[BlockId]:
        """Permanently take blocks from the head of the free queue (attention
        sinks); they keep ref_cnt 0 and are never returned."""
        taken, self.free_queue = self.free_queue[:num_blocks], self.free_queue[num_blocks:]
        self.sink += taken
        return taken

    def take_events(self) -> list[KVCacheEvent]:
        """Return and clear the recorded events ([] when events are off)."""
        events, self.events = self.events, []
        return events

    def check_invariants(self) -> None:
        """Raise InvariantViolation if a pool invariant is broken."""
        require(inv_null_block_inert(self), "the null block is free, hashed or cached")
        require(inv_free_queue_membership(self), "free queue != {non-null, non-sink, ref 0}")
        require(inv_block_conservation(self), "blocks are not conserved")
        require(inv_hash_map_consistent(self), "cache map and block hashes disagree")
        require(0.0 <= self.get_usage() <= 1.0, "usage outside [0, 1]")

    def keys_of(self, b: BlockId) -> list[BlockHashWithGroupId]:
        """Every key of block ``b``: the primary first, then the secondary ones."""
        primary = self.block_hash[b]
        return [] if primary is None else [primary, *self.secondary.get(b, [])]

    def insert_key(self, b: BlockId, key: BlockHashWithGroupId, num_tokens: int) -> None:
        """Cache block ``b`` under ``key`` too (nothing if it already is): as
        its primary key for ``num_tokens`` tokens if it has none, else as a
        secondary one (upstream ``_insert_block_hash``)."""
        if key in self.keys_of(b):
            return
        if self.block_hash[b] is None:
            self.block_hash[b], self.hash_num_tokens[b] = key, num_tokens
        else:
            self.secondary.setdefault(b, []).append(key)
        self.cached.setdefault(key, []).append(b)

    def remove_keys(self, b: BlockId) -> list[BlockHashWithGroupId]:
        """Uncache block ``b`` silently; return its keys, primary first
        (upstream ``_remove_cached_block_hashes``)."""
        keys = self.keys_of(b)
        for key in keys:
            self.cached[key].remove(b)
            if not self.cached[key]:
                del self.cached[key]
        self.block_hash[b], self.hash_num_tokens[b] = None, None
        self.secondary.pop(b, None)
        return keys

    def _evict(self, b: BlockId) -> None:
        """Uncache block ``b`` with one BlockRemoved per key, primary first."""
        for key in self.remove_keys(b):
            if self.enable_kv_cache_events:
                digest, gid = split_key(key)
                ext = external_block_hash(digest, self.int_block_hashes)
                self.events.append(BlockRemoved((ext,), MEDIUM_GPU, gid if event_fields(self.profile)[1] else None))

    def _valid_id(self, b: int, op: str) -> BlockId:
        if not isinstance(b, int) or isinstance(b, bool) or not 0 <= b < self.num_gpu_blocks:
            raise InvalidBlockIdError(f"{op}: block id {b!r} is outside 0..{self.num_gpu_blocks - 1}")
        return BlockId(b)

    def _hashes_at(self, request: Request, block_size: int) -> Sequence[BlockHash]:
        if block_size == self.hash_block_size:
            return request.block_hashes
        return coarse_block_hashes(
            request.block_hashes, self.hash_block_size, block_size, self.profile.coarse_hash_last_fine
        )


def requeue_unhashed_first(pool: BlockPool, skipped: bool = False) -> bool:
    """Whether freed unhashed blocks go to the front of the free queue: from
    vLLM 0.24.0 on (before it, every block went to the tail; in 0.23.0 only
    blocks freed by ``remove_skipped_blocks`` and a sliding-window group's
    blocks freed with its request, ``skipped``), except in 0.27.x with prefix
    caching off (profile switches ``free_unhashed_first``,
    ``skipped_unhashed_first``, ``free_unhashed_needs_caching``).

    post: pool.profile.free_unhashed_first or (skipped and pool.profile.skipped_unhashed_first) or not __return__
    post: not pool.enable_caching or __return__ == (pool.profile.free_unhashed_first or (skipped and pool.profile.skipped_unhashed_first))
    post: pool.enable_caching or __return__ == ((pool.profile.free_unhashed_first or (skipped and pool.profile.skipped_unhashed_first)) and not pool.profile.free_unhashed_needs_caching)
    post: skipped or __return__ == (pool.profile.free_unhashed_first and (pool.enable_caching or not pool.profile.free_unhashed_needs_caching))
    """  # noqa: E501 - a PEP 316 condition is one line
    p = pool.profile
    first = p.free_unhashed_first or (skipped and p.skipped_unhashed_first)
    return first and (pool.enable_caching or not p.free_unhashed_needs_caching)


def requeue(
    free_queue: Sequence[T], released: Sequence[T], hashed: Sequence[bool], unhashed_first: bool = True
) -> list[T]:
    """The free queue after the ``released`` blocks (eviction priority order)
    reached ref_cnt 0; ``hashed[i]`` says whether ``released[i]`` is cached.

    An unhashed block can never be hit, so it goes to the front and is reused
    first; a hashed one goes to the tail, behind every block freed before it
    (least recently used first). Each part keeps the given order. Without
    ``unhashed_first`` every released block goes to the tail, in order.

    pre: len(released) == len(hashed)
    post: len(__return__) == len(free_queue) + len(released)
    post: __return__[(len(released) - sum(hashed)) * unhashed_first :][: len(free_queue)] == list(free_queue)
    post: unhashed_first or __return__[len(free_queue) :] == list(released)
    post: not unhashed_first or __return__[: len(released) - sum(hashed)] == [b for b, h in zip(released, hashed) if not h]
    post: not unhashed_first or __return__[len(__return__) - sum(hashed) :] == [b for b, h in zip(released, hashed) if h]
    """  # noqa: E501 - a PEP 316 condition is one line
    if not unhashed_first:
        return [*free_queue, *released]
    front = [b for b, h in zip(released, hashed, strict=True) if not h]
    return front + list(free_queue) + [b for b, h in zip(released, hashed, strict=True) if h]


def _stored_event(
    pool: BlockPool,
    request: Request,
    hashes: Sequence[BlockHash],
    stored: list[int],
    num_cached: int,
    num_full: int,
    block_size: int,
    group_id: int,
) -> BlockStored:
    """The BlockStored event of one ``cache_full_blocks`` call (without
    extra keys or group index where :func:`event_fields` says so)."""
    as_int = pool.int_block_hashes
    with_keys, with_group, _ = event_fields(pool.profile)
    forms = (pool.profile.mm_key_with_offset, pool.profile.prompt_embeds_digest)
    extra_keys, cursor = [], 0
    ahead = pool.num_hash_lookahead_tokens
    for i in stored:
        start, end = i * block_size, (i + 1) * block_size
        if ahead:
            keys, cursor = lookahead_window_keys(request.extra, start, end, ahead, cursor, False, *forms)
        else:
            keys, cursor = block_extra_keys(request.extra, start, end, cursor, False, *forms)
        extra_keys.append(keys)
    tokens = request.all_token_ids
    lora = request.extra.lora
    return BlockStored(
        block_hashes=tuple(external_block_hash(hashes[i], as_int) for i in stored),
        parent_block_hash=None if num_cached == 0 else external_block_hash(hashes[num_cached - 1], as_int),
        token_ids=request.all_token_ids[num_cached * block_size : num_full * block_size],
        block_size=block_size,
        lora_id=lora.adapter_id if lora else None,
        medium=MEDIUM_GPU,
        lora_name=lora.name if lora else None,
        extra_keys=tuple(extra_keys) if extra_keys and with_keys else None,
        group_idx=group_id if with_group else None,
        lookahead_token_ids=tuple(tokens[(i + 1) * block_size : (i + 1) * block_size + ahead] for i in stored)
        if ahead
        else None,
    )


def event_fields(profile: SemanticsProfile) -> tuple[bool, bool, bool]:
    """Which annotation fields the release's events have: ``BlockStored``'s
    ``extra_keys`` (from vLLM 0.17.0, profile switch ``event_extra_keys``),
    the group index of both events (from 0.20.0, ``event_group_idx``), and
    ``BlockStored``'s kind and window, which the facade adds (from 0.22.0,
    ``event_annotations``). A field the release lacks is None.

    post: __return__ == (profile.event_extra_keys, profile.event_group_idx, profile.event_annotations)
    post: not __return__[2] or __return__[1]
    post: not __return__[1] or __return__[0]
    """
    return profile.event_extra_keys, profile.event_group_idx, profile.event_annotations


def annotated_events(pool: BlockPool) -> bool:
    """Whether the pool's events carry the group index (:func:`event_fields`):
    the cache keys their replay rebuilds are then per group.

    post: __return__ == pool.profile.event_group_idx
    """
    return event_fields(pool.profile)[1]


def inv_null_block_inert(pool: BlockPool) -> bool:
    """The null block is never in the free queue, never hashed, never cached."""
    in_map = any(NULL_BLOCK in ids for ids in pool.cached.values())
    return NULL_BLOCK not in pool.free_queue and pool.block_hash[NULL_BLOCK] is None and not in_map


def inv_free_queue_membership(pool: BlockPool) -> bool:
    """A block is in the free queue exactly once iff it is non-null, not a sink
    block and has no reference."""
    expected = {b for b in range(1, pool.num_gpu_blocks) if pool.ref_cnt[b] == 0} - set(pool.sink)
    return len(pool.free_queue) == len(set(pool.free_queue)) and set(pool.free_queue) == expected


def inv_block_conservation(pool: BlockPool) -> bool:
    """Every block is exactly one of: null, sink, free, or referenced (ref > 0);
    no non-null block has a negative count."""
    used = sum(1 for b in range(1, pool.num_gpu_blocks) if pool.ref_cnt[b] > 0)
    non_negative = all(pool.ref_cnt[b] >= 0 for b in range(1, pool.num_gpu_blocks))
    return non_negative and pool.num_gpu_blocks == 1 + len(pool.sink) + len(pool.free_queue) + used


def inv_hash_map_consistent(pool: BlockPool) -> bool:
    """``cached[k]`` holds exactly the blocks with primary or secondary key
    ``k``, each once; no key maps to an empty list; a block's keys are
    distinct, and only a block with a primary key has secondary ones."""
    by_key: dict[BlockHashWithGroupId, set[int]] = {}
    for b in range(pool.num_gpu_blocks):
        keys = pool.keys_of(BlockId(b))
        if len(keys) != len(set(keys)):
            return False
        for key in keys:
            by_key.setdefault(key, set()).add(b)
    orphans = any(pool.block_hash[b] is None or not keys for b, keys in pool.secondary.items())
    listed = {k: set(ids) for k, ids in pool.cached.items()}
    no_dups = all(len(ids) == len(set(ids)) and ids for ids in pool.cached.values())
    return no_dups and not orphans and listed == by_key
