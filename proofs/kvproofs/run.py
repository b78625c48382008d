"""Run the CrossHair proofs: ``python -m kvproofs.run {holds,mutants,diff,all}``.

``holds``
    CrossHair checks the spec functions' own PEP 316 contracts (where it can
    build their inputs) and the harnesses in ``proofs/kvproofs/holds``; any
    counterexample, or any CrossHair crash, fails.
    It also runs the bounded exhaustive checks of ``proofs/kvproofs/bounded`` (the
    spec's real classes over small domains, plain Python).
``mutants``
    Every module of ``proofs/kvproofs/mutants`` is checked against its own (spec)
    contract and against the ``proofs/kvproofs/holds`` harnesses and ``proofs/kvproofs/bounded``
    checks it names, with the mutant bound in place of the spec function or
    method; the refuted conditions must be exactly those listed in
    ``proofs/kvproofs/mutants/expected.txt``.
``diff``
    The ``crosshair diffbehavior`` demo of ``proofs/diffbehavior.md``.

Budgets are path counts, not seconds, so every machine explores the same
paths (CrossHair seeds its choices): ``# crosshair: max_iterations=N``
directives in the harnesses and mutants, and ``--max_uninteresting_iterations``
for the spec's own contracts and for diffbehavior. ``--per_condition_timeout``
(CPU seconds) is only a safety net that a normal run never reaches. Jobs run in
parallel (``--jobs``, default: CPU count, at most 4); each job prints its wall
and CPU time.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType

from kvproofs.contracts import ALL_RELEASES, CROSSHAIR, Condition, SpecFunction, about_of, spec_functions
from kvproofs.report import RESULTS, STATUSES, Obligation, owner, save
from kvproofs.wrappers import write_modules
from kvspec.profiles import PROFILES

REPO = Path(__file__).resolve().parents[2]
PROOFS = REPO / "proofs" / "kvproofs"
EXPECTED = PROOFS / "mutants" / "expected.txt"

HOLDS_TIMEOUT = 300.0
"""CPU seconds per condition for the spec's contracts and the harnesses: only a
safety net, their ``max_iterations`` directives bound each search."""

PATH_TIMEOUT = 60.0
"""CPU seconds per path (``--per_path_timeout``; CrossHair gives z3 half of it
as a wall-clock limit per query). Large, so that only :data:`SMT_RLIMIT` ever
stops a query: z3's own timeout is wall-clock, and a query it cut short under
load would leave a condition "not refuted" that exhausts on an idle machine."""

SMT_RLIMIT = 20_000_000
"""z3's deterministic work budget per query (``CROSSHAIR_SMT_RLIMIT``): a query
that needs more answers "unknown" at the same point on every machine. At 2,000,000
the nonlinear queries of ``align_down_props`` (with the kind/profile plugin loaded)
ended unknown and the condition "not refuted"; 5,000,000 exhausts it, and this
leaves a tenfold margin."""

MUTANT_TIMEOUT = 60.0
"""CPU seconds per condition for ``mutants``: only a safety net, the
``max_iterations`` directives of the harnesses and mutants bound each search."""

MUTANT_ITERATIONS = 100
"""Cap on the ``max_iterations`` directives of the harness copies that mutants
run against (each mutant's own function carries ``max_iterations=40``). Every
expected refutation comes by iteration 45 (CrossHair 0.0.113): see
proofs/README.md."""

DIFF_ITERATIONS = 50
"""``--max_uninteresting_iterations`` of each ``diffbehavior`` comparison
(iterations without new coverage before it stops): deterministic, unlike a
time budget."""

DIFF_TIMEOUT = 60.0
"""CPU seconds per ``diffbehavior`` comparison: only a safety net."""


HOLDS = ("features", "releases", "alloc", "arith")
"""Harness modules of ``proofs/kvproofs/holds``, slowest first."""

PLUGIN = Path("proofs/crosshair_plugin.py")
"""CrossHair plugin file: symbolic attention kinds and profiles (:mod:`kvproofs.plugin`)."""

SOURCE_ROOTS = (Path("proofs"), Path("spec"), Path("impl"), Path("kit"))
"""Import roots of every CrossHair process, relative to the repository (its
working directory): CrossHair steers its search by code locations, file names
included, so absolute paths would make a clone elsewhere explore other paths."""

GENERATED = Path("build/proofs/generated")
"""Where the contract wrappers and harness copies are written (relative, for
the same reason; emptied at each run)."""

BOUNDED_PROCESSES = 3
"""Processes for the bounded checks (property checks and contract domains)."""

_MESSAGE = re.compile(r"^(?P<path>.+?):(?P<line>\d+): (?P<level>error|info|warning): (?P<text>.*)$")
_EXCEPTION = re.compile(r"^(?P<exc>\w+): ")


@dataclass
class Result:
    """One CrossHair process: its command, exit status, messages and timing."""

    label: str
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    cpu_seconds: float
    messages: list[tuple[Path, int, str, str]] = field(default_factory=list)

    @property
    def crashed(self) -> bool:
        """CrossHair itself failed (an internal error, not a counterexample)."""
        return self.returncode not in (0, 1) or "Traceback (most recent call last)" in self.stderr


def crosshair_argv(*args: str) -> list[str]:
    """The CrossHair command line, preferring the one next to this Python,
    with the plugin that builds kinds and profiles (:data:`PLUGIN`)."""
    exe = Path(sys.executable).with_name("crosshair")
    command, *rest = args
    return [str(exe) if exe.exists() else "crosshair", command, "--extra_plugin", str(PLUGIN), *rest]


def run_crosshair(
    label: str, args: Sequence[str], extra_path: Sequence[Path] = (), env: Mapping[str, str] | None = None
) -> Result:
    """Run CrossHair with the repository's import roots on ``PYTHONPATH``
    (``env``: variables that replace the defaults of :func:`run_command`)."""
    return run_command(label, crosshair_argv(*args), extra_path, env)


def run_bounded(label: str, args: Sequence[str]) -> Result:
    """Run ``python -m kvproofs.bounded`` (same message format as CrossHair)."""
    return run_command(label, [sys.executable, "-m", "kvproofs.bounded", *args])


def run_command(
    label: str, argv: list[str], extra_path: Sequence[Path] = (), overrides: Mapping[str, str] | None = None
) -> Result:
    """Run ``argv`` with the repository's import roots on ``PYTHONPATH``;
    collect its ``path:line: level: text`` messages. ``overrides`` replace
    the environment's values (the hash seed and z3's budget of a retry)."""
    roots = [*extra_path, *SOURCE_ROOTS]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in roots), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("PYTHONHASHSEED", "0")
    env.setdefault("CROSSHAIR_SMT_RLIMIT", str(SMT_RLIMIT))
    env.update(overrides or {})
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    cpu = usage.ru_utime + usage.ru_stime
    result = Result(label, argv, proc.returncode, stdout, stderr, time.monotonic() - start, cpu)
    for line in stdout.splitlines():
        m = _MESSAGE.match(line)
        if m:
            result.messages.append((_repo_path(m["path"]), int(m["line"]), m["level"], m["text"]))
    return result


def _repo_path(path: str) -> Path:
    """A message's path relative to the repository when it lies inside it
    (CrossHair prints absolute paths; the generated wrappers are mapped by
    their relative paths), else as printed."""
    try:
        return Path(path).resolve().relative_to(REPO)
    except ValueError:
        return Path(path)


def run_parallel(jobs: int, tasks: Sequence[tuple[str, Callable[[], Result]]]) -> list[Result]:
    """Run ``tasks`` on ``jobs`` threads (each one a CrossHair process); print
    each as it ends."""

    def one(task: tuple[str, Callable[[], Result]]) -> Result:
        result = task[1]()
        print(f"    {result.label}: {result.seconds:.1f}s wall, {result.cpu_seconds:.1f}s CPU", flush=True)
        return result

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, tasks))


@cache
def _functions(path: Path) -> list[tuple[int, int, str]]:
    tree = ast.parse((REPO / path).read_text())
    return [
        (node.lineno, node.end_lineno or node.lineno, node.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
    ]


@cache
def _lines(path: Path) -> list[str]:
    return (REPO / path).read_text().splitlines()


def describe(path: Path, line: int) -> tuple[str, str]:
    """``(function, condition)`` at ``path:line``: the innermost function that
    contains the line, and the line's text (a ``pre:``/``post:`` line)."""
    inside = [(first, name) for first, last, name in _functions(path) if first <= line <= last]
    name = max(inside)[1] if inside else "<module>"
    return name, _lines(path)[line - 1].strip()


def relative(path: Path) -> str:
    """``path`` relative to the repository (generated mutant harnesses map back
    to the ``proofs/kvproofs/holds`` module they copy)."""
    m = re.match(r"_mut_\w+?__(\w+)\.py$", path.name)
    if m:
        return f"proofs/kvproofs/holds/{m[1]}.py"
    try:
        return str((REPO / path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


WRAPPER_LINES: dict[tuple[Path, int], tuple[Path, int]] = {}
"""Lines of the generated contract wrappers -> the spec lines they copy."""


def condition_key(path: Path, line: int, text: str) -> str:
    """Stable text of one refuted condition: ``file::function: condition``
    (for ``proofs/kvproofs/bounded``, the condition is the name the check
    gives it; a contract wrapper's line is the spec's own line)."""
    path, line = WRAPPER_LINES.get((path, line), (path, line))
    func, cond = describe(path, line)
    if relative(path).startswith("proofs/kvproofs/bounded/"):
        cond = text
    elif not cond.startswith(("post:", "pre:")):
        m = _EXCEPTION.match(text)
        cond = f"raises {m['exc']}" if m else f"error at {cond}"
    elif text.startswith("Error while evaluating post condition"):
        cond += " (raised while evaluating)"
    return f"{relative(path)}::{func}: {cond}"


def report_crash(result: Result) -> None:
    """Print what CrossHair wrote when it failed internally."""
    print(f"!!! {result.label}: CrossHair failed (exit {result.returncode}): {' '.join(result.argv)}")
    print((result.stdout + result.stderr)[-4000:])


# --- holds -------------------------------------------------------------------


def holds(jobs: int, timeout: float) -> bool:
    """Check the spec's own contracts (CrossHair and enumerations), the
    harnesses and the bounded checks; True when every obligation is exhausted
    or confirmed within its bound. Writes :data:`kvproofs.report.RESULTS`."""
    timeouts = [f"--per_condition_timeout={timeout}", f"--per_path_timeout={PATH_TIMEOUT}"]
    opts = ["check", "--analysis_kind=PEP316", *timeouts, "--report_all"]
    gen_dir = _fresh(GENERATED / "contracts")
    targets, mapping = write_modules(gen_dir, list(CROSSHAIR))
    # One process per target: CrossHair's search carries state from one
    # function to the next in a process, so a target's result would depend on
    # what else shares its process (and would move when a contract is added).
    harnesses = [f"kvproofs.holds.{m}.{f}" for m in HOLDS for f in harness_functions(m)]
    commands = {t.rsplit(".", 1)[-1]: [*opts, t] for t in [*targets, *harnesses]}
    tasks = [(label, _bind(label, args, [gen_dir])) for label, args in commands.items()]
    for i, chunk in enumerate(_chunks(bounded_checks(), BOUNDED_PROCESSES), start=1):
        label = f"bounded ({i}/{BOUNDED_PROCESSES})"
        tasks.insert(i - 1, (label, _bounded_task(label, chunk)))
    results = run_parallel(jobs, tasks)
    results = [retry_unexhausted(r, commands[r.label], [gen_dir]) if r.label in commands else r for r in results]
    ok = True
    obligations: list[Obligation] = []
    print("\n  result        condition")
    for result in results:
        if result.crashed:
            report_crash(result)
            ok = False
        for path, line, level, text in result.messages:
            o = obligation(path, line, level, text, mapping)
            obligations.append(o)
            ok = ok and o.status in ("exhausted", "within bound")
            print(f"  {o.status:<13} {o.where} {o.function}  {o.condition}")
            if o.status == "refuted":
                print(f"                {text}")
    save(obligations)
    counts = Counter(o.status for o in obligations)
    summary = ", ".join(f"{counts[k]} {k}" for k in STATUSES)
    print(f"\n==> holds: {len(obligations)} obligations: {summary} ({'OK' if ok else 'FAILED'})")
    print(f"    written to {RESULTS.relative_to(REPO)}; python -m kvproofs.coverage renders the tables")
    return ok


RETRY_ENV = {"PYTHONHASHSEED": "1", "CROSSHAIR_SMT_RLIMIT": str(4 * SMT_RLIMIT)}
"""What a retry of a CrossHair process changes (see :func:`retry_unexhausted`)."""


def retry_unexhausted(result: Result, args: list[str], extra_path: Sequence[Path]) -> Result:
    """``result``, or a second run of its CrossHair process when the first left
    a condition "Not confirmed" without refuting anything.

    CrossHair's search order depends on more than its inputs: it keys its
    choices by code locations, whose file names differ from one checkout and
    venv to another, so a condition that exhausts in a few seconds in one
    place can end "Not confirmed" in another (seen once in CI, on a contract
    that exhausts here at a fiftieth of z3's budget). The retry runs the same
    command in a fresh process under another string-hash seed and with four
    times z3's budget (:data:`RETRY_ENV`); its result replaces the first only
    when it leaves nothing "Not confirmed", and it is then an exhaustive run in
    its own right. A refutation is never retried, and a retry that is still not
    exhausted keeps the first result, which fails the run."""
    unexhausted = [m for m in result.messages if m[3].startswith("Not confirmed")]
    if not unexhausted or result.crashed or any(m[2] == "error" for m in result.messages):
        return result
    retry = run_crosshair(result.label, args, extra_path, RETRY_ENV)
    settled = not retry.crashed and not any(m[3].startswith("Not confirmed") or m[2] == "error" for m in retry.messages)
    verdict = "exhausted on the retry" if settled else "still not exhausted on the retry"
    print(
        f"    {result.label}: {len(unexhausted)} condition(s) not confirmed; {verdict} "
        f"({', '.join(f'{k}={v}' for k, v in RETRY_ENV.items())}; {retry.seconds:.1f}s wall)",
        flush=True,
    )
    return retry if settled else result


def harness_functions(module: str) -> list[str]:
    """The harness functions of ``proofs/kvproofs/holds/<module>.py``: those
    defined there whose docstring has a ``post:`` line."""
    mod = importlib.import_module(f"kvproofs.holds.{module}")
    return [
        name
        for name, fn in vars(mod).items()
        if inspect.isfunction(fn) and fn.__module__ == mod.__name__ and "post:" in (fn.__doc__ or "")
    ]


def _fresh(directory: Path) -> Path:
    """``directory`` (relative to the repository), emptied."""
    shutil.rmtree(REPO / directory, ignore_errors=True)
    (REPO / directory).mkdir(parents=True)
    return directory


def _chunks(items: Sequence[str], n: int) -> list[list[str]]:
    """``items`` dealt round-robin into ``n`` lists (none empty)."""
    return [c for c in ([list(items[i::n]) for i in range(n)]) if c]


def bounded_checks() -> list[str]:
    """Every bounded check name: the property checks, then the contract domains."""
    from kvproofs.bounded import CHECKS, MODULES  # noqa: PLC0415 - loads every domain
    from kvproofs.bounded.pep316 import DOMAINS, PREFIX  # noqa: PLC0415

    for module in MODULES:
        importlib.import_module(f"kvproofs.bounded.{module}")
    return [*CHECKS, *(PREFIX + q.removeprefix("kvspec.") for q in DOMAINS)]


def _bounded_task(label: str, checks: list[str]) -> Callable[[], Result]:
    return lambda: run_bounded(label, checks)


_RELEASES = re.compile(r"releases: (?P<releases>[^)]*)\)")
_CASES = re.compile(r"Confirmed over all (?P<n>\d+) cases")


def obligation(
    path: Path, line: int, level: str, text: str, mapping: dict[tuple[Path, int], tuple[Path, int]]
) -> Obligation:
    """The :class:`~kvproofs.report.Obligation` of one CrossHair or bounded message."""
    status = "refuted" if level == "error" else "not refuted" if text.startswith("Not confirmed") else "within bound"
    if (path, line) in mapping:  # a generated wrapper: the spec's own contract, by CrossHair
        spec_path, spec_line = mapping[(path, line)]
        fn = owner(spec_path, spec_line)
        assert fn is not None
        bound = CROSSHAIR[fn.qualname].bound
        if bound is None and status == "within bound":
            status = "exhausted"
        releases = ALL if _takes_profile(fn) else ()
        return Obligation("contract (CrossHair)", f"{relative(spec_path)}:{spec_line}", fn.name,
                          describe(spec_path, spec_line)[1], (fn.qualname,), status,
                          f"pre: {bound}" if bound else "none", releases)  # fmt: skip
    rel = relative(path)
    func, cond = describe(path, line)
    if rel.startswith("spec/"):  # a contract evaluated over a domain
        fn = owner(path, line)
        assert fn is not None
        m = _RELEASES.search(text)
        releases = tuple(r for r in (m["releases"].split() if m else ()) if r != "-")
        cases = _CASES.search(text)
        bound = f"{cases['n']} cases: {domain_of(fn.qualname)}" if cases else domain_of(fn.qualname)
        return Obligation(
            "contract (enumeration)", f"{rel}:{line}", fn.name, cond, (fn.qualname,), status, bound, releases
        )
    target = _harness(rel, func)
    subjects, marked = about_of(target) if target is not None else ((), None)
    releases = ALL if marked == ALL_RELEASES else tuple(marked or ())
    if rel.startswith("proofs/kvproofs/bounded/"):
        cases = _CASES.search(text)
        return Obligation("enumeration", f"{rel}:{line}", func, text if status == "refuted" else f"(bounded) {func}",
                          subjects, status, f"{cases['n']} cases" if cases else "", releases)  # fmt: skip
    pres = "; ".join(c.source for c in conditions_of_function(target) if c.kind == "pre") if target else ""
    return Obligation("harness", f"{rel}:{line}", func, cond, subjects, status, pres, releases)


ALL: tuple[str, ...] = tuple(p.release for p in PROFILES.values())


def _takes_profile(fn: SpecFunction) -> bool:
    return any(p.annotation in ("SemanticsProfile",) for p in _params(fn))


def _params(fn: SpecFunction) -> list[inspect.Parameter]:
    real = getattr(importlib.import_module(fn.module), fn.name)
    return list(inspect.signature(real).parameters.values())


def _harness(rel: str, func: str) -> Callable[..., object] | None:
    """The harness or bounded check function ``func`` of the file ``rel``."""
    m = re.match(r"proofs/(kvproofs/(holds|bounded)/\w+)\.py$", rel)
    if not m:
        return None
    module = importlib.import_module(m[1].replace("/", "."))
    target = getattr(module, func, None)
    return target if callable(target) else None


def conditions_of_function(fn: Callable[..., object]) -> list[Condition]:
    """The contract lines of a harness (plain text, no file lines)."""
    doc = inspect.getdoc(fn) or ""
    out = []
    for raw in doc.splitlines():
        kind, sep, text = raw.strip().partition(":")
        if sep and kind in ("pre", "post"):
            out.append(Condition(kind, text.strip(), 0))
    return out


def domain_of(qualname: str) -> str:
    """The description of ``qualname``'s enumerated domain."""
    from kvproofs.bounded.pep316 import DOMAINS  # noqa: PLC0415

    bounded_checks()
    return DOMAINS[qualname][1]


def _bind(label: str, args: list[str], extra_path: Sequence[Path] = ()) -> Callable[[], Result]:
    return lambda: run_crosshair(label, args, extra_path)


# --- mutants -------------------------------------------------------------------


@dataclass(frozen=True)
class Mutant:
    """One module of ``proofs/kvproofs/mutants``.

    ``harnesses`` names ``proofs/kvproofs/holds`` harnesses (``module.function``) and
    ``proofs/kvproofs/bounded`` checks (``bounded:module.function``). ``target`` is the
    dotted path of the spec object the mutant replaces (its ``TARGET``;
    default: the spec function of the same name).
    """

    name: str
    module: ModuleType
    function: str
    own_contract: bool
    harnesses: tuple[str, ...]
    target: str | None = None

    @property
    def crosshair_harnesses(self) -> tuple[str, ...]:
        """The ``proofs/kvproofs/holds`` harnesses."""
        return tuple(h for h in self.harnesses if not h.startswith((BOUNDED, CONTRACT)))

    @property
    def contracts(self) -> tuple[str, ...]:
        """Spec functions (``kvspec.module.function``) whose own contract
        CrossHair checks through its wrapper, with the mutant bound in it."""
        return tuple("kvspec." + h.removeprefix(CONTRACT) for h in self.harnesses if h.startswith(CONTRACT))

    @property
    def bounded_checks(self) -> tuple[str, ...]:
        """The ``proofs/kvproofs/bounded`` checks, without the prefix."""
        return tuple(h.removeprefix(BOUNDED) for h in self.harnesses if h.startswith(BOUNDED))


BOUNDED = "bounded:"
CONTRACT = "contract:"


def load_mutants() -> list[Mutant]:
    """Every mutant module, with the one function it defines."""
    package = importlib.import_module("kvproofs.mutants")
    out = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"kvproofs.mutants.{info.name}")
        defined = [
            name for name, obj in vars(module).items() if inspect.isfunction(obj) and obj.__module__ == module.__name__
        ]
        if len(defined) != 1:
            raise SystemExit(f"{PROOFS / 'mutants' / info.name}.py must define exactly one function, found {defined}")
        own = bool(getattr(module, "OWN_CONTRACT", True))
        harnesses = tuple(getattr(module, "HARNESSES", ()))
        out.append(Mutant(info.name, module, defined[0], own, harnesses, getattr(module, "TARGET", None)))
    return out


def contract_lines(fn: object) -> list[str]:
    """The ``pre:``/``post:`` lines of a function's docstring."""
    doc = inspect.getdoc(fn) or ""
    return [line.strip() for line in doc.splitlines() if line.strip().startswith(("pre:", "post:"))]


def spec_function(name: str) -> object:
    """The spec function called ``name``."""
    owner, attr = _spec_owner(name)
    return getattr(owner, attr)


def _spec_owner(name: str) -> tuple[object, str]:
    """``(module, name)`` of the public spec function called ``name``."""
    for fn in spec_functions():
        if fn.name == name:
            return importlib.import_module(fn.module), name
    raise SystemExit(f"no public spec function {name!r} in spec/kvspec")


def mutant_target(mutant: Mutant) -> tuple[object, str]:
    """``(module or class, attribute)`` of the spec object ``mutant`` replaces."""
    if mutant.target is None:
        return _spec_owner(mutant.function)
    path, _, attr = mutant.target.rpartition(".")
    modname, _, cls = path.rpartition(".")
    if not cls[:1].isupper():
        return importlib.import_module(path), attr
    return getattr(importlib.import_module(modname), cls), attr


def mutant_targets(mutant: Mutant, gen_dir: Path) -> list[str]:
    """CrossHair targets of one mutant; writes the harness copies to ``gen_dir``.

    A copy is the harness module's source, unchanged line for line, followed
    by an import that rebinds the spec function's name to the mutant: the
    harness functions look the name up at call time, so they test the mutant.
    Only the ``max_iterations`` directives change (capped at
    :data:`MUTANT_ITERATIONS`). A ``contract:`` entry becomes the spec
    function's contract wrapper (:mod:`kvproofs.wrappers`) with the same
    rebinding.
    """
    targets = [f"kvproofs.mutants.{mutant.name}.{mutant.function}"] if mutant.own_contract else []
    if mutant.contracts:
        names = {mutant.function: f"kvproofs.mutants.{mutant.name}:{mutant.function}"}
        wrapped, mapping = write_modules(
            gen_dir, list(mutant.contracts), names, f"_mutc_{mutant.name}", MUTANT_ITERATIONS
        )
        WRAPPER_LINES.update(mapping)
        targets += wrapped
    for harness in mutant.crosshair_harnesses:
        module, func = harness.split(".")
        gen = f"_mut_{mutant.name}__{module}"
        path = REPO / gen_dir / f"{gen}.py"
        if not path.exists():
            source = _DIRECTIVE.sub(_cap_iterations, (PROOFS / "holds" / f"{module}.py").read_text())
            rebind = f"from kvproofs.mutants.{mutant.name} import {mutant.function}  # noqa: E402, F811\n"
            path.write_text(f"{source}\n{rebind}")
        targets.append(f"{gen}.{func}")
    return targets


_DIRECTIVE = re.compile(r"# crosshair: max_iterations=(\d+)")


def _cap_iterations(m: re.Match[str]) -> str:
    return f"# crosshair: max_iterations={min(int(m[1]), MUTANT_ITERATIONS)}"


def _mutant_task(mutant: Mutant, opts: list[str], gen_dir: Path) -> Callable[[], Result]:
    """CrossHair on the mutant's own contract and harness copies, then its
    bounded checks; one merged result."""
    targets = mutant_targets(mutant, gen_dir)

    def run() -> Result:
        parts = [run_crosshair(mutant.name, [*opts, *targets], [gen_dir])] if targets else []
        if mutant.bounded_checks:
            parts.append(run_bounded(mutant.name, ["--mutant", mutant.name, *mutant.bounded_checks]))
        merged = Result(mutant.name, [], 0, "", "", 0.0, 0.0)
        for part in parts:
            merged.argv += part.argv
            merged.returncode = max(merged.returncode, part.returncode)
            merged.stdout += part.stdout
            merged.stderr += part.stderr
            merged.seconds += part.seconds
            merged.cpu_seconds += part.cpu_seconds
            merged.messages += part.messages
        return merged

    return run


def read_expected() -> dict[str, set[str]]:
    """``expected.txt`` as ``{mutant: {condition, ...}}``."""
    out: dict[str, set[str]] = {}
    for raw in EXPECTED.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, _, cond = line.partition(" | ")
        out.setdefault(name, set()).add(cond)
    return out


def write_expected(found: dict[str, set[str]]) -> None:
    """Rewrite ``expected.txt`` from ``found``."""
    lines = [
        "# Conditions CrossHair refutes for each mutant of proofs/kvproofs/mutants (see proofs/README.md).",
        "# Format: <mutant> | <file>::<function>: <condition>.",
        "# Regenerate (then review the diff): python -m kvproofs.run mutants --write-expected",
    ]
    for name in sorted(found):
        lines += [f"{name} | {cond}" for cond in sorted(found[name])]
    EXPECTED.write_text("\n".join(lines) + "\n")


def mutants(jobs: int, timeout: float, write: bool, only: Sequence[str] = ()) -> bool:
    """Check every mutant (or those named in ``only``); True when the
    refutations match ``expected.txt``."""
    ok = True
    found: dict[str, set[str]] = {}
    all_mutants = [m for m in load_mutants() if not only or m.name in only]
    for mutant in all_mutants:
        owner, attr = mutant_target(mutant)
        spec = contract_lines(getattr(owner, attr))
        mine = contract_lines(getattr(mutant.module, mutant.function))
        if spec != mine:
            print(f"!!! {mutant.name}: contract differs from the spec's {mutant.function}: {mine} != {spec}")
            ok = False
    opts = [
        "check",
        "--analysis_kind=PEP316",
        f"--per_condition_timeout={timeout}",
        f"--per_path_timeout={PATH_TIMEOUT}",
    ]
    gen_dir = _fresh(GENERATED / "mutants")
    tasks = [(m.name, _mutant_task(m, opts, gen_dir)) for m in all_mutants]
    results = run_parallel(jobs, tasks)
    for result in results:
        if result.crashed:
            report_crash(result)
            ok = False
        found[result.label] = {
            condition_key(path, line, text) for path, line, level, text in result.messages if level == "error"
        }
    if write:
        write_expected({**(read_expected() if only else {}), **found})
        print(f"==> wrote {EXPECTED.relative_to(REPO)}")
    expected = read_expected()
    print()
    for mutant in all_mutants:
        got, want = found.get(mutant.name, set()), expected.get(mutant.name, set())
        status = "killed" if got and got == want else "MISMATCH" if got else "SURVIVED"
        ok = ok and status == "killed"
        print(f"  {status:<8} {mutant.name}")
        for cond in sorted(got | want):
            mark = "=" if cond in got and cond in want else "+" if cond in got else "-"
            print(f"      {mark} {cond}")
    for name in sorted(set(expected) - {m.name for m in all_mutants} if not only else ()):
        print(f"  MISMATCH {name}: in expected.txt but no such mutant")
        ok = False
    verdict = "OK" if ok else "FAILED"
    print(f"\n==> mutants: {len(all_mutants)} checked, {verdict} (= expected, + unexpected, - missing)")
    return ok


# --- diffbehavior --------------------------------------------------------------

DIFFS = (
    (
        "spec vs mutant (EAGLE drop skipped)",
        "kvspec.single_type_kv_cache_manager.full_attention_hit",
        "kvproofs.mutants.full_attention_no_drop.full_attention_hit",
        1,
    ),
    (
        "spec vs equivalent rewrite",
        "kvspec.single_type_kv_cache_manager.full_attention_hit",
        "kvproofs.rewrites.full_attention_hit",
        0,
    ),
    (
        "spec vs kvimpl: cdiv",
        "kvspec.single_type_kv_cache_manager.cdiv",
        "kvimpl.single_type_kv_cache_manager.cdiv",
        0,
    ),
    (
        "spec vs kvimpl: contiguous_blocks_for_hit",
        "kvspec.single_type_kv_cache_manager.contiguous_blocks_for_hit",
        "kvimpl.single_type_kv_cache_manager.contiguous_blocks_for_hit",
        0,
    ),
    (
        "spec vs kvimpl: align_down (bounded, via proofs/kvproofs/diff/align_down.py)",
        "kvproofs.diff.align_down.guarded_spec",
        "kvproofs.diff.align_down.guarded_impl",
        0,
    ),
    (
        "spec vs kvimpl: full_attention_hit",
        "kvspec.single_type_kv_cache_manager.full_attention_hit",
        "kvimpl.single_type_kv_cache_manager.full_attention_hit",
        0,
    ),
    (
        "spec vs kvimpl: sliding_window_hit",
        "kvspec.single_type_kv_cache_manager.sliding_window_hit",
        "kvimpl.single_type_kv_cache_manager.sliding_window_hit",
        0,
    ),
    (
        "spec vs kvimpl: chunked_local_hit",
        "kvspec.single_type_kv_cache_manager.chunked_local_hit",
        "kvimpl.single_type_kv_cache_manager.chunked_local_hit",
        0,
    ),
    (
        "spec vs kvimpl: mamba_hit (bounded, via proofs/kvproofs/diff/mamba_hit.py)",
        "kvproofs.diff.mamba_hit.guarded_spec",
        "kvproofs.diff.mamba_hit.guarded_impl",
        0,
    ),
    (
        "spec vs kvimpl: blocks_to_allocate",
        "kvspec.single_type_kv_cache_manager.blocks_to_allocate",
        "kvimpl.single_type_kv_cache_manager.blocks_to_allocate",
        0,
    ),
    (
        "spec vs kvimpl: BlockPool.free_blocks (free-queue order, via proofs/kvproofs/diff/free_blocks.py)",
        "kvproofs.diff.free_blocks.spec_free_blocks",
        "kvproofs.diff.free_blocks.impl_free_blocks",
        0,
    ),
    (
        "spec vs kvimpl: num_skipped_tokens (via proofs/kvproofs/diff/kinds.py)",
        "kvproofs.diff.kinds.spec_num_skipped_tokens",
        "kvproofs.diff.kinds.impl_num_skipped_tokens",
        0,
    ),
    (
        "spec vs kvimpl: reachable_block_mask (via proofs/kvproofs/diff/kinds.py)",
        "kvproofs.diff.kinds.spec_reachable_block_mask",
        "kvproofs.diff.kinds.impl_reachable_block_mask",
        0,
    ),
    (
        "spec vs closed-form rewrite, inside the precondition",
        "kvproofs.rewrites.guarded_spec_full_attention_hit",
        "kvproofs.rewrites.guarded_closed_form_full_attention_hit",
        0,
    ),
)
"""``(title, function 1, function 2, expected exit status)``: 1 = a difference
is found, 0 = none is."""


def diff(jobs: int, timeout: float) -> bool:
    """Run the diffbehavior demo; True when every comparison ends as expected."""
    opts = ["diffbehavior", f"--max_uninteresting_iterations={DIFF_ITERATIONS}", f"--per_condition_timeout={timeout}"]
    tasks = [(title, _bind(title, [*opts, f1, f2])) for title, f1, f2, _ in DIFFS]
    results = run_parallel(jobs, tasks)
    ok = True
    for (title, f1, f2, want), result in zip(DIFFS, results, strict=True):
        good = result.returncode == want and not result.crashed
        ok = ok and good
        print(f"\n  {'ok' if good else 'UNEXPECTED'}: {title} (exit {result.returncode}, expected {want})")
        print(f"  $ crosshair {' '.join(opts)} {f1} {f2}")
        for line in (result.stdout + result.stderr).strip().splitlines()[-12:]:
            print(f"    {line}")
    print(f"\n==> diffbehavior: {'OK' if ok else 'FAILED'}")
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m kvproofs.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("holds", "mutants", "diff", "all"))
    parser.add_argument("--jobs", type=int, default=min(os.cpu_count() or 1, 4))
    parser.add_argument("--holds-timeout", type=float, default=HOLDS_TIMEOUT)
    parser.add_argument("--mutant-timeout", type=float, default=MUTANT_TIMEOUT)
    parser.add_argument("--diff-timeout", type=float, default=DIFF_TIMEOUT)
    parser.add_argument("--write-expected", action="store_true", help="rewrite proofs/kvproofs/mutants/expected.txt")
    parser.add_argument("--only", action="append", default=[], metavar="MUTANT", help="check only this mutant")
    args = parser.parse_args(argv)
    ok = True
    steps: list[tuple[str, Callable[[], bool]]] = []
    if args.what in ("holds", "all"):
        steps.append(("holds", lambda: holds(args.jobs, args.holds_timeout)))
    if args.what in ("mutants", "all"):
        steps.append(("mutants", lambda: mutants(args.jobs, args.mutant_timeout, args.write_expected, args.only)))
    if args.what in ("diff", "all"):
        steps.append(("diff", lambda: diff(args.jobs, args.diff_timeout)))
    total = time.monotonic()
    for name, step in steps:
        start = time.monotonic()
        print(f"==> proofs {name} (jobs={args.jobs})", flush=True)
        ok = step() and ok
        print(f"==> proofs {name}: {time.monotonic() - start:.1f}s", flush=True)
    print(f"==> proofs: {'OK' if ok else 'FAILED'} in {time.monotonic() - total:.1f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
