"""``kvref check --layer pool`` and the replay of pool traces."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from rich.console import Console

from kvref.capabilities import declared_unsupported, parse_features
from kvref.check import MIN_STEPS, run_keep_going, run_lockstep
from kvref.exits import HANG, INTERRUPTED, AdapterHang, InputError
from kvref.layers.pool import PoolFactory, execute_pool, load_pool_factory
from kvref.layers.pool_machine import make_pool_machine
from kvref.lockstep import RunStats
from kvref.settings import load_profile
from kvref.stateful import MachineSetup, default_failure_dir
from kvref.traces import Trace, replay


def run_pool_check(args: argparse.Namespace, target: str, against: str | None, console: Console) -> int:
    """Lockstep of the pool machine: ``target`` against ``against`` (a pool
    factory each; ``spec`` is kvspec's ``BlockPool``)."""
    from kvref.cli.check import _known, _report, _report_classes, choose_profile  # noqa: PLC0415 - cli.check imports this module

    names = [n for n in (against, target) if n is not None]
    factories: list[PoolFactory] = [load_pool_factory(n) for n in names]
    try:
        profile = choose_profile(args.semantics, factories)  # type: ignore[arg-type]  # pool factories declare alike
    except (KeyError, ValueError) as exc:
        raise InputError(f"--semantics: {exc}") from None
    try:
        excluded = parse_features(args.without or "").union(*(declared_unsupported(f) for f in factories))
    except ValueError as exc:
        raise InputError(f"--without: {exc}") from None
    console.print(f"kvref check --layer pool: target [bold]{target}[/] against [bold]{against or '(none)'}[/]; "
                  f"semantics [bold]{profile.name}[/]")  # fmt: skip
    load_profile(args.profile)
    goal = args.min_steps or MIN_STEPS[args.profile]
    setup = MachineSetup(list(factories), RunStats(), default_failure_dir(), profile=profile,  # type: ignore[arg-type]  # pool factories
                         op_timeout=args.op_timeout, known=_known(args), excluded=excluded)  # fmt: skip
    machine = make_pool_machine(setup)
    try:
        if args.keep_going:
            classes = run_keep_going(setup, args.seed, goal, args.out, args.budget, args.max_classes, machine=machine)
            _report(setup.stats, target, against, console, bool(classes), profile)
            _report_classes(classes, console)
            return 1 if classes else (3 if setup.stats.steps == 0 else 0)
        failure = run_lockstep(setup, args.seed, goal, args.budget, machine=machine)
    except (KeyboardInterrupt, AdapterHang) as exc:
        console.print(f"[red]stopped[/]: {exc or 'Ctrl-C'}")
        return HANG if isinstance(exc, AdapterHang) else INTERRUPTED
    if failure is not None:
        console.print(f"[red]unexplained divergence[/]: {failure}")
    _report(setup.stats, target, against, console, failure is not None, profile)
    if failure is not None:
        return 1
    return 3 if setup.stats.steps == 0 else 0


def replay_pool_trace(
    trace: Trace, path: Path, target: str, counts: dict[str, int], reasons: Counter[str] | None
) -> str:
    """Replay one pool trace on ``target``'s pool factory; count the outcome."""
    from kvref.cli.replay import _skip  # noqa: PLC0415 - cli.replay imports this module

    try:
        factory = load_pool_factory(target)
        result = replay(trace, factory, str(path), execute_op=execute_pool)  # type: ignore[arg-type]  # pool adapter
    except InputError:
        raise
    except Exception as exc:
        counts["bad"] += 1
        return f"FAILED at construction: {type(exc).__name__}: {exc}"
    if result.skipped:
        return _skip(counts, reasons, result.skipped)
    counts["ok" if result.ok else "bad"] += 1
    status = "ok" if result.ok else f"FAILED at step {result.failed_step}: {result.message}"
    return f"{status} ({result.steps} steps)"
