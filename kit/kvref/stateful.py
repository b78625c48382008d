"""A scheduler-driving Hypothesis state machine over :class:`Lockstep`.

The machine plays vLLM's scheduler: it admits waiting requests (prefix
lookup, then ``allocate_slots`` with the hit and a chunk of the prompt),
advances running ones (chunked prefill, then decode with sampled tokens and
lookahead slots), preempts on allocation failure, finishes requests with
``free`` or with ``pop_blocks_for_free`` and a later deferred free, loads
connector tokens (``delay_cache_blocks`` + ``cache_blocks``), and calls every
other facade operation, invalid calls included. Every call goes to every
adapter and everything is compared (see :mod:`kvref.lockstep`).

Use :func:`make_lockstep_machine` to build a machine class for your targets;
``TestX = make_lockstep_machine(...).TestCase`` runs it under pytest.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hypothesis import reject, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

from kvref.adapters import AdapterFactory
from kvref.capabilities import trace_features
from kvref.divergences import Divergence
from kvref.exits import DEFAULT_OP_TIMEOUT
from kvref.hypothesis_compat import boolean, byte_string, choose, draw, integer, machine_seed, run_steps
from kvref.lockstep import Lockstep, Refused, RunStats
from kvref.scheduler import ReqState, Scheduler
from kvref.shapes import SHAPES, Shape, build_kinds, drawable
from kvref.swarm import ALL_ON, Swarm, action_swarms, swarm_default, swarms
from kvref.traces import Trace
from kvspec.config import (
    FULL_TYPE_KINDS,
    AttentionKind,
    ChunkedLocal,
    CircularBuffer,
    CrossAttention,
    FullAttention,
    KVCacheConfig,
    Mamba,
    SinkFullAttention,
    SlidingWindow,
    cacheable_blocks,
    prefix_cacheable,
)
from kvspec.errors import ConfigError, InvalidRequestError, UnsupportedByProfileError
from kvspec.hashing import HASH_FUNCTION_NAMES, ExtraKeySource, LoRA
from kvspec.mamba_tail import mamba_tail_boundary
from kvspec.partial_tail import fa_tail_boundary, registers_partial_tail
from kvspec.profiles import NEWEST, SemanticsProfile, profile_named
from kvspec.request import RequestBlockHasher

Json = Any
VOCAB = 4
"""Tokens are drawn from a tiny vocabulary so equal blocks recur by chance too."""
REUSE = ("", "", "repeat", "extend", "aligned")
"""How a new request reuses an earlier one's tokens ("" = a fresh prompt; first, so it shrinks there)."""
PAST = 6
"""Token lists remembered for reuse."""
STEP_EXTRAS = (
    "",
    "take_events",
    "take_new_block_ids",
    "make_prefix_cache_stats",
    "usage",
    "evict_blocks",
    "reset_prefix_cache",
)
"""What may follow ``new_step_starts`` in the ``new_step`` rule ("" = nothing)."""
_EXTRA_FEATURES = {"salt": "cache_salt", "lora": "lora", "mm": "mm", "embeds": "prompt_embeds"}
"""The feature of each extra-key choice of a fresh prompt."""
BAD_CONFIGS = (
    "blocks", "block_size", "window", "watermark", "hash", "eagle_group", "sink", "profile", "no_groups",
    "max_model_len", "batched_tokens", "cp_size", "hash_block", "hash_block_coarse", "hash_block_unitary",
    "ring_only_hybrid", "equal_groups", "chunk", "chunked_eagle", "chunked_block_size", "mamba_mode",
    "mamba_spec_blocks", "cross_cached", "cp_sink", "cp_hybrid", "fine_hits_blocked", "cp_ring", "cp_cached_mamba",
    "foreign_kind", "old_release_watermark", "old_release_budget",
)  # fmt: skip
"""Broken configurations ``invalid_other`` tries (each must raise ConfigError; see :func:`bad_config`)."""
BAD_ALLOCATIONS = ("negative", "zero", "too_long", "groups", "running_hit", "stale_hit", "foreign_hit", "bad_hit")
"""The broken ``allocate_slots`` calls ``invalid_allocate`` makes."""
BAD_OTHERS = ("double_free", "bad_evict", "unknown_prefix", "cache_beyond", "config", "count", "request")
"""The other caller errors ``invalid_other`` makes."""
BAD_HITS = ("out_of_pool", "caching_off", "ring_group", "null_in_full", "length")
"""Broken hit lists ``invalid_allocate`` sends on a first allocation (see ``_bad_hit``)."""
BAD_COUNTS = ("stats_hits", "skipped_tokens", "cache_tokens", "free_out_of_pool", "cache_unallocated")
"""Negative counts, out-of-pool ids and caching past the table (``invalid_other``)."""
BAD_REQUESTS = ("request_id", "empty_prompt", "str_prompt", "negative_token", "lora_id", "lora_path", "append_str")
"""Caller errors of kvspec's request hasher (each must raise InvalidRequestError)."""


def draw_tokens(data: st.DataObject, min_size: int, max_size: int) -> list[int]:
    """Between ``min_size`` and ``max_size`` tokens of the :data:`VOCAB` vocabulary.

    NOTE: drawn as one byte string, each byte a token modulo VOCAB (uniform,
    as 256 is a multiple of VOCAB), not as a list of integers: Hypothesis
    makes one choice for a byte string and two per list element (the element
    and whether another follows), and the token lists were a sixth of every
    choice a ci run made. It shrinks the same way: shorter, then towards 0.
    """
    return [b % VOCAB for b in byte_string(data, min_size, max_size)]


@dataclass(frozen=True)
class ForeignKind:
    """A group object that is no attention kind (``bad_config``'s ``foreign_kind``)."""

    block_size: int


def bad_config(cfg: KVCacheConfig, kind: str) -> dict[str, Any] | None:
    """The fields that break ``cfg`` in the way ``kind`` names (a
    :data:`BAD_CONFIGS` entry), or None where that break does not apply to
    its release (each is a ConfigError under the profile it is tried with)."""
    first, p = cfg.groups[0], cfg.profile
    bs, sbs = first.block_size, cfg.scheduler_block_size
    cached = {"enable_caching": True, "dcp_world_size": 1, "pcp_world_size": 1, "use_eagle": False, "eagle_groups": ()}
    hybrid_cp = dict(cached, groups=(FullAttention(4), SlidingWindow(4, 8)), dcp_world_size=2)
    table: dict[str, dict[str, Any] | None] = {
        "blocks": {"num_blocks": 0},
        "block_size": {"groups": (FullAttention(0),)},
        "window": {"groups": (SlidingWindow(bs, 0),)},
        "watermark": {"watermark": 1.0},
        "hash": {"hash_function": "md5"},
        "eagle_group": {"use_eagle": True, "eagle_groups": (len(cfg.groups),)},
        # a sink of a block and one token (a block of one token divides any sink: use two)
        "sink": {"groups": (SinkFullAttention(max(bs, 2), max(bs, 2) + 1),)},
        "profile": {"profile": p.name},
        "no_groups": {"groups": ()},
        "max_model_len": {"max_model_len": 0},
        "batched_tokens": {"max_num_batched_tokens": 0},
        "cp_size": {"dcp_world_size": 0},
        "hash_block": {"hash_block_size": sbs + 1},
        "hash_block_coarse": dict(cached, groups=(FullAttention(2), SlidingWindow(3, 4)), hash_block_size=3),
        "hash_block_unitary": dict(cached, groups=(FullAttention(4),), hash_block_size=2),
        "ring_only_hybrid": dict(cached, groups=(CircularBuffer(4), CircularBuffer(8))),
        "equal_groups": None if p.single_spec_group_hybrid else dict(cached, groups=(FullAttention(4),) * 2),
        "chunk": {"groups": (ChunkedLocal(bs, 0),)},
        "chunked_eagle": dict(cached, groups=(ChunkedLocal(4, 8),), use_eagle=True),
        "chunked_block_size": dict(cached, groups=(FullAttention(8), ChunkedLocal(4, 16))),
        "mamba_mode": {"groups": (Mamba(bs, "bogus"),)},  # type: ignore[arg-type]  # the broken argument
        "mamba_spec_blocks": {"groups": (Mamba(bs, "none", -1),)},
        "cross_cached": dict(cached, groups=(CrossAttention(bs),)),
        "cp_sink": dict(cached, groups=(SinkFullAttention(4, 4),), dcp_world_size=2),
        "cp_hybrid": hybrid_cp if p.cp_block_scaling == "dcp-pcp" else None,
        "foreign_kind": {"groups": (*cfg.groups, ForeignKind(bs))},
        "old_release_watermark": None if p.admission_controls else {"watermark": 0.1},
        "old_release_budget": None if p.admission_controls else {"max_num_batched_tokens": 8},
        # the last three: configurations the release fails on, or that kvspec does not model for it
        "fine_hits_blocked": dict(cached, groups=(FullAttention(4), Mamba(8, "align"), SlidingWindow(8, 4)))
        if p.partial_hash_hits and not p.partial_hits_gated
        else None,
        "cp_ring": dict(cached, groups=(CircularBuffer(4),), dcp_world_size=2) if p.circular_buffer_kind else None,
        "cp_cached_mamba": dict(cached, groups=(Mamba(4, "align"),), dcp_world_size=2)
        if p.cp_block_scaling == "dcp"
        else None,
    }
    return table[kind]


def fine_tail_group(cfg: KVCacheConfig) -> int | None:
    """The first group that registers partial-tail entries at two hash
    boundaries or more inside one block (the situation of
    ``SchedulerMachine.rekeyed_tails``), or None; only with caching on and
    without EAGLE or context parallelism."""
    if not cfg.enable_caching or cfg.use_eagle or cfg.dcp_world_size * cfg.pcp_world_size > 1:
        return None
    hbs = cfg.resolved_hash_block_size()
    for g, kind in enumerate(cfg.groups):
        if registers_partial_tail(kind, cfg.profile, hbs) and kind.block_size // hbs >= 3:
            return g
    return None


@st.composite
def configs(
    draw: st.DrawFn,
    shapes: Sequence[Shape] = SHAPES,
    profile: SemanticsProfile = NEWEST,
    excluded: frozenset[str] = frozenset(),
) -> tuple[str, KVCacheConfig | str]:
    """A named configuration: group mix, sizes, caching, EAGLE, watermark,
    events, under ``profile``; instead of the configuration, the reason why
    the profile refuses it (:class:`kvspec.errors.ConfigError`).

    A switch named in ``excluded`` (``caching``, ``eagle``, ``events``,
    ``stats``, ``watermark``) is turned off after the draws, so the draws are
    the same with or without exclusions."""
    shape = draw(st.sampled_from(drawable(shapes, profile)))
    bs = draw(st.sampled_from([2, 4]))
    window = draw(st.integers(1, 3 * bs))
    eagle = shape.eagle_ok and draw(st.sampled_from([False, True, True]))
    spec_blocks = draw(st.integers(0, 2)) if eagle else 0
    # a chunked group's chunk is 1 to 3 blocks, read off the window draw (no draw of its own)
    groups = build_kinds(shape, bs, window, spec_blocks, chunk_blocks=1 + (window - 1) // bs)
    caching = shape.caching if shape.caching is not None else draw(st.sampled_from([True, True, False]))
    fields: dict[str, Any] = dict(
        # Pools of 16 blocks first (a shrunk failure keeps a workable pool), then
        # tighter and roomier ones; the tiniest pools starve every admission.
        num_blocks=draw(st.sampled_from([16, 12, 24, 8, 32, 20, 6, 40])),
        groups=groups,
        max_model_len=draw(st.sampled_from([32, 48, 64])),
        max_num_batched_tokens=draw(st.sampled_from([None, 8, 16])),
        enable_caching=caching,
        use_eagle=eagle,
        eagle_groups=tuple(draw(st.sets(st.integers(0, len(groups) - 1)))) if eagle and draw(st.booleans()) else (),
        # Two runs in three keep an event log (checked after every take_events);
        # False stays first so that shrinking drops the events.
        enable_kv_cache_events=draw(st.sampled_from([False, True, True])),
        watermark=draw(st.sampled_from([0.0, 0.0, 0.1, 0.3])),
        hash_function=draw(st.sampled_from(["sha256_cbor", "sha256_cbor", *HASH_FUNCTION_NAMES])),
        hash_seed=draw(st.sampled_from(["0", "42"])),
        log_stats=draw(st.sampled_from([False, True, True])),
        dcp_world_size=shape.dcp,
        pcp_world_size=shape.pcp,
    )
    if draw(st.integers(0, 15)) == 15:  # one run in sixteen: besides the null block, none, one or two
        fields["num_blocks"] = draw(st.sampled_from([1, 2, 3]))
    fields["num_blocks"] *= -(-len(groups) // 4)  # kvref.shapes.WIDE: as many blocks per group (1x up to 4 groups)
    # One event log in three carries the block hashes as bytes, not 64-bit ints.
    fields["int_block_hashes"] = draw(st.sampled_from([True, True, False]))
    # One cached hybrid in four hashes finer than every group (half the base block), so every
    # group's block is coarser than the hash block (coarse keys, partial tails, fine-grained hits).
    if draw(st.sampled_from([False, False, False, True])) and caching and len(groups) > 1:
        fields["hash_block_size"] = bs // 2
    for feature, key, off in _SWITCHES:
        if feature in excluded:
            fields[key] = off
    if not fields["use_eagle"] or not profile.eagle_group_flags:
        fields["eagle_groups"] = ()
    if not profile.admission_controls:  # options the release lacks (drawn all the same, so draws line up)
        fields["watermark"], fields["max_num_batched_tokens"] = 0.0, None
    try:
        return shape.name, KVCacheConfig(profile=profile, **fields)
    except ConfigError as exc:  # valid under another release, not under this profile
        return shape.name, f"{type(exc).__name__}: {exc}"


_SWITCHES = (
    ("caching", "enable_caching", False),
    ("eagle", "use_eagle", False),
    ("events", "enable_kv_cache_events", False),
    ("stats", "log_stats", False),
    ("watermark", "watermark", 0.0),
)
"""Configuration switches an exclusion turns off: (feature, field, value)."""


@dataclass
class MachineSetup:
    """What a generated machine class runs against."""

    factories: list[AdapterFactory]
    stats: RunStats = field(default_factory=RunStats)
    failure_dir: Path = Path("kvref-failures")
    shapes: Sequence[Shape] = SHAPES
    record_dir: Path | None = None
    """If set, every run that ends without divergence is written there as a trace."""
    recorded: int = 0
    record_limit: int | None = None
    """Stop writing traces once this many were recorded."""
    min_allocations: int = 0
    """Record only runs with at least this many successful ``allocate_slots`` calls."""
    recorded_texts: set[str] = field(default_factory=set)
    """Traces already written (a run identical to an earlier one is not written again)."""
    profile: SemanticsProfile = NEWEST
    """The semantics profile every drawn configuration follows."""
    next_batch: int = 0
    """The seeded batch a continued run starts with (kept by :mod:`kvref.check`)."""
    op_timeout: float | None = DEFAULT_OP_TIMEOUT
    """Watchdog seconds per adapter operation (:func:`kvref.exits.watchdog`)."""
    known: tuple[Divergence, ...] = ()
    """Further known differences of the adapters under test (``--known``)."""
    excluded: frozenset[str] = frozenset()
    """Features left out (:mod:`kvref.capabilities`): declared, chosen, or learned."""
    learn_skips: bool = True
    """Leave out, from the next batch on, every feature an adapter raised a skip for."""
    swarm: bool = field(default_factory=swarm_default)
    """Draw a :class:`kvref.swarm.Swarm` per run (``KVREF_SWARM=1``; off by default)."""


def run_machine(machine: type[RuleBasedStateMachine], run_settings: settings) -> None:
    """Run ``machine`` once with ``run_settings``, as
    ``run_state_machine_as_test`` does, and seeded as :func:`kvref.hypothesis_compat.seed_machine`
    seeded it: a scheduler machine through its one rule in kvref's loop
    (:func:`kvref.hypothesis_compat.run_steps`, the same steps without
    Hypothesis's rule selection), any other machine through Hypothesis's runner.

    Raises:
        AssertionError: The (shrunk) failure of a run, as Hypothesis raises it.
    """
    if not issubclass(machine, SchedulerMachine):
        run_state_machine_as_test(machine, settings=run_settings)
        return
    scheduler = machine

    def start(data: st.DataObject) -> SchedulerMachine:
        m = scheduler()
        m.setup(data)
        return m

    run_steps(start, SchedulerMachine.step, SchedulerMachine.teardown, run_settings, machine_seed(machine))


def make_lockstep_machine(setup: MachineSetup) -> type[RuleBasedStateMachine]:
    """A state machine class driving ``setup.factories`` (reference first)."""

    class LockstepMachine(SchedulerMachine):
        SETUP = setup

    return LockstepMachine


class SchedulerMachine(RuleBasedStateMachine):
    """Plays a scheduler against the adapters of ``SETUP``."""

    SETUP: MachineSetup

    def __init__(self) -> None:
        """No configuration yet (drawn in :meth:`setup`)."""
        super().__init__()
        self.lock: Lockstep | None = None
        self.sched: Scheduler | None = None
        self.prefixes: list[list[int]] = []
        self.past: list[tuple[list[int], Json]] = []
        self.counter = 0
        self.swarm: Swarm = ALL_ON
        self.actions_off: frozenset[str] = frozenset()
        self.cross = False
        self.tail_group: int | None = None
        self.past_tail_groups: tuple[int, ...] = ()

    # -- configuration -------------------------------------------------------

    @initialize(data=st.data())
    def setup(self, data: st.DataObject) -> None:
        """Draw a configuration; build every adapter and a prefix universe.

        A configuration the profile (or an adapter) refuses is counted with
        its reason and the run is rejected: it checks nothing."""
        setup = self.SETUP
        name, cfg = draw(data, configs(setup.shapes, setup.profile, setup.excluded), label="config")
        stats = setup.stats
        if isinstance(cfg, str):
            stats.refused_configs[cfg.split(":", 1)[0]] += 1
            stats.refused_reasons[f"{name}: {cfg}"] += 1
            reject()
        self.cfg, self.shape = cfg, name
        self.cross = any(isinstance(k, CrossAttention) for k in cfg.groups)
        self.tail_group = fine_tail_group(cfg)
        hbs = cfg.resolved_hash_block_size()
        self.past_tail_groups = tuple(
            g for g, k in enumerate(cfg.manager_groups())
            if cfg.enable_caching and registers_partial_tail(k, cfg.profile, hbs)
        )  # fmt: skip
        try:
            self.lock = Lockstep(
                cfg, setup.factories, stats, setup.failure_dir, name, setup.op_timeout, setup.known, setup.excluded
            )
        except UnsupportedByProfileError as exc:
            stats.refused_configs["UnsupportedByProfileError"] += 1
            stats.refused_reasons[f"{name}: {exc}"] += 1
            reject()
        except Refused as exc:
            stats.refused_configs[exc.kind] += 1
            stats.refused_reasons[f"{name}: {exc.reason}"] += 1
            if exc.feature:
                stats.skipped[f"construct: {exc.feature}"] += 1
            reject()
        self.sched = Scheduler(cfg, self.lock.book, self.lock.call, self.lock.request_op)
        sched = cfg.scheduler_block_size
        for _ in range(3):
            n = integer(data, 1, 3) * sched + integer(data, 0, sched - 1)
            self.prefixes.append(draw_tokens(data, n, n))
        self.actions_off = draw(data, action_swarms(ACTION_NAMES[1:], ("add_request",)), label="actions")
        if setup.swarm:
            self.swarm = draw(data, swarms(), label="swarm")

    # -- helpers -------------------------------------------------------------

    @property
    def live(self) -> bool:
        return self.lock is not None and not self.lock.halted

    def _allowed(self, feature: str) -> bool:
        """Whether the machine may use ``feature``: no adapter lacks it
        (:attr:`MachineSetup.excluded`) and the profile's release has it
        (:func:`kvref.capabilities.absent_features`)."""
        return feature not in self.SETUP.excluded and (self.lock is None or feature not in self.lock.absent)

    def _on(self, feature: str) -> bool:
        """Whether this run's swarm keeps ``feature`` (:data:`kvref.swarm.SWARM_FEATURES`)."""
        return self.swarm.on(feature)

    def _swarmed(self, feature: str, value: int) -> int:
        """``value``, or 0 (its default) when this run's swarm turned ``feature`` off."""
        return value if self._on(feature) else 0

    def _pop(self, pop: bool) -> bool:
        """``pop`` (deferred free), unless the adapters lack one way of freeing
        (or this run's swarm turned deferred frees off)."""
        can_pop = self._allowed("op:pop_blocks_for_free") and self._allowed("op:free_blocks")
        pop = pop and (self._on("deferred_free") or not self._allowed("op:free"))
        if pop and not can_pop:
            return False
        return pop or (not self._allowed("op:free") and can_pop)

    @property
    def _sched(self) -> Scheduler:
        assert self.sched is not None
        return self.sched

    @property
    def reqs(self) -> dict[str, ReqState]:
        """Live requests (the scheduler model's states)."""
        return self._sched.reqs

    @property
    def waiting(self) -> list[str]:
        return self._sched.waiting

    @property
    def running(self) -> list[str]:
        return self._sched.running

    @property
    def remote(self) -> list[str]:
        return self._sched.remote

    @property
    def pending(self) -> list[list[int]]:
        return self._sched.pending

    def _call(self, op: Json, expect_unchanged: bool = False) -> Json:
        assert self.lock is not None
        return self.lock.call(op, expect_unchanged)

    def _num_tokens(self, rid: str) -> int:
        return self._sched.num_tokens(rid)

    def _chunk(self, data: st.DataObject, st_: ReqState, start: int, admission: bool = False) -> int:
        """Tokens to schedule from ``start``: a drawn chunk of what remains
        (see :func:`kvref.scheduler.schedule_chunk`), cut at the prefix hint's junction.
        One chunk in four asks for everything the step budget allows, as
        vLLM's scheduler does whenever the rest fits: a uniform draw rarely
        schedules a long prompt whole, the one admission where a Mamba align
        table ends past the block holding the prompt's tail boundary."""
        bound = self._sched.chunk_bound(st_.rid, start)
        n = bound if integer(data, 0, 3) == 0 else integer(data, 1, bound)
        return self._sched.chunk(st_.rid, start, n, admission)

    def _sample_token(self, data: st.DataObject, rid: str) -> None:
        assert self.lock is not None
        self._sched.sample(rid, integer(data, 0, VOCAB - 1))

    def _finish(self, rid: str, data: st.DataObject) -> None:
        st_ = self._sched.forget(rid)
        if st_.reusable:
            self._remember(self._sched.tokens(rid), st_.extra)
        self._release(rid, not boolean(data), data)

    def _release(self, rid: str, pop: bool, data: st.DataObject) -> None:
        """Free ``rid``'s blocks now, or pop them and free them later (async
        scheduling).

        NOTE: the next step is scheduled before the deferred free, so cascade
        attention may ask for a running request's common prefix while the
        popped blocks still hold their references; half the time it does so
        here.
        """
        pop = self._pop(pop)
        popped = self._sched.release(rid, pop)
        if pop:
            self._after_pop(rid, popped, data)

    def _after_pop(self, rid: str, popped: list[int] | None, data: st.DataObject) -> None:
        assert self.lock is not None
        self.lock.pending = len(self.pending)
        others = [r for r in self.running if r != rid]
        if popped and others and boolean(data):
            self._call({"op": "get_num_common_prefix_blocks", "rid": choose(data, tuple(others))})

    def _preempt(self, rid: str, data: st.DataObject) -> None:
        pop = self._pop(not boolean(data))
        popped = self._sched.preempt(rid, pop)
        if pop:
            self._after_pop(rid, popped, data)

    # -- the one rule: a scheduler step ---------------------------------------

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """Take one of the :data:`ACTIONS` that is ready and that this run's
        action swarm keeps; nothing once a known divergence stopped the
        comparison.

        NOTE: the actions were Hypothesis rules, each with its precondition.
        Hypothesis picks a rule by drawing a rule and asking the run's
        feature flags about it until one is ready and enabled: about ten
        choices (each with its span) per step, 72% of every choice a ci run
        made, and every choice also costs in Hypothesis' mutation and
        simulation of the choice tree. Here one index into :data:`ACTIONS`
        is drawn; if that action is not ready (or this run's action swarm,
        :func:`kvref.swarm.action_swarms`, left it out), a second choice
        picks among those that are: one or two choices per step, each ready
        action equally likely (``idle`` only on the first choice). The
        first index names an action whatever the state, as Hypothesis' rule
        index does, so the shrinker can delete a step without changing what
        the later steps do, and the simplest step does nothing (an index
        among the ready actions alone let a shrunk pick of 0 turn every step
        into ``add_request``, and shrunk traces grew by a third).
        """
        # NOTE: no precondition: setup rejects every run it builds no lockstep for, and
        # Hypothesis describes each precondition's source for its statistics at every step
        if not self.live:
            return
        ready = [name for name, ok in ACTIONS[1:] if name not in self.actions_off and ok(self)]
        name, ok = ACTIONS[integer(data, 0, len(ACTIONS) - 1)]
        if name == "idle":
            return
        if name in self.actions_off or not ok(self):
            # as Hypothesis keeps one rule flag on, a run whose swarm leaves nothing ready starts a step
            name = choose(data, ready) if len(ready) > 1 else (ready or ["new_step"])[0]
        getattr(self, name)(data)

    # -- scheduler actions ---------------------------------------------------

    def idle(self, data: st.DataObject) -> None:
        """Nothing happens in this step (the simplest step, see :data:`ACTIONS`)."""

    def add_request(self, data: st.DataObject) -> None:
        """A new request: a shared prefix and a fresh suffix, or an earlier
        request's tokens again (repeated, extended, or cut to whole blocks)."""
        assert self.lock is not None
        self.counter += 1
        rid = f"r{self.counter}"
        reuse = choose(data, REUSE) if self.past else ""
        if not self._on("reuse"):
            reuse = ""
        if reuse:
            op, reusable = self._reused_prompt(data, rid, reuse), True
        else:
            op, reusable = self._fresh_prompt(data, rid)
        # One request in ten skips the prefix cache; False is first, so that a
        # shrunk history reads the cache (``integers(0, 9) == 0`` came out
        # true for most requests: Hypothesis favours 0).
        skip = choose(data, (False,) * 9 + (True,))
        if skip and self._allowed("skip_reading_prefix_cache") and self._on("skip_reading"):
            op["skip_reading_prefix_cache"] = True
        # encoder tokens for cross attention; 0 is a request without encoder input (no cross-attention block)
        enc = integer(data, 0, 12) if self.cross else 0
        self._sched.add(op, enc, reusable)
        if reusable:
            self._remember(op["prompt"], op.get("extra"))

    def _fresh_prompt(self, data: st.DataObject, rid: str) -> tuple[Json, bool]:
        """A prompt from the prefix universe, with extra keys drawn; returns
        the operation and whether later requests may reuse its tokens."""
        prefix = choose(data, self.prefixes)
        suffix = draw_tokens(data, 1, 12)
        prompt = (prefix + suffix)[: self._prompt_limit()] or [0]
        op: Json = {"op": "add_request", "rid": rid, "prompt": prompt}
        extra = choose(data, ["", "", "", "salt", "lora", "mm", "embeds"])
        if extra and not (self._allowed(_EXTRA_FEATURES[extra]) and self._on("extra_keys")):
            extra = ""
        if extra == "salt":
            op["extra"] = {"cache_salt": "s"}
        elif extra == "lora":
            op["extra"] = {"lora": {"name": "l", "adapter_id": 1, "path": "/adapters/l"}}
        elif extra == "mm":
            off = integer(data, 0, len(prompt) - 1)
            length = integer(data, 1, len(prompt) - off)
            features = [{"identifier": choose(data, "ab"), "offset": off, "length": length}]
            if off + length < len(prompt) and boolean(data):  # a second input after the first, as vLLM orders them
                off2 = integer(data, off + length, len(prompt) - 1)
                length2 = integer(data, 1, len(prompt) - off2)
                features.append({"identifier": choose(data, "ab"), "offset": off2, "length": length2})
            op["extra"] = {"mm_features": features}
        elif extra == "embeds":
            rows = [bytes([t, 0, 0, 60]).hex() for t in prompt]
            op["prompt"], op["extra"] = [0] * len(prompt), {"prompt_embeds": rows}
        return op, extra not in ("mm", "embeds")

    def _reused_prompt(self, data: st.DataObject, rid: str, how: str) -> Json:
        """An earlier request's tokens (prompt, or prompt and output once it
        finished) and extra keys: as they were, extended by a few tokens (the
        next turn of a chat), or cut to whole scheduler blocks (a fully cached
        prompt: its last block is recomputed, so one hash gets two blocks)."""
        tokens, extra = choose(data, self.past)
        limit = self._prompt_limit()
        sched = self.cfg.scheduler_block_size
        if how == "extend":
            tokens = tokens + draw_tokens(data, 1, 2 * sched)
        elif how == "aligned":
            tokens = tokens[: min(len(tokens), limit) // sched * sched] or tokens
        op: Json = {"op": "add_request", "rid": rid, "prompt": tokens[:limit] or [0]}
        if extra is not None:
            op["extra"] = extra
        return op

    def _prompt_limit(self) -> int:
        """Prompt tokens at most: two below the model length, and no more than
        the pool holds for every group at once (a longer prompt could never be
        admitted and would block the queue)."""
        cfg = self.cfg
        per_group = cfg.num_blocks // len(cfg.groups) * min(k.block_size for k in cfg.groups)
        return max(1, min(cfg.max_model_len - 2, per_group))

    def _remember(self, tokens: list[int], extra: Json) -> None:
        """Keep the last few token lists for later requests to reuse."""
        self.past.append((list(tokens), extra))
        del self.past[:-PAST]

    def admit(self, data: st.DataObject) -> None:
        """Schedule a waiting request (usually the first; a later one when the
        scheduler skips a request that does not fit): prefix lookup, then allocate."""
        rid = self.waiting[integer(data, 0, len(self.waiting) - 1)]
        st_ = self.reqs[rid]
        op: Json = {"op": "allocate_slots", "rid": rid}
        hit = 0
        looked_up = st_.computed == 0
        if looked_up:
            found = self._lookup(rid)
            if found is None:
                return  # the release fails this lookup (nothing changed); the request stays waiting
            hit = found["num_tokens"]
            assert self.lock is not None
            if hit:
                self.lock.stats.prefix_hits += 1
            # NOTE: the hint can only be non-zero for a cached hybrid (one
            # coordinator computes it); elsewhere reading it would lengthen
            # every history and its shrunk traces for a constant 0.
            if len(self.cfg.groups) > 1 and self.cfg.enable_caching and self.cfg.profile.prefix_hint_op:
                if self._sched.read_hint(rid):
                    self.lock.stats.prefix_hints += 1
                self.lock.stats.prefix_hint_reads += 1
            if any(found["blocks"]):
                op["new_computed_blocks"] = self._maybe_null_window_hits(data, found["blocks"])
            op["num_new_computed_tokens"] = hit
        total = self._num_tokens(rid)
        external = 0
        # Connector tokens on one admission in five, one in two after a prefix hit
        # (a hit and external tokens together exercise the touch-then-allocate order).
        if st_.computed == 0 and integer(data, 0, 1 if hit else 4) == 0 and total - hit > 1:
            external = integer(data, 1, total - hit - 1)
            if not (self._allowed("external") and self._on("connector")):
                external = 0
        delay = external > 0 and boolean(data) and self._allowed("delay_cache_blocks") and self._on("delay")
        new = 0 if delay else self._chunk(data, st_, st_.computed + hit + external, looked_up)
        op.update(
            num_new_tokens=new, num_external_computed_tokens=external, delay_cache_blocks=delay,
            num_lookahead_tokens=self._swarmed("lookahead", integer(data, 0, 2) if self.cfg.use_eagle else 0),
            num_encoder_tokens=st_.encoder_tokens if st_.computed == 0 else 0,
            full_sequence_must_fit=bool(self._swarmed("full_sequence", boolean(data))),
            reserved_blocks=self._swarmed("reserve", choose(data, [0, 0, 0, 1, 2])),
            has_scheduled_reqs=bool(self.running),
        )  # fmt: skip
        if self._sched.admit(op, hit, external, delay, looked_up) and not delay and st_.computed == total:
            self._sample_token(data, rid)

    def _maybe_null_window_hits(self, data: st.DataObject, blocks: Json) -> Json:
        """The hit as found, or, in one admission in ten, with every
        sliding-window and chunked-local group's hit blocks replaced by the
        null block: a hit list no lookup returns that every side accepts
        (vLLM's ``touch`` skips the null block; kvspec's hit validation checks
        the keys of real blocks only), so it is sent and compared like any
        admission instead of being refused."""
        if not choose(data, (False,) * 9 + (True,)):
            return blocks
        return [
            [0] * len(ids) if isinstance(kind, SlidingWindow | ChunkedLocal) else ids
            for kind, ids in zip(self.cfg.groups, blocks, strict=True)
        ]

    def finish_remote_load(self, data: st.DataObject) -> None:
        """The connector finished loading: cache the loaded blocks, then the
        request waits to be scheduled with its tokens already computed."""
        self._sched.remote_loaded(choose(data, tuple(self.remote)))

    def schedule_running(self, data: st.DataObject) -> None:
        """Advance a running request (prefill chunk or one decode token);
        on failure preempt the newest running request."""
        rid = choose(data, tuple(self.running))
        st_ = self.reqs[rid]
        total = self._num_tokens(rid)
        if st_.computed >= total:
            self._finish(rid, data)
            return
        new = self._chunk(data, st_, st_.computed)
        look = self._swarmed("lookahead", integer(data, 0, 2) if self.cfg.use_eagle else 0)
        if not self._sched.advance(rid, new, look):
            self._preempt(self.running[-1], data)
            return
        if st_.computed == total and total < self.cfg.max_model_len:
            self._sample_token(data, rid)

    def finish(self, data: st.DataObject) -> None:
        """A request finishes or is aborted (``free`` or deferred free), or a
        running one is preempted for a more urgent request (priority
        scheduling): it waits again and is re-admitted through a prefix lookup."""
        rid = choose(data, tuple(sorted(self.reqs)))
        preempt = rid in self.running and choose(data, ("finish", "finish", "preempt")) == "preempt"
        if preempt and self._on("priority_preempt"):
            self._preempt(rid, data)
            return
        if rid in self.running and boolean(data) and self._on("remove_skipped"):
            self._call({"op": "remove_skipped_blocks", "rid": rid, "total_computed_tokens": self.reqs[rid].computed})
        self._finish(rid, data)

    def drain(self, data: st.DataObject, first: str | None = None) -> None:
        """Every running request finishes in the same step, ``first`` (when
        given) and then the others oldest first (the end of a burst): their
        blocks go back to the free queue in that order, so a later request
        that continues the first one (the next turn of a chat) finds its hits
        at the head of the queue, first in line for eviction by any fresh
        allocation."""
        for rid in sorted(self.running, key=lambda r: r != first):
            st_ = self._sched.forget(rid)
            if st_.reusable:
                self._remember(self._sched.tokens(rid), st_.extra)
            self._sched.release(rid, pop=self._pop(False))

    def flood(self, data: st.DataObject) -> None:
        """Directed: a burst fills the pool and ends, then one request's
        conversation goes on. The running request that computed the most is
        prefilled to a block boundary of every group; up to three fresh
        requests, each as long as the free blocks allow, are admitted and
        prefilled whole, so no never-used block is left; every running
        request finishes in the same step, the chosen one first
        (:meth:`drain`), so its blocks lead the free queue; in the next step
        a request that continues it (its tokens and a few more) is admitted
        with its prefix hit and connector tokens (:meth:`_admit_continued`).

        NOTE: directed because random search rarely lines up the situation
        of vLLM#33775 (0.16.0 touched each group's prefix hits just before
        that group allocated, so with connector tokens an earlier group could
        take a later group's still-free hit block): it needs a pool with no
        never-used block left, the continued request's blocks at the head of
        the queue, an admission with both a hit and connector tokens, and a
        later full-attention-type group whose hit stays in the table after
        the connector load (skipped Mamba states and out-of-window blocks
        hide it). The machine met all of them about once in 50,000 steps;
        with only the burst's end scripted, one seed in five still missed it
        in 160,000 steps. So the flood fires every time in runs with two
        full-attention-type groups and connector tokens, one pick in four
        elsewhere."""
        assert self.lock is not None
        fulls = sum(isinstance(k, FULL_TYPE_KINDS) for k in self.cfg.groups)
        shows = fulls >= 2 and self._allowed("external") and self._on("connector")
        if integer(data, 0, 3) and not shows:
            return  # three picks in four do nothing: a flood ends every running request
        chosen = max(self.running, key=lambda r: self.reqs[r].computed)  # the first that computed the most
        unit = math.lcm(*(k.block_size for k in self.cfg.manager_groups()))
        goal = (self.reqs[chosen].computed + unit - 1) // unit * unit
        if self.reqs[chosen].computed < goal < self._num_tokens(chosen):
            self._prefill(data, chosen, goal)  # its tables end on a block boundary of every group
        if chosen not in self.running:
            return
        state = self._sched.reqs[chosen]
        tokens, extra, reusable = self._sched.tokens(chosen), state.extra, state.reusable
        for token in (VOCAB - 1, VOCAB - 2, VOCAB - 3):  # fresh requests, each prefilled whole, while blocks are left
            free = len(self.lock.adapters[0].to_view().free_queue)
            fits = [n for n in range(1, self._prompt_limit() + 1)
                    if sum(-(-n // k.block_size) for k in self.cfg.manager_groups()) <= free]  # fmt: skip
            if not fits:
                break
            rid = self._add({"prompt": [token] * fits[-1]}, False)
            if not self._admit_step(rid) or not self._prefill(data, rid, fits[-1]):
                break
        self.drain(data, first=chosen)
        if not reusable:
            return  # multimodal or embedded prompts are not continued (see add_request)
        bs = self.cfg.manager_groups()[0].block_size
        more = draw_tokens(data, 1, 2 * self.cfg.scheduler_block_size)
        more += [0] * max(0, 2 * bs + 2 - len(more))  # room for connector tokens past the hit
        turn: Json = {"prompt": (tokens + more)[: self._prompt_limit()]}
        if extra is not None:
            turn["extra"] = extra
        self._call({"op": "new_step_starts"})  # the next turn comes later: a Mamba state cached now is usable
        self._admit_continued(data, self._add(turn, True))

    def _admit_continued(self, data: st.DataObject, rid: str) -> bool:
        """Admit waiting ``rid`` with its prefix hit and, where this run sends
        them, connector tokens: as many as make the first group's allocation
        for them reach the first free-queue block of a later group's hit that
        stays in the table (a full-attention-type group), where the request
        has tokens enough, else a drawn number; whether it runs."""
        assert self.lock is not None
        found = self._lookup(rid)
        total = self._num_tokens(rid)
        hit = found["num_tokens"] if found is not None else total
        if total - hit < 1:
            return False
        external = 0
        if found is not None and hit and total - hit > 1 and self._allowed("external") and self._on("connector"):
            external = integer(data, 1, total - hit - 1)
            blocks, kinds = found["blocks"], self.cfg.manager_groups()
            own = set(blocks[0])
            later = {b for g in range(1, len(blocks)) if isinstance(kinds[g], FULL_TYPE_KINDS) for b in blocks[g] if b}
            queue = [b for b in self.lock.adapters[0].to_view().free_queue if b not in own]
            before = next((k for k, b in enumerate(queue) if b in later), None)
            if before is not None:
                reach = (len(blocks[0]) + before) * kinds[0].block_size + 1
                if hit < reach < total:
                    external = reach - hit
        new = self._sched.chunk(rid, hit + external, total - hit - external, True)
        return self._first_allocation(rid, found, hit, external, new)

    def _admit_step(self, rid: str) -> bool:
        """Admit waiting ``rid`` with its prefix hit and one token (below any
        watermark; its later steps are not held to it); whether it runs."""
        found = self._lookup(rid)
        hit = found["num_tokens"] if found is not None else self._num_tokens(rid)
        if self._num_tokens(rid) - hit < 1:
            return False
        return self._first_allocation(rid, found, hit, 0, 1)

    def _first_allocation(self, rid: str, found: Json | None, hit: int, external: int, new: int) -> bool:
        """The admission's ``allocate_slots``: the lookup's hit ``found`` of
        ``hit`` tokens, ``external`` connector tokens and ``new`` tokens to
        compute; whether the request runs."""
        op: Json = {"op": "allocate_slots", "rid": rid, "num_new_computed_tokens": hit,
                    "num_external_computed_tokens": external, "num_new_tokens": new}  # fmt: skip
        if found is not None and any(found["blocks"]):
            op["new_computed_blocks"] = found["blocks"]
        return self._sched.admit(op, hit, external)

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
        eagle = cfg.use_eagle and cfg.profile.mamba_tail_eagle != "none"
        lengths = [
            n for n in range(2, self._prompt_limit() + 1)
            if (t := mamba_tail_boundary(n, hbs, eagle, cfg.profile.mamba_tail_entries)) % coarse and t < n
        ]  # fmt: skip
        if not lengths:
            return
        n = choose(data, tuple(lengths))
        tail = mamba_tail_boundary(n, hbs, eagle, cfg.profile.mamba_tail_entries)
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

    def _prefill(self, data: st.DataObject, rid: str, goal: int, tokens: list[int] | None = None) -> bool:
        """Advance running ``rid`` chunk by chunk until ``goal`` tokens are
        computed (sampling where its tokens end: a drawn token, or with
        ``tokens`` the one at that position, then 0); False if a step did not fit."""
        while rid in self.running and self.reqs[rid].computed < goal:
            state = self.reqs[rid]
            n = self._num_tokens(rid)
            if state.computed >= n:
                if tokens is None:
                    self._sample_token(data, rid)
                else:
                    self._sched.sample(rid, tokens[n] if n < len(tokens) else 0)
            if not self._sched.advance(rid, self._sched.chunk(rid, state.computed, goal - state.computed)):
                return False
        return rid in self.running

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

    def _admit_whole(self, data: st.DataObject, fields: Json, reusable: bool, connector: bool) -> str | None:
        """Add a request and admit it at once: its prefix lookup, then one
        allocation of its hit and a chunk of the rest (with ``connector``,
        part of the rest loaded through the connector instead); its id if it
        was admitted."""
        rid = self._add(fields, reusable)
        return rid if self._admit_now(data, rid, connector) else None

    def _add(self, fields: Json, reusable: bool) -> str:
        """Add a waiting request with ``fields`` (its prompt, maybe extra keys); its id."""
        self.counter += 1
        rid = f"r{self.counter}"
        self._sched.add({"op": "add_request", "rid": rid, **fields}, 0, reusable)
        if reusable:
            self._remember(fields["prompt"], fields.get("extra"))
        return rid

    def _admit_now(self, data: st.DataObject, rid: str, connector: bool, upto: int | None = None) -> bool:
        """Admit waiting ``rid`` at once: its prefix lookup, then one allocation
        of its hit and a chunk of the rest (with ``connector``, part of the
        rest loaded through the connector instead; with ``upto``, a chunk
        that ends there at most); whether it runs."""
        found = self._lookup(rid)
        total = self._num_tokens(rid) if upto is None else min(upto, self._num_tokens(rid))
        hit = found["num_tokens"] if found is not None else total
        if total - hit < 1:
            return False
        external = integer(data, 1, total - hit - 1) if connector and hit and total - hit > 1 else 0
        if not (self._allowed("external") and self._on("connector")):
            external = 0
        new = self._sched.chunk(rid, hit + external, total - hit - external, True)
        return self._first_allocation(rid, found, hit, external, new)

    def deferred_free(self, data: st.DataObject) -> None:
        """The scheduler frees popped blocks later, reversed."""
        assert self.lock is not None
        self._sched.deferred_free(integer(data, 0, len(self.pending) - 1))
        self.lock.pending = len(self.pending)

    def new_step(self, data: st.DataObject) -> None:
        """A scheduler step begins; the scheduler may then drain events or
        fresh block ids or read statistics or usage, a KV connector may report
        blocks whose contents were lost, or the prefix cache may be reset
        (which fails while blocks are in use). Always ready (the step a run
        takes when its action swarm leaves nothing else ready).

        NOTE: these were four actions. As one action they leave
        more of a run to the scheduling actions, and cache loss (eviction,
        reset) no longer wipes out most prefix hits before they happen.
        """
        which = choose(data, STEP_EXTRAS)
        self._call({"op": "new_step_starts"})
        if which in ("evict_blocks", "reset_prefix_cache") and not self._on("cache_loss"):
            return
        if which == "evict_blocks":
            ids = [integer(data, 0, self.cfg.num_blocks - 1) for _ in range(integer(data, 0, 3))]
            multi = self._multi_key_blocks()
            if multi and boolean(data):
                ids = [choose(data, multi)]  # a block with secondary keys: every key leaves with it
            self._call({"op": "evict_blocks", "block_ids": ids})
        elif which:
            self._call({"op": which})

    def _multi_key_blocks(self) -> tuple[int, ...]:
        """Blocks the reference caches under more than one key (a full block that
        also keeps a partial-tail or Mamba-tail key, vLLM 0.26.0 on)."""
        assert self.lock is not None
        keys = Counter(b for _, ids in self.lock.adapters[0].to_view().cached for b in ids)
        return tuple(sorted(b for b, n in keys.items() if n > 1))

    def common_prefix(self, data: st.DataObject) -> None:
        """Cascade attention asks for the common prefix of a running request."""
        self._call({"op": "get_num_common_prefix_blocks", "rid": choose(data, tuple(self.running))})

    def read_tables(self, data: st.DataObject) -> None:
        """Read a request's block ids."""
        self._call({"op": "get_block_ids", "rid": choose(data, tuple(sorted(self.reqs)))})

    def read_computed_tables(self, data: st.DataObject) -> None:
        """A KV connector asks for a request's blocks up to a token count
        (``get_block_ids_for_computed_tokens``, where the profile's release
        has it, as the scheduler of that release calls it): mostly its
        computed tokens, as vLLM's scheduler passes, else any count up to a
        block past its tokens (a cut inside, at or beyond the tables), or -1,
        which every side must refuse."""
        rid = choose(data, tuple(sorted(self.reqs)))
        computed = self.reqs[rid].computed
        bound = self._num_tokens(rid) + max(k.block_size for k in self.cfg.groups)
        n = integer(data, -1, bound) if boolean(data) else computed
        self._call({"op": "get_block_ids_for_computed_tokens", "rid": rid, "num_computed_tokens": n}, True)

    def estimate_cached(self, data: st.DataObject) -> None:
        """The scheduler asks how many of a request's tokens its cached blocks
        stand for (``estimate_cached_tokens``, reported when a prefill ends;
        only where the profile's release has it, as its scheduler calls it
        only there: a profile without the operation would otherwise end every
        run against a newer release at this rule)."""
        rid = choose(data, tuple(sorted(self.reqs)))
        self._call({"op": "estimate_cached_tokens", "rid": rid}, True)

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
        rid = choose(data, tuple(self.running))
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

    # -- invalid operations: every side must reject them and change nothing ---

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

    def _lookup(self, rid: str) -> Json | None:
        """``get_computed_blocks`` of ``rid``; None where the release fails the
        lookup with a typed error (context parallelism, vLLM 0.16.0's EAGLE
        alignment assertion), which changes nothing."""
        found = self._call({"op": "get_computed_blocks", "rid": rid})
        return None if isinstance(found, dict) and "error" in found else found

    def _stale_hit(self) -> None:
        """Hits evicted between lookup and allocation must be rejected."""
        if not self.waiting:
            return
        rid = self.waiting[0]
        if self.reqs[rid].computed:
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
        if not self.waiting:
            return
        rid = self.waiting[0]
        if self.reqs[rid].computed:
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
        if not self.waiting or len(self.cfg.groups) < 2:
            return
        rid = self.waiting[0]
        if self.reqs[rid].computed:
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

    def _invalid_config(self, kind: str) -> None:
        """A broken configuration is rejected with ConfigError before any manager exists."""
        bad = bad_config(self.cfg, kind)
        if bad is None:
            return
        if kind == "profile":  # a release named by a trace header or --semantics that kvspec does not know
            try:
                profile_named(f"{self.cfg.profile.name}-unknown")
            except KeyError:
                pass
            else:
                raise AssertionError("kvspec knows a profile nobody defined")
        try:
            replace(self.cfg, **bad)
        except ConfigError:
            assert self.lock is not None
            self.lock.stats.invalid_configs += 1
            return
        raise AssertionError(f"config with {bad} was accepted")

    def _bad_request(self, kind: str) -> None:
        """A caller error of the request hasher is rejected with InvalidRequestError
        (kvimpl's own request API gets the same probes under ``--target impl-mutable``)."""
        hasher = RequestBlockHasher.for_config(self.cfg)
        calls: dict[str, Any] = {
            "request_id": lambda: hasher.new_request(7, [1]),  # type: ignore[arg-type]  # the broken argument
            "empty_prompt": lambda: hasher.new_request("bad", []),
            "str_prompt": lambda: hasher.new_request("bad", "12"),  # type: ignore[arg-type]  # the broken argument
            "negative_token": lambda: hasher.new_request("bad", [1, -1]),
            "lora_id": lambda: LoRA("bad", 0),
            "lora_path": lambda: hasher.new_request("bad", [1], ExtraKeySource(lora=LoRA("bad", 1))),
            "append_str": lambda: hasher.with_output_tokens(hasher.new_request("bad", [1]), "7"),  # type: ignore[arg-type]  # the broken argument
        }
        if kind == "lora_path" and not self.cfg.profile.extra_keys_tagged:
            return  # untagged extra keys do not hash the path: a LoRA without one is valid
        try:
            calls[kind]()
        except InvalidRequestError:
            return
        raise AssertionError(f"kvspec's request hasher accepted the caller error {kind!r}")

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
        """An operation, or an ``allocate_slots`` argument, that the profile's
        release lacks (:data:`kvref.capabilities.RELEASE_OPERATIONS`): every
        side must refuse it and change nothing (``Lockstep.call_absent``).

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
        else:  # an admission argument away from its default, on a request not admitted yet
            fresh = [r for r in self.waiting if not self.reqs[r].computed]
            if not fresh:
                return
            value = {"full_sequence_must_fit": True, "reserved_blocks": 1, "has_scheduled_reqs": False}[feature]
            op = {"op": "allocate_slots", "rid": fresh[0], "num_new_tokens": 1, feature: value}
        self.lock.call_absent(op)

    def invalid_other(self, data: st.DataObject) -> None:
        """Other caller errors, and broken configurations and requests."""
        kind = choose(data, BAD_OTHERS)
        if kind == "config":
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

    def _held(self, rid: str) -> list[int]:
        assert self.lock is not None
        tables = self.lock.adapters[0].get_block_ids(rid)
        pending = {b for p in self.pending for b in p}
        return [b for g in tables for b in g if b != 0 and b not in pending]

    def teardown(self) -> None:
        """Drain and compare what is still pending, then record the run as a
        trace if asked to; adapters are garbage collected."""
        setup, lock = self.SETUP, self.lock
        self._drain()

        if setup.record_dir is not None and lock is not None and not lock.halted and lock.stats.steps:
            self._record(setup, setup.record_dir, lock)
        self.lock = None

    def _drain(self) -> None:
        """Nothing observable is left uncompared: every run ends by taking the
        events, the new block ids and the statistics that are still pending
        (on every side, compared like any other step; the events go through
        the consumer-side check). Not after a divergence: its trace ends where it showed."""
        if not self.live or self.lock is None or self.lock.failed:
            return
        for name in ("take_events", "take_new_block_ids", "make_prefix_cache_stats"):
            if self.live:
                self._call({"op": name})

    def _record(self, setup: MachineSetup, record_dir: Path, lock: Lockstep) -> None:
        """Write the run unless the limit is reached or it is too short, too
        poor in allocations or a duplicate."""
        if lock.stats.unexplained or (setup.record_limit is not None and setup.recorded >= setup.record_limit):
            return  # a failing run (or its shrinks) is never a golden trace
        facade_steps = sum(1 for op in lock.log if "expect" in op)
        allocations = sum(1 for op in lock.log if op["op"] == "allocate_slots" and isinstance(op.get("expect"), list))
        if facade_steps < 3 or allocations < setup.min_allocations:
            return
        log = lock.trace_log()
        meta = {"shape": self.shape, "features": trace_features(self.cfg, log)}
        trace = Trace(self.cfg, log, meta)
        text = trace.dumps()
        if text in setup.recorded_texts:
            return
        setup.recorded_texts.add(text)
        setup.recorded += 1
        trace.write_new(record_dir, self.shape, start=setup.recorded)


def _accepted_count(kind: AttentionKind, table_len: int) -> int | None:
    """The largest ``cache_blocks`` count a group of ``kind`` with
    ``table_len`` blocks accepts (the block after its cacheable blocks less
    one token); None for a group that caches nothing."""
    have = cacheable_blocks(kind, table_len)
    return None if have is None else max(have, 0) * kind.block_size + kind.block_size - 1


ACTIONS: tuple[tuple[str, Callable[[SchedulerMachine], bool]], ...] = (
    ("idle", lambda m: True),
    ("add_request", lambda m: len(m.reqs) < 10),
    ("admit", lambda m: bool(m.waiting)),
    ("schedule_running", lambda m: bool(m.running)),
    ("finish", lambda m: bool(m.reqs)),
    ("new_step", lambda m: True),
    ("drain", lambda m: len(m.running) >= 2),
    ("flood", lambda m: bool(m.running) and m.cfg.enable_caching and not m.cross),
    ("tail_pair", lambda m: m.cfg.enable_caching and m._sched.copies and len(m.reqs) < 9),
    ("deferred_free", lambda m: bool(m.pending)),
    ("finish_remote_load", lambda m: bool(m.remote)),
    ("common_prefix", lambda m: bool(m.running)),
    ("read_tables", lambda m: bool(m.reqs)),
    ("read_computed_tables", lambda m: bool(m.reqs) and m.cfg.profile.computed_block_ids_op),
    ("estimate_cached", lambda m: bool(m.reqs) and m.cfg.profile.estimate_cached_tokens_op),
    ("cache_past_slots", lambda m: bool(m.running) and m.cfg.enable_caching),
    ("invalid_allocate", lambda m: bool(m.reqs)),
    ("invalid_other", lambda m: True),
    ("absent_operation", lambda m: m.lock is not None and bool(m.lock.absent - m.SETUP.excluded)),
    ("rekeyed_tails", lambda m: m.tail_group is not None and len(m.reqs) < 9 and m._allowed("evict_blocks")),
)
"""What a scheduler step may do, each with when it is ready (the machine is
live): the names of :class:`SchedulerMachine`'s action methods, simplest
first. A shrunk step falls towards ``idle``, which does nothing: a step the
failure does not need then leaves no operation in the trace even where the
shrinker cannot delete it."""
ACTION_NAMES = tuple(name for name, _ in ACTIONS)
_ABSENT_NEED_REQUEST = frozenset(
    {"pop_blocks_for_free", "get_block_ids_for_computed_tokens", "estimate_cached_tokens", "get_prefix_hint",
     "record_prefix_cache_stats"}
)  # fmt: skip
"""The absent operations that name a request."""


def default_failure_dir() -> Path:
    """Where failing traces go (``KVREF_FAILURE_DIR`` or ./kvref-failures)."""
    return Path(os.environ.get("KVREF_FAILURE_DIR", "kvref-failures"))
