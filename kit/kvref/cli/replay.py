"""``kvref replay``: replay stored traces against an adapter."""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path
from typing import Any

from kvref import corpus
from kvref.adapters import AdapterFactory, KVCacheAdapter, load_factory, semantics_of
from kvref.diagnose import describe
from kvref.divergences import load_registry
from kvref.exits import DIVERGENCE, INTERRUPTED, NOTHING_CHECKED, OK, USAGE, InputError
from kvref.ops import execute
from kvref.traces import ExecuteOp, ReplayResult, Trace, load, replay, view_after
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
    rep.add_argument(
        "--diff-against",
        default="spec",
        metavar="TARGET",
        help="on a view difference, replay the trace on this adapter too and print the first differing field "
        "(default spec; none: only the digest)",
    )
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
    reference = None if args.diff_against == "none" else _Reference(args.diff_against)
    counts = {"ok": 0, "bad": 0, "skipped": 0, "errors": 0}
    reasons: Counter[str] = Counter()
    try:
        for path in files:
            print(f"{path}: {_replay_one(path, factory, counts, reference, reasons, args.target)}")
    except KeyboardInterrupt:
        print(f"interrupted after {sum(counts.values())} of {len(files)} files")
        _summary(counts, args.target, reasons)
        return INTERRUPTED
    _summary(counts, args.target, reasons)
    if counts["errors"]:
        return USAGE
    if counts["bad"]:
        return DIVERGENCE
    return NOTHING_CHECKED if not counts["ok"] else OK


class _Reference:
    """The ``--diff-against`` adapter, loaded on first use."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.factories: dict[str, Any] = {}

    def describe(self, trace: Trace, result: ReplayResult, target: str, execute_op: ExecuteOp) -> str:
        """The first view field where the replayed adapter differs from this
        reference after the failed step, each side named."""
        assert result.failed_step is not None and result.view is not None
        if trace.layer == "pool":
            from kvref.layers.pool import load_pool_factory  # noqa: PLC0415 - only pool traces need it

            factory = self.factories.setdefault("pool", load_pool_factory(self.target))
        else:
            factory = self.factories.setdefault("facade", load_factory(self.target))
        try:
            theirs = view_after(trace, factory, result.failed_step, execute_op)
        except Exception as exc:
            return f"(--diff-against {self.target} could not replay it: {type(exc).__name__}: {exc})"
        expected = trace.steps[result.failed_step].get("view")
        note = "" if theirs.digest() == expected else f" ({self.target} does not match the trace's digest either)"
        return describe(theirs, result.view, self.target, target) + note


def _replay_one(
    path: Path,
    factory: AdapterFactory,
    counts: dict[str, int],
    reference: _Reference | None = None,
    reasons: Counter[str] | None = None,
    target: str = "spec",
) -> str:
    """Replay one file; count and describe the outcome (a pool trace on
    ``target``'s pool factory)."""
    try:
        trace = load(path)
    except InputError as exc:
        counts["errors"] += 1
        return f"ERROR: {str(exc).removeprefix(f'{path}: ').removeprefix(f'{path}')}"
    if not trace.steps:
        counts["errors"] += 1
        return "ERROR: the trace has no step (replaying it would check nothing)"
    if trace.layer != "facade":
        from kvref.cli.pool import replay_pool_trace  # noqa: PLC0415 - only pool traces need it

        return replay_pool_trace(trace, path, target, counts, reasons)
    built: list[KVCacheAdapter] = []
    try:
        result = replay(trace, _remembering(factory, built), str(path))
    except UnsupportedByProfileError as exc:
        return _skip(counts, reasons, f"the adapter refuses the configuration: {exc}")
    except Exception as exc:
        counts["bad"] += 1
        return f"FAILED at construction: {type(exc).__name__}: {exc}"
    if result.skipped:
        return _skip(counts, reasons, result.skipped)
    declared = semantics_of(built[0]) if built else None
    upstream = declared is not None and declared.upstream
    if upstream and declared is not None and declared.profile != trace.config.profile.name:
        return _skip(counts, reasons, f"the trace pins {trace.config.profile.name}, the adapter is {declared.profile}")
    ok, status = _judge(trace, result.ok, result.failed_step, result.message, built, upstream)
    if not ok and result.view is not None and reference is not None and not trace.meta.get("known_divergence"):
        name = built[0].name if built else "the adapter"
        status += f"; {reference.describe(trace, result, name, execute)}"
    counts["ok" if ok else "bad"] += 1
    return f"{status} ({result.steps} steps)"


def _skip(counts: dict[str, int], reasons: Counter[str] | None, reason: str) -> str:
    """Count a skipped trace under its reason."""
    counts["skipped"] += 1
    if reasons is not None:
        reasons[re.sub(r"^step \d+ \((\w+)\)", r"\1", reason)] += 1
    return f"skipped ({reason})"


def _summary(counts: dict[str, int], target: str, reasons: Counter[str] | None = None) -> None:
    checked = counts["ok"] + counts["bad"]
    extra = [f"{counts[k]} {k}" for k in ("skipped", "errors") if counts[k]]
    print(f"{counts['ok']}/{checked} traces as expected against {target}" + (f" ({', '.join(extra)})" if extra else ""))
    for reason, n in (reasons or Counter()).most_common(8):
        print(f"  skipped x{n}: {reason}")


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

    for name in ("supports", "unsupported", "features"):  # the factory's declared capabilities
        if hasattr(factory, name):
            setattr(build, name, getattr(factory, name))
    return build
