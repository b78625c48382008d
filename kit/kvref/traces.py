"""Replayable trace files (JSON Lines), format version 2.

Line 1 is a header object; every further line but the last is one operation
with the expected output and the expected view digest after it; the last
line, ``{"end": {"steps": N, "sha256": D}}``, says how many steps there are
and the SHA-256 of every line before it, so a truncated file is refused.
Version 1 files (no end line) are still read. ``docs/traces.md`` describes
the format for implementers in other languages.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from kvref.adapters import AdapterFactory, KVCacheAdapter
from kvref.capabilities import (
    SKIP_ERRORS,
    absent_features,
    declared_unsupported,
    op_features,
    refusal,
    refused_only,
    trace_features,
)
from kvref.exits import InputError, raise_if_interrupted
from kvref.ops import ABSENT, REQUEST_OPS, RequestBook, config_from_json, config_to_json, execute, execute_absent
from kvspec.config import KVCacheConfig
from kvspec.profiles import PROFILES, VLLM_0_25_1, SemanticsProfile, profile_named
from kvspec.view import KVView

FORMAT = "kvref-trace"
VERSION = 2
READABLE_VERSIONS = (1, 2)
Json = Any

LIMITS = {"num_blocks": 1 << 21, "max_model_len": 1 << 22}
"""Largest configuration values a trace may ask for (a bigger one is refused
as an input error, not allocated); ``KVREF_MAX_BLOCKS`` overrides the first."""


@dataclass
class Trace:
    """A header plus the recorded steps."""

    config: KVCacheConfig
    steps: list[Json] = field(default_factory=list)
    meta: dict[str, Json] = field(default_factory=dict)

    def header(self) -> Json:
        """The first line of the file."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "semantics": self.config.profile.name,
            **switches_to_json(self.config.profile),
            "hash_function": self.config.hash_function,
            "hash_seed": self.config.hash_seed,
            "config": config_to_json(self.config),
            **self.meta,
        }

    def dumps(self) -> str:
        """The whole file as text, the end line included."""
        body = "".join(_line(x) for x in [self.header(), *self.steps])
        end = {"end": {"steps": len(self.steps), "sha256": hashlib.sha256(body.encode()).hexdigest()}}
        return body + _line(end)

    def write(self, path: Path) -> Path:
        """Write the trace; parent folders are created.

        NOTE: the text goes to a temporary file next to ``path`` first and is
        then renamed over it, so an interrupted run never leaves a cut trace
        behind and a reader sees either the old file or the whole new one.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(self.dumps())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return path

    def features(self) -> list[str]:
        """The features the trace uses: its header's ``features``, else
        computed from its configuration and steps (older files have none)."""
        listed = self.meta.get("features")
        if isinstance(listed, list):
            return [str(f) for f in listed]
        return trace_features(self.config, self.steps)

    @property
    def layer(self) -> str:
        """The layer the trace drives: ``facade`` (default) or ``pool``."""
        return str(self.meta.get("layer", "facade"))

    def write_new(self, folder: Path, stem: str, start: int = 1) -> Path:
        """Write the trace as ``<stem>-NNNN.jsonl`` in ``folder`` under the first
        number from ``start`` that no file holds yet.

        NOTE: the whole text is written to a temporary file, then hard-linked
        to the name (a link fails if the name exists): two recorders sharing a
        folder never overwrite each other, and no cut or empty file appears.
        """
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{stem}.{os.getpid()}.tmp"
        try:
            tmp.write_text(self.dumps())
            number = start
            while True:
                path = folder / f"{stem}-{number:04d}.jsonl"
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    number += 1
                    continue
                return path
        finally:
            tmp.unlink(missing_ok=True)


def load(path: Path) -> Trace:
    """Read a trace file.

    Raises:
        TraceFormatError: Naming the file, the line and the broken condition:
            a missing, unreadable or truncated file, a line that is not JSON,
            a header that is not a kvref trace, an invalid configuration.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceFormatError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{path}: not a readable UTF-8 text file ({type(exc).__name__})") from None
    raw = text.splitlines(keepends=True)
    lines: list[Json] = []
    for number, line in enumerate(raw, start=1):
        if not line.strip():
            continue
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise TraceFormatError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(lines[-1], dict):
            raise TraceFormatError(f"{path}:{number}: a trace line must be a JSON object")
    if not lines:
        raise TraceFormatError(f"{path}: empty file")
    header = lines[0]
    if header.get("format") != FORMAT or header.get("version") not in READABLE_VERSIONS:
        raise TraceFormatError(f"{path}:1: not a {FORMAT} file of version {' or '.join(map(str, READABLE_VERSIONS))}")
    steps = lines[1:]
    if header["version"] >= 2:
        steps = _verified_steps(path, raw, steps)
    known = ("format", "version", "semantics", "switches", "hash_function", "hash_seed", "config")
    meta = {k: v for k, v in header.items() if k not in known}
    try:
        profile = profile_named(header["semantics"]) if "semantics" in header else VLLM_0_25_1
        profile = switches_from_json(profile, header.get("switches", {}))
        config = config_from_json(header["config"], profile)
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceFormatError(f"{path}:1: bad header: {type(exc).__name__}: {exc}") from None
    _check_limits(path, config)
    return Trace(config, steps, meta)


def switches_to_json(profile: SemanticsProfile) -> Json:
    """``{"switches": {...}}`` for a profile that differs from the release
    profile of its name (a ``kvref drift`` run that accepted changes), else
    ``{}``: the header names the base profile and each changed switch."""
    base = PROFILES.get(profile.name)
    if base is None or base == profile:
        return {}
    names = [f.name for f in fields(SemanticsProfile) if f.name not in ("name", "release")]
    return {"switches": {n: getattr(profile, n) for n in names if getattr(profile, n) != getattr(base, n)}}


def switches_from_json(profile: SemanticsProfile, switches: Json) -> SemanticsProfile:
    """``profile`` with a header's ``switches`` applied.

    Raises:
        ValueError: For a value that is not an object, or an unknown switch.
    """
    if not isinstance(switches, dict):
        raise ValueError(f"switches must be an object of switch names, got {type(switches).__name__}")
    names = {f.name for f in fields(SemanticsProfile)} - {"name", "release"}
    unknown = sorted(set(switches) - names)
    if unknown:
        raise ValueError(f"unknown profile switch(es) {', '.join(unknown)}")
    return replace(profile, **switches) if switches else profile


class TraceFormatError(InputError):
    """A trace file that cannot be read as a kvref trace."""


def _verified_steps(path: Path, raw: list[str], steps: list[Json]) -> list[Json]:
    """The steps of a version 2 file, after checking its end line: the step
    count and the SHA-256 of the non-blank lines before it, as written."""
    if not steps or "end" not in steps[-1]:
        raise TraceFormatError(f"{path}: truncated: the last line is not the end line (the file was cut short)")
    end = steps[-1]["end"]
    nonblank = [line for line in raw if line.strip()]
    digest = hashlib.sha256("".join(nonblank[:-1]).encode()).hexdigest()
    if not isinstance(end, dict) or end.get("steps") != len(steps) - 1 or end.get("sha256") != digest:
        raise TraceFormatError(
            f"{path}: the end line does not match the file ({len(steps) - 1} steps; the file was changed or cut)"
        )
    return steps[:-1]


def _check_limits(path: Path, config: KVCacheConfig) -> None:
    limits = dict(LIMITS, num_blocks=int(os.environ.get("KVREF_MAX_BLOCKS", LIMITS["num_blocks"])))
    for name, limit in limits.items():
        value = getattr(config, name)
        if value > limit:
            raise TraceFormatError(f"{path}:1: {name} {value} exceeds the limit {limit} (KVREF_MAX_BLOCKS)")


def _line(obj: Json) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n"


@dataclass
class ReplayResult:
    """Outcome of replaying one trace against one adapter.

    Attributes:
        skipped: Why the adapter could not run the trace ("" if it ran):
            a declared missing feature, its ``supports``, or a skip error.
        view: The adapter's view right after the failed step when the view
            digest differed (for :func:`kvref.diagnose.describe`).
    """

    path: str
    ok: bool
    steps: int
    failed_step: int | None = None
    message: str = ""
    skipped: str = ""
    view: KVView | None = None


ExecuteOp = Callable[[KVCacheAdapter, RequestBook, Json], Json]
"""Runs one facade operation on an adapter (default: :func:`kvref.ops.execute`)."""


def split_step(step: Json) -> tuple[Json, Json, str | None]:
    """A recorded step as (operation, expected output, expected view digest).

    A facade step without ``expect`` expects null; ``view`` is optional.
    """
    op = {k: v for k, v in step.items() if k not in ("expect", "view")}
    return op, step.get("expect"), step.get("view")


def run_steps(
    trace: Trace, adapter: KVCacheAdapter, execute_op: ExecuteOp = execute
) -> Iterator[tuple[int, Json, Json]]:
    """The one replay loop: apply request operations to a fresh request book
    and run every facade operation on ``adapter``; yield ``(step index,
    operation, output)`` per facade step.

    Raises:
        StepCrashed: When a step raises; it names the step.
    """
    book = RequestBook(trace.config)
    for i, step in enumerate(trace.steps):
        raise_if_interrupted()  # an interrupt Python swallowed (kvref.exits.interruptible)
        op, expect, _ = split_step(step)
        try:
            if op["op"] in REQUEST_OPS:
                book.apply(op)
                continue
            # an operation its release lacks, sent on purpose: every side must refuse it
            out = execute_absent(adapter, book, op, execute_op) if expect == ABSENT else execute_op(adapter, book, op)
        except Exception as exc:
            raise StepCrashed(i, op, exc) from exc
        yield i, op, out


class StepCrashed(Exception):
    """A step of a replayed trace raised (anything but a caller error, which
    :func:`kvref.ops.execute` turns into an output)."""

    def __init__(self, index: int, op: Json, cause: BaseException) -> None:
        """Remember the step and its exception."""
        super().__init__(f"step {index} ({op.get('op')}): {type(cause).__name__}: {cause}")
        self.index, self.op, self.cause = index, op, cause


def replay(
    trace: Trace,
    factory: AdapterFactory,
    path: str = "<trace>",
    execute_op: ExecuteOp = execute,
    after_step: Callable[[KVCacheAdapter], None] | None = None,
) -> ReplayResult:
    """Run every step on a fresh adapter; stop at the first mismatch of an
    output or of the view digest, or at the first exception (a crash, or one
    raised by ``after_step``, which runs after each facade step).

    A trace the adapter cannot run is skipped, with the reason: it needs a
    feature the factory declares it lacks, the factory's ``supports`` refuses
    the configuration, or the factory or a step raises a skip error
    (:mod:`kvref.capabilities`).
    """
    reason = refusal(factory, trace.config)
    if reason is not None:
        return ReplayResult(path, False, 0, skipped=f"the adapter refuses the configuration: {reason}")
    missing = sorted(set(trace.features()) & declared_unsupported(factory) - refused_only(trace.steps))
    if missing:
        return ReplayResult(path, False, 0, skipped=f"the trace uses {', '.join(missing)}, which the adapter lacks")
    try:
        adapter = factory(trace.config)
    except SKIP_ERRORS as exc:
        return ReplayResult(path, False, 0, skipped=f"the adapter refuses the configuration: {exc}")
    try:
        for index, op, got in run_steps(trace, adapter, execute_op):
            _, expect, view = split_step(trace.steps[index])
            if got != expect:
                message = f"{op['op']}: the trace expects {expect!r}, the adapter returned {got!r}"
                return ReplayResult(path, False, index + 1, index, message)
            if view is not None:
                now = _guarded(index, op, adapter.to_view)
                if now.digest() != view:
                    return ReplayResult(path, False, index + 1, index, f"{op['op']}: view digest differs", view=now)
            if after_step is not None:
                _guarded(index, op, lambda: after_step(adapter))
    except StepCrashed as crash:
        cause, i = crash.cause, crash.index
        claims_all = getattr(adapter, "runs_every_operation", False)
        if isinstance(cause, SKIP_ERRORS) and claims_all and not op_features(crash.op) & absent_features(
            trace.config.profile
        ):
            message = f"{crash.op['op']}: refused an operation {trace.config.profile.name} has: {cause}"
            return ReplayResult(path, False, i + 1, i, message)
        if isinstance(cause, SKIP_ERRORS):
            return ReplayResult(path, False, i, skipped=f"step {i} ({crash.op['op']}): {cause}")
        return ReplayResult(path, False, i + 1, i, f"{crash.op['op']}: crashed: {type(cause).__name__}: {cause}")
    return ReplayResult(path, True, len(trace.steps))


def view_after(trace: Trace, factory: AdapterFactory, index: int, execute_op: ExecuteOp = execute) -> KVView:
    """The view of a fresh ``factory`` adapter right after step ``index``."""
    adapter = factory(trace.config)
    for i, _, _ in run_steps(trace, adapter, execute_op):
        if i >= index:
            break
    return adapter.to_view()


def _guarded(index: int, op: Json, thunk: Callable[[], Json]) -> Json:
    """``thunk()``; an exception becomes :class:`StepCrashed` for step ``index``."""
    try:
        return thunk()
    except Exception as exc:
        raise StepCrashed(index, op, exc) from exc


def transcript(trace: Trace, factory: AdapterFactory) -> str:
    """Everything observable while replaying ``trace``, as canonical JSON.

    One line per facade step: the operation, its output and the full view
    after it (not just the digest), then a final ``take_events`` drain, so the
    whole event stream is included. Two runs of a deterministic adapter give
    byte-identical text, whatever ``PYTHONHASHSEED`` is (kvspec's hash seed is
    the config's ``hash_seed``). Outputs are not compared with the trace's
    expectations here; :func:`replay` does that.
    """
    adapter = factory(trace.config)
    drained = Trace(trace.config, [*trace.steps, {"op": "take_events"}], trace.meta)
    lines = [
        {"step": i, "op": op, "out": out, "view": adapter.to_view().to_json()}
        for i, op, out in run_steps(drained, adapter)
    ]
    return "".join(json.dumps(x, sort_keys=True, separators=(",", ":")) + "\n" for x in lines)
