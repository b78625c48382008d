"""Invalid calls: every side must reject them with the same typed error and change nothing.

Broken ``allocate_slots`` calls (``invalid_allocate``: bad counts, bad hit
lists, hits evicted or of another group), other caller errors
(``invalid_other``: double frees, bad ids and counts, caching past a table;
broken configurations and requests through
:class:`kvref.machine.invalid_inputs.InvalidInputs`) and operations the
profile's release lacks (``absent_operation``).

An engine that trusts its caller (``caller-errors`` left out,
``declare(trusts_caller=True)``) gets none of the invalid calls: the two
actions that make them are never ready (the lockstep also leaves out any
invalid call another family makes). Broken configurations and requests are
tried against kvspec alone and stay.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kvref.capabilities import CALLER_ERRORS, config_features
from kvref.hypothesis_compat import boolean, choose
from kvref.machine.base import Action
from kvref.machine.invalid_inputs import (
    BAD_CONFIGS,
    BAD_REQUESTS,
    CHECKPOINT_BAD_CONFIGS,
    HASH_LOOKAHEAD_BAD_CONFIGS,
    MTP_BAD_CONFIGS,
    RETENTION_BAD_CONFIGS,
    InvalidInputs,
)
from kvref.ops import ZEROING_RANGE
from kvspec.config import FULL_TYPE_KINDS, prefix_cacheable

Json = Any
ACTIONS: tuple[Action, ...] = (
    ("invalid_allocate", lambda m: bool(m.reqs) and m._allowed(CALLER_ERRORS)),
    ("invalid_other", lambda m: m._allowed(CALLER_ERRORS)),
    ("absent_operation", lambda m: m.lock is not None and bool(m.lock.absent - m.SETUP.excluded)),
)
"""The family's actions and when each is ready (their place in the step table: :data:`kvref.stateful.ORDER`)."""
BAD_ALLOCATIONS = ("negative", "zero", "too_long", "groups", "running_hit", "stale_hit", "foreign_hit", "bad_hit")
"""The broken ``allocate_slots`` calls ``invalid_allocate`` makes."""
BAD_OTHERS = ("double_free", "bad_evict", "unknown_prefix", "cache_beyond", "config", "count", "request")
"""The other caller errors ``invalid_other`` makes."""
BAD_HITS = ("out_of_pool", "caching_off", "ring_group", "null_in_full", "length")
"""Broken hit lists ``invalid_allocate`` sends on a first allocation (see ``_bad_hit``)."""
BAD_COUNTS = (
    "stats_hits", "skipped_tokens", "cache_tokens", "free_out_of_pool", "cache_unallocated", "hit_bound",
    "zeroing_range", "skip_group",
)  # fmt: skip
"""Negative counts (a hit-length bound included), out-of-pool ids, caching past the table, a token
range that ends before it starts and a group id the model lacks (``invalid_other``)."""


class InvalidRules(InvalidInputs):
    """Invalid calls of the manager, and operations its release lacks."""

    def invalid_allocate(self, data: st.DataObject) -> None:
        """allocate_slots with a broken argument."""
        kind = choose(data, BAD_ALLOCATIONS)
        if kind == "stale_hit":
            self._stale_hit()
            return
        if kind == "bad_hit":
            self._bad_hit(choose(data, BAD_HITS))
            return
        if kind == "foreign_hit":
            self._foreign_group_hit(data)
            return
        rid = choose(data, tuple(sorted(self.reqs)))
        op: Json = {"op": "allocate_slots", "rid": rid, "num_new_tokens": 1}
        if kind == "negative":
            args = ["num_new_tokens", "num_lookahead_tokens", "reserved_blocks"]
            op[choose(data, args if self.cfg.profile.admission_controls else args[:2])] = -1
        elif kind == "zero":
            op["num_new_tokens"] = 0
        elif kind == "too_long":
            op["num_new_tokens"] = self.cfg.max_model_len + 1
        elif kind == "groups":
            op["new_computed_blocks"] = [[] for _ in range(len(self.cfg.groups) + 1)]
        else:
            if rid not in self.running:
                return
            found = self._lookup(rid)
            if found is None or not any(found["blocks"]):
                return
            op["new_computed_blocks"] = found["blocks"]
        self._call(op, expect_unchanged=True)

    def _fresh_waiting(self) -> str | None:
        """The first waiting request when none of it is computed yet (the invalid
        first allocations start from it); else None."""
        if not self.waiting:
            return None
        rid = self.waiting[0]
        return None if self.reqs[rid].computed else rid

    def _stale_hit(self) -> None:
        """Hits evicted between lookup and allocation must be rejected (only
        where ``evict_blocks`` runs: without it the hit stays valid)."""
        rid = self._fresh_waiting()
        if rid is None or not self._allowed("op:evict_blocks"):
            return
        found = self._lookup(rid)
        if found is None:
            return
        real = sorted({b for g in found["blocks"] for b in g if b != 0})
        if not real:
            return
        self._call({"op": "evict_blocks", "block_ids": real[:1]})
        op = {"op": "allocate_slots", "rid": rid, "num_new_tokens": 1,
              "num_new_computed_tokens": found["num_tokens"], "new_computed_blocks": found["blocks"]}  # fmt: skip
        self._call(op, expect_unchanged=True)

    def _bad_hit(self, how: str) -> None:
        """A first allocation whose hit list no lookup returns: an id outside the
        pool, a hit with caching off, a block in a ring group's hit, the null
        block in a full-attention hit, or one block more than the hit tokens
        take (each is a typed error on every side, nothing changed)."""
        cfg = self.cfg
        rid = self._fresh_waiting()
        if rid is None:
            return
        hits: list[list[int]] = [[] for _ in cfg.groups]
        n_hit = 0
        if cfg.enable_caching:
            found = self._lookup(rid)
            if found is None:
                return
            hits, n_hit = [list(ids) for ids in found["blocks"]], found["num_tokens"]
        cacheable = [g for g, k in enumerate(cfg.groups) if prefix_cacheable(k)]
        if how == "out_of_pool":
            hits[0].append(cfg.num_blocks)
        elif how == "caching_off":
            if cfg.enable_caching or cfg.num_blocks < 2:
                return
            hits[0] = [1]
        elif how == "ring_group":
            rings = [g for g, k in enumerate(cfg.groups) if not prefix_cacheable(k)]
            if not rings or cfg.num_blocks < 2:
                return
            hits[rings[0]].append(1)
        elif how == "null_in_full":
            full = [g for g, k in enumerate(cfg.groups) if isinstance(k, FULL_TYPE_KINDS)]
            if not full or not cfg.enable_caching:
                return
            hits[full[0]].append(0)
        else:
            # one block more than the hit tokens take (a cached one where there is a hit)
            real = [b for g in cacheable for b in hits[g] if b != 0]
            if not cacheable or not cfg.enable_caching or cfg.num_blocks < 2:
                return
            hits[cacheable[0]].append(real[-1] if real else 1)
        op = {"op": "allocate_slots", "rid": rid, "num_new_tokens": 1,
              "num_new_computed_tokens": n_hit, "new_computed_blocks": hits}  # fmt: skip
        self._call(op, expect_unchanged=True)

    def _foreign_group_hit(self, data: st.DataObject) -> None:
        """A hit list carrying a block of another group must be rejected."""
        rid = self._fresh_waiting()
        if rid is None or len(self.cfg.groups) < 2:
            return
        found = self._lookup(rid)
        if found is None:
            return
        slots = [(g, i) for g, ids in enumerate(found["blocks"]) for i, b in enumerate(ids) if b != 0]
        if not slots:
            return
        g, i = choose(data, tuple(slots))
        assert self.lock is not None
        foreign = sorted(
            {
                b
                for r in self.reqs
                for h, ids in enumerate(self.lock.adapters[0].get_block_ids(r))
                if h != g
                for b in ids
            }
            - {0}
        )
        if not foreign:
            return
        hits = [list(ids) for ids in found["blocks"]]
        hits[g][i] = choose(data, tuple(foreign))
        op = {"op": "allocate_slots", "rid": rid, "num_new_tokens": 1,
              "num_new_computed_tokens": found["num_tokens"], "new_computed_blocks": hits}  # fmt: skip
        self._call(op, expect_unchanged=True)

    def _bad_count(self, data: st.DataObject, kind: str) -> None:
        """A negative count, an out-of-pool id, or caching blocks a request does not hold."""
        cfg = self.cfg
        rid = choose(data, tuple(sorted(self.reqs))) if self.reqs else None
        op: Json
        if kind == "stats_hits":
            if rid is None or cfg.profile.stats_at_lookup:
                return
            op = {"op": "record_prefix_cache_stats", "rid": rid, "num_hits": -1}
        elif kind == "skipped_tokens":
            if rid is None:
                return
            op = {"op": "remove_skipped_blocks", "rid": rid, "total_computed_tokens": -1}
        elif kind == "cache_tokens":
            if rid is None or not cfg.enable_caching:
                return
            op = {"op": "cache_blocks", "rid": rid, "num_computed_tokens": -1}
        elif kind == "free_out_of_pool":
            op = {"op": "free_blocks", "block_ids": [cfg.num_blocks]}
        elif kind == "hit_bound":  # a lookup bound below 0, where the release has the argument
            if rid is None or not self._allowed("max_cache_hit_length"):
                return
            op = {"op": "get_computed_blocks", "rid": rid, "max_cache_hit_length": -1}
        elif kind == "zeroing_range":  # a start below 0, or an end before the start
            if rid is None or not self._allowed(f"op:{ZEROING_RANGE}"):
                return
            start = choose(data, (-1, 4))
            op = {"op": ZEROING_RANGE, "rid": rid, "start_token": start, "end_token": 3}
        elif kind == "skip_group":  # an admission that names a group the model lacks, or no collection
            fresh = [r for r in self.waiting if not self.reqs[r].computed]
            if not fresh or not self._allowed("skip_zeroing_group_ids"):
                return
            group = choose(data, (-1, len(cfg.groups), None))
            skip = None if group is None else [group]
            op = {"op": "allocate_slots", "rid": fresh[0], "num_new_tokens": 1, "skip_zeroing_group_ids": skip}
        else:
            # A waiting request that holds no block yet: caching its prompt would
            # cache blocks it does not have.
            fresh = [r for r in self.waiting if not self.reqs[r].computed and not any(self._held(r))]
            need = min(k.block_size for k in cfg.groups)
            if not fresh or not cfg.enable_caching or self._num_tokens(fresh[0]) < need:
                return
            op = {"op": "cache_blocks", "rid": fresh[0], "num_computed_tokens": self._num_tokens(fresh[0])}
        self._call(op, expect_unchanged=True)

    def absent_operation(self, data: st.DataObject) -> None:
        """An operation, an ``allocate_slots`` argument or ``get_computed_blocks``'s
        ``max_cache_hit_length``, that the profile's release lacks
        (:data:`kvref.capabilities.RELEASE_OPERATIONS`): every side must refuse
        it and change nothing (``Lockstep.call_absent``).

        NOTE: the rest of the machine never sends them (the lockstep leaves
        them out), so without this probe a manager that ran an operation its
        release does not have would go unseen."""
        assert self.lock is not None
        feature = choose(data, tuple(sorted(self.lock.absent - self.SETUP.excluded)))
        rid = choose(data, tuple(sorted(self.reqs))) if self.reqs else None
        name = feature.removeprefix("op:")
        op: Json = {"op": name}
        if feature.startswith("op:"):
            if name in _ABSENT_NEED_REQUEST:
                if rid is None:
                    return
                op["rid"] = rid
            if name == "get_block_ids_for_computed_tokens":
                op["num_computed_tokens"] = self.reqs[op["rid"]].computed
            elif name == "record_prefix_cache_stats":
                op["num_hits"] = 0
            elif name == "record_blocks_for_zeroing":
                op["start_token"] = 0
            elif name == ZEROING_RANGE:
                op.update(start_token=0, end_token=self._num_tokens(op["rid"]))
            elif name == "truncate_computed_blocks":
                op.update(blocks=[[] for _ in self.cfg.groups], num_computed_tokens=0)
        elif feature == "max_cache_hit_length":  # a lookup argument: a bound that changes no hit
            if rid is None:
                return
            op = {"op": "get_computed_blocks", "rid": rid, feature: self._num_tokens(rid) - 1}
        else:  # an admission argument away from its default, on a request not admitted yet
            fresh = [r for r in self.waiting if not self.reqs[r].computed]
            if not fresh:
                return
            value = {
                "full_sequence_must_fit": True, "reserved_blocks": 1, "has_scheduled_reqs": False,
                "skip_zeroing_group_ids": [0],
            }[feature]  # fmt: skip
            op = {"op": "allocate_slots", "rid": fresh[0], "num_new_tokens": 1, feature: value}
        self.lock.call_absent(op)

    def invalid_other(self, data: st.DataObject) -> None:
        """Other caller errors, and broken configurations and requests."""
        kind = choose(data, BAD_OTHERS)
        if kind == "config":
            # MTP shapes try every break of their own inputs every other time (no state changes;
            # the other shapes draw as before)
            if self.cfg.num_prefill_lookahead and boolean(data):
                for mtp_kind in MTP_BAD_CONFIGS:
                    self._invalid_config(mtp_kind)
            elif self.cfg.num_hash_lookahead_tokens and boolean(data):  # runs with look-ahead hashes alone
                for hash_kind in HASH_LOOKAHEAD_BAD_CONFIGS:
                    self._invalid_config(hash_kind)
            elif self.cfg.prefix_cache_retention_interval is not None and boolean(data):  # runs with one alone
                for retention_kind in RETENTION_BAD_CONFIGS:
                    self._invalid_config(retention_kind)
            elif "prefill_checkpoints" in config_features(self.cfg) and boolean(data):  # runs with checkpoints
                for checkpoint_kind in CHECKPOINT_BAD_CONFIGS:
                    self._invalid_config(checkpoint_kind)
            else:
                self._invalid_config(choose(data, BAD_CONFIGS))
            return
        if kind == "count":
            self._bad_count(data, choose(data, BAD_COUNTS))
            return
        if kind == "request":
            self._bad_request(choose(data, BAD_REQUESTS))
            return
        if kind == "double_free":
            held = sorted({b for r in self.reqs for b in self._held(r)})
            if not held:
                return
            op: Json = {"op": "free_blocks", "block_ids": [choose(data, tuple(held))]}
        elif kind == "bad_evict":
            op = {"op": "evict_blocks", "block_ids": [choose(data, [-1, self.cfg.num_blocks])]}
        elif kind == "unknown_prefix":
            op = {"op": "get_num_common_prefix_blocks", "rid": "nobody"}
        else:
            if not self.reqs or not self.cfg.enable_caching:
                return
            rid = choose(data, tuple(sorted(self.reqs)))
            op = {"op": "cache_blocks", "rid": rid, "num_computed_tokens": self._num_tokens(rid) + 1}
        self._call(op, expect_unchanged=True)


_ABSENT_NEED_REQUEST = frozenset(
    {"pop_blocks_for_free", "get_block_ids_for_computed_tokens", "estimate_cached_tokens", "get_prefix_hint",
     "record_prefix_cache_stats", "get_num_cached_tokens", "get_num_common_prefix_blocks",
     "record_blocks_for_zeroing", "get_computed_blocks_for_connector", "get_zeroing_block_ids_in_range"}
)  # fmt: skip
"""The absent operations that name a request."""
