"""A connector reports more loaded tokens than a request has slots for.

``cache_past_slots`` sends ``cache_blocks`` with a count that reaches past
some group's table (accepted up to the block after its cacheable blocks,
refused one block further), and one call in four, where a group registers
partial-tail entries, lines up a tail boundary just past the table (see
:meth:`PastSlotRules._tail_past_table`).
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvref.hypothesis_compat import boolean, choose, integer
from kvref.machine.base import Action
from kvref.machine.configuration import draw_tokens
from kvref.machine.scripted import ScriptedMoves
from kvspec.config import AttentionKind, Mamba, cacheable_blocks
from kvspec.partial_tail import fa_tail_boundary
from kvspec.prefill_checkpoints import positional_checkpoints

ACTIONS: tuple[Action, ...] = (("cache_past_slots", lambda m: bool(m.running) and m.cfg.enable_caching),)
"""The family's actions and when each is ready (their place in the step table: :data:`kvref.stateful.ORDER`)."""


class PastSlotRules(ScriptedMoves):
    """``cache_blocks`` past the tables, accepted and refused."""

    def cache_past_slots(self, data: st.DataObject) -> None:
        """A KV connector reports more loaded tokens than a running request
        has slots for: ``cache_blocks`` with a count that reaches into the
        block after some group's table. The contract (checked against real
        vLLM 0.25.1 and 0.33.0): every side caches the full blocks the tables
        hold and leaves out a partial-tail entry whose block is not in the
        table yet (:meth:`_tail_past_table` lines that case up). One block further is refused with
        ``CacheBeyondAllocationError`` on every side (vLLM would cache blocks
        no token reached, a Mamba group's speculative blocks as states), and
        one call in four sends that count. Otherwise the count is the largest
        accepted one half the time (it reaches the prompt's tail boundary most
        often), else any count past the shortest table.

        NOTE: vLLM's scheduler only caches what it allocated, but nothing in
        vLLM refuses the call, so it is generated: without it a fault in the
        branch that skips a tail block past the table goes unseen."""
        assert self.lock is not None
        if self.past_tail_groups and len(self.reqs) < 9 and integer(data, 0, 3) == 0:
            self._tail_past_table(data)
            return
        running = tuple(self.running)
        if any(positional_checkpoints(k, self.cfg.profile) for k in self.cfg.groups if isinstance(k, Mamba)):
            running = tuple(r for r in running if not self._allocation_failed(r))
            if not running:
                return
        rid = choose(data, running)
        low, high = self._cache_bounds(rid)
        if low is None:
            return
        if integer(data, 0, 3) == 0:
            if high < self._num_tokens(rid):
                self._call({"op": "cache_blocks", "rid": rid, "num_computed_tokens": high + 1}, expect_unchanged=True)
            return
        if low >= high:
            return
        n = high if boolean(data) else integer(data, low + 1, high)
        self._call({"op": "cache_blocks", "rid": rid, "num_computed_tokens": n})

    def _allocation_failed(self, rid: str) -> bool:
        """Whether ``rid``'s latest ``allocate_slots`` did not fit.

        NOTE: with positional prefill checkpoints (vLLM 0.30.0 on) vLLM's Mamba
        manager keeps the checkpoint its latest estimate decided on until the
        next estimate, also when that allocation then did not fit, and
        ``cache_blocks`` re-keys its slot, which the table may not reach:
        vLLM fails an assertion. Its scheduler never caches for a request
        whose allocation failed, so this family leaves such requests out
        in runs with those checkpoints."""
        assert self.lock is not None
        for op in reversed(self.lock.log):
            if op["op"] == "allocate_slots" and op.get("rid") == rid:
                return op.get("expect") is None
            if op["op"] == "allocate_slots_batch":
                rids = [item["rid"] for item in op.get("items", ())]
                outs = op.get("expect")
                if rid in rids:
                    return not isinstance(outs, list) or outs[rids.index(rid)] is None
        return False

    def _cache_bounds(self, rid: str) -> tuple[int | None, int]:
        """For running ``rid``: the fewest slots any caching group's table
        holds (None where no group caches), and the largest count
        ``cache_blocks`` accepts (at most the request's tokens)."""
        assert self.lock is not None
        tables = self.lock.adapters[0].get_block_ids(rid)
        high, low = self._num_tokens(rid), None
        for kind, table in zip(self.cfg.manager_groups(), tables, strict=True):  # block sizes under context parallelism
            most = _accepted_count(kind, len(table))
            if most is None:
                continue
            high = min(high, most)
            low = most - kind.block_size + 1 if low is None else min(low, most - kind.block_size + 1)
        return low, high

    def _tail_past_table(self, data: st.DataObject) -> None:
        """Directed, for a group with partial-tail entries (vLLM 0.26.0 on):
        a fresh request whose prompt's tail boundary ``B`` lies inside a block
        of that group is admitted and prefilled up to the start of that
        block, so its table ends just before it; then ``cache_blocks`` is
        sent with a count from ``B`` to the largest accepted one. Every side
        caches the full blocks and skips the partial-tail entry, whose block
        is past the table. Of the machine's calls of :meth:`cache_past_slots`
        in a run with such a group, one in four takes this path.

        NOTE: directed because random search rarely lines it up: the
        request's allocations must stop exactly at the start of the block
        holding ``B`` (no lookahead, a chunk that ends there) while every
        other caching group's table reaches ``B``; measured at seeds 0-4 of
        the ci lockstep before this path existed, the runs met it at seeds
        0 and 3 only."""
        kinds = self.cfg.manager_groups()
        cases: list[tuple[int, int, int]] = []  # (prompt length, boundary, where the table stops)
        for n in range(2, self._prompt_limit() + 1):
            for g in self.past_tail_groups:
                bs = kinds[g].block_size
                b = self.tail_boundary(n, g)
                if b % bs and b >= bs and self._reaches(b // bs * bs, b):
                    cases.append((n, b, b // bs * bs))
        if not cases:
            return
        n, boundary, start = choose(data, tuple(sorted(set(cases))))
        rid = self._add({"prompt": draw_tokens(data, n, n)}, True)
        # a hit at ``start`` or beyond leaves the request waiting; the machine goes on with it as with any other
        if not self._admit_now(data, rid, connector=False, upto=start) or not self._prefill(data, rid, start):
            return
        low, high = self._cache_bounds(rid)
        if low is not None and boundary <= high:
            self._call({"op": "cache_blocks", "rid": rid, "num_computed_tokens": integer(data, boundary, high)})

    def tail_boundary(self, num_prompt_tokens: int, g: int) -> int:
        """Where partial-tail group ``g`` keys the tail of a prompt this long
        (an EAGLE flag on any group of its kind counts: they are looked up together)."""
        cfg = self.cfg
        eagle = any(i in cfg.eagle_group_ids() for i, k in enumerate(cfg.groups) if k == cfg.groups[g])
        return fa_tail_boundary(
            num_prompt_tokens, cfg.resolved_hash_block_size(), eagle, cfg.profile.fa_tail_below_last_token
        )

    def _reaches(self, tokens: int, count: int) -> bool:
        """Whether, once a request has slots for ``tokens`` tokens, every
        caching group other than Mamba accepts ``cache_blocks`` up to ``count``."""
        for kind in self.cfg.manager_groups():
            most = None if isinstance(kind, Mamba) else _accepted_count(kind, -(-tokens // kind.block_size))
            if most is not None and count > most:
                return False
        return True


def _accepted_count(kind: AttentionKind, table_len: int) -> int | None:
    """The largest ``cache_blocks`` count a group of ``kind`` with
    ``table_len`` blocks accepts (the block after its cacheable blocks less
    one token); None for a group that caches nothing."""
    have = cacheable_blocks(kind, table_len)
    return None if have is None else max(have, 0) * kind.block_size + kind.block_size - 1
