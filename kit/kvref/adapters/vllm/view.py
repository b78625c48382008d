"""Live vLLM objects -> kvspec's plain values (views, events, statistics)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kvspec.events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvspec.stats import PrefixCacheStats
from kvspec.view import BlockIds, KVView

from .eras import VllmApi


def ids_of(api: VllmApi, blocks: Iterable[Any]) -> tuple[int, ...]:
    """The ids of vLLM ``KVCacheBlock`` objects, in order."""
    return tuple(api.block_id(b) for b in blocks)


def group_ids(api: VllmApi, blocks: Any) -> BlockIds:
    """The ids of a ``KVCacheBlocks`` value, one tuple per group."""
    return tuple(ids_of(api, g) for g in api.block_groups(blocks))


def to_view(api: VllmApi, pool: Any, managers: Sequence[Any]) -> KVView:
    """The normalized observable state of a block pool and its single-type managers.

    Args:
        api: The era.
        pool: The ``BlockPool``.
        managers: The single-type managers, in group order.
    """
    free_queue = ids_of(api, api.free_queue(pool))
    ref_cnt = tuple((api.block_id(b), api.ref_cnt(b)) for b in api.pool_blocks(pool)[1:] if api.ref_cnt(b) > 0)
    cached = sorted(((bytes(key), ids) for key, ids in api.cached_entries(pool)), key=lambda kv: kv[0])
    tables_by_group = [api.req_to_blocks(m) for m in managers]
    rids: set[str] = set()
    for table in tables_by_group:
        rids.update(table.keys())
    tables: list[tuple[str, BlockIds]] = []
    for rid in sorted(rids):
        groups = tuple(ids_of(api, table.get(rid, ())) for table in tables_by_group)
        if any(groups):
            tables.append((rid, groups))
    return KVView(
        free_queue=free_queue,
        ref_cnt=ref_cnt,
        cached=tuple(cached),
        tables=tuple(tables),
        usage=api.pool_usage(pool),
    )


def convert_event(api: VllmApi, event: Any) -> KVCacheEvent:
    """A vLLM KV-cache event as a :mod:`kvspec.events` value.

    Fields the release does not have keep kvspec's default (None).

    Raises:
        TypeError: For an event class kvspec does not know.
    """
    kind = api.event_type(event)
    if kind == "stored":
        stored = {name: getattr(event, name) for name in api.block_stored_fields}
        stored["block_hashes"] = freeze(stored["block_hashes"])
        stored["token_ids"] = tuple(int(t) for t in stored["token_ids"])
        stored["block_size"] = int(stored["block_size"])
        if "extra_keys" in stored:
            stored["extra_keys"] = freeze(stored["extra_keys"])
        if stored.get("lookahead_token_ids") is not None:
            stored["lookahead_token_ids"] = tuple(tuple(int(t) for t in ts) for ts in stored["lookahead_token_ids"])
        return BlockStored(**stored)
    if kind == "removed":
        removed = {name: getattr(event, name) for name in api.block_removed_fields}
        removed["block_hashes"] = freeze(removed["block_hashes"])
        return BlockRemoved(**removed)
    if kind == "cleared":
        return AllBlocksCleared()
    raise TypeError(f"unexpected vLLM KV-cache event {event!r}")


def convert_stats(fields: dict[str, Any] | None) -> PrefixCacheStats | None:
    """vLLM's ``PrefixCacheStats`` fields (from the era) as kvspec's value."""
    if fields is None:
        return None
    return PrefixCacheStats(
        reset=bool(fields["reset"]),
        requests=int(fields["requests"]),
        queries=int(fields["queries"]),
        hits=int(fields["hits"]),
        preempted_requests=int(fields["preempted_requests"]),
        preempted_queries=int(fields["preempted_queries"]),
        preempted_hits=int(fields["preempted_hits"]),
    )


def freeze(value: Any) -> Any:
    """Lists/tuples (nested) -> tuples; everything else unchanged."""
    if isinstance(value, list | tuple):
        return tuple(freeze(x) for x in value)
    return value
