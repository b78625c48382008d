"""``kvref soak``: a long, seeded, scripted run on one adapter (see :mod:`kvref.soak`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kvref.soak import SoakFailure, run_soak
from kvspec.profiles import NEWEST, profile_named


def add_parser(sub: Any) -> None:
    """Register ``soak`` on the subcommand parser ``sub``."""
    soak = sub.add_parser("soak", help="a long scripted run: no leaked block, no caller error, flat memory")
    soak.add_argument("--ops", type=int, default=1_000_000, help="facade operations to run (default 10^6)")
    soak.add_argument("--target", default="spec", help="spec, impl, vllm or module:factory")
    soak.add_argument("--seed", type=int, default=0)
    soak.add_argument("--check-every", type=int, default=50_000, help="check invariants every N operations")
    soak.add_argument("--rss-tolerance", type=float, default=0.10, help="allowed RSS growth after 10%% of the run")
    soak.add_argument("--semantics", default=None, metavar="PROFILE", help="semantics profile (default: the newest)")
    soak.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the soak, print its figures; 1 on a leak, a caller error or RSS growth."""
    try:
        profile = profile_named(args.semantics) if args.semantics else NEWEST
        res = run_soak(args.target, args.ops, args.seed, args.check_every, args.rss_tolerance, profile)
    except SoakFailure as exc:
        print(f"soak FAILED ({args.target}, seed {args.seed}): {exc}", file=sys.stderr)
        return 1
    print(f"soak {args.target} seed {args.seed}: {res.ops} operations in {res.seconds:.1f} s "
          f"({res.ops_per_second:.0f} ops/s); {res.preemptions} preemptions, {res.resets} resets, "
          f"{res.errors} errors")  # fmt: skip
    print(f"lanes: {res.lanes} under {profile.name}" + (f"; refused: {'; '.join(res.refused)}" if res.refused else ""))
    print(f"leaked blocks: {res.leaked_blocks}")
    print(f"RSS: {res.rss_at_10pct_kib} KiB at 10% of the run, {res.rss_end_kib} KiB at the end, "
          f"peak {res.peak_rss_kib} KiB")  # fmt: skip
    return 0
