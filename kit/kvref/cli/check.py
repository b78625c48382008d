"""``kvref check``: run the lockstep state machines against a reference."""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvref import config_coverage
from kvref.adapters import AdapterFactory, load_factory, semantics_of
from kvref.branches import BranchReport, measure
from kvref.capabilities import SKIP_ERRORS, declared_unsupported, parse_features, probe
from kvref.check import MIN_STEPS, run_keep_going, run_lockstep
from kvref.divergences import Divergence, load_known_file
from kvref.exits import DEFAULT_OP_TIMEOUT, HANG, INTERRUPTED, AdapterHang, InputError
from kvref.lockstep import DivergenceClass, RunStats
from kvref.settings import load_profile
from kvref.shapes import SHAPES, Shape, shape_named
from kvref.stateful import MachineSetup, default_failure_dir
from kvref.traces import load as load_trace
from kvspec.config import FullAttention, KVCacheConfig
from kvspec.profiles import NEWEST, PROFILES, SemanticsProfile, profile_named


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
    check.set_defaults(run=run)


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
        help=f"watchdog seconds per adapter operation (default {DEFAULT_OP_TIMEOUT:g}; exit 4 past it)",
    )
    check.add_argument(
        "--semantics",
        default=None,
        metavar="PROFILE",
        help="semantics profile, e.g. vllm-0.33.0 (default: the one real vLLM declares, else the newest)",
    )
    check.add_argument("--out", type=Path, default=Path("kvref-classes"), help="traces of the divergence classes")
    check.epilog = (
        "A failing run writes its shrunk trace to KVREF_FAILURE_DIR (default ./kvref-failures). "
        "Exit codes: 0 agree, 1 divergence, 2 usage or input error, 3 nothing checked, 4 adapter hang, "
        "130 interrupted."
    )
    check.add_argument("--max-classes", type=int, default=30, help="stop after this many divergence classes")
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
        "arguments (external, lookahead), extra keys (lora, mm) (docs/writing-an-adapter.md)",
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


def _vllm_installed() -> bool:
    from kvref.adapters.vllm import vllm_available  # noqa: PLC0415 - imports vLLM lazily

    return vllm_available()


def _impl_present() -> bool:
    try:
        load_factory("impl")
    except ValueError:
        return False
    return True


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


def run(args: argparse.Namespace) -> int:
    """Run lockstep batches until the step goal or the time budget is reached
    (under coverage.py with ``--coverage``: then the branch report follows)."""
    if not args.coverage and args.coverage_json is None:
        return run_check(args, keep_going=args.keep_going, allow_mismatch=False)
    if importlib.util.find_spec("coverage") is None:
        Console(stderr=True).print("[red]--coverage needs coverage.py[/] (pip install coverage)")
        return 2
    taken: set[str] = set()
    code, report = measure(
        lambda: run_check(args, keep_going=args.keep_going, allow_mismatch=False, taken_classes=taken)
    )
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


def run_check(
    args: argparse.Namespace,
    keep_going: bool,
    allow_mismatch: bool,
    attribute: bool = False,
    taken_classes: set[str] | None = None,
) -> int:
    """``kvref check`` (and ``kvref drift``, which allows a profile other than
    the one real vLLM declares, always keeps going and, with ``attribute``,
    names the profile switches that explain each class, :mod:`kvref.drift`);
    ``taken_classes`` receives the configuration classes the runs took
    (:mod:`kvref.config_coverage`)."""
    console = Console(stderr=True)
    if args.against == "none":
        target, against, why = args.target or "spec", None, "self-check chosen on the command line"
    else:
        target, against, why = choose_targets(args.target, args.against)
    if getattr(args, "layer", "facade") == "pool":
        from kvref.cli.pool import run_pool_check  # noqa: PLC0415 - only the pool layer needs it

        return run_pool_check(args, target, against, console)
    names = [n for n in (against, target) if n is not None]
    factories: list[AdapterFactory] = [load_factory(n) for n in names]
    known = _known(args)
    try:
        profile = choose_profile(args.semantics, factories)
    except (KeyError, ValueError) as exc:
        console.print(f"[red]{exc}[/]")
        return 2
    reference: SemanticsProfile | None = None
    for name, factory in zip(names, factories, strict=True):
        try:
            declared = semantics_of(factory(_probe_config(profile)))
        except SKIP_ERRORS:
            continue  # it refuses the probe configuration: the shape probe below says more
        except Exception as exc:
            console.print(f"[red]cannot construct adapter {name!r} under {profile.name}[/]: {exc}")
            return 2
        if declared.upstream and declared.profile != profile.name and declared.profile in PROFILES:
            reference = PROFILES[declared.profile]
        if declared.upstream and declared.profile != profile.name and not allow_mismatch:
            console.print(
                f"[red]adapter {name!r} behaves like {declared.profile}[/], not {profile.name}: "
                f"check it with --semantics {declared.profile}"
            )
            return 2
    console.print(
        f"kvref check: target [bold]{target}[/] against [bold]{against or '(none)'}[/] ({why}); "
        f"semantics [bold]{profile.name}[/]"
    )
    load_profile(args.profile)
    goal = args.min_steps or MIN_STEPS[args.profile]
    excluded = _excluded(args, factories)
    shapes, excluded, notes = probe(factories, _shapes(args), profile, excluded)
    for note in notes:
        console.print(f"left out: {note}")
    if excluded:
        console.print(f"features left out: {', '.join(sorted(excluded))}")
    if not shapes:
        console.print("[red]nothing to check[/]: the adapters refuse every configuration shape (see above)")
        return 3
    setup = MachineSetup(
        factories, RunStats(), default_failure_dir(), shapes=shapes, profile=profile, op_timeout=args.op_timeout,
        known=known, excluded=excluded,
    )  # fmt: skip
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"))
    classes: list[DivergenceClass] = []
    failure = None
    try:
        with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
            task = progress.add_task("lockstep", total=goal)

            def advance(steps: int) -> None:
                progress.update(task, completed=min(steps, goal), description="lockstep")

            def shrinking() -> None:
                progress.update(task, description="shrinking a divergence")

            setup.stats.on_first_failure = shrinking
            accept = None
            if attribute and reference is not None and target == "spec":
                accept = _acceptor(setup, factories[names.index(target)], reference, console)
            if keep_going:
                classes = run_keep_going(
                    setup, args.seed, goal, args.out, args.budget, args.max_classes, advance, accept=accept
                )
            else:
                failure = run_lockstep(setup, args.seed, goal, args.budget, advance)
    except (KeyboardInterrupt, AdapterHang) as exc:
        hung = isinstance(exc, AdapterHang)
        console.print(f"[red]{'adapter hang' if hung else 'interrupted'}[/]: {exc or 'Ctrl-C'}; the summary so far:")
        _report(setup.stats, target, against, console, setup.stats.unexplained > 0, profile)
        if keep_going and (setup.stats.classes or setup.stats.accepted):
            found = [*setup.stats.accepted, *setup.stats.classes.values()]
            _report_classes(sorted(found, key=lambda c: c.steps_to_find), console)
        return HANG if hung else INTERRUPTED
    finally:
        if taken_classes is not None:
            taken_classes.update(setup.stats.config_properties)
    if keep_going:
        _report(setup.stats, target, against, console, bool(classes), profile)
        _report_classes(classes, console)
        return 1 if classes else (3 if setup.stats.steps == 0 else 0)
    if failure is not None:
        console.print(f"[red]unexplained divergence[/]: {failure}")
    _report(setup.stats, target, against, console, failure is not None, profile)
    if failure is not None:
        return 1
    if setup.stats.steps == 0:
        console.print("[red]no lockstep step ran[/]: every drawn configuration was refused (see the table)")
        return 3
    return 0


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


def _known(args: argparse.Namespace) -> tuple[Divergence, ...]:
    """The entries of every ``--known`` file."""
    return tuple(entry for path in getattr(args, "known", []) for entry in load_known_file(path))


def _excluded(args: argparse.Namespace, factories: list[AdapterFactory]) -> frozenset[str]:
    """``--without`` plus what the factories declare they lack."""
    try:
        chosen = parse_features(getattr(args, "without", "") or "")
    except ValueError as exc:
        raise InputError(f"--without: {exc}") from None
    return chosen.union(*(declared_unsupported(f) for f in factories))


def _shapes(args: argparse.Namespace) -> tuple[Shape, ...]:
    """The ``--shapes`` (default: the whole catalog)."""
    text = getattr(args, "shapes", None)
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


def choose_profile(name: str | None, factories: list[AdapterFactory]) -> SemanticsProfile:
    """``name``, else the profile an upstream adapter (real vLLM) declares,
    else the newest.

    Raises:
        KeyError: For an unknown profile name.
        ValueError: When an upstream adapter declares a profile kvspec does not have.
    """
    if name is not None:
        return profile_named(name)
    for factory in factories:
        try:
            adapter = factory(_probe_config(NEWEST))
        except Exception:  # construction problems are reported by the caller's probe
            continue
        declared = semantics_of(adapter)
        if declared.upstream:
            if declared.profile not in PROFILES:
                raise ValueError(
                    f"the adapter declares {declared.profile}, which kvspec has no profile for; "
                    f"known: {', '.join(PROFILES)}"
                )
            return PROFILES[declared.profile]
    return NEWEST


def _report_classes(classes: list[DivergenceClass], console: Console) -> None:
    """The table of distinct divergence classes of a keep-going run."""
    table = Table(title=f"{len(classes)} distinct divergence class(es)")
    columns = ["class (operation/aspect)", "first seen", "shortest trace", "ops", "after steps", "seen"]
    attributed = any(c.explained_by for c in classes)
    for col in columns + (["explained by (switch, release)"] if attributed else []):
        table.add_column(col)
    for c in classes:
        shapes = ", ".join(sorted(c.shapes))
        first = c.message if len(c.message) <= 90 else c.message[:87] + "..."
        row = [c.key, f"{first} [{shapes}]", str(c.trace or "-"), str(c.trace_ops), str(c.steps_to_find),
               f"{c.occurrences}x"]  # fmt: skip
        table.add_row(*row, *([c.explained_by or "not modelled"] if attributed else []))
    Console(width=max(Console().width, 160)).print(table)


def _probe_config(profile: SemanticsProfile) -> KVCacheConfig:
    return KVCacheConfig(num_blocks=4, groups=(FullAttention(4),), max_model_len=16, profile=profile)


def _report(
    stats: RunStats, target: str, against: str | None, console: Console, failed: bool, profile: SemanticsProfile
) -> None:
    elapsed = max(time.monotonic() - stats.started, 1e-9)
    table = Table(title=f"kvref check: {target} vs {against or '(self)'}, {profile.name}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("steps run", str(stats.steps))
    table.add_row("machine runs", str(stats.runs))
    covered = sorted(stats.configs)
    total = "" if covered == ["pool"] else f"/{len(SHAPES)}"
    table.add_row("configurations covered", f"{len(covered)}{total}: {', '.join(covered)}")
    if covered != ["pool"]:
        absent = config_coverage.missing(stats.config_properties)
        classes = f"{len(config_coverage.NAMES) - len(absent)}/{len(config_coverage.NAMES)}"
        table.add_row("configuration classes taken", classes + (f"; not: {', '.join(absent)}" if absent else ""))
    table.add_row("invariant checks", str(stats.invariant_checks))
    table.add_row("event-log checks", str(stats.event_log_checks))
    table.add_row("prefix hints read (not 0)", f"{stats.prefix_hint_reads} ({stats.prefix_hints})")
    if stats.block_copies:
        table.add_row("copy-on-write copies compared", str(stats.block_copies))
    kinds = ", ".join(sorted(stats.invalid_calls)) or "0"
    table.add_row(
        "invalid calls rejected", f"{sum(stats.invalid_calls.values())} ({len(stats.invalid_calls)} kinds: {kinds})"
    )
    table.add_row("invalid configs rejected", str(stats.invalid_configs))
    refused = ", ".join(f"{k} x{v}" for k, v in sorted(stats.refused_configs.items())) or "0"
    table.add_row("configurations refused (skipped)", refused)
    skipped = ", ".join(f"{k} x{v}" for k, v in sorted(stats.skipped.items())) or "0"
    table.add_row("operations an adapter cannot run (skipped)", skipped)
    left_out = ", ".join(f"{k} x{v}" for k, v in sorted(stats.left_out.items())) or "0"
    table.add_row("operations left out (excluded features)", left_out)
    known = ", ".join(f"{k} x{v}" for k, v in sorted(stats.known.items())) or "0"
    table.add_row("divergences known", known)
    if stats.keep_going:  # a keep-going run counts classes, not stops
        table.add_row("divergence classes not modelled", str(len(stats.classes)))
        if stats.accepted:
            switches = "; ".join(c.explained_by for c in stats.accepted)
            table.add_row("divergence classes explained by switches", f"{len(stats.accepted)} ({switches})")
    else:
        table.add_row("divergences unexplained", "1" if failed else "0")
    table.add_row("steps per second", f"{stats.steps / elapsed:.0f}")
    Console().print(table)
    for reason, count in sorted(stats.refused_reasons.items(), key=lambda kv: -kv[1])[:5]:
        console.print(f"refused x{count}: {reason}")
    for key, reason in sorted(stats.skip_reasons.items()):
        console.print(f"skipped {key}: {reason}")
    if failed and stats.last_failure is not None:
        n_ops = len(stats.last_failure.read_text().splitlines()) - 1
        console.print(f"shrunk trace ({n_ops} operations): {stats.last_failure}")
        console.print(f"replay it: kvref replay {stats.last_failure} --target {target}")
