"""Lockstep execution: one operation on every adapter, everything compared.

:class:`Lockstep` owns a reference adapter (first) and one or more others,
the shared :class:`~kvref.ops.RequestBook`, the operation log (which becomes
a trace on failure) and the run statistics. Differences are failures unless
:mod:`kvref.divergences` explains them (the registry between an upstream and
a kvspec side; what an adapter declares, or ``--known`` adds, between it and
any side). An operation an adapter cannot run
(:data:`kvref.capabilities.SKIP_ERRORS`) is a skip: counted by feature, and
the run stops comparing there; an adapter that declares ``runs_every_operation``
(kvimpl's, both builds) fails instead when it refuses an operation its
release has.

A difference an adapter declares (``DeclaredSemantics.known``, ``--known``)
or a divergence class a keep-going run already listed is counted and then
*restarts the comparison*: the run stops comparing at once, and at the
machine's next step every adapter is built again from the configuration and
the scheduler starts over with no request (:meth:`Lockstep.restart`), so the
rest of the run is compared from a state both sides share. NOTE: not "each
side goes on from its own state": after a difference in the state the two
sides answer every later call differently, and the scheduler can follow one
side only; nor "from the engine's state": an engine's state cannot be loaded
into the reference. A trace written after a restart starts there, so it
replays from an empty state and fails at its own divergence. The registry's
differences between real vLLM and kvspec keep their behaviour (a halting one
ends the comparison of that run).

An adapter operation, view or invariant check that runs past the watchdog
(``op_timeout``) ends the whole check at once (:class:`kvref.exits.AdapterHang`,
exit 4): the trace up to the hanging call is written, nothing after it runs
(not even the run's closing drain), and a later call on the same statistics
raises at once instead of waiting again, so a hang is never replayed or shrunk.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from kvref.adapters import AdapterFactory, KVCacheAdapter, semantics_of
from kvref.capabilities import (
    CALLER_ERRORS,
    SKIP_ERRORS,
    absent_features,
    feature_of,
    op_features,
    refusal,
    trace_features,
    unprobed_absent,
)
from kvref.config_coverage import properties_of
from kvref.diagnose import first_difference
from kvref.divergences import Divergence, explain, explain_state, load_registry, resolve
from kvref.exits import DEFAULT_OP_TIMEOUT, AdapterHang, InputError, Watchdog, watchdog
from kvref.ops import ABSENT, REQUEST_OPS, RequestBook, execute, output_problem
from kvref.safety import SafetyMonitor, SafetyViolation
from kvref.safety_defects import registered
from kvref.traces import Trace
from kvspec.config import KVCacheConfig, Mamba
from kvspec.invariants import inv_hash_lifetime, inv_tables_append_only
from kvspec.request import Request
from kvspec.view import KVView, diff_views

Json = Any
READ_ONLY_OPS = frozenset(
    {
        "get_computed_blocks",
        "get_block_ids",
        "get_num_common_prefix_blocks",
        "usage",
        "make_prefix_cache_stats",
        "take_events",
        "take_new_block_ids",
        "new_step_starts",
    }
)
"""Operations whose invariant check is skipped when they leave every view as it was."""


class LockstepFailure(AssertionError):
    """Two implementations disagree (or one broke an invariant or crashed)."""

    def __init__(self, message: str, trace_path: Path | None) -> None:
        """Remember where the failing history was written."""
        super().__init__(message + (f"\n  trace: {trace_path}" if trace_path else ""))
        self.trace_path = trace_path


@dataclass
class RunStats:
    """Counters shared by every machine run of one ``kvref check``."""

    steps: int = 0
    runs: int = 0
    invariant_checks: int = 0
    configs: Counter[str] = field(default_factory=Counter)
    known: Counter[str] = field(default_factory=Counter)
    unexplained: int = 0
    event_log_checks: int = 0
    """Times an adapter's consumer-side event index was compared with its view."""
    event_log_rebuilds: int = 0
    """Of those, times the index was rebuilt from the view instead (a connector's lookup of
    a report-mode "full" request may or may not have announced its hit: :class:`EventLog`)."""
    announcing_lookups: int = 0
    """Lookups of report-mode "full" requests that hit, with events on (their hits announced again)."""
    started: float = field(default_factory=time.monotonic)
    invalid_configs: int = 0
    config_properties: Counter[str] = field(default_factory=Counter)
    """Machine runs per configuration class (:mod:`kvref.config_coverage`)."""
    invalid_calls: Counter[str] = field(default_factory=Counter)
    """Rejected invalid operations by ``op:ErrorClass``."""
    last_failure: Path | None = None
    prefix_hits: int = 0
    """Admissions whose prefix lookup found at least one token."""
    prefix_hints: int = 0
    """Lookups whose prefix hint (``get_prefix_hint``) was not 0."""
    prefix_hint_reads: int = 0
    """Prefix hints read (and compared) after a lookup."""
    block_copies: int = 0
    """Copy-on-write copies (source, copy) taken and compared (``take_kv_cache_block_copies``)."""
    first_failure_at: float | None = None
    """``time.monotonic()`` of the first unexplained divergence (shrinking starts there)."""
    first_failure_steps: int | None = None
    """Steps run when the first unexplained divergence was seen."""
    on_first_failure: Callable[[], None] | None = field(default=None, compare=False, repr=False)
    """Called once, at the first unexplained divergence (before shrinking starts)."""
    refused_configs: Counter[str] = field(default_factory=Counter)
    """Drawn configurations the profile or an adapter refused, by error class."""
    refused_reasons: Counter[str] = field(default_factory=Counter)
    """The same, by shape and message."""
    keep_going: bool = False
    """Collect divergence classes instead of stopping at the first (see :class:`DivergenceClass`)."""
    classes: dict[str, DivergenceClass] = field(default_factory=dict)
    """Divergence classes found so far, by key; a run that meets a known one halts quietly."""
    accepted: list[DivergenceClass] = field(default_factory=list)
    """Divergence classes a drift run attributed to profile switches and accepted
    (:mod:`kvref.drift`); the hunt goes on under those switches."""
    last_failure_key: str | None = None
    """Class key of the last unexplained divergence."""
    class_found_at: dict[str, int] = field(default_factory=dict)
    """Steps run when each divergence class was first met."""
    last_failure_shape: str = ""
    """Configuration shape of the last unexplained divergence."""
    skipped: Counter[str] = field(default_factory=Counter)
    """Operations an adapter could not run, by ``adapter: feature`` (each stopped its run)."""
    fallback_steps: Counter[str] = field(default_factory=Counter)
    """Steps an adapter ran on a fallback build, by ``adapter: why`` (its ``fallback`` attribute:
    kvimpl's ``--target impl`` on the pure-Python manager where the native core declines)."""
    skip_reasons: dict[str, str] = field(default_factory=dict)
    """The first message of each :attr:`skipped` key."""
    left_out: Counter[str] = field(default_factory=Counter)
    """Operations the machine left out (an excluded feature), by operation."""
    shape_steps: Counter[str] = field(default_factory=Counter)
    """Steps per configuration shape (runs per shape: :attr:`configs`)."""
    skipped_runs: Counter[str] = field(default_factory=Counter)
    """Runs a skip stopped, by configuration shape."""
    unnamed_skips: dict[str, str] = field(default_factory=dict)
    """Skip keys (``adapter: feature``) whose error named no feature, with the operation that raised it."""
    restarts: Counter[str] = field(default_factory=Counter)
    """Comparisons restarted after a declared difference or a known class, by id or class."""
    hung: str = ""
    """The watchdog's message once an adapter hung ("" while none did); every later call raises at once."""
    safety: Counter[str] = field(default_factory=Counter)
    """What the safety oracles did (:class:`kvref.safety.SafetyMonitor`'s counts), when they run."""
    pipeline: Counter[str] = field(default_factory=Counter)
    """What the asynchronous pipeline did (:class:`kvref.scheduler_pipeline.PipelineScheduler`'s counts)."""
    asynchronous: bool = False
    """Whether the run was asked to keep steps in flight (``--async-scheduling``): a run that
    was, and where no step was ever in flight, says so (:func:`kvref.verdict.warnings`)."""
    hit_limits: Counter[str] = field(default_factory=Counter)
    """What the hit-limit family drew, by kind (:mod:`kvref.machine.hit_limits`): bounded lookups,
    ``get_num_cached_tokens``, prompt-logprob requests, late skip flags, wide token ids, reused ids."""
    connector: Counter[str] = field(default_factory=Counter)
    """What the connector-lookup family did, by kind (:mod:`kvref.machine.connectors`): connector
    lookups, hits cut to a block, diverged hits reconciled or loaded."""


@dataclass(frozen=True)
class Layer:
    """What a lockstep drives: how an operation runs and which history rules hold.

    Attributes:
        name: ``facade`` or ``pool`` (a trace header's ``layer``).
        execute: Runs one operation on one adapter (as :func:`kvref.ops.execute`).
        hash_lifetime: ``(before, after, op) -> bool``: no cached hash was
            dropped that the operation may not drop.
    """

    name: str
    execute: Callable[[Any, RequestBook, Json], Json]
    hash_lifetime: Callable[[KVView, KVView, str], bool]


FACADE = Layer("facade", execute, inv_hash_lifetime)
"""The KV-cache manager facade (the default)."""


@dataclass
class DivergenceClass:
    """One class of unexplained divergence: the operation where it shows and
    the aspect that differs (``output``, ``view:<field>``, ``crash``,
    ``invariant``, ``events``, ``unchanged``), with its shortest trace."""

    key: str
    message: str
    trace: Path | None
    trace_ops: int
    steps_to_find: int
    occurrences: int = 1
    shapes: Counter[str] = field(default_factory=Counter)
    explained_by: str = ""
    """The profile switches that reproduce the trace (:mod:`kvref.drift`), if any."""


class _Halted(Exception):
    """A run met an already known divergence class: it stops comparing."""


class Refused(Exception):
    """An adapter does not run this configuration (its ``supports`` or a skip
    error at construction); the run checks nothing.

    Attributes:
        reason: Why, as the adapter said it.
        feature: The feature it lacks ("" when unknown).
    """

    def __init__(self, reason: str, feature: str = "", kind: str = "supports") -> None:
        """Remember the reason (``kind``: ``supports`` or the error class raised)."""
        super().__init__(reason)
        self.reason, self.feature, self.kind = reason, feature, kind


def without_arguments(op: Json, excluded: frozenset[str]) -> Json:
    """An ``allocate_slots`` operation with the valid values of excluded
    argument features (``lookahead``, ``full_sequence_must_fit``,
    ``reserved_blocks``, ``has_scheduled_reqs``) back at their defaults; the
    scheduler's bookkeeping does not depend on them. Negative values (an
    invalid call) stay, so the operation is left out instead."""
    out = dict(op)
    for key, feature, default in _ARGUMENTS:
        if feature in excluded and key in out and not (isinstance(out[key], int) and out[key] < 0):
            out[key] = default
    return out


_ARGUMENTS: tuple[tuple[str, str, Json], ...] = (
    ("num_lookahead_tokens", "lookahead", 0),
    ("full_sequence_must_fit", "full_sequence_must_fit", False),
    ("reserved_blocks", "reserved_blocks", 0),
    ("has_scheduled_reqs", "has_scheduled_reqs", True),
    ("skip_zeroing_group_ids", "skip_zeroing_group_ids", []),
)


def neutral_output(op: str, num_groups: int) -> Json:
    """What a left-out or skipped operation answers the scheduler: no hit, no
    allocation, no blocks, nothing drained (its output is never compared)."""
    empty: list[list[int]] = [[] for _ in range(num_groups)]
    table: dict[str, Json] = {
        "get_computed_blocks": {"blocks": empty, "num_tokens": 0},
        "get_computed_blocks_for_connector": {"blocks": empty, "num_tokens": 0, "hit_diverged": False},
        "truncate_computed_blocks": empty,
        "get_zeroing_block_ids_in_range": [],
        "pop_blocks_for_free": [],
        "get_block_ids": empty,
        "get_num_common_prefix_blocks": [0] * num_groups,
        "take_events": [],
        "take_new_block_ids": [],
        "reset_prefix_cache": False,
        "usage": 0.0,
    }
    return table.get(op)


class Lockstep:
    """Adapters driven in lockstep over one configuration."""

    def __init__(
        self,
        config: KVCacheConfig,
        factories: list[AdapterFactory],
        stats: RunStats,
        failure_dir: Path,
        config_name: str = "",
        op_timeout: float | None = DEFAULT_OP_TIMEOUT,
        known: tuple[Divergence, ...] = (),
        excluded: frozenset[str] = frozenset(),
        layer: Layer = FACADE,
    ) -> None:
        """Construct every adapter (reference first); every construction and
        every operation runs under a watchdog of ``op_timeout`` seconds.

        ``known`` are further known differences of the adapters under test
        (``--known``); operations using an ``excluded`` feature are left out.

        Raises:
            Refused: If an adapter does not run ``config``.
            LockstepFailure: If constructing an adapter crashed.
        """
        self.config = config
        self.op_timeout = op_timeout
        self._watchdog = Watchdog(op_timeout)
        self.excluded = excluded | unprobed_absent(config.profile)
        self.absent = absent_features(config.profile)
        self.layer = layer
        self.config_name = config_name or "custom"
        self.stats = stats
        self.failure_dir = failure_dir
        self.book = RequestBook(config)
        self.log: list[Json] = []
        self.halted = False
        self.failed = False
        """Whether an unexplained divergence ended the run (its trace is written; nothing more runs)."""
        self.skipped = False  # an adapter could not run an operation: every later call is left out
        self.restart_reason: str | None = None
        """Why the comparison stopped and should restart (:meth:`restart`), or None."""
        self.pending = 0
        self._views: list[KVView] | None = None
        self._views_before: list[KVView] = []
        self.factories = list(factories)
        self.known = known
        self.monitor: SafetyMonitor | None = None
        """The safety oracles over the reference adapter (``kvref check --level safety``), if on."""
        self.adapters: list[KVCacheAdapter] = []
        self.event_logs: list[EventLog | None] = []
        self.declared: list[list[Divergence]] = []
        self._build()
        stats.runs += 1
        stats.configs[config_name or "custom"] += 1
        stats.config_properties.update(properties_of(config))

    def _build(self) -> None:
        """Construct every adapter (reference first) and their event logs."""
        config, stats = self.config, self.stats
        self.adapters, self.event_logs = [], []
        for factory in self.factories:
            adapter = self._construct(factory, config, stats)
            if adapter is None:
                raise InputError(f"the factory {getattr(factory, '__name__', factory)!r} returned None, not an adapter")
            if getattr(adapter, "construction_workaround", None) == "sinkfull-ctor":
                stats.known["sinkfull-ctor"] += 1
            self.adapters.append(adapter)
            log = EventLog(config.int_block_hashes, config.profile.event_group_idx)
            self.event_logs.append(log if config.enable_kv_cache_events else None)
        self.declared = [resolve(semantics_of(a).known) for a in self.adapters]
        for extra in self.declared[1:]:
            extra.extend(self.known)

    @property
    def wants_restart(self) -> bool:
        """Whether a declared difference or a known class stopped the comparison (:meth:`restart`)."""
        return self.halted and self.restart_reason is not None and not self.failed

    def restart(self) -> None:
        """Start the comparison over: every adapter built again from the
        configuration, an empty request book and operation log (a trace
        written later starts here), nothing pending. The caller (the
        scheduler machine) forgets its requests too.

        Raises:
            LockstepFailure: If constructing an adapter crashed.
        """
        self.stats.restarts[self.restart_reason or "restart"] += 1
        self.restart_reason = None
        self.halted = self.skipped = False
        self.pending = 0
        self._views = None
        self.book = RequestBook(self.config)
        self.log = []
        self._build()

    def _restart_after(self, reason: str) -> None:
        """Stop comparing now; the machine restarts the comparison at its next step."""
        self.restart_reason = reason
        raise _Halted

    def _construct(self, factory: AdapterFactory, config: KVCacheConfig, stats: RunStats) -> KVCacheAdapter:
        """``factory(config)``; a refusal raises :class:`Refused`, a crash a
        :class:`LockstepFailure` with an empty trace."""
        name = getattr(factory, "__name__", "an adapter")
        reason = refusal(factory, config)
        if reason is not None:
            raise Refused(f"{name}: {reason}")
        self._raise_if_hung()
        try:
            with watchdog(self.op_timeout, f"constructing {name}"):
                adapter: KVCacheAdapter = factory(config)
        except AdapterHang as hang:
            self.stats.hung = str(hang)
            self.failed = True
            raise
        except SKIP_ERRORS as exc:
            raise Refused(f"{name}: {exc}", getattr(exc, "feature", ""), type(exc).__name__) from exc
        except (Exception, SystemExit) as exc:
            message = f"constructing {name} crashed: {type(exc).__name__}: {exc}"
            known = stats.classes.get("construct/crash") if stats.keep_going else None
            if known is not None:  # a keep-going run registered this class: count it, check nothing
                known.occurrences += 1
                known.shapes[self.config_name] += 1
                raise Refused(f"{name}: a known divergence class (construct/crash): {exc}", kind="known class") from exc
            stats.unexplained += 1
            stats.last_failure_key, stats.last_failure_shape = "construct/crash", self.config_name
            raise LockstepFailure(message, self._write_trace(message)) from exc
        return adapter

    def request_op(self, op: Json) -> None:
        """Apply a request operation (no adapter call)."""
        self.book.apply(op)
        self.log.append(op)

    def call(self, op: Json, expect_unchanged: bool = False) -> Json:
        """Run a facade operation everywhere; return the reference output.

        ``expect_unchanged`` additionally requires every view to be the same
        after the call as before it (caller errors must change nothing). An
        operation or argument the profile's release lacks
        (:func:`kvref.capabilities.absent_features`) is left out like an
        excluded feature; :meth:`call_absent` sends one on purpose.
        """
        assert op["op"] not in REQUEST_OPS
        left_out = self.excluded | self.absent
        if left_out and op["op"] == "allocate_slots":
            op = without_arguments(op, left_out)
        if left_out and op["op"] == "allocate_slots_batch":
            op = {**op, "items": [without_arguments(item, left_out) for item in op["items"]]}
        return self._run(op, expect_unchanged, left_out, absent=False)

    def call_absent(self, op: Json) -> Json:
        """Send an operation (or ``allocate_slots`` argument) the profile's
        release lacks: every adapter must refuse it with a skip error (its
        output is then :data:`kvref.ops.ABSENT`) and change nothing; an
        adapter that runs it instead diverges. Left out where an adapter
        declared or showed that it lacks the feature itself (``excluded``).
        """
        assert op_features(op) & self.absent, f"{op['op']} is not absent from {self.config.profile.name}"
        return self._run(op, True, self.excluded, absent=True)

    def _run(self, op: Json, expect_unchanged: bool, left_out: frozenset[str], absent: bool) -> Json:
        if self.halted or self.skipped or (left_out and op_features(op) & left_out):
            # NOTE: a run that met a halting known divergence compares nothing more, not even
            # the rest of the rule that met it (the scheduler reads the prefix hint right
            # after the lookup that diverged)
            if not (self.skipped or self.halted):
                self.stats.left_out[op["op"]] += 1
            return neutral_output(op["op"], len(self.config.groups))
        outs: list[Json] = []
        try:
            return self._call(op, expect_unchanged, outs, absent)
        except _Halted:
            self.halted = True
            if self.skipped or not outs or (isinstance(outs[0], dict) and "crash" in outs[0]):
                # a crash marker is no output the scheduler model can read (drift and
                # --keep-going go on after a halting divergence)
                return neutral_output(op["op"], len(self.config.groups))
            return outs[0]

    def _call(self, op: Json, expect_unchanged: bool, outs: list[Json], absent: bool = False) -> Json:
        self._raise_if_hung()
        with self._watchdog as dog:
            return self._compare(op, expect_unchanged, outs, absent, dog)

    def _compare(self, op: Json, expect_unchanged: bool, outs: list[Json], absent: bool, dog: Watchdog) -> Json:
        """Run ``op`` on every adapter and compare; every adapter call (the
        operation, its views, its invariant check) runs under ``dog``."""
        before = self._views_before = self._views_now(dog, op)
        self._views = None  # the operation may change every state
        crashes: list[str] = []
        refusals: list[str] = []
        for a in self.adapters:
            if outs and self._trusted_caller_error(op, outs[0], absent):
                return outs[0]
            try:
                outs.append(
                    self._guarded(dog, f"{a.name}.{op['op']}", op, partial(self.layer.execute, a, self.book, op))
                )
            except SKIP_ERRORS as exc:
                if not absent and getattr(a, "runs_every_operation", False):
                    refusals.append(
                        f"{a.name} refused {op['op']}, which {self.config.profile.name} has, and it declares "
                        f"that it runs every operation ({type(exc).__name__}: {exc})"
                    )
                elif not absent:
                    self._skip(a, op, exc)
                outs.append(dict(ABSENT))
            except (Exception, SystemExit) as exc:
                outs.append({"crash": type(exc).__name__})
                crashes.append(f"{a.name} crashed: {type(exc).__name__}: {exc}")
        self.stats.steps += 1
        self.stats.shape_steps[self.config_name] += 1
        for a in self.adapters:
            fallback = getattr(a, "fallback", None)
            if fallback:
                self.stats.fallback_steps[f"{a.name}: {fallback}"] += 1
        entry = {**op, "expect": outs[0]}
        self.log.append(entry)
        if refusals:
            self._fail("; ".join(refusals), op, "refusal")
        for a, out in zip(self.adapters, outs, strict=True):
            problem = output_problem(op["op"], out)
            if problem is not None:
                self._fail(f"{a.name}: {problem}", op, "types")
        if crashes and len(self.adapters) == 1 and self._crash_known_alone(op, outs[0]):
            return outs[0]
        if crashes and (len(crashes) == len(self.adapters) or len(self.adapters) == 1):
            self._fail("; ".join(crashes), op, "crash")
        ref_view = self._view(dog, self.adapters[0], op)
        entry["view"] = ref_view  # its digest is taken when a trace is written (see trace_log)
        for a, out in zip(self.adapters[1:], outs[1:], strict=True):
            explained = out == outs[0] or self._explained(op, a, outs[0], out)
            if not explained and not self._state_explains(op, a, before[0]):
                detail = "; ".join(crashes)
                message = f"{a.name} returned {out!r}, {self.adapters[0].name} returned {outs[0]!r} {detail}"
                self._fail(message.strip(), op, "crash" if crashes else "output")
        if self.halted:
            return outs[0]
        if op["op"] == "take_kv_cache_block_copies" and isinstance(outs[0], dict):
            self.stats.block_copies += len(outs[0].get("copies", ()))
        after = [ref_view, *(self._view(dog, a, op) for a in self.adapters[1:])]
        for a, view in zip(self.adapters[1:], after[1:], strict=True):
            if view != ref_view and self._state_explains(op, a, before[0]):
                return outs[0]  # a known halting divergence: nothing more is compared
            if view != ref_view:
                first = first_difference(ref_view, view, self.adapters[0].name, a.name)
                where, text = first if first is not None else ("view", "; ".join(diff_views(ref_view, view)))
                self._fail(f"views differ after {op['op']}: {text}", op, f"view:{where}")
        changed = [old != new for old, new in zip(before, after, strict=True)]
        for a, out, old, new, moved in zip(self.adapters, outs, before, after, changed, strict=True):
            if expect_unchanged and a is self.adapters[0] and isinstance(outs[0], dict) and "error" in outs[0]:
                self.stats.invalid_calls[f"{op['op']}:{outs[0]['error']}"] += 1
            if not moved:
                continue  # an unchanged view: nothing rewritten, nothing dropped
            if expect_unchanged:
                self._fail(_changed_by_caller_error(a.name, op["op"], out, a is self.adapters[0]), op, "unchanged")
            if not inv_tables_append_only(old, new):
                self._fail(f"{a.name}: {op['op']} rewrote a table entry (tables must be append-only)", op, "invariant")
            if not self.layer.hash_lifetime(old, new, op["op"]):
                self._fail(f"{a.name}: {op['op']} dropped a cached hash it may not drop", op, "invariant")
        self._views = after
        self._check_invariants(op, changed, dog)
        if op["op"] == "take_events":
            self._check_event_logs(op, outs, dog)
        elif op["op"] in ("get_computed_blocks", "get_computed_blocks_for_connector"):
            self._expect_announcements(op, outs)
        elif op["op"] == "reset_prefix_cache":
            for log, out in zip(self.event_logs, outs, strict=True):
                if log is not None and out is True:
                    log.cleared()
        if self.monitor is not None:
            self.watch(lambda m: m.after(op, outs[0], ref_view), op)
        return outs[0]

    def watch(self, event: Callable[[SafetyMonitor], None], op: Json) -> None:
        """Tell the safety monitor an event (``op`` names it in a failure); a
        violation fails the run like a divergence of aspect ``safety/<oracle>``."""
        assert self.monitor is not None
        if self.halted:
            return  # a run that met a halting known divergence (or a registered defect) checks nothing more
        try:
            event(self.monitor)
        except SafetyViolation as exc:
            defect = registered(exc.defect, exc.oracle, self.config.profile.release)
            if defect is None:
                self._fail(f"safety ({exc.oracle}): {exc}", op, f"safety/{exc.oracle}")
                return
            # a registered defect of this vLLM release (kvref.safety_defects): named, and the run stops there
            key = f"safety defect {defect.id}"
            self.stats.known[key] += 1
            self.stats.class_found_at.setdefault(key, self.stats.steps)
            self.halted = True

    def _trusted_caller_error(self, op: Json, ref_out: Json, absent: bool) -> bool:
        """Whether the reference refused ``op`` as a caller error while an
        adapter trusts its caller (``caller-errors`` left out): the others then
        never get the call. The reference changed nothing (its view is
        compared with its own), so every state still agrees; the call is
        counted as left out and not logged (a trace replays without it)."""
        if CALLER_ERRORS not in self.excluded or absent or not (isinstance(ref_out, dict) and "error" in ref_out):
            return False
        self._views = None
        if self._view(self._watchdog, self.adapters[0], op) != self._views_before[0]:
            self._fail(_changed_by_caller_error(self.adapters[0].name, op["op"], ref_out, True), op, "unchanged")
        self._views = self._views_before
        self.stats.left_out[f"{op['op']} (a caller error)"] += 1
        return True

    def _guarded(self, dog: Watchdog, what: str, op: Json, thunk: Callable[[], Json]) -> Json:
        """``thunk()`` under the watchdog as the adapter call ``what``; a hang
        writes the trace up to this call and ends the check (see the module docstring)."""
        try:
            dog.arm(what)
            return thunk()
        except AdapterHang as hang:
            self.failed = True
            path = self._write_trace(f"hang: {hang}")
            self.stats.hung = f"{hang}; the trace up to the hanging call ({op['op']}): {path}"
            raise AdapterHang(self.stats.hung) from None
        finally:
            dog.disarm()

    def _view(self, dog: Watchdog, adapter: KVCacheAdapter, op: Json) -> KVView:
        """``adapter.to_view()`` under the watchdog; an exception is a crash of the adapter."""
        try:
            view: KVView = self._guarded(dog, f"{adapter.name}.to_view", op, adapter.to_view)
        except (Exception, SystemExit) as exc:
            self._fail(f"{adapter.name}.to_view crashed after {op['op']}: {type(exc).__name__}: {exc}", op, "crash")
            raise  # unreachable: _fail raises
        return view

    def _raise_if_hung(self) -> None:
        """Once an adapter hung, every later call raises at once (never waits again)."""
        if self.stats.hung:
            self.failed = True
            raise AdapterHang(self.stats.hung)

    def _views_now(self, dog: Watchdog, op: Json) -> list[KVView]:
        """Every adapter's view of its current state.

        NOTE: the views taken after the previous operation are kept and reused
        as this one's "before": the state changes only through :meth:`call`
        (the machine's direct reads are read-only by the adapter protocol), so
        a step takes one ``to_view`` per adapter instead of three (before: 74,740
        calls per side in a ci run at seed 0, 7% of its time under cProfile;
        docs/reports/lockstep-speed.md).
        """
        if self._views is None:
            self._views = [self._view(dog, a, op) for a in self.adapters]
        return self._views

    def trace_log(self) -> list[Json]:
        """The operation log with each step's view as its digest (the trace form)."""
        return [{**e, "view": e["view"].digest()} if isinstance(e.get("view"), KVView) else e for e in self.log]

    def _check_event_logs(self, op: Json, outs: list[Json], dog: Watchdog) -> None:
        """Feed each adapter's drained events to its consumer index, then
        compare the index with the adapter's cache map."""
        for a, log, out in zip(self.adapters, self.event_logs, outs, strict=True):
            if log is None or not isinstance(out, list):
                continue
            before = log.resyncs
            problem = log.consume(out) or log.compare(self._view(dog, a, op))
            if problem:
                message = f"{a.name}: the event stream is not a faithful log of the prefix cache: {problem}"
                self._fail(message, op, "events")
            self.stats.event_log_checks += 1
            self.stats.event_log_rebuilds += log.resyncs - before

    def _expect_announcements(self, op: Json, outs: list[Json]) -> None:
        """Tell each event log what a lookup that hit announces again (report
        mode "full"). A connector's lookup in a cached Mamba hybrid announces
        only when it falls back to the plain lookup: never when it reports a
        diverged hit, and undecided from its result otherwise."""
        cfg = self.config
        if not (cfg.enable_kv_cache_events and cfg.profile.report_mode_full):
            return
        req = self.book.requests.get(op.get("rid", ""))
        per_group = (
            op["op"] == "get_computed_blocks_for_connector" and cfg.enable_caching and len(cfg.groups) > 1
            and any(isinstance(k, Mamba) for k in cfg.groups)
        )  # fmt: skip
        for log, out in zip(self.event_logs, outs, strict=True):
            if log is None or req is None or not isinstance(out, dict) or not out.get("num_tokens"):
                continue
            if log is self.event_logs[0] and req.kv_cache_report_mode == "full":
                self.stats.announcing_lookups += 1
            if per_group and out.get("hit_diverged"):
                continue
            log.expect_announcement(cfg, req, out.get("blocks") or [], sure=not per_group)

    def _skip(self, adapter: KVCacheAdapter, op: Json, exc: BaseException) -> None:
        """``adapter`` cannot run ``op``: count it and stop comparing this run
        (an error that names no feature is remembered: the summary warns about it)."""
        key = f"{adapter.name}: {feature_of(exc, op)}"
        self.stats.skipped[key] += 1
        self.stats.skipped_runs[self.config_name] += 1
        self.stats.skip_reasons.setdefault(key, f"{type(exc).__name__}: {exc}")
        if not getattr(exc, "feature", ""):
            self.stats.unnamed_skips.setdefault(key, op["op"])
        self.skipped = True
        raise _Halted

    def _explained(self, op: Json, other: KVCacheAdapter, ref_out: Json, out: Json) -> bool:
        """Whether a known divergence explains ``out != ref_out``: a registered
        one only between a side that declares upstream vLLM behaviour and one
        that declares kvspec semantics (:class:`kvref.adapters.DeclaredSemantics`),
        one an adapter declares between it and the other side."""
        pending = self.pending > 0
        ref_upstream = semantics_of(self.adapters[0]).upstream
        if ref_upstream != semantics_of(other).upstream:
            vllm_out, spec_out = (ref_out, out) if ref_upstream else (out, ref_out)
            release = self._upstream_release(other)
            div_id = explain(self.config, op, vllm_out, spec_out, pending, release)
            if div_id is not None:
                return self._known(load_registry()[div_id])
        index = self.adapters.index(other)
        for own, theirs, entries in ((out, ref_out, self.declared[index]), (ref_out, out, self.declared[0])):
            for entry in entries:
                if entry.applies_to(self.config.profile.release) and entry.explains(
                    self.config, op, own, theirs, pending
                ):
                    self._known(entry)
                    self._restart_after(entry.id)
        return False

    def _crash_known_alone(self, op: Json, out: Json) -> bool:
        """Whether a lone upstream target (the safety level runs one) crashed at
        ``op`` as a registered halting divergence says it does where kvspec
        refuses the call (``None``): then the divergence is named and the run
        stops there, as in a comparison with kvspec (real vLLM's
        ``mamba-align-external-estimate`` runs out of blocks half-way)."""
        target = self.adapters[0]
        if not semantics_of(target).upstream:
            return False
        div_id = explain(self.config, op, out, None, self.pending > 0, self._upstream_release(target))
        entry = load_registry()[div_id] if div_id is not None else None
        return entry is not None and entry.halts and self._known(entry)

    def _state_explains(self, op: Json, other: KVCacheAdapter, before: KVView) -> bool:
        """Whether a registered divergence that shows in the state
        (:data:`kvref.divergences.TRIGGERS`) is met at ``op``, run from the
        state ``before``, between an upstream side and a spec side."""
        if semantics_of(self.adapters[0]).upstream == semantics_of(other).upstream:
            return False
        req = self.book.requests.get(op.get("rid", ""))
        computed = req.num_computed_tokens if req else 0
        div_id = explain_state(self.config, op, before, computed, self._upstream_release(other))
        return div_id is not None and self._known(load_registry()[div_id])

    def _upstream_release(self, other: KVCacheAdapter) -> str | None:
        """The release the upstream side of the reference and ``other``
        declares; None when it is not a plain release number (a test's fake
        upstream, a dev build), so that the profile's release applies."""
        upstream = self.adapters[0] if semantics_of(self.adapters[0]).upstream else other
        number = semantics_of(upstream).profile.removeprefix("vllm-")
        return number if re.fullmatch(r"\d+(\.\d+)*", number) else None

    def _known(self, entry: Divergence) -> bool:
        """Count a known divergence; a halting one stops the comparison."""
        self.stats.known[entry.id] += 1
        if entry.halts:
            self.halted = True
        return True

    def _declared_class(self, op_name: str, aspect: str) -> Divergence | None:
        """A declared entry naming the divergence class ``op_name/aspect``."""
        release = self.config.profile.release
        for entries in self.declared:
            for entry in entries:
                if entry.applies_to(release) and entry.explains_class(op_name, aspect):
                    return entry
        return None

    def _check_invariants(self, op: Json, changed: list[bool], dog: Watchdog) -> None:
        """Each adapter's ``check_invariants``, unless a read-only operation
        left its view unchanged.

        NOTE: about half the steps are reads (lookups, statistics, drained
        events, block ids, the step boundary); their internal state is checked
        again after the next operation that changes a view, so a read that
        corrupts internals is still caught, one step later at most.
        """
        for a, moved in zip(self.adapters, changed, strict=True):
            check = getattr(a, "check_invariants", None)
            if check is None or (not moved and op["op"] in READ_ONLY_OPS):
                continue
            try:
                self._guarded(dog, f"{a.name}.check_invariants", op, check)
            except AssertionError as exc:
                self._fail(f"{a.name} broke an invariant after {op['op']}: {exc}", op, "invariant")
            except (Exception, SystemExit) as exc:  # an adapter's own check that breaks is a finding too
                message = f"{a.name}'s check_invariants raised {type(exc).__name__} after {op['op']}: {exc}"
                self._fail(message, op, "invariant")
            self.stats.invariant_checks += 1

    def _fail(self, message: str, op: Json, aspect: str) -> None:
        """Record an unexplained divergence of ``aspect`` at ``op``: write the
        history as a trace and raise :class:`LockstepFailure`. A divergence
        class a declared entry names, or (with ``keep_going``) one already
        listed, is counted and restarts the comparison instead (the module
        docstring): whatever the same cause does next is not listed again as
        another class."""
        key = f"{op['op']}/{aspect}"
        # a declared policy difference never silences a safety oracle
        declared = None if aspect.startswith("safety/") else self._declared_class(op["op"], aspect)
        if declared is not None:
            self._known(declared)
            self._restart_after(declared.id)
        known = self.stats.classes.get(key)
        if self.stats.keep_going and known is not None:
            known.occurrences += 1
            known.shapes[self.config_name] += 1
            self._restart_after(key)
        self.stats.last_failure_key, self.stats.last_failure_shape = key, self.config_name
        self.stats.class_found_at.setdefault(key, self.stats.steps)
        self.stats.unexplained += 1
        if self.stats.first_failure_at is None:
            self.stats.first_failure_at = time.monotonic()
            self.stats.first_failure_steps = self.stats.steps
            if self.stats.on_first_failure is not None:
                self.stats.on_first_failure()
        self.failed = True
        path = self._write_trace(message)
        raise LockstepFailure(message, path)

    def _write_trace(self, message: str) -> Path:
        """Write the history so far as a trace for ``message``."""
        path = self.failure_dir / f"failure-{os.getpid()}.jsonl"
        log = self.trace_log()
        meta = {"failure": message, "shape": self.config_name, "features": trace_features(self.config, log)}
        if self.layer is not FACADE:
            meta["layer"] = self.layer.name
        Trace(self.config, log, meta).write(path)
        self.stats.last_failure = path
        return path


def _changed_by_caller_error(name: str, op_name: str, out: Json, reference: bool) -> str:
    """The message of an invalid call (sent on purpose) that changed ``name``'s state."""
    if isinstance(out, dict) and "error" in out:
        return f"{name}: {op_name} raised {out['error']} but changed the state (a caller error must change nothing)"
    cause = " (the reference accepted it too: this call is valid here, a fault of kvref's machine)" if reference else ""
    return (
        f"{name}: {op_name} is an invalid call the machine sent on purpose, but {name} returned {out!r} "
        f"and changed the state{cause}"
    )


class EventLog:
    """What a KV-event consumer (a router, an external cache index) knows.

    Built only from the events that ``take_events`` returned, in order: a
    multiset of ``(external hash, group_idx)``. ``BlockStored`` adds one per
    listed hash, ``BlockRemoved`` removes one, ``AllBlocksCleared`` empties
    it. Right after a ``take_events`` step the multiset must equal the
    adapter's cache map (a key counts once per block cached under it); a lost,
    duplicated or misordered event breaks the equality.

    NOTE: the external form is recomputed here from the view's keys (low 64
    bits, big-endian, or the raw digest as hex) instead of calling
    :func:`kvspec.hashing.external_block_hash`, so that a wrong conversion in
    the spec is caught too.
    """

    def __init__(self, int_block_hashes: bool, grouped: bool = True) -> None:
        """An empty index; hashes are ints when ``int_block_hashes``. Without
        ``grouped`` (releases before vLLM 0.20.0, whose events have no group
        index: profile switch ``event_group_idx``) every entry is indexed under
        group None."""
        self.int_block_hashes = int_block_hashes
        self.grouped = grouped
        self.counts: dict[tuple[Json, Json], int] = {}
        self.consumed = 0
        self.parents: dict[tuple[Json, Json], Json] = {}
        """``(hash, group) -> parent hash`` as the events told it (kept across
        clears); without group indices ``(hash, block size)``."""
        self.announced: list[tuple[int, Json, tuple[Json, ...]]] = []
        """Re-announcements the lookups since the last drain emitted (report
        mode "full"): ``(clears before it, group, hashes)`` each
        (:meth:`expect_announcement`)."""
        self.clears = 0
        """Prefix-cache resets since the last drain (:meth:`cleared`): each put
        an ``AllBlocksCleared`` among the drain's events."""
        self.unsure = False
        """A lookup since the last drain may or may not have announced its hit:
        the next comparison rebuilds the index from the cache instead."""
        self.resyncs = 0
        """Comparisons not judged for that reason (the index was rebuilt instead)."""

    def expect_announcement(
        self, config: KVCacheConfig, request: Request, blocks: list[list[int]], sure: bool = True
    ) -> None:
        """A lookup of ``request`` hit ``blocks`` (per group): under report mode
        "full" each group with hit blocks announces them again, naming the
        request's own hashes (at most its hashed blocks). Such an event stores
        nothing: :meth:`consume` leaves it out of the index (:meth:`_announcements`)
        at the next drain, which holds every event the lookups made.
        Without ``sure`` the lookup may have announced nothing (a connector's
        lookup in a Mamba hybrid searches group by group and announces only
        when it falls back to the plain lookup, which its result does not
        always tell): the drain's events are then applied as they come and
        the index is rebuilt from the cache at the comparison.
        """
        if not (config.profile.report_mode_full and request.kv_cache_report_mode == "full"):
            return
        if not sure:
            self.unsure = True
            return
        hash_block = config.resolved_hash_block_size()
        for gid, ids in enumerate(blocks):
            size = config.groups[gid].block_size
            if not ids or size % hash_block:
                continue
            k = size // hash_block
            fine = request.block_hashes
            n = min(len(ids), len(fine) // k)
            digests = [fine[(i + 1) * k - 1] for i in range(n)]
            if digests:
                hashes = tuple(self._external(d) for d in digests)
                self.announced.append((self.clears, gid if self.grouped else None, hashes))

    def cleared(self) -> None:
        """A prefix-cache reset succeeded: the announcements of later lookups
        come after its ``AllBlocksCleared`` in the drain's events."""
        self.clears += 1

    def _external(self, digest: bytes) -> Json:
        """A digest's external form: its low 64 bits (big-endian) or its hex."""
        return int.from_bytes(digest[-8:], "big") if self.int_block_hashes else digest.hex()

    def consume(self, events: list[Json]) -> str:
        """Apply events (as :func:`kvref.ops.event_to_json` writes them);
        return a problem description, or "" if they applied cleanly."""
        skip = self._announcements(events)
        for i, event in enumerate(events):
            self.consumed += 1
            kind = event.get("type")
            if kind == "AllBlocksCleared":
                self.counts.clear()
                continue
            if i in skip:
                continue
            group = event.get("group_idx")
            if kind == "BlockStored":
                problem = self._check_chain(event, group)
                if problem:
                    return problem
            for h in event.get("block_hashes", []):
                key = (h, group)
                if kind == "BlockStored":
                    self.counts[key] = self.counts.get(key, 0) + 1
                elif self.counts.get(key, 0) == 0:
                    return (
                        f"event #{self.consumed} removes hash {h!r} of group {group} that no earlier event "
                        "stored (a BlockStored was lost or came after its BlockRemoved)"
                    )
                else:
                    self.counts[key] -= 1
                    if not self.counts[key]:
                        del self.counts[key]
        return ""

    def _announcements(self, events: list[Json]) -> set[int]:
        """The positions in ``events`` of the announcements the lookups since
        the last drain made: for each, the last event that matches it (a
        BlockStored of its group and hashes, with no parent) and no earlier
        announcement took, between the ``AllBlocksCleared`` of the resets
        before its lookup and the next one. A block stored from block 0 with
        the very same hashes is the same event to a consumer; taking the last
        one never makes a later removal look premature, and the index ends the
        same (a clear in between would empty it: hence the bounds)."""
        announced, self.announced, self.clears = self.announced, [], 0
        clears = [i for i, e in enumerate(events) if e.get("type") == "AllBlocksCleared"]
        taken: set[int] = set()
        for epoch, group, hashes in announced:
            low = clears[min(epoch, len(clears)) - 1] + 1 if epoch and clears else 0
            high = clears[epoch] if epoch < len(clears) else len(events)
            for i in range(high - 1, low - 1, -1):
                e = events[i]
                if (
                    i not in taken and e.get("type") == "BlockStored" and e.get("parent_block_hash") is None
                    and e.get("group_idx") == group and tuple(e.get("block_hashes", [])) == hashes
                ):  # fmt: skip
                    taken.add(i)
                    break
        return taken

    def _check_chain(self, event: Json, group: Json) -> str:
        """A stored block's parent must be the one every earlier event gave it.

        A block hash chains its parent's, so one hash has one parent. The
        parents are known when the call stored every block of its range
        (``token_ids`` is then exactly ``block_size`` tokens per listed hash):
        ``parent_block_hash`` is the first one's, each listed hash the next
        one's. A call that skipped a block (null or masked) tells nothing.
        """
        hashes, block_size = event.get("block_hashes", []), event.get("block_size") or 0
        if not hashes or not block_size or len(event.get("token_ids", [])) != len(hashes) * block_size:
            return ""
        # Without group indices (before vLLM 0.20.0) a block's granularity is
        # told by its block size alone: a group coarser than the hash block
        # reports its blocks under their last fine hash's 64 bits, which a
        # finer group reports too, with another parent.
        scope = f"group {group}" if self.grouped else f"block size {block_size}"
        for parent, h in zip([event.get("parent_block_hash"), *hashes[:-1]], hashes, strict=True):
            known = self.parents.setdefault((h, scope), parent)
            if known != parent:
                return (
                    f"event #{self.consumed} stores hash {h!r} ({scope}) with parent {parent!r}, "
                    f"an earlier event gave it parent {known!r} (a block hash has one parent)"
                )
        return ""

    def compare(self, view: KVView) -> str:
        """Differences between the index and ``view.cached`` ("" if none)."""
        expected: dict[tuple[Json, Json], int] = {}
        for key, ids in view.cached:
            digest, group = key[:-4], int.from_bytes(key[-4:], "big")
            ext = self._external(digest)
            where = group if self.grouped else None
            expected[(ext, where)] = expected.get((ext, where), 0) + len(ids)
        if self.unsure:
            self.unsure, self.counts, self.resyncs = False, expected, self.resyncs + 1
            return ""
        if expected == self.counts:
            return ""
        diffs = [
            f"hash {k[0]!r} group {k[1]}: events say {self.counts.get(k, 0)}, cache holds {expected.get(k, 0)}"
            for k in sorted(set(expected) | set(self.counts), key=repr)
            if self.counts.get(k, 0) != expected.get(k, 0)
        ]
        more = f" (+{len(diffs) - 5} more)" if len(diffs) > 5 else ""
        cause = "an event was lost, duplicated or emitted out of order"
        return f"after {self.consumed} events: {'; '.join(diffs[:5])}{more} ({cause})"
