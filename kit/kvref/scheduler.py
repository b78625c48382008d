"""The scheduler model: the bookkeeping vLLM's scheduler does around the manager.

One model for everything in kvref that plays a scheduler: the lockstep state
machine (:mod:`kvref.stateful`), the soak (:mod:`kvref.soak`), hand-written
scenario scripts and the benchmark loop (:mod:`kvref.bench`). It owns the
request states (computed tokens, status, preemptions), the waiting, running
and remote-loading queues and the popped block lists that wait for their
deferred free, and turns scheduling moves into facade operations and request
updates. It never chooses: which request, how many tokens, free or pop, how
many lookahead slots are arguments, so a Hypothesis machine, a seeded random
soak, a script and a benchmark each decide in their own way and share the
rules below.

Rules (as vLLM's scheduler applies them):

* A chunk never goes past the request's tokens; with a Mamba group in
  ``align`` mode it is split as the release's scheduler splits it
  (:func:`kvref.scheduler_chunks.schedule_chunk`: a chunk from a block boundary ends on one, unless
  vLLM 0.29.0's prefill checkpoints let it end anywhere; one that starts inside a block is a whole
  number of blocks long up to vLLM 0.25.x and stops at that block's end from 0.26.0 on), and with
  fine-grained hits it also stops at the prompt's Mamba tail boundary when that lies in the prompt's last block
  (:meth:`Scheduler.tail_stop`), where the tail entry can be registered.
* With a Mamba group in ``align`` mode the chunk also stops at the shared
  prefix a sparse group has not cached yet, floored to a scheduler block
  (vLLM's Marconi-style admission, :func:`kvref.scheduler_chunks.cap_at_junction`), from the prefix
  hint of the request's lookup (``get_prefix_hint``).
* Under multi-module MTP a chunk never leaves fewer than ``num_prefill_lookahead``
  tokens (:func:`kvref.scheduler_chunks.reserve_prefill_lookahead`).
* Admission: prefix lookup, then ``allocate_slots`` with the hit; on success
  the request runs with ``hit + external + new`` computed tokens, or, with
  delayed caching, waits for its connector load.
* A running step adds its new tokens to the computed count.
* With fine-grained hits (vLLM 0.26.0 on), a step that allocated ends with
  the copy hand-off: ``take_kv_cache_block_copies``, then ``free_blocks`` of
  the retained blocks in the order given (:meth:`Scheduler.hand_off_copies`).
* Preemption frees (or pops) the request's blocks; it goes back to the head
  of the waiting queue with nothing computed and one more preemption.
* A finished request is forgotten after its blocks were freed or popped.
* A ``set_request`` update carries exactly the fields that changed.

NOTE: a scheduler feature that adds state is a module of its own beside
this one, ``kvref/scheduler_<feature>.py``, built on :class:`Scheduler`
rather than switches added to it: the async pipeline (steps in flight
before the previous step's output is processed, output placeholders, frees
deferred until the steps that read the blocks are done) is
:mod:`kvref.scheduler_pipeline`, which learns of each step through
:meth:`Scheduler.scheduled`. The popped lists below
(:meth:`Scheduler.release`, :meth:`Scheduler.deferred_free`) are the
simplest form of such a deferred free, freed whenever the caller says.
Every module of the model stays under 400 lines (tests/test_module_size.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvref.ops import ZEROING_RANGE, RequestBook
from kvref.scheduler_chunks import mamba_tail_stop, schedule_chunk, settle_chunk
from kvspec.config import KVCacheConfig, prefix_cacheable
from kvspec.profiles import features_used

Json = Any

@dataclass
class ReqState:
    """The scheduler's view of one request."""

    rid: str
    status: str = "WAITING"
    computed: int = 0
    preemptions: int = 0
    encoder_tokens: int = 0
    """Encoder input tokens (cross attention); sent on the first allocation."""
    remote_target: int = 0
    """Computed tokens once a delayed (connector) load finishes."""
    remote_local: int = 0
    """Of those, the tokens of the local prefix hit (a failed load keeps at least these)."""
    extra: Json = None
    """The request's ``extra`` operation field, kept for requests that reuse its tokens."""
    reusable: bool = True
    """Whether later requests may reuse this request's tokens."""
    hint: int = 0
    """The prefix hint of the request's latest lookup (:func:`kvref.scheduler_chunks.cap_at_junction`)."""
    in_flight: int = 0
    """Tokens of steps dispatched whose output is not processed yet
    (``num_in_flight_tokens``; only the asynchronous pipeline,
    :mod:`kvref.scheduler_pipeline`, has any)."""

    def admitted(self, computed: int) -> None:
        """The request was allocated and runs with ``computed`` tokens."""
        self.status, self.computed = "RUNNING", computed

    def preempted(self) -> None:
        """The request lost its blocks and waits again from scratch."""
        self.status, self.computed, self.preemptions = "PREEMPTED", 0, self.preemptions + 1


def allocated(out: Json) -> bool:
    """Whether an ``allocate_slots`` output is an allocation: not None (it did not fit), nor an
    error or a crash (an engine run alone may refuse or fail where the reference would not)."""
    return out is not None and not (isinstance(out, dict) and ("error" in out or "crash" in out))


class Scheduler:
    """Queues and request states over one manager (or one lockstep of several).

    ``call`` runs a facade operation and returns its output (as
    :func:`kvref.ops.execute` does); ``record`` applies a request operation
    to ``book`` (and may log it).
    """

    def __init__(
        self,
        config: KVCacheConfig,
        book: RequestBook,
        call: Callable[[Json], Json],
        record: Callable[[Json], None],
    ) -> None:
        """An empty scheduler."""
        self.config = config
        self.book = book
        self.call = call
        self.record = record
        self.reqs: dict[str, ReqState] = {}
        self.waiting: list[str] = []
        self.running: list[str] = []
        self.remote: list[str] = []
        self.pending: list[list[int]] = []
        """Popped block lists awaiting their deferred free, oldest first."""
        self.copies = "partial-hash-hits" in features_used(config)
        """Whether allocations may queue copy-on-write copies (:meth:`hand_off_copies`)."""
        self.whole_prefill = False
        """Whether every chunk is the whole rest of the request (an engine without chunked prefill)."""
        self.drain_zeroing = False
        """Whether the zeroing list is drained (``take_new_block_ids``) at the end of every
        scheduling pass, here after each allocation and each failed load's re-listing: vLLM's
        scheduler of a model that zeroes fresh blocks drains it at the end of every ``schedule()``
        (0.24.0 on), so no listing outlives the pass that made it (a block freed and handed on later
        was zeroed before its next owner got it)."""
        self.zeroing_skip = ""
        """How the scheduler keeps a delayed connector load's blocks off the zeroing list: ``range``
        (vLLM 0.26.0 to 0.31.0, in a model that zeroes fresh blocks: it asks
        ``get_zeroing_block_ids_in_range`` after the admission and leaves those ids out),
        ``groups`` (0.32.0 on: ``allocate_slots(skip_zeroing_group_ids=...)`` names the groups the
        connector loads, its prefix-cacheable ones) or ``""`` (not asked)."""

    # -- requests ----------------------------------------------------------

    def add(self, op: Json, encoder_tokens: int = 0, reusable: bool = True) -> ReqState:
        """Record an ``add_request`` operation; the request waits."""
        self.record(op)
        st = ReqState(op["rid"], encoder_tokens=encoder_tokens, extra=op.get("extra"), reusable=reusable)
        self.reqs[st.rid] = st
        self.waiting.append(st.rid)
        return st

    def num_tokens(self, rid: str) -> int:
        """Prompt plus output tokens of ``rid`` so far."""
        return int(self.book.requests[rid].num_tokens)

    def tokens(self, rid: str) -> list[int]:
        """Every token of ``rid`` so far."""
        return list(self.book.requests[rid].all_token_ids)

    def sample(self, rid: str, token: int) -> None:
        """The model produced ``token`` for ``rid``."""
        self.record({"op": "append_tokens", "rid": rid, "tokens": [token]})

    def sync(self, st: ReqState) -> None:
        """Tell the request values what changed in ``st`` (nothing if nothing did)."""
        req = self.book.requests[st.rid]
        op: Json = {"op": "set_request", "rid": st.rid}
        if req.num_computed_tokens != st.computed:
            op["num_computed_tokens"] = st.computed
        if req.status.value != st.status:
            op["status"] = st.status
        if req.num_preemptions != st.preemptions:
            op["num_preemptions"] = st.preemptions
        if req.num_in_flight_tokens != st.in_flight:
            op["num_in_flight_tokens"] = st.in_flight
        if len(op) > 2:
            self.record(op)

    # -- chunks -------------------------------------------------------------

    def chunk_bound(self, rid: str, start: int) -> int:
        """The largest chunk a caller should ask for from ``start``: the
        remaining tokens, at most the step token budget (at least 1)."""
        return max(1, min(self.num_tokens(rid) - start, self.config.batched_tokens()))

    def chunk(self, rid: str, start: int, n: int, admission: bool = False) -> int:
        """The chunk scheduled when ``n`` tokens are wanted (:func:`schedule_chunk`),
        cut at the junction of the request's prefix hint and short of an MTP
        drafter's look-ahead (:func:`settle_chunk`; ``admission``: the chunk
        of the admission that did the lookup)."""
        if self.whole_prefill:
            return self.num_tokens(rid) - start
        prompt = self.book.requests[rid].num_prompt_tokens
        total = self.num_tokens(rid)
        n = schedule_chunk(self.config, total, start, n, self.tail_stop(rid, start), prompt)
        st = self.reqs.get(rid)
        return settle_chunk(self.config, total, start, n, st.hint if st else 0, admission)

    def tail_stop(self, rid: str, start: int) -> int:
        """Where a prefill chunk from ``start`` must stop so that a Mamba tail
        entry can be registered (:func:`~kvref.scheduler_chunks.mamba_tail_stop`);
        0 (no stop) unless the configuration has fine-grained hits."""
        req = self.book.requests[rid]
        return mamba_tail_stop(self.config, req.num_prompt_tokens, req.num_tokens, start) if self.copies else 0

    # -- scheduling moves ---------------------------------------------------

    def lookup(self, rid: str) -> Json:
        """The prefix lookup of a waiting request (``get_computed_blocks``)."""
        return self.call({"op": "get_computed_blocks", "rid": rid})

    def read_hint(self, rid: str) -> int:
        """Read the prefix hint right after ``rid``'s lookup, as vLLM's
        scheduler does (``get_prefix_hint``); later chunks of ``rid`` use it.
        An adapter without the operation answers None: no hint."""
        out = self.call({"op": "get_prefix_hint", "rid": rid})
        hint = out if isinstance(out, int) and not isinstance(out, bool) else 0
        self.reqs[rid].hint = hint
        return hint

    def admit(
        self, op: Json, hit: int, external: int = 0, delay: bool = False, looked_up: bool = True
    ) -> bool:
        """Run an admission's ``allocate_slots`` ``op``; on success the request
        leaves the waiting queue and runs (or, with ``delay``, waits for its
        connector load of ``hit + external`` tokens).

        From vLLM 0.27.0 on, a successful admission that did a prefix lookup
        records it in the statistics (``record_prefix_cache_stats``), as the
        scheduler does."""
        if delay and self.zeroing_skip == "groups":
            loaded = [g for g, kind in enumerate(self.config.groups) if prefix_cacheable(kind)]
            op = {**op, "skip_zeroing_group_ids": loaded}
        if not allocated(self.call(op)):
            return False
        self.hand_off_copies()
        rid = op["rid"]
        if delay and external > 0 and self.zeroing_skip == "range":
            start = self.reqs[rid].computed + hit
            self.call({"op": ZEROING_RANGE, "rid": rid, "start_token": start, "end_token": start + external})
        self.end_of_pass()
        if looked_up and not self.config.profile.stats_at_lookup:
            self.call({"op": "record_prefix_cache_stats", "rid": rid, "num_hits": hit})
        st = self.reqs[rid]
        if rid in self.waiting:
            self.waiting.remove(rid)
        if delay:
            st.status, st.remote_target, st.remote_local = "WAITING_FOR_REMOTE_KVS", hit + external, hit
            self.remote.append(rid)
        else:
            start = st.computed + hit + external
            self.scheduled(st, start, op["num_new_tokens"])
            st.admitted(start + op["num_new_tokens"])
            self.running.append(rid)
        self.sync(st)
        return True

    def advance(self, rid: str, new: int, lookahead: int = 0) -> bool:
        """A running request's step of ``new`` tokens; False if it did not fit."""
        op = {"op": "allocate_slots", "rid": rid, "num_new_tokens": new, "num_lookahead_tokens": lookahead}
        if not allocated(self.call(op)):
            return False
        self.hand_off_copies()
        self.end_of_pass()
        st = self.reqs[rid]
        self.scheduled(st, st.computed, new)
        st.computed += new
        self.sync(st)
        return True

    def advance_batch(self, items: list[tuple[str, int, int]]) -> list[bool]:
        """Several running requests' steps in one batch ``(rid, new tokens,
        lookahead)`` (``allocate_slots_batch``: the same as their calls one after
        another); per request, whether it fit."""
        op = {
            "op": "allocate_slots_batch",
            "items": [{"rid": r, "num_new_tokens": n, "num_lookahead_tokens": k} for r, n, k in items],
        }
        outs = self.call(op)
        fits = [out is not None for out in outs] if isinstance(outs, list) else [False] * len(items)
        if any(fits):
            self.hand_off_copies()
            self.end_of_pass()
        for (rid, new, _), fit in zip(items, fits, strict=True):
            if fit:
                st = self.reqs[rid]
                self.scheduled(st, st.computed, new)
                st.computed += new
                self.sync(st)
        return fits

    def scheduled(self, st: ReqState, start: int, n: int) -> None:
        """``st`` computes ``n`` tokens from ``start`` in this step (nothing to
        keep here: every step runs at once; :mod:`kvref.scheduler_pipeline`
        keeps steps in flight)."""

    def hand_off_copies(self) -> None:
        """The end of a step that allocated: take the copy-on-write copies and
        release their retained blocks at once, in the order given (as vLLM's
        scheduler does when block frees are not deferred). Only for
        configurations with fine-grained hits (vLLM 0.26.0 on)."""
        if not self.copies:
            return
        out = self.call({"op": "take_kv_cache_block_copies"})
        if isinstance(out, dict) and out.get("retained"):
            self.call({"op": "free_blocks", "block_ids": out["retained"]})

    def end_of_pass(self) -> None:
        """The end of a scheduling pass: drain the zeroing list where the
        model zeroes fresh blocks (:attr:`drain_zeroing`)."""
        if self.drain_zeroing:
            self.call({"op": "take_new_block_ids"})

    def remote_loaded(self, rid: str) -> None:
        """The connector finished loading: cache what it loaded; the request
        waits at the head of the queue with those tokens computed."""
        st = self.reqs[rid]
        self.call({"op": "cache_blocks", "rid": rid, "num_computed_tokens": st.remote_target})
        self.remote.remove(rid)
        st.status, st.computed = "WAITING", st.remote_target
        self.sync(st)
        self.waiting.insert(0, rid)

    def remote_failed(self, rid: str, valid: int, zeroing: bool) -> None:
        """The connector load failed past ``valid`` tokens (block-aligned), as
        vLLM's scheduler handles it (``_update_waiting_for_remote_kv``, 0.26.0
        on): with valid tokens, cache them and, where the model zeroes fresh
        blocks, list the blocks past them for zeroing again
        (``record_blocks_for_zeroing``: their zeroing was skipped while the
        load was to fill them); with none, free the request's blocks. Either
        way it waits at the head of the queue with ``valid`` tokens computed."""
        st = self.reqs[rid]
        self.remote.remove(rid)
        if valid:
            self.call({"op": "cache_blocks", "rid": rid, "num_computed_tokens": valid})
            if zeroing:
                self.call({"op": "record_blocks_for_zeroing", "rid": rid, "start_token": valid})
                self.end_of_pass()
        else:
            self.call({"op": "free", "rid": rid})
        st.status, st.computed = "WAITING", valid
        self.sync(st)
        self.waiting.insert(0, rid)

    def release(self, rid: str, pop: bool) -> list[int] | None:
        """Free ``rid``'s blocks now, or pop them for a deferred free (returns
        the popped list, kept in :attr:`pending` when it is not empty)."""
        if not pop:
            self.call({"op": "free", "rid": rid})
            return None
        popped: list[int] = self.call({"op": "pop_blocks_for_free", "rid": rid})
        if popped:
            self.pending.append(popped)
        return popped

    def preempt(self, rid: str, pop: bool) -> list[int] | None:
        """Take a running request's blocks; it waits again from scratch."""
        popped = self.release(rid, pop)
        self.running.remove(rid)
        st = self.reqs[rid]
        st.preempted()
        self.sync(st)
        self.waiting.insert(0, rid)
        return popped

    def forget(self, rid: str) -> ReqState:
        """Drop ``rid`` from every queue and return its last state."""
        st = self.reqs.pop(rid)
        for queue in (self.waiting, self.running, self.remote):
            if rid in queue:
                queue.remove(rid)
        return st

    def finish(self, rid: str, pop: bool) -> list[int] | None:
        """The request finished or was aborted: forget it, free or pop its blocks."""
        self.forget(rid)
        return self.release(rid, pop)

    def deferred_free(self, index: int) -> None:
        """Free the popped list ``pending[index]``, reversed (as vLLM does)."""
        blocks = self.pending.pop(index)
        self.call({"op": "free_blocks", "block_ids": list(reversed(blocks))})
