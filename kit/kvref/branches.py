"""Branch coverage of kvspec and kvimpl under a lockstep run (``kvref check --coverage``).

A *branch outcome* is one arc out of a decision (``if``, ``while``, ``for``,
``match``, a conditional expression...): coverage.py with ``branch=True``
records which arcs ran. A fault planted on an outcome the machine never takes
is invisible to it, so the outcomes not taken are the generator's to-do list.

:func:`measure` runs a callable under coverage.py and returns a
:class:`BranchReport`: per file, the outcomes taken, those never taken, and
which of the latter are listed as unreachable through the public API in
``unreachable_branches.toml`` (next to this module; one reviewed entry per
outcome, with the source line it leaves from, so that an entry whose line
moved is reported as stale instead of silently matching another branch).

NOTE: coverage starts after kvspec and kvimpl are imported (the command has
imported them to parse its options), so decisions at module or class level
ran before measurement; they are counted apart as ``import_time`` and are
not gaps. Only decisions inside functions count.
"""

from __future__ import annotations

import ast
import json
import tempfile
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

PACKAGES = ("kvspec", "kvimpl")
"""The packages measured."""
UNREACHABLE_FILE = Path(__file__).with_name("unreachable_branches.toml")
"""The reviewed list of outcomes no public call sequence takes."""

T = TypeVar("T")
Arc = tuple[int, int]
"""``(from_line, to_line)``; a negative ``to_line`` -n is an exit from the code object starting at line n."""


@dataclass(frozen=True)
class Unreachable:
    """One listed outcome: file (package-relative), arc, the source line it leaves from, and why."""

    file: str
    line: int
    to: int
    code: str
    why: str


@dataclass
class FileBranches:
    """The branch outcomes of one source file."""

    file: str
    total: int = 0
    taken: int = 0
    import_time: int = 0
    unreachable: list[Arc] = field(default_factory=list)
    gaps: list[Arc] = field(default_factory=list)
    """Outcomes inside functions, not taken and not listed: reachable as far as anyone showed."""


@dataclass
class BranchReport:
    """What :func:`measure` found."""

    files: dict[str, FileBranches]
    stale: list[str] = field(default_factory=list)
    """Listed entries that match no untaken outcome (taken now, or the line moved)."""
    sources: dict[str, list[str]] = field(default_factory=dict, repr=False)
    """Source lines of each file, to quote a gap's decision."""

    @property
    def totals(self) -> dict[str, int]:
        """Sums over every file."""
        fs = self.files.values()
        return {
            "outcomes": sum(f.total for f in fs),
            "taken": sum(f.taken for f in fs),
            "import_time": sum(f.import_time for f in fs),
            "unreachable": sum(len(f.unreachable) for f in fs),
            "gaps": sum(len(f.gaps) for f in fs),
            "stale": len(self.stale),
        }

    def gap_lines(self) -> list[str]:
        """Every gap as ``file:line->to  code`` (``to`` is ``exit`` for a return)."""
        out = []
        for name in sorted(self.files):
            lines = self.sources.get(name, [])
            for a, b in sorted(self.files[name].gaps):
                code = lines[a - 1].strip() if a - 1 < len(lines) else ""
                out.append(f"{name}:{a}->{b if b > 0 else 'exit'}  {code}")
        return out

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form (gaps and listed outcomes as ``[from, to]`` pairs)."""
        return {
            "totals": self.totals,
            "stale": self.stale,
            "files": {
                n: {
                    "outcomes": f.total,
                    "taken": f.taken,
                    "import_time": f.import_time,
                    "unreachable": [list(a) for a in f.unreachable],
                    "gaps": [list(a) for a in f.gaps],
                }
                for n, f in sorted(self.files.items())
            },
        }


def measure(run: Callable[[], T], unreachable_file: Path = UNREACHABLE_FILE) -> tuple[T, BranchReport]:
    """Run ``run()`` under coverage.py (branch=True, kvspec and kvimpl only).

    Raises:
        ImportError: coverage.py is not installed (``pip install coverage``).
    """
    import coverage  # noqa: PLC0415 - an optional dependency, needed only here

    cov = coverage.Coverage(branch=True, source_pkgs=list(PACKAGES), data_file=None, config_file=False)
    cov.start()
    try:
        result = run()
    finally:
        cov.stop()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "coverage.json"
        cov.json_report(outfile=str(out))
        raw = json.loads(out.read_text())
    return result, build_report(raw, load_unreachable(unreachable_file))


def load_unreachable(path: Path = UNREACHABLE_FILE) -> list[Unreachable]:
    """The listed outcomes (``[[outcome]]`` tables: file, line, to, code, why)."""
    if not path.exists():
        return []
    entries = tomllib.loads(path.read_text()).get("outcome", [])
    return [Unreachable(e["file"], int(e["line"]), int(e["to"]), e["code"], e["why"]) for e in entries]


def build_report(raw: dict[str, Any], listed: list[Unreachable]) -> BranchReport:
    """Turn coverage.py's JSON report into a :class:`BranchReport`."""
    files: dict[str, FileBranches] = {}
    sources: dict[str, list[str]] = {}
    untaken: dict[tuple[str, Arc], None] = {}
    for path, data in raw["files"].items():
        name = package_relative(path)
        if name is None:
            continue
        text = Path(path).read_text()
        sources[name] = text.splitlines()
        in_functions = function_lines(text)
        fb = files[name] = FileBranches(name, total=data["summary"]["num_branches"])
        fb.taken = data["summary"]["covered_branches"]
        for a, b in data["missing_branches"]:
            if a not in in_functions:
                fb.import_time += 1
                continue
            untaken[(name, (a, b))] = None
    matched: set[tuple[str, Arc]] = set()
    stale: list[str] = []
    for e in listed:
        key = (e.file, (e.line, e.to))
        code = sources.get(e.file, [])[e.line - 1].strip() if e.line - 1 < len(sources.get(e.file, [])) else None
        if key in untaken and code == e.code:
            matched.add(key)
        else:
            why = "taken in this run" if code == e.code else f"line {e.line} now reads {code!r}"
            stale.append(f"{e.file}:{e.line}->{e.to} ({e.code}): {why}")
    for name, arc in untaken:
        target = files[name].unreachable if (name, arc) in matched else files[name].gaps
        target.append(arc)
    return BranchReport(files, stale, sources)


def package_relative(path: str) -> str | None:
    """``.../spec/kvspec/pool.py`` -> ``kvspec/pool.py`` (None outside the measured packages)."""
    parts = Path(path).parts
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in PACKAGES:
            return "/".join(parts[i:])
    return None


def function_lines(text: str) -> set[int]:
    """Lines inside a function or lambda body (where a decision runs after import)."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            end = node.end_lineno or node.lineno
            lines.update(range(node.lineno, end + 1))
    return lines
