"""The ``kvref`` command: ``check``, ``bench``, ``mutants``, ``replay``, ``traces record`` and ``traces directed``."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvref.adapters import AdapterFactory, KVCacheAdapter, load_factory
from kvref.directed import build_parser as build_directed_parser
from kvref.directed import write_all as write_directed
from kvref.lockstep import RunStats
from kvref.mutants import build_parser as build_mutants_parser
from kvref.mutants import run as run_mutants
from kvref.profiles import load_profile
from kvref.stateful import SHAPES, MachineSetup, default_failure_dir, make_lockstep_machine
from kvref.traces import load, replay
from kvspec.config import FullAttention, KVCacheConfig

if TYPE_CHECKING:
    from kvref.bench import Workload

MIN_STEPS = {"dev": 2_000, "ci": 20_000, "nightly": 500_000, "crosshair": 200}
BATCH_EXAMPLES = 100
RECORD_BATCH_EXAMPLES = 20


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvref`` console script."""
    parser = argparse.ArgumentParser(prog="kvref", description="Conformance kit for paged KV-cache managers.")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="run the lockstep state machines")
    check.add_argument("--target", default=None, help="impl, spec, vllm or module:factory")
    check.add_argument("--against", default=None, help="spec or vllm (default: vllm if installed)")
    check.add_argument("--profile", default="dev", choices=sorted(MIN_STEPS))
    check.add_argument("--seed", type=int, default=0)
    check.add_argument("--budget", type=float, default=None, help="stop after this many seconds")
    check.add_argument("--min-steps", type=int, default=None, help="override the profile's step goal")
    ben = sub.add_parser("bench", help="time the managers on one scheduler workload (or a sweep of them)")
    ben.add_argument("--mix", default="full", choices=["full", "full+swa", "full+mamba"])
    ben.add_argument("--requests", type=int, default=300)
    ben.add_argument("--max-running", type=int, default=64)
    ben.add_argument("--blocks", type=int, default=2048)
    ben.add_argument("--prompt-len", type=_int_range, default=(128, 512), metavar="MIN:MAX", help="prompt tokens")
    ben.add_argument("--decode-len", type=_int_range, default=(16, 64), metavar="MIN:MAX", help="decode steps")
    ben.add_argument("--prefixes", type=int, default=4, help="shared system prompts")
    ben.add_argument("--window", type=int, default=None, help="full+swa window (default: 1024 if prompts allow)")
    ben.add_argument("--repeats", type=int, default=None, help="runs per engine, median taken (default 5; sweeps 3)")
    ben.add_argument("--seed", type=int, default=0)
    ben.add_argument("--engines", default=None, help="comma-separated subset (spec,impl,impl-batched,vllm)")
    ben.add_argument(
        "--sweep",
        choices=["batch", "pool"],
        default=None,
        help="running-batch sizes 32..1024 or pool sizes 8k..512k blocks (sets --requests/--max-running/--blocks)",
    )
    ben.add_argument("--plot", type=Path, default=Path("bench.png"), help="sweep plot PNG (needs matplotlib)")
    build_mutants_parser(sub.add_parser("mutants", help="generic mutants of kvimpl (mutmut) vs the kill test"))
    rep = sub.add_parser("replay", help="replay trace files against an adapter")
    rep.add_argument("files", nargs="+", type=Path)
    rep.add_argument("--target", default="spec")
    traces = sub.add_parser("traces", help="trace corpus tools")
    tsub = traces.add_subparsers(dest="traces_command", required=True)
    build_directed_parser(
        tsub.add_parser("directed", help="record the directed scenarios (kvref/directed.py) on the spec")
    )
    rec = tsub.add_parser("record", help="record traces from lockstep runs")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--count", type=int, default=50)
    rec.add_argument("--seed", type=int, default=0)
    rec.add_argument("--against", default=None, help="also require agreement with this adapter (e.g. vllm)")
    rec.add_argument(
        "--shape",
        action="append",
        choices=[s.name for s in SHAPES],
        default=None,
        help="record only this configuration shape (repeatable; default: every shape)",
    )
    rec.add_argument(
        "--min-allocations",
        type=int,
        default=0,
        help="keep only runs with at least this many successful allocate_slots calls",
    )
    args = parser.parse_args(argv)
    if args.command == "check":
        return cmd_check(args)
    if args.command == "replay":
        return cmd_replay(args.files, args.target)
    if args.command == "bench":
        return cmd_bench(args)
    if args.command == "mutants":
        return run_mutants(args)
    if args.traces_command == "directed":
        return write_directed(args.out, args.check)
    return cmd_record(args)


def _vllm_installed() -> bool:
    from kvref.adapters.vllm_adapter import vllm_available  # noqa: PLC0415 - imports vLLM lazily

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
            against, why = "vllm", why + "; real vLLM 0.25.1 is installed"
        elif target != "spec":
            against, why = "spec", why + "; vLLM is not installed, comparing with kvspec"
        else:
            why += "; vLLM is not installed: kvspec self-check (invariants, error contract)"
    return target, against, why


def cmd_check(args: argparse.Namespace) -> int:
    """Run lockstep batches until the step goal or the time budget is reached."""
    console = Console(stderr=True)
    target, against, why = choose_targets(args.target, args.against)
    names = [n for n in (against, target) if n is not None]
    factories: list[AdapterFactory] = [load_factory(n) for n in names]
    for name, factory in zip(names, factories, strict=True):
        try:
            factory(KVCacheConfig(num_blocks=4, groups=(FullAttention(4),), max_model_len=16))
        except Exception as exc:
            console.print(f"[red]cannot construct adapter {name!r}[/]: {exc}")
            return 2
    console.print(f"kvref check: target [bold]{target}[/] against [bold]{against or '(none)'}[/] ({why})")
    load_profile(args.profile)
    goal = args.min_steps or MIN_STEPS[args.profile]
    setup = MachineSetup(factories, RunStats(), default_failure_dir())
    failed = _run_batches(setup, args, goal, console)
    _report(setup.stats, target, against, console, failed)
    return 1 if failed else 0


def _run_batches(setup: MachineSetup, args: argparse.Namespace, goal: int, console: Console) -> bool:
    stats = setup.stats
    deadline = None if args.budget is None else time.monotonic() + args.budget
    machine = make_lockstep_machine(setup)
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"))
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("lockstep", total=goal)
        batch = 0
        while stats.steps < goal and (deadline is None or time.monotonic() < deadline):
            machine._hypothesis_internal_use_seed = args.seed * 1_000_003 + batch
            try:
                run_state_machine_as_test(
                    machine,
                    settings=settings(
                        settings.default, max_examples=BATCH_EXAMPLES, database=None, report_multiple_bugs=False
                    ),
                )
            except AssertionError as exc:
                console.print(f"[red]unexplained divergence[/]: {str(exc).splitlines()[0]}")
                return True
            batch += 1
            progress.update(task, completed=min(stats.steps, goal))
    return False


def _report(stats: RunStats, target: str, against: str | None, console: Console, failed: bool) -> None:
    elapsed = max(time.monotonic() - stats.started, 1e-9)
    table = Table(title=f"kvref check: {target} vs {against or '(self)'}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("steps run", str(stats.steps))
    table.add_row("machine runs", str(stats.runs))
    covered = sorted(stats.configs)
    table.add_row("configurations covered", f"{len(covered)}/{len(SHAPES)}: {', '.join(covered)}")
    table.add_row("invariant checks", str(stats.invariant_checks))
    table.add_row("event-log checks", str(stats.event_log_checks))
    kinds = ", ".join(sorted(stats.invalid_calls)) or "0"
    table.add_row(
        "invalid calls rejected", f"{sum(stats.invalid_calls.values())} ({len(stats.invalid_calls)} kinds: {kinds})"
    )
    table.add_row("invalid configs rejected", str(stats.invalid_configs))
    known = ", ".join(f"{k} x{v}" for k, v in sorted(stats.known.items())) or "0"
    table.add_row("divergences known", known)
    table.add_row("divergences unexplained", "1" if failed else "0")
    table.add_row("steps per second", f"{stats.steps / elapsed:.0f}")
    Console().print(table)
    if failed and stats.last_failure is not None:
        n_ops = len(stats.last_failure.read_text().splitlines()) - 1
        console.print(f"shrunk trace ({n_ops} operations): {stats.last_failure}")
        console.print(f"replay it: kvref replay {stats.last_failure} --target {target}")


def _int_range(text: str) -> tuple[int, int]:
    """``MIN:MAX`` (or one number for both) as an inclusive range."""
    lo, _, hi = text.partition(":")
    try:
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN:MAX or N, got {text!r}") from None
    if not 1 <= a <= b:
        raise argparse.ArgumentTypeError(f"expected 1 <= MIN <= MAX, got {text!r}")
    return a, b


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def cmd_bench(args: argparse.Namespace) -> int:
    """Print µs per allocation and per request-step of every installed
    engine on one workload, or per point of a sweep (with a plot)."""
    from kvref.bench import SWEEP_REPEATS, Workload, bench  # noqa: PLC0415 - only this command needs it

    w = Workload(
        num_requests=args.requests,
        max_running=args.max_running,
        num_blocks=args.blocks,
        prompt_len=args.prompt_len,
        decode_len=args.decode_len,
        num_prefixes=args.prefixes,
        window=args.window,
        mix=args.mix,
        seed=args.seed,
    )
    only = None if args.engines is None else [e.strip() for e in args.engines.split(",") if e.strip()]
    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the tables into 80 columns
        console.width = max(console.width, 140)
    if args.sweep is not None:
        return _bench_sweep(args, w, only, console, args.repeats or SWEEP_REPEATS)
    repeats = args.repeats or 5
    rows = bench(w, repeats=repeats, only=only)
    table = Table(title=f"kvref bench: {w.describe()}; median of {repeats}")
    cols = ("engine", "calls", "allocations", "µs/alloc", "x vLLM", "req-steps", "µs/req-step", "x vLLM",
            "µs/running", "x vLLM")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r.engine, str(r.calls), str(r.allocs), f"{r.us_per_alloc:.2f}", _ratio(r.x_alloc_vs_vllm),
            str(r.request_steps), f"{r.us_per_request_step:.3f}", _ratio(r.x_step_vs_vllm),
            f"{r.us_per_running_step:.3f}", _ratio(r.x_running_vs_vllm),
        )  # fmt: skip
    console.print(table)
    print("µs/alloc: every allocate call; µs/req-step: every manager call per request-step; µs/running: the")
    print("running phase's allocate calls (decode and chunked prefill, no admission) per allocation")
    print("all engines allocated identical block ids")
    return 0


def _bench_sweep(args: argparse.Namespace, w: Workload, only: list[str] | None, console: Console, repeats: int) -> int:
    """``kvref bench --sweep``: a table of µs per request-step per engine per point, and a plot."""
    from kvref.bench import (  # noqa: PLC0415
        POOL_SWEEP_BATCH,
        POOL_SWEEP_REQUESTS,
        SPEC_MAX_SWEEP_POOL,
        plot_sweep,
        sweep,
        sweep_engines,
    )

    kind = args.sweep

    def progress(x: int, pw: Workload) -> None:
        console.print(f"[dim]{kind} = {x}: {pw.num_requests} requests, {pw.num_blocks} blocks ...[/dim]")

    points = sweep(kind, w, repeats=repeats, only=only, progress=progress)
    if kind == "batch":
        how = "requests = max(256, 2 x batch), pool sized so nothing is preempted"
    else:
        how = f"batch {POOL_SWEEP_BATCH}, {POOL_SWEEP_REQUESTS} requests"
    if only is None:
        how += f"; spec only on pools up to {SPEC_MAX_SWEEP_POOL} blocks"
    window = f" (window {w.swa_window()})" if w.mix == "full+swa" else ""
    title = (
        f"kvref bench --sweep {kind}: {w.mix}{window}, µs per request-step (median of {repeats}; "
        f"reduced workload: {how}; prompts {w.prompt_len[0]}-{w.prompt_len[1]}, decode {w.decode_len[0]}-"
        f"{w.decode_len[1]})"
    )
    table = Table(title=title)
    engines = sweep_engines(points)
    for col in (kind, "requests", "blocks", "request-steps", *engines):
        table.add_column(col, justify="right")
    for p in points:
        cells = []
        for name in engines:
            r = next((r for r in p.rows if r.engine == name), None)
            if r is None:
                cells.append("-")
                continue
            ratio = "" if r.engine == "vllm" or r.x_step_vs_vllm is None else f" ({r.x_step_vs_vllm:.1f}x)"
            run = "" if r.engine == "vllm" or r.x_running_vs_vllm is None else f" ({r.x_running_vs_vllm:.1f}x)"
            cells.append(f"{r.us_per_request_step:.3f}{ratio} | {r.us_per_running_step:.3f}{run}")
        table.add_row(str(p.x), str(p.workload.num_requests), str(p.workload.num_blocks),
                      str(p.rows[0].request_steps if p.rows else 0), *cells)  # fmt: skip
    console.print(table)
    print("each cell: µs per request-step | µs per running-phase allocation; (x) = speed vs vLLM")
    print("all engines allocated identical block ids at every point")
    if plot_sweep(kind, points, args.plot, title):
        print(f"plot: {args.plot}")
    else:
        print("matplotlib not installed: no plot")
    return 0


def cmd_replay(files: Sequence[Path], target: str) -> int:
    """Replay traces; a trace marked ``known_divergence`` must fail on vLLM
    at its marked step and pass elsewhere. ``divergence_step == -1`` marks a
    divergence at construction: on vLLM every step must pass and the adapter
    must report that it was built through the documented workaround
    (``construction_workaround`` equal to the divergence id)."""
    factory = load_factory(target)
    bad = 0
    for path in files:
        trace = load(path)
        built: list[KVCacheAdapter] = []
        result = replay(trace, _remembering(factory, built), str(path))
        known = trace.meta.get("known_divergence")
        if known and target == "vllm" and trace.meta.get("divergence_step") == -1:
            workaround = getattr(built[0], "construction_workaround", None) if built else None
            ok = result.ok and workaround == known
            status = f"known divergence {known} confirmed at construction"
            if not ok:
                status = f"known divergence {known} NOT reproduced ({workaround=}, {result.message or 'steps ok'})"
        elif known and target == "vllm":
            ok = not result.ok and result.failed_step == trace.meta.get("divergence_step")
            status = f"known divergence {known} confirmed" if ok else f"known divergence {known} NOT reproduced"
        else:
            ok = result.ok
            status = "ok" if ok else f"FAILED at step {result.failed_step}: {result.message}"
        bad += not ok
        print(f"{path}: {status} ({result.steps} steps)")
    print(f"{len(files) - bad}/{len(files)} traces as expected against {target}")
    return 1 if bad else 0


def _remembering(factory: AdapterFactory, built: list[KVCacheAdapter]) -> AdapterFactory:
    """``factory``, also appending every adapter it builds to ``built``."""

    def build(config: KVCacheConfig) -> KVCacheAdapter:
        adapter = factory(config)
        built.append(adapter)
        return adapter

    return build


def cmd_record(args: argparse.Namespace) -> int:
    """Record ``--count`` traces from lockstep runs of the spec (optionally
    kept only when ``--against`` agrees at every step), drawing configurations
    from the ``--shape`` names only when any are given and keeping only runs
    with ``--min-allocations`` successful ``allocate_slots`` calls."""
    load_profile("dev")
    factories = [load_factory("spec")] + ([load_factory(args.against)] if args.against else [])
    shapes = SHAPES if not args.shape else tuple(s for s in SHAPES if s.name in args.shape)
    setup = MachineSetup(factories, RunStats(), default_failure_dir(), shapes=shapes, record_dir=args.out)
    setup.min_allocations, setup.record_limit = args.min_allocations, args.count
    machine = make_lockstep_machine(setup)
    batch = 0
    while setup.recorded < args.count:
        machine._hypothesis_internal_use_seed = args.seed * 1_000_003 + batch
        # Hypothesis starts every run with its simplest example; a batch of a
        # few examples only would record that same trivial run again and again.
        examples = max(args.count - setup.recorded, RECORD_BATCH_EXAMPLES)
        run_state_machine_as_test(machine, settings=settings(settings.default, max_examples=examples, database=None))
        batch += 1
    print(f"recorded {setup.recorded} traces in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
