"""``kvref bench``: time the managers on one scheduler workload (or a sweep of them)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from kvref.adapters import AdapterFactory, load_factory
from kvref.bench import MIXES

if TYPE_CHECKING:
    from kvref.bench import Workload


def add_parser(sub: Any) -> None:
    """Register ``bench`` on the subcommand parser ``sub``."""
    ben = sub.add_parser("bench", help="time the managers on one scheduler workload (or a sweep of them)")
    ben.add_argument("--mix", default="full", choices=[*MIXES, "all"], help="group mix (all: each in turn)")
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
        "--target",
        action="append",
        default=None,
        metavar="MODULE:FACTORY",
        help="also time this adapter (repeatable); it must allocate the same block ids",
    )
    ben.add_argument(
        "--sweep",
        choices=["batch", "pool"],
        default=None,
        help="running-batch sizes 32..1024 or pool sizes 8k..512k blocks (sets --requests/--max-running/--blocks)",
    )
    ben.add_argument("--plot", type=Path, default=Path("bench.png"), help="sweep plot PNG (needs matplotlib)")
    ben.add_argument(
        "--steady-decode",
        type=int,
        default=None,
        metavar="RUNNING",
        help="instead: steady decode of RUNNING requests, one token each per step (--mix full or full+swa)",
    )
    ben.add_argument(
        "--device",
        default=None,
        metavar="DEVICE",
        help="with --steady-decode: also time device tables on DEVICE (cpu, cpu-copy, cuda): the manager, kvimpl's "
        "commit and slot mapping, and vLLM's worker tables for the same steps, side by side",
    )
    ben.add_argument("--steps", type=int, default=128, help="with --steady-decode: decode steps per run")
    ben.add_argument(
        "--paths",
        action="store_true",
        help="instead: µs per operation of each block-moving path (admission with and without hits, chunk, "
        "fill, take, free; default engines vllm,impl-native,impl-python)",
    )
    ben.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        default="cpu",
        help="time with this thread's CPU time (default: on a shared machine elapsed time also counts the "
        "other processes) or elapsed time",
    )
    ben.set_defaults(run=_dispatch)


def _dispatch(args: argparse.Namespace) -> int:
    if args.paths:
        return _paths(args)
    if args.steady_decode is not None and args.device is not None:
        from kvref.bench_tables import report as tables_report  # noqa: PLC0415 - imports kvimpl, torch and vLLM

        return tables_report(args.mix, args.steady_decode, args.steps, args.repeats or 3, args.device)
    if args.steady_decode is not None:
        from kvref.bench_decode import report  # noqa: PLC0415 - imports kvimpl and vLLM

        return report(args.mix, args.steady_decode, args.steps, args.repeats or 3, args.clock)
    return run(args)


def _paths(args: argparse.Namespace) -> int:
    """``kvref bench --paths``: a table of µs per operation per path and engine, per mix."""
    from kvref.bench import MIXES  # noqa: PLC0415 - imports kvimpl and vLLM
    from kvref.bench_paths import PATHS, REQUESTS, bench_paths  # noqa: PLC0415

    only = None if args.engines is None else [e.strip() for e in args.engines.split(",") if e.strip()]
    repeats = args.repeats or 5
    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 160)
    for mix in list(MIXES) if args.mix == "all" else [args.mix]:
        before = load_average()
        rows = bench_paths(mix, repeats, only, clock=args.clock)
        table = Table(
            title=f"kvref bench --paths: {mix}, {REQUESTS} requests per path, µs per operation "
            f"(median of {repeats}, {args.clock} clock; {before} before, {load_average()} after)"
        )
        table.add_column("engine")
        for p in PATHS:
            table.add_column(p, justify="right")
            table.add_column("x vLLM", justify="right")
        for r in rows:
            cells = []
            for p in PATHS:
                cells += [f"{r.us[p]:.3f}", _ratio(r.x_vs_vllm[p])]
            table.add_row(r.engine, *cells)
        console.print(table)
    return 0


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


def load_average() -> str:
    """The 1, 5 and 15 minute load averages (benchmarks on a shared machine print them)."""
    try:
        a, b, c = os.getloadavg()
    except OSError:
        return "load average: unknown"
    return f"load average {a:.2f} {b:.2f} {c:.2f} on {os.cpu_count()} CPUs"


def run(args: argparse.Namespace) -> int:
    """Print µs per request-step in each phase of every installed engine on
    one workload (every mix with ``--mix all``), or per point of a sweep."""
    from kvref.bench import MIXES, SWEEP_REPEATS, Workload  # noqa: PLC0415 - imports kvimpl and vLLM

    mixes = list(MIXES) if args.mix == "all" else [args.mix]
    only = None if args.engines is None else [e.strip() for e in args.engines.split(",") if e.strip()]
    extra = {t: load_factory(t) for t in args.target or ()}
    if only is not None:
        only += list(extra)
    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the tables into 80 columns
        console.width = max(console.width, 160)
    for mix in mixes:
        w = Workload(
            num_requests=args.requests,
            max_running=args.max_running,
            num_blocks=args.blocks,
            prompt_len=args.prompt_len,
            decode_len=args.decode_len,
            num_prefixes=args.prefixes,
            window=args.window,
            mix=mix,
            seed=args.seed,
        )
        if args.sweep is not None:
            _bench_sweep(args, w, only, console, args.repeats or SWEEP_REPEATS, extra)
        else:
            _bench_one(w, only, extra, console, args.repeats or 5, args.clock)
    return 0


def _bench_one(
    w: Workload,
    only: list[str] | None,
    extra: dict[str, AdapterFactory],
    console: Console,
    repeats: int,
    clock: str = "cpu",
) -> None:
    from kvref.bench import PHASES, bench  # noqa: PLC0415

    runs = iter(range(1, 10**9))

    def progress(name: str) -> None:
        print(f"bench: run {next(runs)}: {name} ...", file=sys.stderr, flush=True)

    before = load_average()
    for name, factory in extra.items():
        # kvimpl's --target impl runs a configuration the native core declines on its pure-Python
        # manager: every step of this workload then times that build, and the table must say so.
        fallback = getattr(factory(w.config()), "fallback", None)
        if fallback:
            console.print(f"{name}: every step of this workload runs on the {fallback}")
    rows = bench(w, repeats=repeats, only=only, extra=extra, progress=progress, clock=clock)
    table = Table(title=f"kvref bench: {w.describe()}; µs per request-step, median of {repeats}, {clock} clock")
    for col in ("engine", "calls", "req-steps", *PHASES, "manager", "x vLLM", "total", "x vLLM", "µs/run-alloc",
                "x vLLM"):  # fmt: skip
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r.engine, str(r.calls), str(r.request_steps), *(f"{r.us[p]:.3f}" for p in PHASES),
            f"{r.manager:.3f}", _ratio(r.x_manager_vs_vllm), f"{r.total:.3f}", _ratio(r.x_total_vs_vllm),
            f"{r.us_per_running_alloc:.3f}", _ratio(r.x_running_vs_vllm),
        )  # fmt: skip
    console.print(table)
    print("phases: step = new_step_starts, running = the running requests' allocations (and preemptions),")
    print("admit = lookups and admissions, advance = request advancing (tokens, hashes), free = finished")
    print("requests, tables = device-table sync; manager = step + running + admit + free")
    print(f"{before} before, {load_average()} after")
    print("all engines allocated identical block ids")


def _bench_sweep(
    args: argparse.Namespace,
    w: Workload,
    only: list[str] | None,
    console: Console,
    repeats: int,
    extra: dict[str, AdapterFactory],
) -> int:
    """``kvref bench --sweep``: a table of µs per request-step per engine per point, and a plot."""
    print(load_average())
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

    points = sweep(kind, w, repeats=repeats, only=only, progress=progress, extra=extra, clock=args.clock)
    if kind == "batch":
        how = "requests = max(256, 2 x batch), pool sized so nothing is preempted"
    else:
        how = f"batch {POOL_SWEEP_BATCH}, {POOL_SWEEP_REQUESTS} requests"
    if only is None:
        how += f"; spec only on pools up to {SPEC_MAX_SWEEP_POOL} blocks"
    window = f" (window {w.swa_window()})" if "swa" in w.mix else ""
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
            ratio = "" if r.engine == "vllm" or r.x_total_vs_vllm is None else f" ({r.x_total_vs_vllm:.1f}x)"
            mgr = "" if r.engine == "vllm" or r.x_manager_vs_vllm is None else f" ({r.x_manager_vs_vllm:.1f}x)"
            cells.append(f"{r.total:.3f}{ratio} | {r.manager:.3f}{mgr}")
        table.add_row(str(p.x), str(p.workload.num_requests), str(p.workload.num_blocks),
                      str(p.rows[0].request_steps if p.rows else 0), *cells)  # fmt: skip
    console.print(table)
    print("each cell: µs per request-step, all phases | manager phases only; (x) = speed vs vLLM")
    print(load_average())
    print("all engines allocated identical block ids at every point")
    if plot_sweep(kind, points, args.plot, title):
        print(f"plot: {args.plot}")
    else:
        print("matplotlib not installed: no plot")
    return 0
