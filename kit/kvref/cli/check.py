"""``kvref check``: run the lockstep state machines against a reference.

The arguments become one :class:`kvref.check.CheckRequest` here, at the
edge (:func:`request_from`); everything after works on that value
(:func:`kvref.check.start`, the lockstep loops, :mod:`kvref.verdict`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvref.adapters import AdapterFactory
from kvref.adapters.vllm.errors import CannotRead
from kvref.branches import BranchReport, measure
from kvref.capabilities import parse_features
from kvref.check import MIN_STEPS, CheckRequest, Session, run_keep_going, run_lockstep, start
from kvref.divergences import load_known_file
from kvref.exits import DEFAULT_OP_TIMEOUT, HANG, INTERRUPTED, NOTHING_CHECKED, USAGE, AdapterHang, InputError
from kvref.lockstep import DivergenceClass, RunStats
from kvref.settings import load_profile
from kvref.shapes import SHAPES, Shape, shape_named
from kvref.stateful import MachineSetup
from kvref.surface import SurfaceChange
from kvref.traces import load as load_trace
from kvref.verdict import classes_table, judge, summary
from kvspec.profiles import SemanticsProfile


def add_parser(sub: Any) -> None:
    """Register ``check`` on the subcommand parser ``sub``."""
    check = sub.add_parser("check", help="run the lockstep state machines")
    add_lockstep_arguments(check)
    _add_coverage_arguments(check)
    check.add_argument(
        "--keep-going",
        action="store_true",
        help="collect every distinct divergence class (each shrunk, its trace in --out) instead of stopping",
    )
    check.add_argument(
        "--level",
        choices=LEVELS,
        default="conformance",
        help="conformance: the same outputs and state as the reference (default); safety: the target alone under "
        "the safety oracles, whatever its policy (no KV for another prefix, no block reused under a step in "
        "flight; docs/safety.md); all: both, one after the other",
    )
    check.add_argument(
        "--safety", dest="level", action="store_const", const="safety", help="the same as --level safety"
    )
    check.add_argument(
        "--async-scheduling",
        action="store_true",
        help="the scheduler keeps steps in flight as vLLM's asynchronous scheduler does (output placeholders, "
        "rejected draft tokens, frees fenced from vLLM 0.24.0 and immediate before it; docs/safety.md); runs "
        "without it draw as before",
    )
    check.set_defaults(run=run)


LEVELS = ("conformance", "safety", "all")
"""``kvref check --level``: what is checked (docs/safety.md)."""


def add_lockstep_arguments(check: argparse.ArgumentParser) -> None:
    """The options ``check`` and ``drift`` share."""
    check.add_argument(
        "--target",
        default=None,
        help="impl (impl-native, impl-python: one build; impl-batch, impl-batch-native: its batch API on either "
        "build; impl-mutable: its own mutable requests), spec, vllm or module:factory",
    )
    check.add_argument(
        "--against",
        default=None,
        help="reference: spec, vllm or module:factory; none: a self-check (default: vllm if installed)",
    )
    check.add_argument("--profile", default="dev", choices=sorted(MIN_STEPS))
    check.add_argument("--seed", type=int, default=0)
    check.add_argument("--budget", type=_positive(float), default=None, help="stop after this many seconds")
    check.add_argument("--min-steps", type=_positive(int), default=None, help="override the profile's step goal")
    check.add_argument(
        "--op-timeout",
        type=_positive(float),
        default=DEFAULT_OP_TIMEOUT,
        help=f"watchdog seconds per adapter call, start-up included (default {DEFAULT_OP_TIMEOUT:g}; exit 4 past it)",
    )
    check.add_argument(
        "--semantics",
        default=None,
        metavar="PROFILE",
        help="semantics profile, e.g. vllm-0.33.0 (default: the release an adapter declares, real vLLM or a fork "
        "first, else the newest; `kvref --version` lists them)",
    )
    check.add_argument("--out", type=Path, default=Path("kvref-classes"), help="traces of the divergence classes")
    check.epilog = (
        "A failing run writes its shrunk trace to KVREF_FAILURE_DIR (default ./kvref-failures). "
        "Exit codes: 0 agree, 1 divergence, 2 usage or input error, 3 nothing checked or below the floor "
        "(half the step goal compared, at most half the runs stopped by a skip), 4 adapter hang, 130 interrupted."
    )
    check.add_argument(
        "--max-classes", type=_positive(int), default=30, help="stop after this many divergence classes (above 0)"
    )
    check.add_argument(
        "--shapes",
        default=None,
        metavar="SHAPE,...",
        help="draw only these configuration shapes (catalog names or kind tokens joined by +, e.g. full,full+swa)",
    )
    check.add_argument(
        "--without",
        default="",
        metavar="FEATURE,...",
        help="leave these features out: operations (pop_blocks_for_free), switches (events, stats, eagle), "
        "arguments (external, lookahead), extra keys (lora, mm), histories (chunked-prefill, caller-errors) "
        "(docs/writing-an-adapter.md)",
    )
    check.add_argument(
        "--known",
        action="append",
        type=Path,
        default=[],
        metavar="FILE",
        help="a TOML file of known differences of the target (the format of divergences.toml; repeatable)",
    )
    check.add_argument(
        "--isolate",
        action="store_true",
        help="run the target in a child process: a crash (segfault, abort) or hang of a native engine becomes a "
        "divergence with its shrunk trace instead of killing the check (calls cost a pipe round trip each)",
    )
    check.add_argument(
        "--layer",
        choices=("facade", "pool"),
        default="facade",
        help="the layer to check: the KV-cache manager facade (default) or the block pool alone",
    )


def _add_coverage_arguments(check: argparse.ArgumentParser) -> None:
    check.add_argument(
        "--coverage",
        action="store_true",
        help="measure branch coverage of kvspec and kvimpl during the run (needs coverage.py)",
    )
    check.add_argument(
        "--coverage-json", type=Path, default=None, metavar="PATH", help="also write the branch report there (JSON)"
    )


def request_from(
    args: argparse.Namespace, keep_going: bool | None = None, allow_mismatch: bool = False
) -> CheckRequest:
    """The typed request of ``kvref check`` (or ``kvref drift``) from its
    parsed arguments: every option is parsed and checked here, at the edge.

    Raises:
        InputError: For an unknown feature or shape, an unreadable known-differences
            file, or an ``--out`` folder a keep-going run cannot write.
    """
    try:
        without = parse_features(args.without or "")
    except ValueError as exc:
        raise InputError(f"--without: {exc}") from None
    going = args.keep_going if keep_going is None else keep_going
    if going:
        _writable(args.out)
    return CheckRequest(
        target=args.target, against=args.against, settings=args.profile, seed=args.seed, budget=args.budget,
        min_steps=args.min_steps, op_timeout=args.op_timeout, semantics=args.semantics, shapes=_shapes(args.shapes),
        without=without, known=tuple(e for path in args.known for e in load_known_file(path)), layer=args.layer,
        keep_going=going, out=args.out, max_classes=args.max_classes, allow_mismatch=allow_mismatch,
        isolate=getattr(args, "isolate", False), level=getattr(args, "level", "conformance"),
        asynchronous=getattr(args, "async_scheduling", False),
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Run lockstep batches until the step goal or the time budget is reached
    (under coverage.py with ``--coverage``: then the branch report follows);
    ``--level all`` runs the conformance check and then the safety check,
    under the semantics profile the conformance check chose (the safety
    check runs the target alone, which would choose its own)."""
    request = request_from(args)
    if request.level == "all":
        chosen: list[str] = []
        first = execute(replace(request, level="conformance"), chosen_profile=chosen)
        semantics = request.semantics or (chosen[0] if chosen else None)
        codes = [first, execute(replace(request, level="safety", against=None, semantics=semantics))]
        return next((c for c in codes if c not in (0, 3)), max(codes) if all(c == 3 for c in codes) else 0)
    if not args.coverage and args.coverage_json is None:
        return execute(request)
    if importlib.util.find_spec("coverage") is None:
        raise InputError("--coverage needs coverage.py (pip install coverage)")
    taken: set[str] = set()
    code, report = measure(lambda: execute(request, taken_classes=taken))
    _report_branches(report)
    if args.coverage_json is not None:
        args.coverage_json.parent.mkdir(parents=True, exist_ok=True)
        out = {**report.to_json(), "config_properties": sorted(taken)}
        args.coverage_json.write_text(json.dumps(out, indent=1) + "\n")
    return code


def _report_branches(report: BranchReport, shown: int = 25) -> None:
    """The branch-coverage table and the first ``shown`` gaps."""
    table = Table(title="branch outcomes of kvspec and kvimpl (coverage.py, branch=True)")
    for col in ("package", "outcomes", "taken", "at import", "listed unreachable", "not taken (gaps)"):
        table.add_column(col, justify="right" if col != "package" else "left")
    for pkg in ("kvspec", "kvimpl"):
        fs = [f for n, f in report.files.items() if n.startswith(pkg + "/")]
        table.add_row(pkg, *(str(v) for v in (sum(f.total for f in fs), sum(f.taken for f in fs),
                      sum(f.import_time for f in fs), sum(len(f.unreachable) for f in fs),
                      sum(len(f.gaps) for f in fs))))  # fmt: skip
    console = Console()
    console.print(table)
    gaps = report.gap_lines()
    for line in gaps[:shown]:
        console.print(f"  not taken: {line}", highlight=False, markup=False, soft_wrap=True)
    if len(gaps) > shown:
        console.print(f"  ... and {len(gaps) - shown} more (--coverage-json PATH lists every one)")
    for line in report.stale:
        console.print(f"  stale unreachable entry: {line}", highlight=False, markup=False, soft_wrap=True)


def execute(
    request: CheckRequest,
    attribute: bool = False,
    taken_classes: set[str] | None = None,
    surface: list[SurfaceChange] | None = None,
    chosen_profile: list[str] | None = None,
) -> int:
    """Run one check and print its summary and verdict; the exit code.

    ``kvref drift`` asks for ``attribute``: replay each class under the
    switches of the release the upstream adapter declares and go on under
    those that explain it (:mod:`kvref.drift`), and passes the ``surface``
    changes it found (an operation the release removed is a class of its
    own, a class no switch explains is named by the surface change of its
    operation). ``taken_classes`` receives the configuration classes the runs
    took (:mod:`kvref.config_coverage`); ``chosen_profile`` the name of the
    semantics profile the check chose.
    """
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    session = start(request)
    if chosen_profile is not None:
        chosen_profile.append(session.profile.name)
    layer = " --layer pool" if request.layer == "pool" else ""
    console.print(
        f"kvref check{layer}: target [bold]{session.target}[/] against [bold]{session.against or '(none)'}[/] "
        f"({session.why}); semantics [bold]{session.profile.name}[/]; goal {request.goal:,} steps"
    )
    if session.release_note:
        console.print(session.release_note, markup=False)
    for note in session.notes:
        console.print(f"left out: {note}", markup=False)
    setup = session.setup
    if setup.excluded:
        console.print(f"features left out: {', '.join(sorted(setup.excluded))}")
    if request.layer == "facade" and not setup.shapes:
        console.print("[red]nothing to check[/]: the adapters refuse every configuration shape (see above)")
        return NOTHING_CHECKED
    load_profile(request.settings)
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"))
    classes: list[DivergenceClass] = []
    failure = None
    try:
        with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
            task = progress.add_task("lockstep", total=request.goal)

            def advance(steps: int) -> None:
                progress.update(task, completed=min(steps, request.goal), description="lockstep")

            def shrinking() -> None:
                progress.update(task, description="shrinking a divergence")

            setup.stats.on_first_failure = shrinking
            accept = None
            if attribute and session.reference is not None and session.target == "spec":
                accept = _acceptor(setup, setup.factories[-1], session.reference, console)
            if request.keep_going:
                classes = run_keep_going(
                    setup, request.seed, request.goal, request.out, request.budget, request.max_classes, advance,
                    machine=session.machine, accept=accept,
                )  # fmt: skip
            else:
                failure = run_lockstep(setup, request.seed, request.goal, request.budget, advance,
                                       machine=session.machine)  # fmt: skip
    except CannotRead as exc:  # a vLLM internal this release reorganised (kvref.adapters.vllm.eras)
        console.print(str(exc), markup=False)
        return USAGE
    except (KeyboardInterrupt, AdapterHang) as exc:
        hung = isinstance(exc, AdapterHang)
        console.print(f"[red]{'adapter hang' if hung else 'interrupted'}[/]: {exc or 'Ctrl-C'}", markup=True)
        console.print("the summary so far:")
        _print_summary(session, classes=[*setup.stats.accepted, *setup.stats.classes.values()])
        return HANG if hung else INTERRUPTED
    finally:
        if taken_classes is not None:
            taken_classes.update(setup.stats.config_properties)
    if request.keep_going:
        if surface is not None:
            classes += _removed_operations(setup.stats, session, surface)
        _name_surface(classes, surface or [])
    if failure is not None:
        console.print(f"[red]unexplained divergence[/]: {failure}")
    _print_summary(session, classes)
    verdict = judge(setup.stats, request.goal, failure, classes)
    if failure is not None and setup.stats.last_failure is not None:
        n_ops = len(setup.stats.last_failure.read_text().splitlines()) - 1
        print(f"shrunk trace ({n_ops} operations): {setup.stats.last_failure}")
        print(f"replay it: kvref replay {setup.stats.last_failure} --target {session.target}")
    print(f"kvref check: {verdict.line}")
    return verdict.code


def _print_summary(session: Session, classes: list[DivergenceClass]) -> None:
    """The summary (:func:`kvref.verdict.summary`) and the classes of a keep-going run, on stdout."""
    title = f"kvref check: {session.target} vs {session.against or '(self)'}, {session.profile.name}"
    for line in summary(session.setup.stats, title, session.setup.excluded):
        print(line)
    if session.request.keep_going or classes:
        for line in classes_table(sorted(classes, key=lambda c: c.steps_to_find)):
            print(line)


def _writable(folder: Path) -> None:
    """``--out`` must be a folder this run can create and write (checked before the run).

    Raises:
        InputError: Naming the folder and the reason.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe_file = folder / f".kvref-write-test-{os.getpid()}"
        probe_file.write_text("")
        probe_file.unlink()
    except OSError as exc:
        raise InputError(
            f"--out {folder}: cannot write the divergence classes' traces there ({exc.strerror or exc})"
        ) from None


def _removed_operations(stats: RunStats, session: Session, surface: list[SurfaceChange]) -> list[DivergenceClass]:
    """``kvref drift``: an operation (or argument) the upstream side skipped
    while the working profile has it is a class of its own, ``<op>/absent``
    (the release removed it), explained by the surface change of that
    operation and the switches that model it."""
    from kvref.drift import explain_surface, surface_for_class  # noqa: PLC0415 - only drift needs it

    working, reference = session.profile, session.reference
    found: list[DivergenceClass] = []
    for key, count in sorted(stats.skipped.items()):
        side, _, feature = key.partition(": ")
        if side not in session.upstream:
            continue
        op = feature.removeprefix("op:")
        cls = DivergenceClass(f"{op}/absent", stats.skip_reasons.get(key, key), None, 0, 0, count)
        change = surface_for_class(cls.key, surface)
        if change is not None:
            cls.explained_by = f"{explain_surface(change, working, reference)}; surface: {change.describe()}"
        found.append(cls)
    return found


def _name_surface(classes: list[DivergenceClass], surface: list[SurfaceChange]) -> None:
    """Give each class no switch explains the surface change of its operation,
    else the state-adding features its trace's configuration uses, if any."""
    from kvref.drift import features_of_trace, surface_for_class  # noqa: PLC0415 - only drift needs it

    for c in classes:
        if c.explained_by:
            continue
        found = surface_for_class(c.key, surface)
        if found is not None:
            c.explained_by = f"surface: {found.describe()}"
        elif c.trace is not None and (features := features_of_trace(c.trace)):
            c.explained_by = f"feature: {', '.join(features)} (a state-adding feature this configuration uses)"


def _acceptor(
    setup: MachineSetup, spec: AdapterFactory, reference: SemanticsProfile, console: Console
) -> Callable[[Path], str | None]:
    """``kvref drift``'s attribution step: replay a class's trace under the
    working profile with switches of ``reference`` set; when some explain
    it, go on under them (:mod:`kvref.drift`)."""
    from kvref.drift import attribute, with_switches  # noqa: PLC0415 - only drift needs it

    def accept(path: Path) -> str | None:
        found = attribute(load_trace(path), spec, setup.profile, reference)
        if found is None:
            return None
        setup.profile = with_switches(setup.profile, found.switches, reference)
        console.print(f"explained by {found.describe()}: going on with it set as in {reference.name}")
        return found.describe()

    return accept


def _shapes(text: str | None) -> tuple[Shape, ...]:
    """The ``--shapes`` (default: the whole catalog)."""
    if not text:
        return SHAPES
    try:
        return tuple(shape_named(name.strip()) for name in text.split(",") if name.strip())
    except ValueError as exc:
        raise InputError(f"--shapes: {exc}") from None


def _positive(kind: type[int] | type[float]) -> Any:
    """An argparse type: a number above 0 (a run with no budget checks nothing)."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text!r}: a run without steps checks nothing")
        return value

    return parse
