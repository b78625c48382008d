"""KV-cache events of the native core: its raw records made into kvspec events.

The C core (``impl/kvimpl/_native/events.c``) appends one raw record per
event at the moment kvimpl's Python block pool appends its event, with
everything the event needs copied out of the request then (digests, the
call's token range, the request's extra-key sources). Building the frozen
event values is left to this module, on ``take_events``: the same fields as
:func:`kvimpl.block_pool._stored_event` and
:meth:`kvimpl.kv_cache_manager.KVCacheManager.take_events` (external hashes,
extra keys per stored block, the group's kind and sliding window).

NOTE: records rather than events in C: the event dataclasses, the external
hash form and the extra-key rules live in Python (kvspec), and a scheduler
drains events once per step, so their construction is paid once per event
either way; the core keeps only copies of bytes and ints on the hot path.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from kvimpl.config_rules import event_sliding_window, kind_name
from kvspec.config import KVCacheConfig
from kvspec.events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvspec.hashing import block_extra_keys, external_block_hash

STORED, REMOVED, CLEARED = 0, 1, 2
"""The record tags of events.c."""


def events_from_records(config: KVCacheConfig, records: Sequence[tuple[Any, ...]]) -> list[KVCacheEvent]:
    """The kvspec events of the core's raw records, in order."""
    as_int = config.int_block_hashes
    out: list[KVCacheEvent] = []
    for rec in records:
        tag = rec[0]
        if tag == STORED:
            out.append(_stored(config, rec, as_int))
        elif tag == REMOVED:
            _, gid, digest = rec
            out.append(BlockRemoved((external_block_hash(digest, as_int),), MEDIUM_GPU, gid))
        else:
            out.append(AllBlocksCleared())
    return out


def _stored(config: KVCacheConfig, rec: tuple[Any, ...], as_int: bool) -> BlockStored:
    _, gid, stored, digests, parent, token_ids, block_size, extra = rec
    extra_keys, cursor = [], 0
    for i in stored:
        keys, cursor = block_extra_keys(extra, i * block_size, (i + 1) * block_size, cursor)
        extra_keys.append(keys)
    lora = extra.lora
    kind = config.groups[gid]
    return BlockStored(
        block_hashes=tuple(external_block_hash(d, as_int) for d in digests),
        parent_block_hash=None if parent is None else external_block_hash(parent, as_int),
        token_ids=token_ids,
        block_size=block_size,
        lora_id=lora.adapter_id if lora else None,
        medium=MEDIUM_GPU,
        lora_name=lora.name if lora else None,
        extra_keys=tuple(extra_keys) if extra_keys else None,
        group_idx=gid,
        kv_cache_spec_kind=kind_name(kind),
        kv_cache_spec_sliding_window=event_sliding_window(kind),
    )


def reannounced_event(
    config: KVCacheConfig, request: Any, num_blocks: int, block_size: int, gid: int
) -> BlockStored | None:
    """The BlockStored that announces the first ``num_blocks`` blocks of
    ``request`` in group ``gid`` again (report mode "full";
    ``kvimpl.block_pool.BlockPool.emit_cached_block_events``): at most its
    hashed blocks, with no parent; None for ``num_blocks`` 0 or a block size
    that is not a multiple of the hash block. The native profiles view fine
    hashes at a coarser block by the last fine hash inside it."""
    hash_block = config.resolved_hash_block_size()
    k = block_size // hash_block
    fine = request.block_hashes
    n = min(num_blocks, len(fine) // k) if block_size % hash_block == 0 else 0
    if n == 0:
        return None
    digests = [fine[(i + 1) * k - 1] for i in range(n)]
    tokens = tuple(request.all_token_ids[: n * block_size])
    rec = (STORED, gid, range(n), digests, None, tokens, block_size, request.extra)
    return _stored(config, rec, config.int_block_hashes)


def replay_events(keys: Counter[tuple[object, int | None]], events: Sequence[KVCacheEvent]) -> None:
    """Apply events to a multiset of (external hash, group) cache entries
    (:func:`kvimpl.kv_cache_manager.replay_events`, written again so that the
    native build imports none of the Python manager)."""
    for ev in events:
        if isinstance(ev, BlockStored):
            keys.update((h, ev.group_idx) for h in ev.block_hashes)
        elif isinstance(ev, BlockRemoved):
            keys.subtract((h, ev.group_idx) for h in ev.block_hashes)
        else:
            keys.clear()
