"""Hit limits: the lookup inputs of vLLM 0.33.0 and 0.34.0, and requests at the edges.

What a scheduler of these releases sends that the other families never do:

* ``bounded_admit``: an admission whose prefix lookup carries
  ``max_cache_hit_length`` (vLLM 0.33.0 takes it as given, 0.34.0 only lets
  it lower the request's own limit: switch ``hit_length_bound``), the bound
  drawn around what matters (0, a block boundary, just below, at and above
  ``num_tokens - 1``);
* ``num_cached_tokens``: the read-only ``get_num_cached_tokens`` (0.34.0),
  mostly of a waiting request before its admission, as the scheduler asks;
* ``logprob_request``: a request asking for prompt logprobs, reading the
  cache or not, with its first scored row drawn (0.34.0 reads at most up to
  that row: ``prompt_logprobs_hit_cap``);
* ``late_skip``: the skip flag of a waiting request set (or cleared) after
  it was made, half the time looked up at once (0.34.0 reads the limit fixed
  when the request was made, 0.33.0 the flag at each lookup:
  ``hit_limit_at_construction``);
* ``reused_id``: a request made under the id of one that finished and was freed;
* ``wide_tokens`` (sparingly): token ids beyond 32 bits, which 0.33.0 takes
  and 0.34.0 refuses where the request is made (``token_ids_int32``:
  kvspec's request hasher must raise :class:`kvspec.errors.InvalidRequestError`;
  ids just below 2**31 go to every side).

The family takes part in the runs whose release has one of these lookup
inputs (vLLM 0.33.0 on) and that are not at the safety level; every other run
draws as before. A release that lacks ``max_cache_hit_length`` or
``get_num_cached_tokens`` gets them from ``absent_operation``
(:mod:`kvref.machine.invalid`), which expects its refusal.

NOTE: an adapter may decline a lookup whose length is not ``num_tokens - 1``
call by call, naming the inputs in ``declines_per_call`` (kvimpl's native core
did until its lookup took a length). Against such an adapter the family draws
only bounds that cannot lower the lookup and prompt-logprob requests that do
not read the cache, and counts each narrowed draw (``RunStats.hit_limits``),
so that its lockstep runs every other input of the family instead of stopping. An
adapter whose ``declines_per_call`` names :data:`ALL_INPUTS` (kvimpl's own
mutable requests, ``--target impl-mutable``, ``impl-array``, which do not
take these inputs yet) keeps the family out of its runs.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kvref.hypothesis_compat import boolean, choose, integer
from kvref.machine.admission import AdmissionRules
from kvref.machine.base import Action, Family, MachineBase
from kvref.machine.configuration import VOCAB, draw_tokens
from kvspec.errors import InvalidRequestError

Json = Any
NAME = "hit_limits"
INT32_LIMIT = 1 << 31
"""The smallest token id vLLM 0.34.0's 32-bit token storage cannot hold."""
WIDE_IDS = (INT32_LIMIT - 1, INT32_LIMIT, (1 << 32) + 1, (1 << 63) - 1)
"""Token ids at and beyond the 32-bit edge (the largest fits a signed 64-bit int)."""
ALL_INPUTS = "hit-limit-inputs"
"""Named in an adapter's ``declines_per_call``: it takes none of the family's inputs."""
BOUNDS = ("zero", "below", "at", "above", "whole", "block", "block_plus", "any")
"""How ``bounded_admit`` draws ``max_cache_hit_length`` (see :func:`draw_bound`)."""


def _fresh_waiting(m: MachineBase) -> list[str]:
    """Waiting requests that will look the prefix cache up when admitted."""
    return [r for r in m.waiting if not m.reqs[r].computed]


def _freed_ids(m: MachineBase) -> list[str]:
    """Ids of the machine's requests that are gone (finished and freed or popped)."""
    return [f"r{i}" for i in range(1, m.counter + 1) if f"r{i}" not in m.reqs]


def _room(m: MachineBase) -> bool:
    """Whether a request may be made now that repeats an earlier one's tokens."""
    return bool(m.past) and len(m.reqs) < 10


ACTIONS: tuple[Action, ...] = (
    *(("bounded_admit", lambda m: m._allowed("max_cache_hit_length") and (bool(_fresh_waiting(m)) or _room(m))),) * 2,
    ("num_cached_tokens", lambda m: bool(m.reqs) and m._allowed("op:get_num_cached_tokens")),
    ("logprob_request", lambda m: len(m.reqs) < 10 and m.cfg.profile.prompt_logprobs_hit_cap),
    ("late_skip", lambda m: bool(_fresh_waiting(m)) and m._allowed("skip_reading_prefix_cache")),
    ("reused_id", lambda m: len(m.reqs) < 10 and not m.family_on("async_pipeline") and bool(_freed_ids(m))),
    ("wide_tokens", lambda m: len(m.reqs) < 10),
)
"""The family's actions and when each is ready (a bounded admission listed twice:
vLLM's scheduler bounds every lookup where an auxiliary output connector is set)."""


def draw_bound(data: st.DataObject, how: str, num_tokens: int, block: int) -> int:
    """A ``max_cache_hit_length`` for a request of ``num_tokens`` tokens:
    ``how`` (a :data:`BOUNDS` entry) says whether 0, just below, at or above
    ``num_tokens - 1``, the whole prompt, a block boundary (or one past it),
    or anything up to a block past the prompt."""
    last = num_tokens - 1
    if how == "zero":
        return 0
    if how == "below":
        return max(0, last - integer(data, 1, 3))
    if how == "at":
        return last
    if how == "above":
        return last + integer(data, 2, 6)
    if how == "whole":
        return num_tokens
    if how in ("block", "block_plus"):
        boundary = block * integer(data, 0, max(0, last // block))
        return boundary + (how == "block_plus")
    return integer(data, 0, num_tokens + block)


class HitLimitRules(AdmissionRules):
    """Bounded lookups, the cached-token probe, prompt-logprob requests, late
    skip flags, reused ids and wide token ids."""

    def _declined(self, feature: str) -> bool:
        """Whether an adapter of this run declines ``feature`` call by call
        (its ``declines_per_call``, see the module's NOTE)."""
        assert self.lock is not None
        return any(feature in getattr(a, "declines_per_call", ()) for a in self.lock.adapters)

    def _count(self, what: str) -> None:
        assert self.lock is not None
        self.lock.stats.hit_limits[what] += 1

    def bounded_admit(self, data: st.DataObject) -> None:
        """Admit a request whose lookup carries a drawn ``max_cache_hit_length``:
        a waiting one that has not computed anything, or (half the time, and
        where none waits) one made now from an earlier request's tokens, as
        they were or cut to whole blocks (a bound past ``num_tokens - 1`` then
        meets a prompt the cache may hold whole), sometimes asking for prompt
        logprobs from a drawn row where the release caps its reads there."""
        fresh = _fresh_waiting(self)
        again = not fresh or (_room(self) and boolean(data))
        rid = self._made_again(data) if again else choose(data, tuple(fresh))
        n = self._num_tokens(rid)
        bound = draw_bound(data, choose(data, BOUNDS), n, self.cfg.scheduler_block_size)
        if self._declined("max_cache_hit_length") and bound != n - 1:
            # the only bounds that cannot lower the lookup: at num_tokens - 1, or above it where 0.34.0 caps
            capped = self.cfg.profile.hit_length_bound == "capped"
            bound = max(bound, n - 1) if capped else n - 1
            self._count("bounded lookup narrowed (an adapter declines lower ones)")
        self._count("bounded lookup")
        self.lookup_bound = bound
        try:
            self._admit(data, rid)
        finally:
            self.lookup_bound = None

    def _made_again(self, data: st.DataObject) -> str:
        """A new request repeating an earlier one's tokens (cut to whole blocks
        half the time); under vLLM 0.34.0 half of them read the cache as
        prompt-logprob requests from a drawn row (not where an adapter
        declines their lookups). Its id."""
        self.counter += 1
        rid = f"r{self.counter}"
        op = self._reused_prompt(data, rid, choose(data, ("aligned", "repeat")))
        if self.cfg.profile.prompt_logprobs_hit_cap and boolean(data) and not self._declined("prompt_logprobs"):
            op.update(prompt_logprobs=True, skip_reading_prefix_cache=False)
            op["prompt_logprob_start"] = integer(data, 0, len(op["prompt"]))
            self._count("prompt-logprob request reading")
        self._count("bounded lookup of an earlier prompt")
        self._add_op(data, op, True)
        return rid

    def num_cached_tokens(self, data: st.DataObject) -> None:
        """``get_num_cached_tokens`` of a request: mostly a waiting one before
        its admission (the scheduler's cache-aware ordering asks those), else
        any; read-only, compared on every side."""
        fresh = _fresh_waiting(self)
        pool = fresh if fresh and integer(data, 0, 3) else sorted(self.reqs)
        self._count("get_num_cached_tokens")
        self._call({"op": "get_num_cached_tokens", "rid": choose(data, tuple(pool))}, True)

    def logprob_request(self, data: st.DataObject) -> None:
        """A request asking for prompt logprobs: its first scored row unset,
        0, a block boundary, just below, at or past ``num_tokens - 1``; the
        skip flag unset (then it skips reads) in one request in four, else
        False (it reads up to that row). A prompt of the universe or an
        earlier request's tokens, so that its lookup can hit."""
        self.counter += 1
        rid = f"r{self.counter}"
        op, reusable = self._some_prompt(data, rid)
        n = len(op["prompt"])
        sched = self.cfg.scheduler_block_size
        start = choose(data, (None, 0, "block", n - 2, n - 1, n, n + 3))
        if start == "block":
            start = sched * integer(data, 0, max(0, (n - 1) // sched))
        reads = choose(data, (True, True, True, False))
        if reads and start and self._declined("prompt_logprobs"):
            reads = False  # a reading prompt-logprob request looks up fewer than num_tokens - 1 tokens
            self._count("prompt-logprob request narrowed (an adapter declines its lookups)")
        op["prompt_logprobs"] = True
        if start is not None:
            op["prompt_logprob_start"] = max(0, start)
        if reads:
            op["skip_reading_prefix_cache"] = False
        self._count("prompt-logprob request" + (" reading" if reads else ""))
        self._add_op(data, op, reusable)

    def late_skip(self, data: st.DataObject) -> None:
        """The scheduler sets a waiting request's skip flag after the request
        was made (or clears one it was made with); half the time it is then
        looked up and admitted at once."""
        assert self.lock is not None
        rid = choose(data, tuple(_fresh_waiting(self)))
        skip = not self.lock.book.requests[rid].skip_reading_prefix_cache
        self._sched.record({"op": "set_request", "rid": rid, "skip_reading_prefix_cache": skip})
        self._count("late skip set" if skip else "late skip cleared")
        if boolean(data):
            self._admit(data, rid)

    def reused_id(self, data: st.DataObject) -> None:
        """A new request under the id of one that finished and was freed: an
        earlier request's tokens or a fresh prompt, sometimes asking for
        prompt logprobs where the release reads them."""
        rid = choose(data, tuple(_freed_ids(self)))
        op, reusable = self._some_prompt(data, rid)
        if self.cfg.profile.prompt_logprobs_hit_cap and boolean(data):
            op["prompt_logprobs"] = True  # the flag unset: it skips reads, which every side runs
        self._count("reused id")
        self._add_op(data, op, reusable)

    def wide_tokens(self, data: st.DataObject) -> None:
        """A request whose prompt holds token ids at the 32-bit edge or
        beyond: where the release stores 32-bit ids (vLLM 0.34.0), one of
        2**31 or more must be refused where it is made (kvspec's request
        hasher: InvalidRequestError, the output append too) and the request
        is made with ids below 2**31 only; elsewhere it is made as drawn."""
        prefix = choose(data, self.prefixes)
        tokens = (prefix + draw_tokens(data, 1, 8))[: self._prompt_limit()]
        for _ in range(integer(data, 1, 3)):
            tokens[integer(data, 0, len(tokens) - 1)] = choose(data, WIDE_IDS)
        if self.cfg.profile.token_ids_int32 and any(t >= INT32_LIMIT for t in tokens):
            self._refused_wide(tokens)
            tokens = [t if t < INT32_LIMIT else INT32_LIMIT - 1 - t % VOCAB for t in tokens]
        self.counter += 1
        op: Json = {"op": "add_request", "rid": f"r{self.counter}", "prompt": tokens}
        self._count("wide token ids")
        self._add_op(data, op, True)

    def _some_prompt(self, data: st.DataObject, rid: str) -> tuple[Json, bool]:
        """The ``add_request`` of ``rid``: an earlier request's tokens (half the
        time, where there are any) or a prompt of the universe; and whether
        later requests may reuse its tokens."""
        if self.past and boolean(data):
            return self._reused_prompt(data, rid, choose(data, ("repeat", "extend", "aligned"))), True
        return self._fresh_prompt(data, rid)

    def _add_op(self, data: st.DataObject, op: Json, reusable: bool) -> None:
        """Make the request of ``op`` (encoder tokens drawn as ``add_request``
        draws them, under cross attention); it waits."""
        self._sched.add(op, integer(data, 0, 12) if self.cross else 0, reusable)
        if reusable:
            self._remember(op["prompt"], op.get("extra"))

    def _refused_wide(self, tokens: list[int]) -> None:
        """kvspec's request hasher refuses ``tokens`` (some id 2**31 or more)
        and an output append of such an id, each with InvalidRequestError."""
        assert self.lock is not None
        hasher = self.lock.book.hasher
        wide = next(t for t in tokens if t >= INT32_LIMIT)
        for what in ("prompt", "output"):
            try:
                if what == "prompt":
                    hasher.new_request("wide", tokens)
                else:
                    hasher.with_output_tokens(hasher.new_request("wide", [1]), [wide])
            except InvalidRequestError:
                self.lock.stats.invalid_calls["add_request:InvalidRequestError"] += 1
                self._count(f"wide token id refused ({what})")
                continue
            raise AssertionError(f"{self.cfg.profile.name} stores 32-bit token ids, yet a {what} id {wide} was taken")


def _takes_part(m: MachineBase) -> bool:
    p = m.cfg.profile
    assert m.lock is not None
    if any(ALL_INPUTS in getattr(a, "declines_per_call", ()) for a in m.lock.adapters):
        return False
    return not m.SETUP.safety and (p.hit_length_bound != "absent" or p.num_cached_tokens_op)


FAMILY = Family(NAME, ACTIONS, _takes_part)
"""Joins the runs of vLLM 0.33.0 on (not at the safety level)."""
