"""Directed traces: hand-written scheduler scripts for states the random
machine rarely or never reaches.

Each scenario is a short script over the facade (a configuration and a
sequence of operations) written to pin down one rule: a capacity estimate at
the exact free-block boundary, a hybrid hit search that comes back to an
EAGLE group, a caller error on a boundary value, a default argument. The
script is run on kvspec, which records every output and view digest, and the
result is written to ``traces/directed/<name>.jsonl`` as an ordinary
version-1 trace (``docs/traces.md``), so every adapter replays it like a
golden trace, real vLLM 0.25.1 included (``ci/test.sh`` does).

Regenerate with ``kvref traces directed`` (``--check`` only compares);
``tests/stateful/test_traces.py`` fails when a committed file differs from a
fresh recording. The mutation kill test (``tests/mutation/test_kill.py``)
replays them first: most scenarios were written for a generic mutant of
kvimpl that the random runs did not detect (the reason is in each
scenario's ``why``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvref.adapters import load_factory
from kvref.ops import REQUEST_OPS, RequestBook, execute
from kvref.traces import Trace
from kvspec.config import (
    MLA,
    AttentionKind,
    CrossAttention,
    FullAttention,
    KVCacheConfig,
    Mamba,
    SlidingWindow,
)
from kvspec.profiles import VLLM_0_25_1

Json = Any
ROOT = Path(__file__).resolve().parents[2]
DIRECTED_DIR = ROOT / "traces" / "directed"


class Script:
    """A scheduler script run on kvspec while it is written down.

    Facade calls return kvspec's output (so a script can branch on it, as a
    scheduler would) and are recorded with it and the view digest after it.
    """

    def __init__(self, config: KVCacheConfig) -> None:
        """A fresh kvspec manager for ``config`` and an empty request book."""
        self.config = config
        self.adapter = load_factory("spec")(config)
        self.book = RequestBook(config)
        self.steps: list[Json] = []
        self.computed: dict[str, int] = {}

    # -- raw operations --------------------------------------------------------------------------

    def request(self, op: Json) -> None:
        """A request operation (``add_request``, ``append_tokens``, ``set_request``)."""
        assert op["op"] in REQUEST_OPS
        self.book.apply(op)
        self.steps.append(op)

    def call(self, op: Json) -> Json:
        """A facade operation; returns kvspec's output."""
        out = execute(self.adapter, self.book, op)
        self.steps.append({**op, "expect": out, "view": self.adapter.to_view().digest()})
        return out

    # -- scheduler-shaped helpers ----------------------------------------------------------------

    def add(self, rid: str, prompt: Sequence[int], **extra: Json) -> None:
        """A new waiting request."""
        op: Json = {"op": "add_request", "rid": rid, "prompt": list(prompt)}
        if extra:
            op["extra"] = extra
        self.request(op)
        self.computed[rid] = 0

    def tokens(self, rid: str) -> int:
        """The request's token count (prompt plus output so far)."""
        return int(self.book.requests[rid].num_tokens)

    def admit(self, rid: str, new: int | None = None, external: int = 0, lookahead: int = 0, **kw: Json) -> bool:
        """Prefix lookup, then ``allocate_slots`` with the hit; on success the
        request runs with ``hit + external + new`` computed tokens (``new``
        defaults to the rest of its tokens)."""
        found = self.call({"op": "get_computed_blocks", "rid": rid})
        hit = int(found["num_tokens"])
        n = self.tokens(rid) - hit - external if new is None else new
        op: Json = {"op": "allocate_slots", "rid": rid, "num_new_tokens": n, "num_new_computed_tokens": hit}
        if any(found["blocks"]):
            op["new_computed_blocks"] = found["blocks"]
        op.update(num_external_computed_tokens=external, num_lookahead_tokens=lookahead, **kw)
        if self.call(op) is None:
            return False
        self.computed[rid] = hit + external + n
        self.request({"op": "set_request", "rid": rid, "status": "RUNNING", "num_computed_tokens": self.computed[rid]})
        return True

    def step(self, rid: str, new: int | None = None, lookahead: int = 0, sample: int | None = None) -> bool:
        """A running request's step (default: every uncomputed token), then,
        if ``sample`` is given, the sampled token is appended."""
        n = self.tokens(rid) - self.computed[rid] if new is None else new
        if (
            self.call({"op": "allocate_slots", "rid": rid, "num_new_tokens": n, "num_lookahead_tokens": lookahead})
            is None
        ):
            return False
        self.computed[rid] += n
        self.request({"op": "set_request", "rid": rid, "num_computed_tokens": self.computed[rid]})
        if sample is not None:
            self.request({"op": "append_tokens", "rid": rid, "tokens": [sample]})
        return True

    def decode(self, rid: str, steps: int, lookahead: int = 0, first_token: int = 1) -> int:
        """``steps`` decode steps; before each, if every token is computed,
        the next sampled token (``first_token, first_token + 1, ...``) is
        appended. Returns how many steps fitted."""
        for i in range(steps):
            if self.tokens(rid) == self.computed[rid]:
                self.request({"op": "append_tokens", "rid": rid, "tokens": [first_token + i]})
            if not self.step(rid, lookahead=lookahead):
                return i
        return steps

    def free(self, rid: str) -> None:
        """The request finishes."""
        self.call({"op": "free", "rid": rid})
        self.computed.pop(rid, None)

    def preempt(self, rid: str) -> None:
        """Free the request and put it back to waiting with nothing computed."""
        self.call({"op": "free", "rid": rid})
        preemptions = int(self.book.requests[rid].num_preemptions) + 1
        self.request(
            {"op": "set_request", "rid": rid, "status": "PREEMPTED", "num_computed_tokens": 0,
             "num_preemptions": preemptions}
        )  # fmt: skip
        self.computed[rid] = 0

    def new_step(self) -> None:
        """A new scheduler step begins."""
        self.call({"op": "new_step_starts"})

    def trace(self, name: str, why: str) -> Trace:
        """The recorded trace."""
        return Trace(self.config, list(self.steps), {"directed": name, "why": why})


@dataclass(frozen=True)
class Scenario:
    """One directed trace: a name, what it pins down, and its script."""

    name: str
    why: str
    config: KVCacheConfig
    script: Callable[[Script], None]

    def record(self) -> Trace:
        """Run the script on kvspec; a scenario that meets a known divergence
        of vLLM 0.25.1 is marked as ``traces/divergences`` files are."""
        s = Script(self.config)
        self.script(s)
        if self.config.enable_kv_cache_events:
            s.call({"op": "take_events"})  # whatever the script left in the event queue
        trace = s.trace(self.name, self.why)
        if self.name in KNOWN_DIVERGENCES:
            known, step = KNOWN_DIVERGENCES[self.name]
            trace.meta.update(known_divergence=known, divergence_step=step)
        return trace


KNOWN_DIVERGENCES: dict[str, tuple[str, int]] = {
    name: ("mamba-align-external-estimate", 21)
    for name in ("boundary-full+mamba-align-n14", "boundary-mamba-align-n04", "boundary-mamba-align-spec-n07")
}
"""Scenarios where vLLM 0.25.1 differs from kvspec by a divergence of
``kvref/divergences.toml``: (divergence id, step at which vLLM differs).
There, vLLM's Mamba align estimate for a request with connector tokens is a
block short and its pool raises; ``kvref replay --target vllm`` checks that
it fails exactly there (``ci/test.sh``)."""


def _cfg(*groups: AttentionKind, **kw: Any) -> KVCacheConfig:
    base: dict[str, Any] = {"num_blocks": 16, "max_model_len": 64, "enable_kv_cache_events": True}
    base["profile"] = VLLM_0_25_1
    base.update(kw)
    return KVCacheConfig(groups=tuple(groups), **base)


# --- scenarios written for generic mutants of kvimpl --------------------------------------------


def _decode_fills_first_block(s: Script) -> None:
    s.add("a", range(10))
    s.admit("a")
    s.request({"op": "append_tokens", "rid": "a", "tokens": [7]})
    s.decode("a", 8, first_token=20)
    s.add("b", [*range(16), 99])
    s.admit("b")


def _lookahead_cap(s: Script) -> None:
    s.add("a", range(30))
    s.admit("a", lookahead=4)
    s.add("b", range(100, 120))
    s.admit("b", new=8, lookahead=30)


def _watermark_waiting_again(s: Script) -> None:
    # A request allocated with look-ahead while still WAITING (connector
    # scheduling), allocated again: its table is already longer than the step needs.
    s.add("a", range(16))
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 16, "num_lookahead_tokens": 16})
    s.add("b", range(100, 148))
    s.request({"op": "set_request", "rid": "b", "status": "RUNNING"})  # a running request's chunk
    s.call({"op": "allocate_slots", "rid": "b", "num_new_tokens": 48})
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 16})
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 16, "has_scheduled_reqs": False})


def _refused_after_window_slide(s: Script) -> None:
    s.add("a", range(8))
    s.admit("a")
    s.add("b", range(50, 54))
    s.admit("b")
    s.request({"op": "append_tokens", "rid": "a", "tokens": list(range(20, 28))})
    s.step("a", new=8)  # refused on this pool, after the window slid
    s.free("b")
    s.step("a", new=8)


def _schedule_past_the_prompt(s: Script) -> None:
    s.add("a", range(5))
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 8})
    s.add("b", range(5))
    s.call({"op": "get_computed_blocks", "rid": "b"})


def _cross_without_encoder(s: Script) -> None:
    s.add("a", range(10))
    s.admit("a")
    s.decode("a", 8, first_token=30)
    s.add("b", range(40, 45))
    s.admit("b", num_encoder_tokens=20)
    s.decode("b", 3, first_token=60)
    # The encoder length passed again on a running request's step: its cross
    # table already covers it, so the step needs no encoder block.
    s.request({"op": "append_tokens", "rid": "b", "tokens": [61]})
    s.call({"op": "allocate_slots", "rid": "b", "num_new_tokens": 1, "num_encoder_tokens": 20})
    s.free("a")
    s.add("c", range(70, 90))
    s.admit("c")


def _bad_hits(s: Script) -> None:
    n = s.config.num_blocks
    s.add("a", range(48))
    s.admit("a", new=40)
    s.decode("a", 2, first_token=5)
    s.free("a")
    s.add("b", range(48))
    found = s.call({"op": "get_computed_blocks", "rid": "b"})
    hit, blocks = found["num_tokens"], found["blocks"]
    base = {"op": "allocate_slots", "rid": "b", "num_new_tokens": 4, "num_new_computed_tokens": hit}
    groups = len(s.config.groups)
    s.call({**base, "new_computed_blocks": [[n]] + [[]] * (groups - 1)})
    s.call({**base, "new_computed_blocks": [[n - 1]] + [[]] * (groups - 1)})
    s.call({**base, "new_computed_blocks": [[*g, g[-1] if g else 1] for g in blocks]})
    s.call({**base, "new_computed_blocks": [[0, *g] for g in blocks]})
    s.call({**base, "new_computed_blocks": blocks})
    s.add("c", range(10))
    s.call(
        {"op": "allocate_slots", "rid": "c", "num_new_tokens": 4, "new_computed_blocks": [[1]] + [[]] * (groups - 1)}
    )


def _null_hits(s: Script) -> None:
    # A sliding-window hit may lead with null blocks; a full-attention hit never
    # holds one, and with prefix caching off no hit is valid at all.
    s.add("a", range(40))
    s.admit("a")
    s.decode("a", 2, first_token=5)
    s.free("a")
    s.add("b", range(40))
    found = s.call({"op": "get_computed_blocks", "rid": "b"})
    hit, blocks = found["num_tokens"], found["blocks"]
    base = {"op": "allocate_slots", "rid": "b", "num_new_tokens": 4, "num_new_computed_tokens": hit}
    s.call({**base, "new_computed_blocks": [[0, *blocks[0][1:]], blocks[1]]})
    s.call({**base, "new_computed_blocks": [[0] * len(blocks[0]), [0] * len(blocks[1])]})
    s.call({**base, "new_computed_blocks": blocks})


def _hits_without_caching(s: Script) -> None:
    s.add("a", range(20))
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 4, "num_new_computed_tokens": 16,
            "new_computed_blocks": [[0], []]})  # fmt: skip
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 4, "num_new_computed_tokens": 16,
            "new_computed_blocks": [[], [0]]})  # fmt: skip
    s.admit("a")


def _rehit(length: int, steps: int) -> Callable[[Script], None]:
    """A prompt of ``length`` tokens computed, decoded ``steps`` times and freed;
    its tokens and first two samples hit again."""

    def script(s: Script) -> None:
        s.add("a", range(length))
        s.admit("a")
        s.decode("a", steps, first_token=40)
        s.free("a")
        s.add("b", [*range(length), 40, 41])
        s.admit("b")

    return script


def _rehit_after_evicting(group: int, index: int) -> Callable[[Script], None]:
    """As :func:`_rehit`, with one cached block of ``a`` (group, table index) evicted before the lookup."""

    def script(s: Script) -> None:
        s.add("a", range(25))
        s.admit("a")
        table = s.call({"op": "get_block_ids", "rid": "a"})[group]
        s.free("a")
        s.call({"op": "evict_blocks", "block_ids": [table[index]]})
        s.add("b", [*range(25), 7])
        s.admit("b")

    return script


def _running_gates(s: Script) -> None:
    # reserved_blocks and full_sequence_must_fit on a running request whose
    # table is already longer than the step needs (an earlier look-ahead).
    s.add("a", range(8))
    s.admit("a", lookahead=8)
    s.request({"op": "append_tokens", "rid": "a", "tokens": [1]})
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 1, "reserved_blocks": 3})
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 1, "reserved_blocks": 1})


def _running_full_sequence(s: Script) -> None:
    s.add("a", range(40))
    s.admit("a", new=8)
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 8, "full_sequence_must_fit": True})
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 8})


def _one_token_prompts(s: Script) -> None:
    s.add("a", [5])
    s.admit("a")
    s.decode("a", 2, first_token=6)
    s.free("a")
    s.add("b", [5])
    s.admit("b")
    s.add("c", [5, 6])
    s.admit("c")


def _cache_without_blocks(s: Script) -> None:
    s.add("a", range(10))
    s.admit("a")
    s.add("b", range(10))
    s.call({"op": "cache_blocks", "rid": "b", "num_computed_tokens": 0})
    s.call({"op": "get_num_common_prefix_blocks", "rid": "a"})
    s.admit("b")
    s.call({"op": "get_num_common_prefix_blocks", "rid": "a"})


def _cache_and_skip_edges(s: Script) -> None:
    n = s.config.num_blocks
    s.add("a", range(40))
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 20, "delay_cache_blocks": True})
    for k in (0, 16, 20, 40, 41, 48, -1):
        s.call({"op": "cache_blocks", "rid": "a", "num_computed_tokens": k})
    s.call({"op": "remove_skipped_blocks", "rid": "a", "total_computed_tokens": 0})
    s.call({"op": "remove_skipped_blocks", "rid": "a", "total_computed_tokens": -1})
    s.add("b", range(40))
    s.call({"op": "allocate_slots", "rid": "b", "num_new_tokens": 16, "delay_cache_blocks": True})
    s.call({"op": "cache_blocks", "rid": "b", "num_computed_tokens": 40})  # past b's one-block table
    s.call({"op": "cache_blocks", "rid": "b", "num_computed_tokens": 16})
    s.call({"op": "free_blocks", "block_ids": [n]})
    s.call({"op": "free_blocks", "block_ids": [n - 1]})
    s.call({"op": "evict_blocks", "block_ids": [n]})
    s.free("a")


def _negative_counts(s: Script) -> None:
    s.add("a", range(20))
    base = {"op": "allocate_slots", "rid": "a", "num_new_tokens": 4}
    for key in ("num_new_tokens", "num_new_computed_tokens", "num_lookahead_tokens", "num_external_computed_tokens",
                "num_encoder_tokens", "reserved_blocks"):  # fmt: skip
        s.call({**base, key: -1})
    s.request({"op": "set_request", "rid": "a", "num_computed_tokens": -1})
    s.call(base)
    s.request({"op": "set_request", "rid": "a", "num_computed_tokens": 0})
    s.call({**base, "num_new_tokens": 0})
    s.call({**base, "num_new_tokens": 0, "num_external_computed_tokens": 4, "delay_cache_blocks": True})


def _defaults(s: Script) -> None:
    # Only the required keys: every optional argument takes the protocol's default.
    s.add("a", range(16))
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 16})
    s.request({"op": "set_request", "rid": "a", "status": "RUNNING", "num_computed_tokens": 16})
    s.request({"op": "append_tokens", "rid": "a", "tokens": [3]})
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 1})
    s.add("b", range(16))
    s.call({"op": "get_computed_blocks", "rid": "b"})
    s.add("c", range(100, 140))
    s.call({"op": "allocate_slots", "rid": "c", "num_new_tokens": 40})
    s.call({"op": "allocate_slots", "rid": "c", "num_new_tokens": 40, "num_external_computed_tokens": 0})


def _two_mamba_groups(s: Script) -> None:
    for rid, base in (("a", 0), ("b", 0), ("c", 50)):
        s.add(rid, range(base, base + 20))
        s.admit(rid, new=16)
        s.decode(rid, 6, first_token=base + 3)
    s.free("b")
    s.add("d", range(20))
    s.admit("d")


# --- scenarios written for the coordinator's hit search -----------------------------------------


def _eagle_repass(s: Script) -> None:
    # Found by the bug-zoo hunt for eagle_drop_every_pass (vllm#33270): the
    # second pass over an EAGLE sliding-window group must not drop again.
    s.add("r1", [0] * 5)
    s.call({"op": "pop_blocks_for_free", "rid": "r1"})
    s.add("r2", [0] * 9)
    s.admit("r2", new=6, external=1)
    s.step("r2", new=1)
    s.add("r3", [0] * 9)
    s.admit("r3")


def _hit_lengths(s: Script) -> None:
    # Every prompt length from 1 to three scheduler blocks: cached, then hit
    # again by a request that extends it.
    sched = s.config.scheduler_block_size
    for length in range(1, 3 * sched + 2):
        rid, prompt = f"p{length}", [length] * length
        s.add(rid, prompt)
        if s.admit(rid):
            s.decode(rid, 2, first_token=length + 1)
            s.free(rid)
        s.add(f"q{length}", [*prompt, length + 1, 0])
        if s.admit(f"q{length}"):
            s.free(f"q{length}")
        if s.config.enable_kv_cache_events:
            s.call({"op": "take_events"})


# --- capacity at the free-block boundary ---------------------------------------------------------


def _boundary_workload(s: Script) -> None:
    """Admissions, decode, a shared prefix with connector tokens, a re-hit
    after free, a same-step hit and a preempted request re-admitted: on a
    pool just large enough, each capacity estimate decides an outcome."""
    sched = s.config.scheduler_block_size
    s.new_step()
    s.add("a", range(3 * sched + 1))
    s.admit("a", lookahead=1 if s.config.use_eagle else 0)
    s.add("b", [*range(2 * sched), 90, 91])
    s.admit("b")  # same step: a hit on blocks cached this step
    s.new_step()
    s.decode("a", 3, first_token=50)
    s.add("c", [*range(2 * sched), 70, 71, 72])
    s.admit("c", external=2)
    s.new_step()
    if s.computed.get("b"):
        s.preempt("b")
        s.admit("b")
        s.decode("b", 2, first_token=60)
    s.free("a")
    s.add("d", [*range(3 * sched + 1), 50])
    s.admit("d", full_sequence_must_fit=True)
    s.new_step()
    s.add("e", range(200, 200 + sched + 2))
    s.admit("e", reserved_blocks=1)


BOUNDARY_SHAPES: dict[str, tuple[AttentionKind, ...]] = {
    "mamba-align": (Mamba(4, "align", 0),),
    "mamba-align-spec": (Mamba(4, "align", 1),),
    "mamba-all": (Mamba(4, "all", 0),),
    "mamba-all-spec": (Mamba(4, "all", 1),),
    "full+mamba-align": (FullAttention(4), Mamba(4, "align", 0)),
    "full@2x+mamba-align": (FullAttention(8), Mamba(8, "align", 0), SlidingWindow(4, 5)),
    "full+swa": (FullAttention(4), SlidingWindow(4, 5)),
    "swa-eagle": (SlidingWindow(4, 6),),
}


def _boundary_scenarios() -> Iterator[Scenario]:
    for shape, groups in BOUNDARY_SHAPES.items():
        eagle = shape == "swa-eagle" or shape.endswith("-spec")
        for blocks in range(2, 15):
            cfg = _cfg(*groups, num_blocks=blocks, use_eagle=eagle, max_model_len=48)
            yield Scenario(
                f"boundary-{shape}-n{blocks:02d}",
                f"capacity estimates of {shape} on a pool of {blocks} blocks: the same workload on pools of 2 to 14 "
                "blocks puts every admission and step at the free-block boundary once (Mamba estimate mutants)",
                cfg,
                _boundary_workload,
            )


def scenarios() -> list[Scenario]:
    """Every directed scenario, in file-name order."""
    full16 = FullAttention(16)
    out = [
        Scenario(
            "decode-fills-first-block",
            "a short prompt decoded until its first block fills: that step must cache the block (quiet-step cache "
            "limit, kvimpl _allocate_running)",
            _cfg(full16, num_blocks=8),
            _decode_fills_first_block,
        ),
        Scenario(
            "lookahead-cap",
            "look-ahead slots are capped at max_model_len",
            _cfg(full16, num_blocks=8, max_model_len=32, use_eagle=True),
            _lookahead_cap,
        ),
        Scenario(
            "watermark-waiting-again",
            "a waiting request whose table is already longer than the step needs still passes the watermark check",
            _cfg(full16, num_blocks=10, watermark=0.5),
            _watermark_waiting_again,
        ),
        Scenario(
            "watermark-waiting-again-hybrid",
            "as watermark-waiting-again, with a sliding-window group",
            _cfg(full16, SlidingWindow(16, 32), num_blocks=14, watermark=0.5),
            _watermark_waiting_again,
        ),
        Scenario(
            "refused-after-window-slide",
            "a step refused after the window slid past blocks it freed (device rows must follow)",
            _cfg(SlidingWindow(4, 4), num_blocks=4, enable_caching=False, enable_kv_cache_events=False),
            _refused_after_window_slide,
        ),
        Scenario(
            "refused-after-window-slide-hybrid",
            "as refused-after-window-slide, with a full-attention group",
            _cfg(FullAttention(4), SlidingWindow(4, 4), num_blocks=7, enable_caching=False),
            _refused_after_window_slide,
        ),
        Scenario(
            "schedule-past-the-prompt",
            "a step scheduling more tokens than the request has caches only the request's full blocks",
            _cfg(FullAttention(4)),
            _schedule_past_the_prompt,
        ),
        Scenario(
            "schedule-past-the-prompt-hybrid",
            "as schedule-past-the-prompt, with a sliding-window group",
            _cfg(FullAttention(4), SlidingWindow(4, 8)),
            _schedule_past_the_prompt,
        ),
        Scenario(
            "cross-without-encoder",
            "cross attention takes blocks only for encoder tokens: a request without any gets none",
            _cfg(full16, CrossAttention(16), num_blocks=6, enable_caching=False, enable_kv_cache_events=False),
            _cross_without_encoder,
        ),
        Scenario(
            "bad-hits",
            "caller-given hits: an id equal to num_blocks, a stale id, a list one entry too long, a null entry, then "
            "the real hit; a hit for a request with nothing cached",
            _cfg(FullAttention(16), SlidingWindow(16, 32), num_blocks=12),
            _bad_hits,
        ),
        Scenario(
            "bad-hits-mixed-block-sizes",
            "as bad-hits, with group block sizes 32 and 16 (two hash blocks per full-attention block)",
            _cfg(FullAttention(32), SlidingWindow(16, 32), num_blocks=12),
            _bad_hits,
        ),
        Scenario(
            "null-hits",
            "the null block in a full-attention hit is a caller error (StaleHitError); a sliding-window hit's "
            "leading null blocks are not",
            _cfg(FullAttention(4), SlidingWindow(4, 5), num_blocks=24),
            _null_hits,
        ),
        Scenario(
            "hits-without-caching",
            "with prefix caching off no hit is valid, not even an all-null one (vLLM asserts there)",
            _cfg(FullAttention(16), SlidingWindow(16, 32), num_blocks=8, enable_caching=False),
            _hits_without_caching,
        ),
        Scenario(
            "cache-and-skip-edges",
            "cache_blocks at 0, inside, at and past the table and negative; remove_skipped_blocks at 0 and -1; "
            "free_blocks / evict_blocks with id num_blocks",
            _cfg(full16, num_blocks=8),
            _cache_and_skip_edges,
        ),
        Scenario(
            "rehit-window-ratio-3",
            "a sliding-window group whose block size is a third of the scheduler block size: hit ends must align",
            _cfg(FullAttention(12), SlidingWindow(4, 13), num_blocks=32),
            _rehit(30, 2),
        ),
        Scenario(
            "rehit-window-ratio-3-eagle",
            "as rehit-window-ratio-3 with EAGLE and window 5: which window blocks are worth caching",
            _cfg(FullAttention(12), SlidingWindow(4, 5), num_blocks=32, use_eagle=True),
            _rehit(30, 2),
        ),
        Scenario(
            "rehit-after-evicting-window-block",
            "a hole in the cached window blocks (one evicted): the hit must end where a whole window is cached",
            _cfg(FullAttention(8), SlidingWindow(4, 8), num_blocks=32),
            _rehit_after_evicting(1, 5),
        ),
        Scenario(
            "rehit-after-evicting-small-full-block",
            "two full-attention groups, the second with half the block size, one of its blocks evicted: the hit "
            "stays aligned to the scheduler block size",
            _cfg(FullAttention(8), FullAttention(4), num_blocks=32),
            _rehit_after_evicting(1, 1),
        ),
        Scenario(
            "running-gates",
            "reserved_blocks on a running request whose table is longer than the step needs",
            _cfg(FullAttention(4), num_blocks=6, use_eagle=True),
            _running_gates,
        ),
        Scenario(
            "running-full-sequence",
            "full_sequence_must_fit on a running sliding-window request: the per-request admission cap applies",
            _cfg(SlidingWindow(4, 4), num_blocks=6, max_num_batched_tokens=8),
            _running_full_sequence,
        ),
        Scenario(
            "one-token-prompts",
            "block size 1 and one-token prompts: a hit never covers the whole prompt",
            _cfg(FullAttention(1), num_blocks=12),
            _one_token_prompts,
        ),
        Scenario(
            "cache-without-blocks",
            "cache_blocks(0) for a request that holds no block leaves the common prefix alone",
            _cfg(FullAttention(4), num_blocks=12),
            _cache_without_blocks,
        ),
        Scenario(
            "negative-counts",
            "every count of allocate_slots at -1 in turn, and a negative num_computed_tokens, is an "
            "InvalidTokenCountError; zero new tokens only with connector tokens",
            _cfg(FullAttention(4), SlidingWindow(4, 8), num_blocks=12),
            _negative_counts,
        ),
        Scenario(
            "refused-after-window-slide-mamba",
            "as refused-after-window-slide, with a Mamba group without prefix caching",
            _cfg(Mamba(4, "none", 0), SlidingWindow(4, 4), num_blocks=7, enable_caching=False),
            _refused_after_window_slide,
        ),
        Scenario(
            "defaults",
            "allocate_slots with only the required keys: every default of the protocol applies",
            _cfg(full16, num_blocks=8, watermark=0.2),
            _defaults,
        ),
        Scenario(
            "two-mamba-groups",
            "two Mamba groups (all and align with a speculative block) and no attention group",
            _cfg(Mamba(8, "all", 0), Mamba(8, "align", 1), num_blocks=24, use_eagle=True),
            _two_mamba_groups,
        ),
        Scenario(
            "int-block-hashes-off",
            "block hashes kept as bytes (int_block_hashes off): events carry them unchanged",
            _cfg(FullAttention(4), SlidingWindow(4, 5), int_block_hashes=False),
            _hit_lengths,
        ),
        Scenario(
            "eagle-repass",
            "the hybrid hit search comes back to an EAGLE sliding-window group after another one shortened the "
            "hit: it must not drop the look-ahead block again (vllm#33270)",
            _cfg(
                FullAttention(4),
                SlidingWindow(4, 1),
                SlidingWindow(4, 5),
                use_eagle=True,
                max_model_len=32,
                enable_kv_cache_events=False,
            ),
            _eagle_repass,
        ),
        Scenario(
            "unitary-swa-eagle-window-1",
            "one sliding-window group of window 1 with EAGLE: its blocks must be cached (the look-ahead needs them)",
            _cfg(SlidingWindow(2, 1), use_eagle=True),
            _rehit(9, 3),
        ),
    ]
    for name, groups, eagle in (
        ("hit-lengths-full@2x+mamba-align", (FullAttention(8), Mamba(8, "align", 0), SlidingWindow(4, 5)), False),
        ("hit-lengths-mamba-align", (Mamba(4, "align", 0),), False),
        ("hit-lengths-full+swa+swa2-eagle", (FullAttention(4), SlidingWindow(4, 3), SlidingWindow(4, 7)), True),
        ("hit-lengths-mla+swa", (MLA(4), SlidingWindow(4, 6)), False),
    ):
        out.append(
            Scenario(
                name,
                "every prompt length up to three scheduler blocks, cached and hit again (hit alignment)",
                _cfg(*groups, num_blocks=40, use_eagle=eagle),
                _hit_lengths,
            )
        )
    out += list(_boundary_scenarios())
    return sorted(out, key=lambda sc: sc.name)


def write_all(out_dir: Path, check: bool) -> int:
    """Record every scenario; write it (or, with ``check``, compare it). Returns the exit code."""
    stale = []
    names = set()
    for sc in scenarios():
        names.add(f"{sc.name}.jsonl")
        text = sc.record().dumps()
        path = out_dir / f"{sc.name}.jsonl"
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        elif not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    extra = sorted(p.name for p in out_dir.glob("*.jsonl") if p.name not in names)
    if check and (stale or extra):
        print(f"kvref traces directed: out of date: {stale}; not a scenario: {extra}", file=sys.stderr)
        return 1
    for name in extra if not check else ():
        (out_dir / name).unlink()
    print(f"kvref traces directed: {len(names)} scenarios {'match' if check else 'written to'} {out_dir}")
    return 0


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of ``kvref traces directed``."""
    parser.add_argument("--out", type=Path, default=DIRECTED_DIR, help="output folder (default traces/directed)")
    parser.add_argument("--check", action="store_true", help="only compare the committed files with a fresh recording")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvtools.directed``."""
    args = build_parser(argparse.ArgumentParser(prog="kvref traces directed")).parse_args(argv)
    return write_all(args.out, args.check)


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["DIRECTED_DIR", "Scenario", "Script", "scenarios", "write_all"]
