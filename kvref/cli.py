"""The ``kvref`` command: ``check``, ``replay`` and ``traces record``."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvref.adapters import AdapterFactory, KVCacheAdapter, load_factory
from kvref.lockstep import RunStats
from kvref.profiles import load_profile
from kvref.stateful import SHAPES, MachineSetup, default_failure_dir, make_lockstep_machine
from kvref.traces import load, replay
from kvspec.config import FullAttention, KVCacheConfig

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
    ben = sub.add_parser("bench", help="time the managers on one scheduler workload")
    ben.add_argument("--mix", default="full", choices=["full", "full+swa", "full+mamba"])
    ben.add_argument("--requests", type=int, default=300)
    ben.add_argument("--max-running", type=int, default=64)
    ben.add_argument("--blocks", type=int, default=2048)
    ben.add_argument("--repeats", type=int, default=5)
    ben.add_argument("--seed", type=int, default=0)
    rep = sub.add_parser("replay", help="replay trace files against an adapter")
    rep.add_argument("files", nargs="+", type=Path)
    rep.add_argument("--target", default="spec")
    traces = sub.add_parser("traces", help="trace corpus tools")
    tsub = traces.add_subparsers(dest="traces_command", required=True)
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


def cmd_bench(args: argparse.Namespace) -> int:
    """Print µs per allocate call of every installed engine on one workload."""
    from kvref.bench import Workload, bench  # noqa: PLC0415 - only this command needs it

    w = Workload(
        num_requests=args.requests, max_running=args.max_running, num_blocks=args.blocks, mix=args.mix, seed=args.seed
    )
    rows = bench(w, repeats=args.repeats)
    table = Table(
        title=f"kvref bench: {w.mix}, {w.num_requests} requests, batch {w.max_running}, {w.num_blocks} blocks"
    )
    for col in ("engine", "allocate calls", "µs per call (median)", "speed vs vLLM"):
        table.add_column(col, justify="right")
    for r in rows:
        ratio = "-" if r.x_vs_vllm is None else f"{r.x_vs_vllm:.2f}x"
        table.add_row(r.engine, str(r.calls), f"{r.us_per_call:.2f}", ratio)
    Console().print(table)
    print("all engines allocated identical block ids")
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
