"""The library behind ``kvref check``: a typed request, the start-up, lockstep batches until a step goal.

A check is a :class:`CheckRequest` (the command line builds one at its edge,
the pytest plugin from its options). :func:`start` resolves its adapters and
semantics profile, probes what the adapters run and builds the
:class:`~kvref.stateful.MachineSetup` (a :class:`Session`); every adapter it
builds on the way is under the watchdog. :func:`run_lockstep` drives the
scheduler machine of :mod:`kvref.stateful` for a setup in seeded batches of
:data:`BATCH_EXAMPLES` runs each, until ``goal`` steps ran, a time budget ran
out or a divergence that nothing explains was found (Hypothesis has then
shrunk it and the lockstep has written its trace); :func:`run_keep_going`
collects every distinct divergence class instead. :mod:`kvref.verdict` says
what the run checked and how it ends. Tools that hunt faults (the project's
bug zoo) call :func:`run_lockstep` exactly as the command does.
"""

from __future__ import annotations

import re
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis.errors import Unsatisfiable
from hypothesis.stateful import RuleBasedStateMachine

from kvref.adapters import AdapterFactory, DeclaredSemantics, load_factory, semantics_of
from kvref.capabilities import SKIP_ERRORS, declared_unsupported, probe
from kvref.divergences import Divergence
from kvref.exits import DEFAULT_OP_TIMEOUT, InputError, raise_if_interrupted, watchdog
from kvref.hypothesis_compat import seed_machine
from kvref.isolation import isolated
from kvref.layers.pool import load_pool_factory
from kvref.layers.pool_machine import make_pool_machine
from kvref.lockstep import DivergenceClass, RunStats
from kvref.shapes import SHAPES, Shape
from kvref.stateful import MachineSetup, default_failure_dir, make_lockstep_machine, run_machine
from kvspec.config import FullAttention, KVCacheConfig
from kvspec.profiles import NEWEST, PROFILES, SemanticsProfile, profile_for_release, profile_named, release_key

MIN_STEPS = {"dev": 20_000, "ci": 20_000, "nightly": 500_000, "crosshair": 200}
"""Default step goal of each settings profile.

NOTE: ``dev`` (plain ``kvref check``) was 2,000 steps. Spread over every
configuration shape, that is about a hundred steps a shape: a vLLM fork with
a one-line fault in its prefix lookup (a hit not capped at the prompt's last
token) passed it, and 20,000 steps find it (docs/writing-an-adapter.md
gives the figures). A check of one's own engine should not pass on a sample
that small, so ``dev`` now asks as many steps as ``ci`` and differs from it
in the Hypothesis settings only (fewer runs per batch, shorter runs)."""
BATCH_EXAMPLES = 100
"""Machine runs per seeded batch."""
SEED_STRIDE = 1_000_003
"""Batch ``b`` of ``--seed s`` is seeded ``s * SEED_STRIDE + b``."""


@dataclass(frozen=True)
class CheckRequest:
    """One check as typed values: what ``kvref check`` and ``kvref drift`` build
    from their arguments at the command line's edge, and the pytest plugin
    from its options.

    Attributes:
        target: The adapter under test (``impl``, ``spec``, ``vllm``,
            ``module:factory``; None: kvimpl if present, else kvspec).
        against: The reference (None: real vLLM if installed, else kvspec;
            ``"none"``: a self-check of ``target``).
        settings: The settings profile: ``dev``, ``ci``, ``nightly``, ``crosshair``.
        seed: The seed of the first batch (:data:`SEED_STRIDE`).
        budget: Seconds after which no new batch starts (None: none).
        min_steps: The step goal (None: the settings profile's, :data:`MIN_STEPS`).
        op_timeout: Watchdog seconds per adapter call, start-up included.
        semantics: The semantics profile's name (None: :func:`choose_profile`).
        shapes: The configuration shapes to draw.
        without: Features to leave out besides those the adapters declare.
        known: Further known differences of the target (``--known`` files).
        layer: ``facade`` or ``pool``.
        keep_going: Collect every divergence class instead of stopping at the first.
        out: Where a keep-going run writes each class's trace.
        max_classes: A keep-going run stops after this many classes.
        allow_mismatch: Run a profile other than the one an upstream adapter
            declares (``kvref drift``).
        isolate: Run the target in a child process (:mod:`kvref.isolation`).
        level: ``conformance`` (the same outputs and state as the reference),
            ``safety`` (the target alone under the safety oracles, :mod:`kvref.safety`)
            or ``all`` (one, then the other: the command runs two requests).
    """

    target: str | None = None
    against: str | None = None
    settings: str = "dev"
    seed: int = 0
    budget: float | None = None
    min_steps: int | None = None
    op_timeout: float = DEFAULT_OP_TIMEOUT
    semantics: str | None = None
    shapes: tuple[Shape, ...] = SHAPES
    without: frozenset[str] = frozenset()
    known: tuple[Divergence, ...] = ()
    layer: str = "facade"
    keep_going: bool = False
    out: Path = Path("kvref-classes")
    max_classes: int = 30
    allow_mismatch: bool = False
    isolate: bool = False
    level: str = "conformance"
    asynchronous: bool = False

    @property
    def goal(self) -> int:
        """The step goal: ``min_steps``, else the settings profile's."""
        return self.min_steps or MIN_STEPS[self.settings]


@dataclass
class Session:
    """A check ready to run: its adapters, profile and machine setup.

    Attributes:
        request: What was asked.
        target: The adapter under test, resolved.
        against: The reference, resolved (None: a self-check).
        why: Why these two (defaults are explained in the header line).
        profile: The semantics profile every drawn configuration follows.
        reference: The profile an upstream adapter declares when it differs
            from ``profile`` (``kvref drift`` attributes classes to it).
        setup: The machine setup (reference factory first).
        notes: One line per shape or switch the probe left out, and why.
        machine: The state machine class (the pool machine for ``--layer pool``;
            None: the facade's scheduler machine).
        upstream: The names (as skips count them) of the adapters that
            declare upstream vLLM behaviour.
        release_note: The line that says an upstream release without a
            profile of its own runs under ``profile`` (None: it has one).
    """

    request: CheckRequest
    target: str
    against: str | None
    why: str
    profile: SemanticsProfile
    reference: SemanticsProfile | None
    setup: MachineSetup
    notes: list[str] = field(default_factory=list)
    machine: type[RuleBasedStateMachine] | None = None
    upstream: set[str] = field(default_factory=set)
    release_note: str | None = None

    @property
    def factories(self) -> list[AdapterFactory]:
        """Reference first, then the target."""
        return self.setup.factories


def start(request: CheckRequest) -> Session:
    """Resolve ``request``'s adapters and profile, probe what they run and
    build the machine setup. Every adapter built on the way (the semantics
    and capability probes) runs under the watchdog of ``request.op_timeout``.

    Raises:
        InputError: For a target that cannot be imported or built, a profile
            kvspec does not have, an adapter that declares another release
            than the chosen profile (unless ``allow_mismatch``), a
            ``sys.exit`` in a factory, or a facade adapter given to the pool
            layer (and the other way round).
        kvref.exits.AdapterHang: If importing or building an adapter runs past the watchdog.
    """
    safety = request.level == "safety"
    if request.against == "none" or (safety and request.against is None):
        target = request.target or ("spec" if request.against == "none" else choose_targets(None, "none")[0])
        against, why = None, "self-check chosen on the command line"
    else:
        target, against, why = choose_targets(request.target, request.against)
    if safety:
        if against is not None:
            raise InputError(f"--level safety runs the target alone: leave out --against ({against})")
        why = "the safety level runs the target alone, whatever its policy"
    names = [n for n in (against, target) if n is not None]
    pool = request.layer == "pool"
    timeout = request.op_timeout
    factories: list[AdapterFactory] = []
    for name in names:
        with watchdog(timeout, f"importing the target {name!r} (start-up)"):
            factories.append(load_pool_factory(name) if pool else load_factory(name))  # type: ignore[arg-type]  # a pool factory
    if request.isolate:
        factories[-1] = isolated(factories[-1])
    watched = [_watched(f, n, timeout) for f, n in zip(factories, names, strict=True)]
    try:
        profile = choose_profile(request.semantics, watched)
    except (KeyError, ValueError) as exc:
        raise InputError(f"--semantics: {exc}") from None
    reference, upstream, release_note = _declared_release(watched, names, profile, request.allow_mismatch, pool)
    excluded = request.without.union(*(declared_unsupported(f) for f in factories))
    failure_dir = default_failure_dir()
    if pool:
        setup = MachineSetup(factories, RunStats(), failure_dir, profile=profile, op_timeout=timeout,
                             known=request.known, excluded=excluded, safety=safety)  # fmt: skip
        return Session(request, target, against, why, profile, reference, setup, [], make_pool_machine(setup),
                       upstream, release_note)  # fmt: skip
    shapes, excluded, notes = probe(watched, request.shapes, profile, excluded)
    setup = MachineSetup(factories, RunStats(), failure_dir, shapes=shapes, profile=profile, op_timeout=timeout,
                         known=request.known, excluded=excluded, safety=safety,
                         asynchronous=request.asynchronous)  # fmt: skip
    setup.stats.asynchronous = request.asynchronous
    return Session(request, target, against, why, profile, reference, setup, notes, None, upstream, release_note)


def choose_targets(target: str | None, against: str | None) -> tuple[str, str | None, str]:
    """Resolve defaults: kvimpl if present, else kvspec against real vLLM if
    installed, else a kvspec self-check. Returns (target, against, why)."""
    if target is None:
        if _impl_present():
            target, why = "impl", "kvimpl is present"
        else:
            target, why = "spec", "kvimpl is not built yet"
    else:
        why = "chosen on the command line"
    if against is None:
        if _vllm_installed() and target != "vllm":
            against, why = "vllm", why + "; real vLLM is installed"
        elif target != "spec":
            against, why = "spec", why + "; vLLM is not installed, comparing with kvspec"
        else:
            why += "; vLLM is not installed: kvspec self-check (invariants, error contract)"
    return target, against, why


def choose_profile(name: str | None, factories: list[AdapterFactory]) -> SemanticsProfile:
    """``name``, else the profile an upstream adapter (real vLLM, a fork)
    declares (for a release kvspec has no profile of, the newest profile of
    an older release: :func:`kvspec.profiles.profile_for_release`), else the
    one any adapter declares (:class:`kvref.adapters.DeclaredSemantics`),
    else the newest.

    Raises:
        KeyError: For an unknown profile name, or an upstream release older than every profile.
        ValueError: When a non-upstream adapter declares a profile kvspec does not have.
    """
    if name is not None:
        return profile_named(name)
    declared = []
    for factory in factories:
        try:
            adapter = factory(probe_config(NEWEST))
        except SKIP_ERRORS:  # it refuses the probe configuration: the shape probe says more
            continue
        except InputError:
            raise
        except Exception:  # construction problems are reported by the lockstep, with a trace
            continue
        if isinstance(getattr(adapter, "semantics", None), DeclaredSemantics):
            declared.append(semantics_of(adapter))
    for semantics in sorted(declared, key=lambda d: not d.upstream):
        if semantics.profile in PROFILES:
            return PROFILES[semantics.profile]
        if semantics.upstream:
            return profile_for_release(semantics.profile)
        raise ValueError(
            f"an adapter declares {semantics.profile}, which kvspec has no profile for; known: {', '.join(PROFILES)}"
        )
    return NEWEST


def newer_release_note(declared: str, profile: SemanticsProfile) -> str:
    """The one line that says an upstream release without a profile of its own
    runs under ``profile``."""
    release = declared.removeprefix("vllm-")
    try:
        newer = release_key(release) > release_key(NEWEST.release)
    except KeyError:
        newer = False
    why = f"is newer than kvref's newest semantics profile ({NEWEST.name})" if newer else "has no semantics profile"
    return f"vLLM {release} {why}: checking it under {profile.name} (kvref drift lists what it changed)"


def probe_config(profile: SemanticsProfile) -> KVCacheConfig:
    """The small configuration the start-up builds each adapter with."""
    return KVCacheConfig(num_blocks=4, groups=(FullAttention(4),), max_model_len=16, profile=profile)


def _declared_release(
    factories: list[AdapterFactory], names: list[str], profile: SemanticsProfile, allow_mismatch: bool, pool: bool
) -> tuple[SemanticsProfile | None, set[str], str | None]:
    """The profile an upstream adapter declares when it is not ``profile``
    (for ``kvref drift``), the names of the upstream adapters, and the note
    for an upstream release kvspec has no profile of; checks each adapter's
    kind for its layer.

    Raises:
        InputError: For an adapter that cannot be built, one of the wrong
            layer, or a mismatch without ``allow_mismatch``.
    """
    reference = None
    upstream: set[str] = set()
    note = None
    for name, factory in zip(names, factories, strict=True):
        try:
            adapter = factory(probe_config(profile))
        except SKIP_ERRORS:
            continue  # it refuses the probe configuration: the shape probe says more
        except InputError:
            raise
        except Exception as exc:
            raise InputError(
                f"cannot construct adapter {name!r} under {profile.name}: {type(exc).__name__}: {exc}"
            ) from None
        _check_layer(name, adapter, pool)
        declared = semantics_of(adapter)
        if declared.upstream:
            upstream.add(str(getattr(adapter, "name", name)))
            if declared.profile not in PROFILES:
                note = newer_release_note(declared.profile, profile)
        if declared.upstream and declared.profile != profile.name and declared.profile in PROFILES:
            reference = PROFILES[declared.profile]
            if not allow_mismatch:
                raise InputError(
                    f"adapter {name!r} behaves like {declared.profile}, not {profile.name}: "
                    f"check it with --semantics {declared.profile}"
                )
    return reference, upstream, note


def _check_layer(name: str, adapter: object, pool: bool) -> None:
    """A pool adapter for the pool layer, a facade adapter for the facade.

    Raises:
        InputError: Naming what the adapter is and what the layer needs.
    """
    kind = type(adapter).__name__
    if pool and not hasattr(adapter, "get_new_blocks"):
        raise InputError(
            f"--layer pool: {name!r} builds a {kind}, which has no get_new_blocks: the pool layer needs a "
            "block-pool adapter (kvref.BlockPoolAdapter); drop --layer pool to check a KV-cache manager facade"
        )
    if not pool and not hasattr(adapter, "allocate_slots") and hasattr(adapter, "get_new_blocks"):
        raise InputError(f"{name!r} builds a {kind}, a block pool without allocate_slots: check it with --layer pool")


def _watched(factory: AdapterFactory, name: str, seconds: float | None) -> AdapterFactory:
    """``factory`` with each call under the watchdog; a ``sys.exit`` in it is an input error.
    Keeps the factory's declared capabilities."""

    def build(config: KVCacheConfig) -> Any:
        try:
            with watchdog(seconds, f"constructing {name!r} (start-up probe)"):
                return factory(config)
        except SystemExit as exc:
            raise InputError(
                f"the factory of {name!r} called sys.exit({exc.code!r}); a factory returns an adapter or raises "
                "(kvref.Unsupported for a configuration it does not run)"
            ) from None

    for attr in ("supports", "unsupported", "features"):
        if hasattr(factory, attr):
            setattr(build, attr, getattr(factory, attr))
    build.__name__ = getattr(factory, "__name__", name)
    return build


def _vllm_installed() -> bool:
    from kvref.adapters.vllm import vllm_available  # noqa: PLC0415 - imports vLLM lazily

    return vllm_available()


def _impl_present() -> bool:
    try:
        load_factory("impl")
    except InputError:
        return False
    return True


def run_lockstep(
    setup: MachineSetup,
    seed: int,
    goal: int,
    budget: float | None = None,
    on_batch: Callable[[int], None] | None = None,
    first_batch: int = 0,
    machine: type[RuleBasedStateMachine] | None = None,
    base: settings | None = None,
) -> str | None:
    """Run batches until ``setup.stats.steps >= goal`` or ``budget`` seconds passed.

    ``machine`` is the state machine class (default: the facade's scheduler
    machine for ``setup``; :func:`kvref.layers.pool_machine.make_pool_machine`
    for the pool layer). ``base`` are the Hypothesis settings each batch
    starts from (default: Hypothesis's current default, which ``kvref check``
    loads from a settings profile; the pytest plugin passes its profile's
    settings instead of loading them).

    Returns:
        None if every step agreed (or was explained), else the first line of
        the unexplained divergence.
    """
    stats = setup.stats
    deadline = None if budget is None else time.monotonic() + budget
    machine = machine or make_lockstep_machine(setup)
    batch = first_batch
    setup.next_batch = batch
    while stats.steps < goal and (deadline is None or time.monotonic() < deadline):
        seed_machine(machine, seed * SEED_STRIDE + batch)
        steps_before = stats.steps
        try:
            run_machine(
                machine,
                settings(
                    base or settings.default, max_examples=BATCH_EXAMPLES, database=None, report_multiple_bugs=False
                ),
            )
        except AssertionError as exc:
            raise_if_interrupted()  # a rule cut short by Ctrl-C is no divergence
            setup.next_batch = batch + 1
            return (str(exc).splitlines() or [f"{type(exc).__name__} without a message"])[0]
        except Unsatisfiable:
            if stats.steps == steps_before:
                break  # every configuration was refused (counted): more batches would check nothing
        batch += 1
        setup.next_batch = batch
        learn_skips(setup)
        if on_batch is not None:
            on_batch(stats.steps)
    return None


def learn_skips(setup: MachineSetup) -> frozenset[str]:
    """Leave out, from now on, the features adapters raised a skip for (an
    unsupported operation, argument or switch); returns the newly left out.

    NOTE: only between batches: within one, Hypothesis replays examples while
    it shrinks, and a machine that changed in between would be flaky.
    """
    if not setup.learn_skips:
        return frozenset()
    learned = {key.rsplit(": ", 1)[-1] for key in setup.stats.skipped} - {"op:allocate_slots", "config"}
    new = frozenset(learned - setup.excluded)
    setup.excluded = setup.excluded | new
    return new


def run_keep_going(
    setup: MachineSetup,
    seed: int,
    goal: int,
    out_dir: Path,
    budget: float | None = None,
    max_classes: int = 50,
    on_batch: Callable[[int], None] | None = None,
    machine: type[RuleBasedStateMachine] | None = None,
    accept: Callable[[Path], str | None] | None = None,
    base: settings | None = None,
) -> list[DivergenceClass]:
    """Like :func:`run_lockstep`, but go on after an unexplained divergence.

    Each divergence is classified by the operation where it shows and the
    aspect that differs (:class:`kvref.lockstep.DivergenceClass`). The first
    one of a class is shrunk and its trace copied to ``out_dir`` as
    ``<class>.jsonl``. Then ``accept`` (``kvref drift``'s attribution,
    :mod:`kvref.drift`) may explain the trace and change ``setup`` so that
    the behaviour is expected from now on; it returns what explained it.
    Otherwise the class counts as known for the rest of the run: a run that
    meets it again counts it and restarts its comparison from a fresh state
    (:mod:`kvref.lockstep`), so one cause is listed once, whatever it does
    to the later steps, and each class's trace fails at that class (it holds
    the steps since the last restart only). The hunt goes on until the step
    goal, the budget or ``max_classes`` classes.

    Returns:
        The classes found, accepted ones included, in the order they were found.
    """
    stats = setup.stats
    stats.keep_going = True
    deadline = None if budget is None else time.monotonic() + budget
    batch = 0
    found_order: list[DivergenceClass] = []
    while stats.steps < goal and len(found_order) < max_classes:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            break
        steps_before = stats.steps
        failure = run_lockstep(setup, seed, goal, left, on_batch, first_batch=batch, machine=machine, base=base)
        batch = setup.next_batch
        if failure is None:
            break
        key = stats.last_failure_key or "unknown"
        trace = None
        ops = 0
        if stats.last_failure is not None and stats.last_failure.exists():
            out_dir.mkdir(parents=True, exist_ok=True)
            trace = out_dir / f"{re.sub(r'[^A-Za-z0-9_.+-]', '_', key)}.jsonl"
            shutil.copyfile(stats.last_failure, trace)
            ops = len(trace.read_text().splitlines()) - 1
        found = stats.class_found_at.pop(key, steps_before)
        cls = DivergenceClass(key, failure, trace, ops, found, shapes=Counter({stats.last_failure_shape: 1}))
        stats.unexplained -= 1  # counted as a class, not as a stop
        cls.explained_by = (accept(trace) if accept is not None and trace is not None else None) or ""
        if cls.explained_by and trace is not None:
            # the same operation/aspect may show again with another cause: keep each trace
            cls.trace = trace.rename(trace.with_name(f"{trace.stem}-{len(stats.accepted) + 1}.jsonl"))
            stats.accepted.append(cls)
        else:
            stats.classes[key] = cls
        found_order.append(cls)
    return found_order
