"""``kvref replay``: replay stored traces against an adapter."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvref.adapters import AdapterFactory, KVCacheAdapter, load_factory, semantics_of
from kvref.divergences import load_registry
from kvref.traces import Trace, load, replay
from kvspec.config import KVCacheConfig


def add_parser(sub: Any) -> None:
    """Register ``replay`` on the subcommand parser ``sub``."""
    rep = sub.add_parser("replay", help="replay trace files against an adapter")
    rep.add_argument("files", nargs="+", type=Path)
    rep.add_argument("--target", default="spec")
    rep.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Replay traces and print one line per file and a summary.

    Every trace runs under the semantics profile its header names. An adapter
    that declares upstream vLLM behaviour (:class:`kvref.adapters.DeclaredSemantics`)
    only replays traces of its own release; it must fail a trace marked
    ``known_divergence`` exactly at ``divergence_step`` when that divergence
    applies to its release (``divergence_step == -1``: at construction, where
    every step must pass and the adapter must report the documented
    ``construction_workaround``), and pass it otherwise.
    """
    files: list[Path] = args.files
    factory = load_factory(args.target)
    bad = skipped = 0
    for path in files:
        trace = load(path)
        built: list[KVCacheAdapter] = []
        result = replay(trace, _remembering(factory, built), str(path))
        declared = semantics_of(built[0]) if built else None
        if declared is not None and declared.upstream and declared.profile != trace.config.profile.name:
            skipped += 1
            print(f"{path}: skipped (the trace pins {trace.config.profile.name}, the adapter is {declared.profile})")
            continue
        ok, status = _judge(
            trace, result.ok, result.failed_step, result.message, built, declared is not None and declared.upstream
        )
        bad += not ok
        print(f"{path}: {status} ({result.steps} steps)")
    checked = len(files) - skipped
    print(
        f"{checked - bad}/{checked} traces as expected against {args.target}"
        + (f", {skipped} skipped" if skipped else "")
    )
    return 1 if bad else 0


def _judge(
    trace: Trace, ok: bool, failed_step: int | None, message: str, built: list[KVCacheAdapter], upstream: bool
) -> tuple[bool, str]:
    """Whether the replay went as the trace expects on this adapter, and a status line."""
    known = trace.meta.get("known_divergence")
    release = trace.config.profile.release
    applies = bool(known) and upstream and known in load_registry() and load_registry()[known].applies_to(release)
    if applies and trace.meta.get("divergence_step") == -1:
        workaround = getattr(built[0], "construction_workaround", None) if built else None
        if ok and workaround == known:
            return True, f"known divergence {known} confirmed at construction"
        return False, f"known divergence {known} NOT reproduced ({workaround=}, {message or 'steps ok'})"
    if applies:
        if not ok and failed_step == trace.meta.get("divergence_step"):
            return True, f"known divergence {known} confirmed"
        return False, f"known divergence {known} NOT reproduced"
    return ok, "ok" if ok else f"FAILED at step {failed_step}: {message}"


def _remembering(factory: AdapterFactory, built: list[KVCacheAdapter]) -> AdapterFactory:
    """``factory``, also appending every adapter it builds to ``built``."""

    def build(config: KVCacheConfig) -> KVCacheAdapter:
        adapter = factory(config)
        built.append(adapter)
        return adapter

    return build
