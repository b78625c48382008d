"""``kvref replay``: replay stored traces against an adapter."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvref import corpus
from kvref.adapters import AdapterFactory, KVCacheAdapter, load_factory, semantics_of
from kvref.divergences import load_registry
from kvref.exits import DIVERGENCE, INTERRUPTED, NOTHING_CHECKED, OK, USAGE, InputError
from kvref.traces import Trace, load, replay
from kvspec.config import KVCacheConfig
from kvspec.errors import UnsupportedByProfileError


def add_parser(sub: Any) -> None:
    """Register ``replay`` on the subcommand parser ``sub``."""
    rep = sub.add_parser("replay", help="replay trace files against an adapter")
    rep.add_argument("files", nargs="*", type=Path)
    rep.add_argument(
        "--corpus",
        metavar="SELECTOR",
        action="append",
        default=[],
        help="replay shipped traces: a folder (vllm-0.25.1/golden) or a profile (vllm-0.33.0); see `kvref corpus`",
    )
    rep.add_argument("--target", default="spec")
    rep.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Replay traces and print one line per file and a summary; a file that
    cannot be read is reported on its line and the others still run (exit
    codes: :mod:`kvref.exits`).

    Every trace runs under the semantics profile its header names. An adapter
    that declares upstream vLLM behaviour (:class:`kvref.adapters.DeclaredSemantics`)
    only replays traces of its own release; it must fail a trace marked
    ``known_divergence`` exactly at ``divergence_step`` when that divergence
    applies to its release (``divergence_step == -1``: at construction, where
    every step must pass and the adapter must report the documented
    ``construction_workaround``), and pass it otherwise.
    """
    files: list[Path] = [*args.files, *(p for selector in args.corpus for p in corpus.files(selector))]
    if not files:
        raise InputError("no trace files given (name files, or --corpus SELECTOR)")
    factory = load_factory(args.target)
    counts = {"ok": 0, "bad": 0, "skipped": 0, "errors": 0}
    try:
        for path in files:
            print(f"{path}: {_replay_one(path, factory, counts)}")
    except KeyboardInterrupt:
        print(f"interrupted after {sum(counts.values())} of {len(files)} files")
        _summary(counts, args.target)
        return INTERRUPTED
    _summary(counts, args.target)
    if counts["errors"]:
        return USAGE
    if counts["bad"]:
        return DIVERGENCE
    return NOTHING_CHECKED if not counts["ok"] else OK


def _replay_one(path: Path, factory: AdapterFactory, counts: dict[str, int]) -> str:
    """Replay one file; count and describe the outcome."""
    try:
        trace = load(path)
    except InputError as exc:
        counts["errors"] += 1
        return f"ERROR: {str(exc).removeprefix(f'{path}: ').removeprefix(f'{path}')}"
    if not trace.steps:
        counts["errors"] += 1
        return "ERROR: the trace has no step (replaying it would check nothing)"
    built: list[KVCacheAdapter] = []
    try:
        result = replay(trace, _remembering(factory, built), str(path))
    except UnsupportedByProfileError as exc:
        counts["skipped"] += 1
        return f"skipped (the adapter refuses the configuration: {exc})"
    except Exception as exc:
        counts["bad"] += 1
        return f"FAILED at construction: {type(exc).__name__}: {exc}"
    declared = semantics_of(built[0]) if built else None
    upstream = declared is not None and declared.upstream
    if upstream and declared is not None and declared.profile != trace.config.profile.name:
        counts["skipped"] += 1
        return f"skipped (the trace pins {trace.config.profile.name}, the adapter is {declared.profile})"
    ok, status = _judge(trace, result.ok, result.failed_step, result.message, built, upstream)
    counts["ok" if ok else "bad"] += 1
    return f"{status} ({result.steps} steps)"


def _summary(counts: dict[str, int], target: str) -> None:
    checked = counts["ok"] + counts["bad"]
    extra = [f"{counts[k]} {k}" for k in ("skipped", "errors") if counts[k]]
    print(f"{counts['ok']}/{checked} traces as expected against {target}" + (f" ({', '.join(extra)})" if extra else ""))


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
