"""``kvref replay``: replay stored traces against an adapter."""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvref import corpus
from kvref.adapters import AdapterFactory, KVCacheAdapter, load_factory, semantics_of
from kvref.capabilities import declared_unsupported, refused_only, trace_features
from kvref.diagnose import describe
from kvref.divergences import load_registry
from kvref.exits import DEFAULT_OP_TIMEOUT, DIVERGENCE, INTERRUPTED, NOTHING_CHECKED, OK, USAGE, InputError, watchdog
from kvref.isolation import isolated
from kvref.layers.pool import PoolFactory, execute_pool, load_pool_factory
from kvref.ops import RequestBook, execute
from kvref.traces import ExecuteOp, ReplayResult, Trace, load, replay, view_after
from kvspec.config import KVCacheConfig
from kvspec.errors import UnsupportedByProfileError

Json = Any
EPILOG = """\
FILES are trace files (.jsonl, docs/traces.md) or folders: a folder stands for every .jsonl file in it, sorted.
Each trace runs on a fresh adapter built by --target's factory under the semantics profile its header names;
a trace the adapter cannot run (its supports() refuses the configuration, the header's features name one it
declares unsupported, or it raises kvref.Unsupported) is skipped and counted, never failed.
Exit codes: 0 every trace checked went as expected, 1 one did not, 2 a file could not be read (or bad usage),
3 nothing was checked (no trace ran: all skipped), 4 an adapter call ran past --op-timeout, 130 interrupted.
"""


def add_parser(sub: Any) -> None:
    """Register ``replay`` on the subcommand parser ``sub``."""
    rep = sub.add_parser(
        "replay",
        help="replay trace files against an adapter",
        description="Replay stored traces on an adapter and compare every output and view digest with the trace.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rep.add_argument("files", nargs="*", type=Path, metavar="FILE", help="trace files or folders of them")
    rep.add_argument(
        "--corpus",
        metavar="SELECTOR",
        action="append",
        default=[],
        help="replay shipped traces: a folder (vllm-0.25.1/golden) or a profile (vllm-0.33.0); see `kvref corpus`",
    )
    rep.add_argument(
        "--target",
        default="spec",
        help="the adapter to replay on: spec (default), impl, vllm or module:factory (a block-pool factory "
        "for pool traces)",
    )
    rep.add_argument(
        "--isolate",
        action="store_true",
        help="run the target in a child process, so that a trace that crashes a native engine is reported, not fatal",
    )
    rep.add_argument(
        "--no-checks",
        dest="checks",
        action="store_false",
        help="do not run the adapter's own check_invariants after every step (default: run them where it has one)",
    )
    rep.add_argument(
        "--diff-against",
        default="spec",
        metavar="TARGET",
        help="on a view difference, replay the trace on this adapter too and print the first differing field "
        "(default spec; none: only the digest)",
    )
    rep.add_argument(
        "--op-timeout",
        type=float,
        default=DEFAULT_OP_TIMEOUT,
        help=f"watchdog seconds per adapter call, its construction included (default {DEFAULT_OP_TIMEOUT:g}; "
        "exit 4 past it)",
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
    files: list[Path] = [
        *(f for path in args.files for f in expand(path)),
        *(p for selector in args.corpus for p in corpus.files(selector)),
    ]
    if not files:
        raise InputError("no trace files given (name files or folders, or --corpus SELECTOR)")
    timeout = args.op_timeout if args.op_timeout > 0 else None
    with watchdog(timeout, f"importing the target {args.target!r}"):
        factory = load_factory(args.target)
    if getattr(args, "isolate", False):
        factory = isolated(factory)
    reference = None if args.diff_against == "none" else _Reference(args.diff_against)
    counts = {"ok": 0, "bad": 0, "skipped": 0, "errors": 0, "checks": 0}
    reasons: Counter[str] = Counter()
    checks = getattr(args, "checks", True)
    replayer = _Replayer(args.target, factory, timeout, reference, counts, reasons, checks)
    try:
        for path in files:
            print(f"{path}: {replayer.one(path)}")
    except KeyboardInterrupt:
        print(f"interrupted after {counts['ok'] + counts['bad'] + counts['skipped']} of {len(files)} files")
        _summary(counts, args.target, reasons, checks)
        return INTERRUPTED
    _summary(counts, args.target, reasons, checks)
    if counts["errors"]:
        return USAGE
    if counts["bad"]:
        return DIVERGENCE
    return NOTHING_CHECKED if not counts["ok"] else OK


def expand(path: Path) -> list[Path]:
    """``path``, or for a folder every ``.jsonl`` file in it, sorted.

    Raises:
        InputError: For a folder that holds no ``.jsonl`` file.
    """
    if not path.is_dir():
        return [path]
    found = sorted(path.glob("*.jsonl"))
    if not found:
        raise InputError(f"{path}: a folder without .jsonl trace files")
    return found


class _Replayer:
    """Replays one file at a time on ``target``, every adapter call under the
    watchdog; with ``checks``, the adapter's own ``check_invariants`` runs
    after every step (counted in ``counts["checks"]``): a check that fails is
    a failure of the trace at that step."""

    def __init__(
        self,
        target: str,
        factory: AdapterFactory,
        timeout: float | None,
        reference: _Reference | None,
        counts: dict[str, int],
        reasons: Counter[str],
        checks: bool = True,
    ) -> None:
        self.target, self.factory, self.timeout = target, factory, timeout
        self.reference, self.counts, self.reasons, self.checks = reference, counts, reasons, checks

    def _after_step(self, adapter: KVCacheAdapter) -> None:
        check = getattr(adapter, "check_invariants", None)
        if check is not None:
            with watchdog(self.timeout, f"{getattr(adapter, 'name', 'the adapter')}.check_invariants"):
                check()
            self.counts["checks"] += 1

    def one(self, path: Path) -> str:
        """Replay one file; count and describe the outcome (a pool trace on
        the target's pool factory)."""
        try:
            trace = load(path)
        except InputError as exc:
            self.counts["errors"] += 1
            return f"ERROR: {str(exc).removeprefix(f'{path}: ').removeprefix(f'{path}')}"
        if not trace.steps:
            self.counts["errors"] += 1
            return "ERROR: the trace has no step (replaying it would check nothing)"
        if trace.layer != "facade":
            return self._pool(trace, path)
        lacking = sorted(
            set(trace_features(trace.config, trace.steps)) & declared_unsupported(self.factory)
            - refused_only(trace.steps)
        )
        if lacking:
            return self._skip(f"the trace uses {', '.join(lacking)}, which the adapter lacks")
        built: list[KVCacheAdapter] = []
        try:
            after_step = self._after_step if self.checks else None
            result = replay(trace, self._watched(self.factory, built), str(path), self._execute(execute), after_step)
        except UnsupportedByProfileError as exc:
            return self._skip(f"the adapter refuses the configuration: {exc}")
        except (Exception, SystemExit) as exc:
            self.counts["bad"] += 1
            return f"FAILED at construction: {type(exc).__name__}: {exc}"
        if result.skipped:
            return self._skip(result.skipped)
        declared = semantics_of(built[0]) if built else None
        upstream = declared is not None and declared.upstream
        if upstream and declared is not None and declared.profile != trace.config.profile.name:
            return self._skip(f"the trace pins {trace.config.profile.name}, the adapter is {declared.profile}")
        ok, status = _judge(trace, result.ok, result.failed_step, result.message, built, upstream)
        if not ok and result.view is not None and self.reference is not None and not trace.meta.get("known_divergence"):
            name = built[0].name if built else "the adapter"
            status += f"; {self.reference.describe(trace, result, name, execute)}"
        self.counts["ok" if ok else "bad"] += 1
        return f"{status} ({result.steps} steps)"

    def _pool(self, trace: Trace, path: Path) -> str:
        """Replay one pool trace on the target's pool factory."""
        try:
            factory = load_pool_factory(self.target)
            built: list[Any] = []
            result = replay(trace, self._watched(factory, built), str(path), self._execute(execute_pool))
        except InputError:
            raise
        except (Exception, SystemExit) as exc:
            self.counts["bad"] += 1
            return f"FAILED at construction: {type(exc).__name__}: {exc}"
        if result.skipped:
            return self._skip(result.skipped)
        self.counts["ok" if result.ok else "bad"] += 1
        status = "ok" if result.ok else f"FAILED at step {result.failed_step}: {result.message}"
        return f"{status} ({result.steps} steps)"

    def _watched(self, factory: AdapterFactory | PoolFactory, built: list[Any]) -> AdapterFactory:
        """``factory`` under the watchdog, appending every adapter it builds to
        ``built``, with the factory's declared capabilities."""
        timeout, target = self.timeout, self.target

        def build(config: KVCacheConfig) -> KVCacheAdapter:
            with watchdog(timeout, f"constructing {target!r}"):
                adapter: KVCacheAdapter = factory(config)  # type: ignore[assignment]  # a pool adapter for pool traces
            built.append(adapter)
            return adapter

        for name in ("supports", "unsupported", "features"):  # the factory's declared capabilities
            if hasattr(factory, name):
                setattr(build, name, getattr(factory, name))
        return build

    def _execute(self, run_op: Callable[[Any, RequestBook, Json], Json]) -> ExecuteOp:
        timeout = self.timeout

        def run_watched(adapter: Any, book: RequestBook, op: Json) -> Json:
            with watchdog(timeout, f"{getattr(adapter, 'name', 'the adapter')}.{op['op']}"):
                return run_op(adapter, book, op)

        return run_watched

    def _skip(self, reason: str) -> str:
        """Count a skipped trace under its reason."""
        self.counts["skipped"] += 1
        self.reasons[re.sub(r"^step \d+ \((\w+)\)", r"\1", reason)] += 1
        return f"skipped ({reason})"


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


def _summary(counts: dict[str, int], target: str, reasons: Counter[str] | None = None, checks: bool = False) -> None:
    checked = counts["ok"] + counts["bad"]
    extra = [f"{counts[k]} {k}" for k in ("skipped", "errors") if counts[k]]
    print(f"{counts['ok']}/{checked} traces as expected against {target}" + (f" ({', '.join(extra)})" if extra else ""))
    if checked and checks:
        ran = counts.get("checks", 0)
        print(f"  {ran} runs of the adapter's own check_invariants" if ran else "  the adapter has no check_invariants")
    elif checked:
        print("  the adapter's own checks were not run (--no-checks)")
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
