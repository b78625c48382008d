"""Hand-written traces: a :class:`Script` plays a scheduler on kvspec and
writes down every operation; a :class:`Scenario` names a script, its
configuration and what it pins down.

Both trace corpora written by hand use them: the directed traces
(:mod:`kvtools.directed`) and the minimal known-divergence traces
(:mod:`kvtools.divergence_traces`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvref.adapters import load_factory
from kvref.ops import REQUEST_OPS, RequestBook, execute
from kvref.scheduler import Scheduler
from kvref.traces import Trace
from kvspec.config import AttentionKind, KVCacheConfig
from kvspec.profiles import VLLM_0_25_1

Json = Any


class Script:
    """A scheduler script run on kvspec while it is written down.

    Facade calls return kvspec's output (so a script can branch on it, as a
    scheduler would) and are recorded with it and the view digest after it.
    The scheduler-shaped moves (:meth:`admit`, :meth:`step`, :meth:`decode`,
    :meth:`preempt`, :meth:`free`) are those of the one scheduler model,
    :class:`kvref.scheduler.Scheduler`; raw :meth:`call` and :meth:`request`
    operations reach the manager and the request book directly, for the
    arguments no scheduler would pass.
    """

    def __init__(self, config: KVCacheConfig) -> None:
        """A fresh kvspec manager for ``config``, an empty request book and scheduler."""
        self.config = config
        self.adapter = load_factory("spec")(config)
        self.book = RequestBook(config)
        self.steps: list[Json] = []
        self.sched = Scheduler(config, self.book, self.call, self._record)

    # -- raw operations --------------------------------------------------------------------------

    def request(self, op: Json) -> None:
        """A request operation (``add_request``, ``append_tokens``, ``set_request``).

        The scheduler model follows: an added request waits, a ``set_request``
        sets its state to the values given.
        """
        assert op["op"] in REQUEST_OPS
        if op["op"] == "add_request":
            self.sched.add(op)
            return
        self._record(op)
        st = self.sched.reqs.get(op["rid"]) if op["op"] == "set_request" else None
        if st is not None:
            st.computed = op.get("num_computed_tokens", st.computed)
            st.status = op.get("status", st.status)
            st.preemptions = op.get("num_preemptions", st.preemptions)

    def call(self, op: Json) -> Json:
        """A facade operation; returns kvspec's output."""
        out = execute(self.adapter, self.book, op)
        self.steps.append({**op, "expect": out, "view": self.adapter.to_view().digest()})
        return out

    def play(self, ops: Sequence[Json]) -> None:
        """Raw operations in order, each a request operation or a facade call."""
        for op in ops:
            if op["op"] in REQUEST_OPS:
                self.request(op)
            else:
                self.call(op)

    # -- scheduler moves -------------------------------------------------------------------------

    def add(self, rid: str, prompt: Sequence[int], **extra: Json) -> None:
        """A new waiting request."""
        op: Json = {"op": "add_request", "rid": rid, "prompt": list(prompt)}
        if extra:
            op["extra"] = extra
        self.sched.add(op)

    def tokens(self, rid: str) -> int:
        """The request's token count (prompt plus output so far)."""
        return self.sched.num_tokens(rid)

    def computed(self, rid: str) -> int:
        """The request's computed tokens (0 once it finished)."""
        st = self.sched.reqs.get(rid)
        return 0 if st is None else st.computed

    def admit(self, rid: str, new: int | None = None, external: int = 0, lookahead: int = 0, **kw: Json) -> bool:
        """Prefix lookup, then ``allocate_slots`` with the hit; on success the
        request runs with ``hit + external + new`` computed tokens (``new``
        defaults to the rest of its tokens). ``kw`` are further
        ``allocate_slots`` arguments."""
        found = self.sched.lookup(rid)
        hit = int(found["num_tokens"])
        n = self.tokens(rid) - hit - external if new is None else new
        op: Json = {"op": "allocate_slots", "rid": rid, "num_new_tokens": n, "num_new_computed_tokens": hit}
        if any(found["blocks"]):
            op["new_computed_blocks"] = found["blocks"]
        op.update(num_external_computed_tokens=external, num_lookahead_tokens=lookahead, **kw)
        return self.sched.admit(op, hit, external)

    def step(self, rid: str, new: int | None = None, lookahead: int = 0, sample: int | None = None) -> bool:
        """A running request's step (default: every uncomputed token), then,
        if ``sample`` is given, the sampled token is appended."""
        n = self.tokens(rid) - self.computed(rid) if new is None else new
        if not self.sched.advance(rid, n, lookahead):
            return False
        if sample is not None:
            self.sched.sample(rid, sample)
        return True

    def decode(self, rid: str, steps: int, lookahead: int = 0, first_token: int = 1) -> int:
        """``steps`` decode steps; before each, if every token is computed,
        the next sampled token (``first_token, first_token + 1, ...``) is
        appended. Returns how many steps fitted."""
        for i in range(steps):
            if self.tokens(rid) == self.computed(rid):
                self.sched.sample(rid, first_token + i)
            if not self.step(rid, lookahead=lookahead):
                return i
        return steps

    def free(self, rid: str) -> None:
        """The request finishes; its blocks are freed."""
        self.sched.finish(rid, pop=False)

    def preempt(self, rid: str) -> None:
        """Free the running request's blocks and put it back to waiting with nothing computed."""
        self.sched.preempt(rid, pop=False)

    def new_step(self) -> None:
        """A new scheduler step begins."""
        self.call({"op": "new_step_starts"})

    def _record(self, op: Json) -> None:
        self.book.apply(op)
        self.steps.append(op)


@dataclass(frozen=True)
class Scenario:
    """One hand-written trace: a name, what it pins down, its configuration and script."""

    name: str
    why: str
    config: KVCacheConfig
    script: Callable[[Script], None]
    divergence: tuple[str, int] | None = None
    """A known divergence of vLLM 0.25.1 the script meets (``kit/kvref/divergences.toml``):
    (its id, the step at which vLLM's output differs; -1: when the manager is built)."""

    def run(self) -> Script:
        """The script, run on kvspec."""
        s = Script(self.config)
        self.script(s)
        return s

    def record(self) -> Trace:
        """The directed trace: the script's steps, then a ``take_events`` for
        whatever the script left in the event queue; the header names the
        scenario, says why it exists and marks a known divergence as
        ``traces/vllm-0.25.1/divergences`` files are."""
        s = self.run()
        if self.config.enable_kv_cache_events:
            s.call({"op": "take_events"})
        meta: dict[str, Json] = {"directed": self.name, "why": self.why}
        if self.divergence is not None:
            meta.update(known_divergence=self.divergence[0], divergence_step=self.divergence[1])
        return Trace(self.config, list(s.steps), meta)


def playing(ops: Sequence[Json]) -> Callable[[Script], None]:
    """A script that only plays ``ops`` (see :meth:`Script.play`)."""

    def script(s: Script) -> None:
        s.play(ops)

    return script


def config(*groups: AttentionKind, **kw: Any) -> KVCacheConfig:
    """A directed scenario's configuration: 16 blocks, ``max_model_len`` 64, events on, unless ``kw`` says otherwise."""
    base: dict[str, Any] = {"num_blocks": 16, "max_model_len": 64, "enable_kv_cache_events": True}
    base.update(kw)
    base.setdefault("profile", VLLM_0_25_1)
    return KVCacheConfig(groups=tuple(groups), **base)
