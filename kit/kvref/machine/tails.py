"""Directed: partial-tail and Mamba-tail keys that random search does not line up.

``tail_pair`` (fine-grained hits: a hit that ends inside coarse blocks,
served by copy-on-write) and ``rekeyed_tails`` (two requests key one block
again after a connector reported it lost); see each method.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvref.hypothesis_compat import boolean, choose, integer
from kvref.machine.base import Action
from kvref.machine.configuration import draw_tokens
from kvref.machine.connectors import ConnectorRules
from kvref.scheduler_chunks import tail_eagle
from kvspec.config import Mamba
from kvspec.mamba_tail import mamba_tail_boundary
from kvspec.partial_tail import fa_tail_boundary

ACTIONS: tuple[Action, ...] = (
    ("tail_pair", lambda m: m.cfg.enable_caching and m._sched.copies and len(m.reqs) < 9),
    ("rekeyed_tails", lambda m: m.tail_group is not None and len(m.reqs) < 9 and m._allowed("evict_blocks")),
)
"""The family's actions and when each is ready (their place in the step table: :data:`kvref.stateful.ORDER`)."""


class TailRules(ConnectorRules):
    """Tail pairs and rekeyed tails."""

    def tail_pair(self, data: st.DataObject) -> None:
        """Directed, for configurations with fine-grained hits (a cached hybrid
        whose Mamba align group is coarser than the hash block, vLLM 0.26.0
        to 0.29.0): a fresh request A whose prompt's Mamba tail boundary lies
        inside a coarse block is admitted and prefilled up to that boundary
        (the scheduler's tail stop cuts its chunks there, and the coarse
        groups key their blocks at it); one pair in four a connector then
        reports A's keyed Mamba state lost; under EAGLE A goes one hash block
        further (an EAGLE lookup drops one); a scheduler step starts; then B,
        A's tokens up to there and up to two more, is admitted with its
        lookup: a hit that ends inside the coarse blocks, served by
        copy-on-write and handed off.

        One pair in four (where the run sends delayed connector loads) has a
        twin instead of the connector's loss: a request for the same prompt
        is admitted before A with its tokens up to the tail boundary loaded
        through a connector, caching delayed; A misses it, runs to the
        boundary and keys its own state block there; the twin's load ends
        and keys the twin's block under the same key; A takes one more
        token, which moves A's entry to a private copy while the twin's
        block keeps the key.

        NOTE: directed because random search almost never lines these steps
        up before the eviction and A's next step: the one shape with
        fine-grained hits compared one copy-on-write copy in 8,394 steps;
        and a key on two state blocks needs the delayed load to end at the
        tail boundary exactly."""
        cfg = self.cfg
        hbs = cfg.resolved_hash_block_size()
        coarse = max(k.block_size for k in cfg.groups)
        eagle, ahead = tail_eagle(cfg), cfg.num_hash_lookahead_tokens
        lengths = [
            n for n in range(2, self._prompt_limit() + 1)
            if (t := mamba_tail_boundary(n, hbs, eagle, cfg.profile.mamba_tail_entries, ahead)) % coarse and t < n
        ]  # fmt: skip
        if not lengths:
            return
        n = choose(data, tuple(lengths))
        tail = mamba_tail_boundary(n, hbs, eagle, cfg.profile.mamba_tail_entries, ahead)
        prompt = (choose(data, self.prefixes) + draw_tokens(data, n, n))[:n]
        twin = None
        if integer(data, 0, 3) == 0 and self._delayed_loads():
            twin = self._admit_loading(prompt, tail)
            if twin is None:
                return
        a = self._admit_whole(data, {"prompt": prompt}, reusable=True, connector=False)
        if a is None or not self._prefill(data, a, tail):
            return
        if twin is not None:
            self._sched.remote_loaded(twin)
            if not self._prefill(data, a, tail + 1):
                return
        elif integer(data, 0, 3) == 0:
            self._lose_tail_state(a, tail)
        goal = tail + hbs if cfg.use_eagle else tail
        if not self._prefill(data, a, goal):
            return
        self._call({"op": "new_step_starts"})
        head = self._sched.tokens(a)[:goal] if cfg.use_eagle else prompt
        more = draw_tokens(data, 1 if cfg.use_eagle else 0, 2) if boolean(data) or cfg.use_eagle else []
        self._admit_whole(data, {"prompt": (head + more)[: self._prompt_limit()]}, reusable=True, connector=False)

    def rekeyed_tails(self, data: st.DataObject) -> None:
        """Directed, for a full-attention group with partial-tail entries and
        two hash boundaries or more inside a block (vLLM 0.26.0 on): two
        requests share a block that holds both prompts' tail boundaries, a
        connector reports it lost, and each request keys it again.

        Y, a fresh prompt whose tail boundary lies inside a block, runs past
        that block's end, so the block is cached whole (with Y's partial key
        besides). X, Y's prompt cut to an earlier boundary in the same
        block, runs and produces Y's tokens (a model continues a prefix the
        same way) past the block's end; preempted and admitted again, its
        lookup hits Y's block. The block's keys are evicted; X takes a
        token and keys it under its own boundary; Y takes a token and keys
        it under its later boundary, which first removes X's key (the block
        now holds more tokens than that key stands for).

        NOTE: directed because random search does not line these up: two
        requests hold a block at their tail boundaries only when one was
        preempted after producing the other's tokens, and the keys are
        re-registered only after a loss of that very block."""
        assert self.lock is not None and self.tail_group is not None
        cfg, g = self.cfg, self.tail_group
        bs, hbs = cfg.groups[g].block_size, cfg.resolved_hash_block_size()
        below = cfg.profile.fa_tail_below_last_token
        inner = {
            n: t for n in range(2, self._prompt_limit() + 1) if (t := fa_tail_boundary(n, hbs, False, below)) % bs
        }  # fmt: skip
        pairs = [
            (nx, ny) for nx, tx in inner.items() for ny, ty in inner.items()
            if tx < ty and tx // bs == ty // bs and (ty // bs + 1) * bs + 2 <= cfg.max_model_len
        ]  # fmt: skip
        if not pairs:
            return
        nx, ny = choose(data, tuple(pairs))
        end = (inner[ny] // bs + 1) * bs  # the end of the block holding both boundaries
        tokens = draw_tokens(data, end + 1, end + 1)
        y = self._admit_whole(data, {"prompt": tokens[:ny]}, reusable=True, connector=False)
        if y is None or not self._prefill(data, y, end + 1, tokens):
            return
        x = self._admit_whole(data, {"prompt": tokens[:nx]}, reusable=True, connector=False)
        if x is None or not self._prefill(data, x, end + 1, tokens):
            return
        self._sched.preempt(x, False)
        self._call({"op": "new_step_starts"})
        if not self._admit_now(data, x, connector=False):
            return
        block = self.lock.adapters[0].get_block_ids(x)[g][inner[ny] // bs]
        self._call({"op": "new_step_starts"})
        self._call({"op": "evict_blocks", "block_ids": [block]})
        for rid in (x, y):
            if rid in self.running:
                self._prefill(data, rid, self.reqs[rid].computed + 1, tokens)

    def _lose_tail_state(self, rid: str, tail: int) -> None:
        """A connector reports that ``rid``'s Mamba state block at ``tail`` lost
        its contents (``evict_blocks``), then ``rid`` takes one more token."""
        assert self.lock is not None
        g = next(i for i, k in enumerate(self.cfg.groups) if isinstance(k, Mamba))
        table = self.lock.adapters[0].get_block_ids(rid)[g]
        idx = -(-tail // self.cfg.groups[g].block_size) - 1
        if idx < len(table) and table[idx]:
            self._call({"op": "evict_blocks", "block_ids": [table[idx]]})
            computed = self.reqs[rid].computed
            if computed < self._num_tokens(rid):
                self._sched.advance(rid, self._sched.chunk(rid, computed, 1))
