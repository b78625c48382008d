"""The block-pool layer: a pool adapter protocol, its operations and traces.

A port built bottom up can be checked from its first day: its block pool
alone, against kvspec's :class:`kvspec.block_pool.BlockPool` (the reference)
or real vLLM's ``BlockPool``, with ``kvref check --layer pool --target
mod:factory``. The lockstep, the trace format (header ``"layer": "pool"``)
and ``kvref replay`` are the facade's; only the operations differ:

=====================  =============================================================
operation              fields -> output
=====================  =============================================================
``get_new_blocks``     ``num_blocks`` -> block ids
``free_blocks``        ``block_ids`` (eviction priority order) -> null
``touch``              ``block_ids`` -> null
``cache_full_blocks``  ``rid``, ``block_ids``, ``num_cached_blocks``, ``num_full_blocks``,
                       ``block_size``, ``group_id`` -> null (hashes: the request's)
``get_cached_block``   ``block_hash`` (hex), ``group_ids`` -> block ids or null
``evict_blocks``       ``block_ids`` -> null
``reset_prefix_cache`` -> bool
``get_num_free_blocks`` -> int
``get_usage``          -> float (rounded to 9 digits)
``take_events``        -> events (as the facade's)
=====================  =============================================================

Requests (``add_request``, ``append_tokens``) are the facade's request
operations: ``cache_full_blocks`` hashes a request's blocks, as vLLM's does.
The configuration is a :class:`kvspec.config.KVCacheConfig` with one
full-attention group (its block size is the pool's hash block size). A pool's
view is a :class:`kvspec.view.KVView` without tables.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from kvref.capabilities import SKIP_ERRORS
from kvref.exits import InputError
from kvref.lockstep import Layer
from kvref.ops import RequestBook, event_to_json
from kvref.targets import load_callable
from kvspec.block_pool import BlockId, BlockPool
from kvspec.config import KVCacheConfig
from kvspec.errors import KVCacheError
from kvspec.events import KVCacheEvent
from kvspec.request import Request
from kvspec.view import KVView

Json = Any
POOL_OPS = (
    "get_new_blocks",
    "free_blocks",
    "touch",
    "cache_full_blocks",
    "get_cached_block",
    "evict_blocks",
    "reset_prefix_cache",
    "get_num_free_blocks",
    "get_usage",
    "take_events",
)
"""Every pool operation :func:`execute_pool` runs."""


@runtime_checkable
class BlockPoolAdapter(Protocol):
    """vLLM's ``BlockPool`` over plain values (kvspec: :class:`kvspec.block_pool.BlockPool`).

    Blocks are integer ids ``0 .. num_blocks - 1``; 0 is the null block (never
    free, never cached). Caller errors raise :mod:`kvspec.errors` classes and
    change nothing: ``PoolExhaustedError`` (more blocks than are free),
    ``DoubleFreeError`` (a block freed below zero references),
    ``InvalidBlockIdError`` (an id outside the pool).
    """

    name: str

    def get_new_blocks(self, num_blocks: int) -> Sequence[int]:
        """Take blocks from the head of the free queue (their hashes evicted), ref_cnt 1."""
        ...

    def free_blocks(self, block_ids: Sequence[int]) -> None:
        """Drop one reference each; unhashed blocks reaching 0 go to the front, hashed to the tail."""
        ...

    def touch(self, block_ids: Sequence[int]) -> None:
        """Add a reference each (a prefix hit); a free block leaves the queue."""
        ...

    def cache_full_blocks(
        self,
        request: Request,
        block_ids: Sequence[int],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int,
    ) -> None:
        """Cache ``block_ids[num_cached_blocks:num_full_blocks]`` under the request's hashes."""
        ...

    def get_cached_block(self, block_hash: bytes, group_ids: Sequence[int]) -> Sequence[int] | None:
        """The oldest block cached under ``block_hash`` in each group, or None on any miss."""
        ...

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the blocks from the prefix cache (ascending ids); references stay."""
        ...

    def reset_prefix_cache(self) -> bool:
        """Forget every hash if no block but the null block is in use."""
        ...

    def get_num_free_blocks(self) -> int:
        """Free blocks, cached ones included."""
        ...

    def get_usage(self) -> float:
        """``1 - free / (num_blocks - 1)``."""
        ...

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the recorded events."""
        ...

    def to_view(self) -> KVView:
        """The pool's observable state (tables empty)."""
        ...


PoolFactory = Callable[[KVCacheConfig], BlockPoolAdapter]


class SpecPoolAdapter:
    """kvspec's :class:`~kvspec.block_pool.BlockPool`, the reference."""

    name = "spec"

    def __init__(self, config: KVCacheConfig) -> None:
        """A pool of ``config.num_blocks`` hashing at its one group's block size."""
        self.pool = BlockPool(
            config.num_blocks, config.enable_caching, config.groups[0].block_size,
            config.enable_kv_cache_events, config.int_block_hashes, config.profile,
        )  # fmt: skip

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """See :class:`BlockPoolAdapter`."""
        return list(self.pool.get_new_blocks(num_blocks))

    def free_blocks(self, block_ids: Sequence[int]) -> None:
        """See :class:`BlockPoolAdapter`."""
        self.pool.free_blocks(BlockId(b) for b in block_ids)

    def touch(self, block_ids: Sequence[int]) -> None:
        """See :class:`BlockPoolAdapter`."""
        self.pool.touch([BlockId(b) for b in block_ids])

    def cache_full_blocks(
        self,
        request: Request,
        block_ids: Sequence[int],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int,
    ) -> None:
        """See :class:`BlockPoolAdapter`."""
        ids = [BlockId(b) for b in block_ids]
        self.pool.cache_full_blocks(request, ids, num_cached_blocks, num_full_blocks, block_size, group_id)

    def get_cached_block(self, block_hash: bytes, group_ids: Sequence[int]) -> list[int] | None:
        """See :class:`BlockPoolAdapter`."""
        found = self.pool.get_cached_block(block_hash, group_ids)  # type: ignore[arg-type]  # bytes is a BlockHash
        return None if found is None else list(found)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """See :class:`BlockPoolAdapter`."""
        self.pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        """See :class:`BlockPoolAdapter`."""
        return self.pool.reset_prefix_cache()

    def get_num_free_blocks(self) -> int:
        """See :class:`BlockPoolAdapter`."""
        return self.pool.get_num_free_blocks()

    def get_usage(self) -> float:
        """See :class:`BlockPoolAdapter`."""
        return self.pool.get_usage()

    def take_events(self) -> list[KVCacheEvent]:
        """See :class:`BlockPoolAdapter`."""
        return self.pool.take_events()

    def check_invariants(self) -> None:
        """The pool's invariants (``BlockPool.check_invariants``)."""
        self.pool.check_invariants()

    def to_view(self) -> KVView:
        """See :class:`BlockPoolAdapter`."""
        return pool_view(self.pool.free_queue, self.pool.ref_cnt, self.pool.cached, self.pool.get_usage())


def make_spec_pool(config: KVCacheConfig) -> SpecPoolAdapter:
    """Factory for ``--layer pool --target spec``."""
    return SpecPoolAdapter(config)


def pool_view(
    free_queue: Iterable[int], ref_cnt: Sequence[int], cached: dict[bytes, list[int]] | Any, usage: float
) -> KVView:
    """A pool's :class:`KVView` from its free queue (head first), per-block
    reference counts (index = id), hash -> ids map and usage."""
    return KVView(
        free_queue=tuple(int(b) for b in free_queue),
        ref_cnt=tuple((b, int(n)) for b, n in enumerate(ref_cnt) if b != 0 and n > 0),
        cached=tuple(sorted((bytes(k), tuple(int(b) for b in ids)) for k, ids in cached.items())),
        tables=(),
        usage=usage,
    )


def load_pool_factory(target: str) -> PoolFactory:
    """``spec``, ``impl``, ``vllm`` or ``module:factory`` as a pool factory.

    Raises:
        InputError: As :func:`kvref.adapters.load_factory`.
    """
    builtin = {
        "spec": "kvref.layers.pool:make_spec_pool",
        "impl": "kvref.adapters.impl:make_impl_pool",
        "vllm": "kvref.adapters.vllm.pool:make_vllm_pool",
    }
    path = builtin.get(target, target)
    if ":" not in path:
        raise InputError(f"pool target {target!r} is not spec, impl, vllm or module:factory")
    factory: PoolFactory = load_callable(path, f"pool target {target!r}")
    return factory


def execute_pool(adapter: BlockPoolAdapter, book: RequestBook, op: Json) -> Json:
    """Run one pool operation; caller errors become ``{"error": ClassName}``
    (skip errors propagate, as in :func:`kvref.ops.execute`)."""
    try:
        return _execute(adapter, book, op)
    except SKIP_ERRORS:
        raise
    except KVCacheError as exc:
        return {"error": type(exc).__name__}


def _execute(a: BlockPoolAdapter, book: RequestBook, op: Json) -> Json:
    name = op["op"]
    if name == "get_new_blocks":
        return [int(b) for b in a.get_new_blocks(op["num_blocks"])]
    if name in ("free_blocks", "touch", "evict_blocks"):
        getattr(a, name)(list(op["block_ids"]))
        return None
    if name == "cache_full_blocks":
        request = book.requests[op["rid"]]
        a.cache_full_blocks(request, list(op["block_ids"]), op["num_cached_blocks"], op["num_full_blocks"],
                            op["block_size"], op["group_id"])  # fmt: skip
        return None
    if name == "get_cached_block":
        found = a.get_cached_block(bytes.fromhex(op["block_hash"]), list(op["group_ids"]))
        return None if found is None else [int(b) for b in found]
    if name == "reset_prefix_cache":
        return a.reset_prefix_cache()
    if name == "get_num_free_blocks":
        return a.get_num_free_blocks()
    if name == "get_usage":
        return round(a.get_usage(), 9)
    if name == "take_events":
        return [event_to_json(e) for e in a.take_events()]
    raise ValueError(f"unknown pool operation {name!r}")


def pool_hash_lifetime(before: KVView, after: KVView, operation: str) -> bool:
    """A cached hash is only dropped by ``evict_blocks``, ``reset_prefix_cache``
    and ``get_new_blocks`` (of the blocks it hands out, which then hold a
    reference); every other pool operation keeps every hash."""
    lost = {(k, b) for k, ids in before.cached for b in ids} - {(k, b) for k, ids in after.cached for b in ids}
    if operation in ("evict_blocks", "reset_prefix_cache"):
        return True
    if operation == "get_new_blocks":
        held = {b for b, _ in after.ref_cnt}
        return all(b in held for _, b in lost)
    return not lost


POOL = Layer("pool", execute_pool, pool_hash_lifetime)
"""The block-pool layer for :class:`kvref.lockstep.Lockstep`."""
