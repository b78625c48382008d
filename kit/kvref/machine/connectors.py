"""KV connectors: tokens loaded from outside, with or without delayed caching.

An admission may take connector tokens past its prefix hit
(``num_external_computed_tokens``); with ``delay_cache_blocks`` the request
then waits for its load, and ``finish_remote_load`` ends it (``cache_blocks``
of what was loaded; the request waits again with those tokens computed).
What a connector reads or reports elsewhere: :mod:`kvref.machine.reads`
(``get_block_ids_for_computed_tokens``), :mod:`kvref.machine.running`
(lost blocks at a step), :mod:`kvref.machine.past_slots` (more loaded tokens
than slots).

Loads that fail part-way (``fail_remote_load``, the ``failed_load``
family): the request keeps the valid prefix, and the blocks past it are
listed for zeroing again (``record_blocks_for_zeroing``).

NOTE: the place for richer connector paths (loads that finish out of order,
partial loads).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from kvref.hypothesis_compat import boolean, choose, integer
from kvref.machine.base import Action, Family, MachineBase
from kvref.machine.configuration import draw_tokens
from kvref.machine.scripted import ScriptedMoves
from kvspec.config import FULL_TYPE_KINDS, Mamba, prefix_cacheable
from kvspec.profiles import features_used

Json = Any
ACTIONS: tuple[Action, ...] = (("finish_remote_load", lambda m: bool(m.remote)),)
"""The family's actions and when each is ready (their place in the step table: :data:`kvref.stateful.ORDER`)."""


class ConnectorRules(ScriptedMoves):
    """Connector tokens at admission and the end of delayed loads."""

    new_step: Callable[[st.DataObject], None]
    """A scheduler step boundary (:meth:`kvref.machine.running.RunningRules.new_step`, composed in by the machine)."""

    def _connector_tokens(self, data: st.DataObject, computed: int, hit: int, total: int) -> tuple[int, bool]:
        """An admission's connector tokens past a hit of ``hit`` of ``total``
        tokens (only for a request with nothing ``computed`` yet), and whether
        their caching is delayed until the load ends."""
        external = 0
        # Connector tokens on one admission in five, one in two after a prefix hit
        # (a hit and external tokens together exercise the touch-then-allocate order).
        if computed == 0 and integer(data, 0, 1 if hit else 4) == 0 and total - hit > 1:
            external = integer(data, 1, total - hit - 1)
            if not (self._allowed("external") and self._on("connector")):
                external = 0
        delay = external > 0 and boolean(data) and self._allowed("delay_cache_blocks") and self._on("delay")
        return external, delay

    def _tally(self, what: str) -> None:
        assert self.lock is not None
        self.lock.stats.connector[what] += 1

    def _local_lookup(self, rid: str, tally: str = "connector lookups") -> tuple[Json | None, bool]:
        """An admission's prefix lookup and whether its hit diverged: in runs
        of the ``connector_lookup`` family the lookup vLLM's scheduler makes
        when a KV connector may load the rest
        (``get_computed_blocks_for_connector``, counted under ``tally``), else
        ``get_computed_blocks`` (never diverged); None where the release fails
        the lookup."""
        if not self.family_on("connector_lookup"):
            return self._lookup(rid), False
        op: Json = {"op": "get_computed_blocks_for_connector", "rid": rid}
        if self.lookup_bound is not None:
            op["max_cache_hit_length"] = self.lookup_bound
        found = self._call(op)
        if not isinstance(found, dict) or "hit_diverged" not in found:
            return None, False  # a caller error, or the reference crashed (a known divergence halts there)
        self._tally(tally)
        return found, bool(found["hit_diverged"])

    def _settle_connector_hit(
        self, data: st.DataObject, rid: str, found: Json, diverged: bool, total: int
    ) -> tuple[Json | None, int, int]:
        """What vLLM's scheduler (0.27.0 on) makes of a connector's lookup
        before it allocates: the connector matches tokens past the hit cut to
        a scheduler block (drawn); a hit ending inside a block keeps that
        partial block only when the connector matches no further, else it is
        cut off (``truncate_computed_blocks``) and the connector loads from the
        block boundary; a diverged hit with nothing loaded is looked up again
        the reconciled way (``get_computed_blocks``). Returns the hit lists,
        the hit and the external tokens; None lists where a call failed (the
        request stays waiting)."""
        hit, blocks = found["num_tokens"], found["blocks"]
        aligned = hit - hit % self.cfg.scheduler_block_size
        matched = 0
        if integer(data, 0, 1) == 0 and total - aligned > 1:
            matched = integer(data, 1, total - aligned - 1)
        external = matched
        if hit > aligned and matched > hit - aligned:
            self._tally("connector hits cut to a block")
            cut = self._call({"op": "truncate_computed_blocks", "blocks": blocks, "num_computed_tokens": aligned})
            if not isinstance(cut, list):
                return None, 0, 0
            blocks, hit = cut, aligned
        elif hit > aligned:
            external = 0
        if diverged and external == 0:
            self._tally("diverged hits reconciled")
            again = self._lookup(rid)
            if again is None:
                return None, 0, 0
            hit, blocks = again["num_tokens"], again["blocks"]
        elif diverged:
            self._tally("diverged hits loaded")
        return blocks, hit, external

    def truncate_probe(self, data: st.DataObject) -> None:
        """Directed (the ``connector_lookup`` family): a connector's lookup of a
        request, then ``truncate_computed_blocks`` of its lists, to a
        scheduler-block length within the hit as the scheduler cuts them, or,
        one call in two, with a caller error every side must refuse: a
        negative length, a length off the block size, a group missing, a block
        id outside the pool, a list for a ring group. Nothing changes."""
        found, _ = self._local_lookup(choose(data, tuple(sorted(self.reqs))), "truncation probes")
        if found is None:
            return
        blocks, sched = [list(g) for g in found["blocks"]], self.cfg.scheduler_block_size
        n = (found["num_tokens"] // sched - integer(data, 0, found["num_tokens"] // sched)) * sched
        bad = choose(data, ("", "", "", "", "", "negative", "off-block", "group", "id", "ring"))
        if bad == "negative":
            n = -sched
        elif bad == "off-block":
            n += 1
        elif bad == "group":
            blocks.pop()
        elif bad == "id":
            blocks[0].append(self.cfg.num_blocks)
        elif bad == "ring":
            rings = [g for g, k in enumerate(self.cfg.groups) if not prefix_cacheable(k)]
            if not rings:
                return
            blocks[rings[0]].append(1)
        op: Json = {"op": "truncate_computed_blocks", "blocks": blocks, "num_computed_tokens": n}
        self._call(op, expect_unchanged=True)

    def finish_remote_load(self, data: st.DataObject) -> None:
        """The connector finished loading: cache the loaded blocks, then the
        request waits to be scheduled with its tokens already computed."""
        self._sched.remote_loaded(choose(data, tuple(self.remote)))

    def fail_remote_load(self, data: st.DataObject, rid: str | None = None) -> None:
        """The ``failed_load`` family: a delayed connector load (``rid``'s, else
        a drawn one) fails part-way. The valid prefix ends on a block boundary
        of every attention group at or past the local hit (or is 0: the
        request's blocks are freed); the request then waits with that prefix
        computed, and the blocks past it are listed for zeroing again
        (:meth:`kvref.scheduler.Scheduler.remote_failed`). One call in four
        first sends a start inside a block, which every side refuses (vLLM
        asserts it) or before the first token, changing nothing."""
        if rid is None:
            rid = choose(data, tuple(self.remote))
            if self.SETUP.safety:
                # a failure comes with a step's output, after the scheduling that admitted the load
                # (whose end drains the zeroing list, the load's destinations left out)
                self.new_step(data)
                if rid not in self.remote:
                    return
        st = self._sched.reqs[rid]
        align = self._attention_alignment()
        first = -(-st.remote_local // align) * align
        options = sorted({*range(first, st.remote_target, align), 0})
        if len(self.cfg.groups) == 1:
            # vLLM's recovery: the valid prefix ends at the first block that failed, a real one
            # (a connector lists no null block), so no earlier than the first real block
            assert self.lock is not None
            table = self.lock.adapters[0].get_block_ids(rid)[0]
            real = next((i for i, b in enumerate(table) if b), None)
            floor = first if real is None else max(first, real * align)
            options = [v for v in options if v >= floor]
            if real is None or not options:  # nothing the load fills can fail
                self._sched.remote_loaded(rid)
                return
        valid = options[-1 - integer(data, 0, len(options) - 1)]  # the longest valid prefix first
        zeroing = self.zeroes and self._allowed("op:record_blocks_for_zeroing")
        if zeroing and integer(data, 0, 3) == 0:
            bad = valid + 1 if align > 1 and boolean(data) else -align
            self._call({"op": "record_blocks_for_zeroing", "rid": rid, "start_token": bad}, expect_unchanged=True)
        self._sched.remote_failed(rid, valid, zeroing)

    def failing_load(self, data: st.DataObject) -> None:
        """Directed (the ``failed_load`` family): a request (after a known
        prefix, or not) loads its prompt past a block boundary through a
        connector, caching delayed, and the load fails with the next step's
        output (:meth:`fail_remote_load`). Random runs rarely have a delayed load
        that reaches past a block boundary of every attention group."""
        align = self._attention_alignment()
        head = choose(data, self.prefixes) if self.prefixes and boolean(data) else []
        prompt = (head + draw_tokens(data, align + 2, 3 * align + 2))[: self._prompt_limit()]
        if len(prompt) < align + 2:
            return
        rid = self._admit_loading(prompt, integer(data, align + 1, len(prompt) - 1))
        if rid is not None:
            self.new_step(data)  # the failure comes with a step's output, after that step's scheduling
            if rid in self.remote:
                self.fail_remote_load(data, rid)

    def _attention_alignment(self) -> int:
        """The least common multiple of the attention groups' block sizes (a Mamba-only model: its groups')."""
        sizes = [k.block_size for k in self.cfg.groups if not isinstance(k, Mamba)]
        return math.lcm(*(sizes or [k.block_size for k in self.cfg.groups]))

    def load_twin(self, data: st.DataObject) -> None:
        """Directed (the ``load_twin`` family): a request loads its prompt up
        to a position inside a block through a connector, with caching
        delayed; the load ends at once (its blocks are cached) and a twin
        follows (:meth:`_twin_after_load`)."""
        sched = self.cfg.scheduler_block_size
        prompt = (choose(data, self.prefixes) + draw_tokens(data, 1, 2 * sched))[: self._prompt_limit()]
        if len(prompt) < sched + 2:
            return
        upto = integer(data, 1, len(prompt) - 1)
        upto -= upto % sched == 0  # inside a block: the block the load fills in part
        rid = self._admit_loading(prompt, upto) if upto else None
        if rid is not None:
            self._sched.remote_loaded(rid)
            self._twin_after_load(data, rid)

    def _twin_after_load(self, data: st.DataObject, rid: str) -> None:
        """A request with the prompt (and extra keys) of ``rid``, whose load
        just ended, is looked up and admitted at once, before ``rid`` computes
        past what was loaded. An engine that caches the block the load filled
        in part (counting the loaded tokens in whole blocks, vLLM#34616's
        class) serves it to this twin, and the content oracle finds the slots
        never written. Random runs line this up rarely: delayed loads are few,
        and the twin must come between the load's end and ``rid``'s next step."""
        assert self.lock is not None
        req = self.lock.book.requests[rid]
        fields: Json = {"prompt": list(req.all_token_ids[: req.num_prompt_tokens])}
        if self._sched.reqs[rid].extra is not None:
            fields["extra"] = self._sched.reqs[rid].extra
        self._admit_whole(data, fields, False, connector=False)

    def _delayed_loads(self) -> bool:
        """Whether this run sends connector loads with delayed caching."""
        return (
            self._allowed("external") and self._allowed("delay_cache_blocks")
            and self._on("connector") and self._on("delay")
        )  # fmt: skip

    def _admit_loading(self, prompt: list[int], upto: int) -> str | None:
        """Add a request for ``prompt`` and admit it with its tokens after the
        prefix hit and up to ``upto`` loaded through a connector, caching
        delayed; its id, or None where the lookup fails or hits ``upto``
        tokens or more, or the admission does not fit."""
        rid = self._add({"prompt": prompt}, True)
        found = self._lookup(rid)
        if found is None or found["num_tokens"] >= upto:
            return None
        hit = found["num_tokens"]
        op: Json = {"op": "allocate_slots", "rid": rid, "num_new_computed_tokens": hit, "num_new_tokens": 0,
                    "num_external_computed_tokens": upto - hit, "delay_cache_blocks": True}  # fmt: skip
        if any(found["blocks"]):
            op["new_computed_blocks"] = found["blocks"]
        return rid if self._sched.admit(op, hit, upto - hit, delay=True) else None


def _twins_take_part(m: MachineBase) -> bool:
    return (
        m.SETUP.safety and m.cfg.enable_caching and not m.cross
        and m._allowed("external") and m._allowed("delay_cache_blocks")
    )  # fmt: skip


def _failed_loads_take_part(m: MachineBase) -> bool:
    if not (m._allowed("external") and m._allowed("delay_cache_blocks")):
        return False
    zeroing_contract = (
        m.zeroes and all(isinstance(k, (Mamba, *FULL_TYPE_KINDS)) for k in m.cfg.groups)
        and m._allowed("op:record_blocks_for_zeroing")
    )  # fmt: skip
    # the scheduler's own path: it recovers a failed load in a model of one KV-cache group
    return zeroing_contract or (m.SETUP.safety and len(m.cfg.groups) == 1 and not m.cross)


FAILED_LOAD_FAMILY = Family(
    "failed_load",
    (("fail_remote_load", lambda m: bool(m.remote)), ("failing_load", lambda m: True)),
    _failed_loads_take_part,
)
"""Connector loads that fail part-way, in runs of a model that zeroes fresh
blocks (a Mamba group next to full-attention-type groups only) under a release
with ``record_blocks_for_zeroing`` (vLLM 0.26.0 on), and at the safety level in
runs of a model with one KV-cache group of any kind (the models whose failed
loads vLLM's scheduler recovers, every release); every other run draws as before.

NOTE: a contract of the manager more than a path of vLLM's scheduler: up to
0.34.0 the scheduler finds a failed load's first invalid block in a model
with one KV-cache group only (it unpacks ``get_block_ids`` into one table),
while it zeroes fresh blocks for models with a Mamba group (several groups)
or, from 0.34.0 on, a mixed-precision KV cache (not modelled). In a one-group
model with a sliding or chunked window, a load that fails past the valid prefix
leaves the window before it in blocks the admission already skipped, and the
recomputation reads them: a defect of every release, registered as
``swa-failed-load`` (docs/safety.md). Conformance runs leave the one-group
models out, so that their draws stay as they were."""


def _connector_lookups_take_part(m: MachineBase) -> bool:
    return (
        m.cfg.profile.connector_lookup_op and m.cfg.enable_caching and len(m.cfg.groups) > 1
        and not m.cross and not (m.SETUP.safety and "partial-hash-hits" in features_used(m.cfg))
        and m._allowed("op:get_computed_blocks_for_connector") and m._allowed("op:truncate_computed_blocks")
        and m._allowed("external") and m._on("connector")
    )  # fmt: skip


CONNECTOR_LOOKUP_FAMILY = Family(
    "connector_lookup",
    (("connector_twin", lambda m: bool(m.past) and len(m.reqs) < 10), ("truncate_probe", lambda m: bool(m.reqs))),
    _connector_lookups_take_part,
)
"""A KV connector's local lookup at admission (vLLM 0.27.0 on:
``get_computed_blocks_for_connector``, and ``truncate_computed_blocks`` for a
hit that ends inside a block), as vLLM's scheduler makes it with a connector
that accepts diverging hybrid hits (NIXL's), in conformance runs of cached
hybrids, at either level: with a Mamba group each group is looked up alone
(lagging groups allowed), in other models it is ``get_computed_blocks``.
Every other run draws as before. At the safety level a lagging group's hit
leaves blocks between its own hit and the reported one that only the
connector's load fills; the monitor's load fills them, as vLLM's NIXL
connector fills every block of the request that holds no cached hit
(:meth:`kvref.safety_base.Load.start_of`).

NOTE: not at the safety level with fine-grained hits (a Mamba group coarser
than the hash block): a lagging Mamba hit may then end inside its last block,
and the lookup's lists do not say where, so the monitor could not tell which
state the hit serves."""

LOAD_TWIN_FAMILY = Family("load_twin", (("load_twin", lambda m: bool(m.prefixes)),), _twins_take_part)
"""Directed, at the safety level with prefix caching on: a load that ends
inside a block, then a twin (:meth:`ConnectorRules.load_twin`); every other
run draws as before."""
