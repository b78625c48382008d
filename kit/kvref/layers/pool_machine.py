"""A Hypothesis state machine over the block pool alone.

It plays what the single-type managers do with a pool: *owners* (requests)
take fresh blocks, look their prefix up block by block and touch the hits,
cache their full blocks under their hashes, and free their blocks (last
first); other rules evict blocks, reset the prefix cache, read the counters,
drain events, and try the pool's caller errors (too many blocks, a double
free, an id outside the pool), which must change nothing. Every operation
runs on every adapter through :class:`kvref.lockstep.Lockstep` with the pool
layer, so outputs, views, invariants and the event log are compared as at
the facade.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import reject
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from kvref.layers.pool import POOL
from kvref.lockstep import Lockstep, Refused
from kvref.stateful import VOCAB, MachineSetup
from kvspec.config import FullAttention, KVCacheConfig
from kvspec.errors import UnsupportedByProfileError
from kvspec.hashing import HASH_FUNCTION_NAMES

Json = Any


@st.composite
def pool_configs(draw: st.DrawFn, setup: MachineSetup) -> KVCacheConfig:
    """A pool: its size, block size, caching, events and hash settings."""
    excluded = setup.excluded
    return KVCacheConfig(
        num_blocks=draw(st.sampled_from([8, 12, 6, 16, 4])),
        groups=(FullAttention(draw(st.sampled_from([2, 4]))),),
        max_model_len=64,
        enable_caching=draw(st.sampled_from([True, True, False])) and "caching" not in excluded,
        enable_kv_cache_events=draw(st.sampled_from([False, True])) and "events" not in excluded,
        int_block_hashes=draw(st.booleans()),
        hash_function=draw(st.sampled_from(["sha256_cbor", *HASH_FUNCTION_NAMES])),
        hash_seed=draw(st.sampled_from(["0", "42"])),
        profile=setup.profile,
    )


@dataclass
class Owner:
    """A request holding pool blocks: hits first, then fresh blocks."""

    rid: str
    blocks: list[int] = field(default_factory=list)
    num_cached: int = 0


def make_pool_machine(setup: MachineSetup) -> type[RuleBasedStateMachine]:
    """A pool machine class driving ``setup.factories`` (reference first)."""

    class PoolLockstepMachine(PoolMachine):
        SETUP = setup

    return PoolLockstepMachine


class PoolMachine(RuleBasedStateMachine):
    """Plays the single-type managers against the pool adapters of ``SETUP``."""

    SETUP: MachineSetup

    def __init__(self) -> None:
        """No pool yet (drawn in :meth:`setup`)."""
        super().__init__()
        self.lock: Lockstep | None = None
        self.owners: dict[str, Owner] = {}
        self.prompts: list[list[int]] = []
        self.counter = 0

    @initialize(data=st.data())
    def setup(self, data: st.DataObject) -> None:
        """Draw a pool; build every adapter and a few shared prompts."""
        setup = self.SETUP
        cfg = data.draw(pool_configs(setup), label="pool")
        try:
            self.lock = Lockstep(cfg, setup.factories, setup.stats, setup.failure_dir, "pool", setup.op_timeout,
                                 setup.known, setup.excluded, POOL)  # fmt: skip
        except (UnsupportedByProfileError, Refused) as exc:
            setup.stats.refused_configs[type(exc).__name__] += 1
            setup.stats.refused_reasons[f"pool: {exc}"] += 1
            reject()
        self.cfg, self.bs = cfg, cfg.groups[0].block_size
        for _ in range(3):
            n = data.draw(st.integers(1, 4)) * self.bs
            self.prompts.append(data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=n, max_size=n)))

    @property
    def live(self) -> bool:
        return self.lock is not None and not self.lock.halted

    def _call(self, op: Json, expect_unchanged: bool = False) -> Json:
        assert self.lock is not None
        return self.lock.call(op, expect_unchanged)

    def _hashes(self, rid: str) -> tuple[bytes, ...]:
        assert self.lock is not None
        return tuple(self.lock.book.requests[rid].block_hashes)

    def _free_count(self) -> int:
        assert self.lock is not None
        return len(self.lock.adapters[0].to_view().free_queue)

    @precondition(lambda self: self.live and len(self.owners) < 6)
    @rule(data=st.data())
    def new_owner(self, data: st.DataObject) -> None:
        """A request arrives: a shared prompt plus a few tokens; it looks its
        prefix up block by block and touches the hits (caching on)."""
        assert self.lock is not None
        self.counter += 1
        rid = f"r{self.counter}"
        prompt = data.draw(st.sampled_from(self.prompts)) + data.draw(st.lists(st.integers(0, VOCAB - 1), max_size=6))
        self.lock.request_op({"op": "add_request", "rid": rid, "prompt": prompt})
        owner = self.owners[rid] = Owner(rid)
        if not self.cfg.enable_caching:
            return
        hits: list[int] = []
        for h in self._hashes(rid)[: (len(prompt) - 1) // self.bs]:
            found = self._call({"op": "get_cached_block", "block_hash": h.hex(), "group_ids": [0]})
            if not found:
                break
            hits.append(found[0])
        touch: bool = data.draw(st.booleans())
        if hits and touch:
            self._call({"op": "touch", "block_ids": hits})
            owner.blocks, owner.num_cached = list(hits), len(hits)

    @precondition(lambda self: self.live and bool(self.owners))
    @rule(data=st.data())
    def allocate(self, data: st.DataObject) -> None:
        """An owner takes fresh blocks (sometimes more than are free: refused)."""
        owner = self.owners[data.draw(st.sampled_from(sorted(self.owners)))]
        free = self._free_count()
        n = data.draw(st.integers(0, 3)) if data.draw(st.integers(0, 5)) else free + 1
        out = self._call({"op": "get_new_blocks", "num_blocks": n}, expect_unchanged=n > free)
        if isinstance(out, list):
            owner.blocks += out

    @precondition(lambda self: self.live and self.cfg.enable_caching and bool(self.owners))
    @rule(data=st.data())
    def cache(self, data: st.DataObject) -> None:
        """An owner's blocks become full: cache them under its hashes."""
        owner = self.owners[data.draw(st.sampled_from(sorted(self.owners)))]
        full = min(len(owner.blocks), len(self._hashes(owner.rid)))
        if full <= owner.num_cached:
            return
        end = data.draw(st.integers(owner.num_cached + 1, full))
        self._call({"op": "cache_full_blocks", "rid": owner.rid, "block_ids": list(owner.blocks),
                    "num_cached_blocks": owner.num_cached, "num_full_blocks": end, "block_size": self.bs,
                    "group_id": 0})  # fmt: skip
        owner.num_cached = end

    @precondition(lambda self: self.live and bool(self.owners))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        """An owner finishes: its blocks are freed, last first (or in table order)."""
        owner = self.owners.pop(data.draw(st.sampled_from(sorted(self.owners))))
        blocks = owner.blocks[::-1] if data.draw(st.booleans()) else owner.blocks
        self._call({"op": "free_blocks", "block_ids": blocks})

    @precondition(lambda self: self.live)
    @rule(data=st.data(), which=st.sampled_from(["get_num_free_blocks", "get_usage", "take_events",
                                                 "evict_blocks", "reset_prefix_cache", "lookup"]))  # fmt: skip
    def other(self, data: st.DataObject, which: str) -> None:
        """Counters, events, eviction, a reset, or a lookup of any known hash."""
        if which == "evict_blocks":
            ids = data.draw(st.lists(st.integers(1, self.cfg.num_blocks - 1), max_size=3))
            self._call({"op": "evict_blocks", "block_ids": ids})
        elif which == "lookup":
            hashes = [h for rid in sorted(self.owners) for h in self._hashes(rid)]
            if hashes:
                block_hash = data.draw(st.sampled_from(hashes))
                self._call({"op": "get_cached_block", "block_hash": block_hash.hex(), "group_ids": [0]})
        else:
            self._call({"op": which})

    @precondition(lambda self: self.live)
    @rule(data=st.data(), kind=st.sampled_from(["double_free", "bad_id", "bad_evict"]))
    def invalid(self, data: st.DataObject, kind: str) -> None:
        """Caller errors: each must be refused and change nothing."""
        if kind == "double_free":
            held = {b for o in self.owners.values() for b in o.blocks}
            free = sorted(set(range(1, self.cfg.num_blocks)) - held)
            if not free:
                return
            op: Json = {"op": "free_blocks", "block_ids": [data.draw(st.sampled_from(free))]}
        elif kind == "bad_id":
            op = {"op": "free_blocks", "block_ids": [self.cfg.num_blocks]}
        else:
            op = {"op": "evict_blocks", "block_ids": [data.draw(st.sampled_from([-1, self.cfg.num_blocks]))]}
        self._call(op, expect_unchanged=True)

    def teardown(self) -> None:
        """Adapters are garbage collected."""
        self.lock = None
