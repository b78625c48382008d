"""The spec's own PEP 316 contracts, evaluated on every case of a finite domain.

For a spec function that takes a pool, a manager, a coordinator or a
configuration, CrossHair cannot build the arguments (proofs/README.md,
"CrossHair pitfalls"), so its docstring contract is checked here instead: a
*domain* (a generator registered with :func:`contract`) yields argument
tuples built with the spec's real classes, under every semantics profile;
for each case whose ``pre:`` lines hold, the function is called and every
``post:`` line is evaluated in the function's module namespace with
``__return__`` (and ``__old__``, a deep copy of the arguments taken before
the call) bound, exactly as CrossHair would. A raise of a class named by a
``raises:`` line ends the case without evaluating the posts; any other raise
refutes the contract.

The conditions are read from the spec's source (:mod:`kvproofs.contracts`),
not restated, and the function is looked up at run time, so a mutant put in
its place (``python -m kvproofs.bounded --mutant NAME``) is checked against
the spec's contract. Each condition is reported at its own line of the spec
file, with the number of cases and the releases whose profiles the domain
fed in.
"""

from __future__ import annotations

import builtins
import copy
import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from types import CodeType, SimpleNamespace
from typing import Any, TypeVar

from kvproofs.contracts import Condition, SpecFunction, spec_function
from kvspec.block_pool import BlockPool
from kvspec.config import KVCacheConfig
from kvspec.profiles import PROFILES, SemanticsProfile

PROFILE_LIST: tuple[SemanticsProfile, ...] = tuple(PROFILES.values())

Case = tuple[Any, ...]


@dataclass(frozen=True)
class Scenario:
    """A case built once per profile: ``build(profile)`` returns the
    arguments (None where the spec refuses the configuration)."""

    build: Callable[[SemanticsProfile], Case | None]
    profiles: Sequence[SemanticsProfile] = PROFILE_LIST


_SWITCHES = frozenset(f.name for f in fields(SemanticsProfile))
_READS: set[str] = set()
"""Switches read from a :class:`RecordingProfile` since the last clear."""


class RecordingProfile(SemanticsProfile):
    """A profile that notes each switch read from it (its name included: the
    spec decides on it in places), so that a scenario runs once per class of
    profiles that agree on everything it read."""

    __slots__ = ()

    def __getattribute__(self, name: str) -> Any:
        """The attribute, noting a switch."""
        if name in _SWITCHES:
            _READS.add(name)
        return super().__getattribute__(name)

    def __copy__(self) -> RecordingProfile:
        """Itself: a profile is an immutable value (copying reads no switch)."""
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> RecordingProfile:
        """Itself, as :meth:`__copy__`."""
        return self


def recording(profile: SemanticsProfile) -> RecordingProfile:
    """``profile`` as a :class:`RecordingProfile` with the same switches."""
    return RecordingProfile(**{f.name: getattr(profile, f.name) for f in fields(SemanticsProfile)})


DOMAINS: dict[str, tuple[Callable[[], Iterable[Case | Scenario]], str]] = {}
"""Spec function (``kvspec.module.function``) -> (its domain, a description)."""

PREFIX = "contract:"
"""Check names of contract checks: ``contract:module.function``."""


Domain = Callable[[], Iterable[Case | Scenario]]
D = TypeVar("D", bound=Domain)


def contract(qualname: str, description: str) -> Callable[[D], D]:
    """Register a domain generator for the contract of ``qualname``: it yields
    argument tuples, or :class:`Scenario` s built under each profile."""

    def register(domain: D) -> D:
        assert qualname not in DOMAINS, f"two domains for {qualname}"
        DOMAINS[qualname] = (domain, description)
        return domain

    return register


@dataclass
class Outcome:
    """What happened to one condition over the domain."""

    condition: Condition
    cases: int = 0
    failure: str | None = None
    releases: set[str] = field(default_factory=set)


@dataclass
class Report:
    """One contract check: its cases, its posts' outcomes and the raises."""

    function: SpecFunction
    cases: int = 0
    skipped: int = 0
    raised: int = 0
    outcomes: list[Outcome] = field(default_factory=list)
    error: tuple[str, str] | None = None
    """A refutation that is not one post: ``(what, first case)``."""


def _compile(fn: SpecFunction, cond: Condition) -> CodeType:
    return compile(cond.text, f"{fn.path}:{cond.line}", "eval")


def profiles_of(case: Case) -> set[str]:
    """Releases of the semantics profiles among a case's arguments."""
    return set().union(*(profiles_in(a) for a in case))


def profiles_in(value: Any) -> set[str]:
    """The release of a profile or configuration argument (a pool, manager or
    coordinator argument counts only through a :class:`Scenario`, which
    builds it under each profile)."""
    if isinstance(value, SemanticsProfile):
        return {value.release}
    if isinstance(value, KVCacheConfig):
        return {value.profile.release}
    return set()


def run_contract(qualname: str) -> Report:
    """Evaluate ``qualname``'s contract over its domain."""
    fn = spec_function(qualname)
    domain, _ = DOMAINS[qualname]
    module = importlib.import_module(fn.module)
    checker = _Checker(fn, getattr(module, fn.name), vars(module))  # looked up now: a mutant may stand in
    for item in domain():
        if isinstance(item, Scenario):
            checker.scenario(item)
        else:
            checker.case(item, profiles_of(item))
    return checker.report


class _Checker:
    """Evaluates one function's contract case by case into a :class:`Report`."""

    def __init__(self, fn: SpecFunction, target: Callable[..., Any], namespace: dict[str, Any]) -> None:
        self.target = target
        self.namespace = namespace
        self.names = list(fn.params)  # the spec's own, whatever a mutant standing in declares
        self.pres = [_compile(fn, c) for c in fn.pres]
        self.posts = [_compile(fn, c) for c in fn.posts]
        self.raises = tuple(namespace[n] if n in namespace else getattr(builtins, n) for n in fn.raises)
        self.needs_old = any("__old__" in c.text for c in fn.posts)
        self.report = Report(fn, outcomes=[Outcome(c) for c in fn.posts])

    def scenario(self, scenario: Scenario) -> None:
        """Run ``scenario`` under each profile, once per class of profiles
        that agree on every switch the run read (build, call and conditions):
        the others would take the same path, so they share its outcome."""
        pending = list(scenario.profiles)
        while pending:
            profile = pending.pop(0)
            _READS.clear()
            case = scenario.build(recording(profile))
            if case is not None:
                self.case(case, set())
            read = set(_READS)
            same = [p for p in [profile, *pending] if all(getattr(p, r) == getattr(profile, r) for r in read)]
            pending = [p for p in pending if p not in same]
            if case is not None:
                self._attribute({p.release for p in same})

    def _attribute(self, releases: set[str]) -> None:
        for outcome in self.report.outcomes:
            outcome.releases |= releases

    def case(self, case: Case, releases: set[str]) -> None:
        """Check one argument tuple."""
        report = self.report
        # One dict as globals: names bound here must be visible inside the
        # conditions' comprehensions, whose scopes skip an eval's locals.
        args = dict(zip(self.names, case, strict=True))
        env = {**self.namespace, **args}
        if not all(eval(code, env) for code in self.pres):
            report.skipped += 1
            return
        report.cases += 1
        old = SimpleNamespace(**copy.deepcopy(args)) if self.needs_old else None
        try:
            result = self.target(*case)
        except self.raises:
            report.raised += 1
            return
        except Exception as exc:
            if report.error is None:
                report.error = (f"raises {type(exc).__name__}: {exc}", _show(case))
            return
        env.update(__return__=result, __old__=old)
        self._attribute(releases)
        for outcome, code in zip(report.outcomes, self.posts, strict=True):
            outcome.cases += 1
            if outcome.failure is not None:
                continue
            try:
                ok = eval(code, env)
            except Exception as exc:
                outcome.failure = f"{_show(case)} (raised {type(exc).__name__} while evaluating: {exc})"
                continue
            if not ok:
                outcome.failure = f"{_show(case)} -> {result!r}"


def _show(case: Case) -> str:
    text = "(" + ", ".join(_describe(a) for a in case) + ")"
    return text if len(text) <= 600 else text[:600] + "..."


def _describe(value: Any) -> str:
    """A readable stand-in for a coordinator, manager or pool argument (its
    configuration or kind, release and cache map), else the repr."""
    config, pool = getattr(value, "config", None), getattr(value, "pool", None)
    if isinstance(value, BlockPool):
        pool = value
    if pool is None or not isinstance(pool, BlockPool):
        return repr(value)
    cached = {k.hex(): ids for k, ids in pool.cached.items()}
    if isinstance(config, KVCacheConfig):
        head = f"groups={config.groups}, eagle={config.use_eagle}, release={config.profile.release}"
    else:
        head = f"kind={getattr(value, 'kind', None)}, release={pool.profile.release}"
    return f"<{type(value).__name__} {head}, cached={cached}>"


def messages(report: Report) -> list[str]:
    """``path:line: level: text`` lines (CrossHair's format) for ``report``."""
    fn = report.function
    out = []
    if report.error is not None:
        out.append(f"{fn.path}:{fn.line}: error: {report.error[0]}")
        out.append(f"    first case: {report.error[1]}")
    if not report.cases:
        out.append(f"{fn.path}:{fn.line}: error: the domain has no case where the preconditions hold")
    for outcome in report.outcomes:
        line = outcome.condition.line
        if outcome.failure is not None:
            out.append(f"{fn.path}:{line}: error: {outcome.condition.source}")
            out.append(f"    first case: {outcome.failure}")
        else:
            releases = " ".join(sorted(outcome.releases, key=_release_key)) or "-"
            out.append(
                f"{fn.path}:{line}: info: Confirmed over all {outcome.cases} cases "
                f"({report.raised} raised as declared; releases: {releases})."
            )
    return out


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split("."))
