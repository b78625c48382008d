"""``kvref traces record``: write traces of lockstep runs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis.errors import Unsatisfiable

from kvref.adapters import AdapterFactory, KVCacheAdapter, load_factory
from kvref.capabilities import parse_features
from kvref.check import SEED_STRIDE, choose_profile
from kvref.exits import InputError
from kvref.hypothesis_compat import seed_machine
from kvref.lockstep import RunStats
from kvref.settings import load_profile
from kvref.shapes import SHAPES
from kvref.stateful import MachineSetup, default_failure_dir, make_lockstep_machine, run_machine
from kvspec.config import KVCacheConfig

RECORD_BATCH_EXAMPLES = 20
MAX_BATCHES = 200
"""A recording that has not filled its count after this many batches gives up."""


def add_parser(sub: Any) -> None:
    """Register ``traces record`` on the subcommand parser ``sub``."""
    traces = sub.add_parser("traces", help="record traces")
    tsub = traces.add_subparsers(dest="traces_command", required=True)
    rec = tsub.add_parser("record", help="record traces from lockstep runs of the spec")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--count", type=int, default=50)
    rec.add_argument("--seed", type=int, default=0)
    rec.add_argument("--also", default=None, help="keep only runs on which this adapter (e.g. vllm) agrees too")
    rec.add_argument(
        "--semantics",
        default=None,
        metavar="PROFILE",
        help="semantics profile (default: the one the --also adapter declares, else the newest)",
    )
    rec.add_argument(
        "--shape",
        action="append",
        choices=[s.name for s in SHAPES],
        default=None,
        help="record only this configuration shape (repeatable; default: every shape)",
    )
    rec.add_argument(
        "--without",
        default="",
        metavar="FEATURE,...",
        help="leave these features out (as kvref check --without), e.g. for a corpus a minimal engine can run",
    )
    rec.add_argument(
        "--caching",
        choices=("drawn", "on"),
        default="drawn",
        help="prefix caching as the shapes draw it (default), or on in every recorded run (a corpus for an "
        "engine that always caches)",
    )
    rec.add_argument(
        "--min-allocations",
        type=int,
        default=0,
        help="keep only runs with at least this many successful allocate_slots calls",
    )
    rec.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Record ``--count`` traces from lockstep runs of the spec (optionally
    kept only when ``--also`` agrees at every step), drawing configurations
    from the ``--shape`` names only when any are given and keeping only runs
    with ``--min-allocations`` successful ``allocate_slots`` calls."""
    load_profile("dev")
    spec = load_factory("spec")
    factories = [_caching_only(spec) if args.caching == "on" else spec] + (
        [load_factory(args.also)] if args.also else []
    )
    profile = choose_profile(args.semantics, factories)
    shapes = SHAPES if not args.shape else tuple(s for s in SHAPES if s.name in args.shape)
    try:
        excluded = parse_features(args.without)
    except ValueError as exc:
        raise InputError(f"--without: {exc}") from None
    setup = MachineSetup(
        factories, RunStats(), default_failure_dir(), shapes=shapes, record_dir=args.out, profile=profile,
        excluded=excluded, learn_skips=False,
    )  # fmt: skip
    setup.min_allocations, setup.record_limit = args.min_allocations, args.count
    machine = make_lockstep_machine(setup)
    batch = 0
    while setup.recorded < args.count:
        if batch >= MAX_BATCHES:
            raise InputError(
                f"only {setup.recorded} of {args.count} traces after {batch} batches: the shapes "
                f"{[sh.name for sh in shapes]} are refused or too poor under {profile.name}"
            )
        seed_machine(machine, args.seed * SEED_STRIDE + batch)
        # Hypothesis starts every run with its simplest example; a batch of a
        # few examples only would record that same trivial run again and again.
        examples = max(args.count - setup.recorded, RECORD_BATCH_EXAMPLES)
        try:
            run_machine(machine, settings(settings.default, max_examples=examples, database=None))
        except Unsatisfiable:
            # Every drawn configuration was refused (by the profile or an adapter).
            reasons = "; ".join(r for r, _ in setup.stats.refused_reasons.most_common(2))
            raise InputError(
                f"only {setup.recorded} of {args.count} traces: every configuration of the shapes "
                f"{[sh.name for sh in shapes]} is refused under {profile.name} ({reasons})"
            ) from None
        batch += 1
    print(f"recorded {setup.recorded} traces in {args.out}")
    return 0


def _caching_only(factory: AdapterFactory) -> AdapterFactory:
    """``factory``, refusing a configuration with prefix caching off (``--caching on``)."""

    def build(config: KVCacheConfig) -> KVCacheAdapter:
        return factory(config)

    build.supports = lambda c: None if c.enable_caching else "prefix caching off (--caching on)"  # type: ignore[attr-defined]  # a declared attribute of the factory
    return build
