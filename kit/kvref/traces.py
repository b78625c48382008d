"""Replayable trace files (JSON Lines), format version 1.

Line 1 is a header object; every further line is one operation with the
expected output and the expected view digest after it. ``docs/traces.md``
describes the format for implementers in other languages.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvref.adapters import AdapterFactory, KVCacheAdapter
from kvref.ops import REQUEST_OPS, RequestBook, config_from_json, config_to_json, execute
from kvspec.config import KVCacheConfig
from kvspec.profiles import VLLM_0_25_1, profile_named

FORMAT = "kvref-trace"
VERSION = 1
Json = Any


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
            "hash_function": self.config.hash_function,
            "hash_seed": self.config.hash_seed,
            "config": config_to_json(self.config),
            **self.meta,
        }

    def dumps(self) -> str:
        """The whole file as text."""
        lines = [self.header(), *self.steps]
        return "".join(json.dumps(x, sort_keys=True, separators=(",", ":")) + "\n" for x in lines)

    def write(self, path: Path) -> Path:
        """Write the trace; parent folders are created."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.dumps())
        return path


def load(path: Path) -> Trace:
    """Read a trace file.

    Raises:
        ValueError: If the header is not a version-1 kvref trace.
    """
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{path}: empty trace")
    header = lines[0]
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise ValueError(f"{path}: not a {FORMAT} version {VERSION} file")
    known = ("format", "version", "semantics", "hash_function", "hash_seed", "config")
    meta = {k: v for k, v in header.items() if k not in known}
    profile = profile_named(header["semantics"]) if "semantics" in header else VLLM_0_25_1
    return Trace(config_from_json(header["config"], profile), lines[1:], meta)


@dataclass
class ReplayResult:
    """Outcome of replaying one trace against one adapter."""

    path: str
    ok: bool
    steps: int
    failed_step: int | None = None
    message: str = ""


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
        op, _, _ = split_step(step)
        try:
            if op["op"] in REQUEST_OPS:
                book.apply(op)
                continue
            out = execute_op(adapter, book, op)
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
    raised by ``after_step``, which runs after each facade step)."""
    adapter = factory(trace.config)
    try:
        for index, op, got in run_steps(trace, adapter, execute_op):
            _, expect, view = split_step(trace.steps[index])
            if got != expect:
                return ReplayResult(path, False, index + 1, index, f"{op['op']}: expected {expect!r}, got {got!r}")
            if view is not None and _guarded(index, op, lambda: adapter.to_view().digest()) != view:
                return ReplayResult(path, False, index + 1, index, f"{op['op']}: view digest differs")
            if after_step is not None:
                _guarded(index, op, lambda: after_step(adapter))
    except StepCrashed as crash:
        cause, i = crash.cause, crash.index
        return ReplayResult(path, False, i + 1, i, f"{crash.op['op']}: crashed: {type(cause).__name__}: {cause}")
    return ReplayResult(path, True, len(trace.steps))


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
