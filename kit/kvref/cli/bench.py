"""``kvref bench``: time the managers on one scheduler workload (or a sweep of them)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from kvref.adapters import AdapterFactory, load_factory
from kvref.shapes import BENCH_MIXES

if TYPE_CHECKING:
    from kvref.bench import Workload


def add_parser(sub: Any) -> None:
    """Register ``bench`` on the subcommand parser ``sub``."""
    ben = sub.add_parser("bench", help="time the managers on one scheduler workload (or a sweep of them)")
    ben.add_argument("--mix", default="full", choices=BENCH_MIXES)
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
    ben.set_defaults(run=_dispatch)


def _dispatch(args: argparse.Namespace) -> int:
    if args.steady_decode is not None:
        from kvref.bench_decode import report  # noqa: PLC0415 - imports kvimpl and vLLM

        return report(args.mix, args.steady_decode, 128, args.repeats or 3)
    return run(args)


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


def run(args: argparse.Namespace) -> int:
    """Print µs per allocation and per request-step of every installed
    engine on one workload, or per point of a sweep (with a plot)."""
    from kvref.bench import SWEEP_REPEATS, Workload, bench  # noqa: PLC0415 - imports kvimpl and vLLM

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
    extra = {t: load_factory(t) for t in args.target or ()}
    if only is not None:
        only += list(extra)
    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the tables into 80 columns
        console.width = max(console.width, 140)
    if args.sweep is not None:
        return _bench_sweep(args, w, only, console, args.repeats or SWEEP_REPEATS, extra)
    repeats = args.repeats or 5
    runs = iter(range(1, 10**9))

    def progress(name: str) -> None:
        print(f"bench: run {next(runs)}: {name} ...", file=sys.stderr, flush=True)

    rows = bench(w, repeats=repeats, only=only, extra=extra, progress=progress)
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


def _bench_sweep(
    args: argparse.Namespace,
    w: Workload,
    only: list[str] | None,
    console: Console,
    repeats: int,
    extra: dict[str, AdapterFactory],
) -> int:
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

    points = sweep(kind, w, repeats=repeats, only=only, progress=progress, extra=extra)
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


