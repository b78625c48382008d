"""The branch-coverage gate of CI: merged runs against the committed list of known gaps.

CI runs the impl-vs-spec lockstep once per semantics profile (and a few more
runs, :data:`kvtools.coverage.ci_runs`), each with ``--coverage-json``;
:func:`merge_runs` makes one report of them (an outcome is taken if any run
took it) and :func:`gate` compares its gaps with ``coverage_gaps.toml`` (next
to this module), the reachable outcomes nobody has covered or argued
unreachable yet. The list is a ratchet: a gap not in it fails the build (new
code whose branches the machine does not reach, or a generator change that
lost some), and so does a listed gap that a run took or that
``unreachable_branches.toml`` now lists (delete the entry), or whose line no
longer reads as recorded (the code moved: regenerate the list with
``python -m kvtools coverage --merge DIR --write-gaps``, or move the
entries with ``python -m kvtools coverage --relocate``). So the list only
shrinks, one reviewed commit at a time. The gate also fails when no run took
one of the configuration classes of :mod:`kvref.config_coverage`.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvref.config_coverage import missing

GAPS_FILE = Path(__file__).with_name("coverage_gaps.toml")
"""The known gaps of CI's merged seed-0 run."""

HEADER = """\
# Reachable branch outcomes of kvspec and kvimpl that CI's lockstep does not take yet (a ratchet).
#
# CI merges the branch reports of its impl-vs-spec locksteps at seed 0 (every semantics profile;
# `python -m kvtools coverage --ci-runs` lists them) and fails on a gap that is not listed here, on a
# listed gap that a run took or that kit/kvref/unreachable_branches.toml lists, and on an entry whose
# `code` no longer reads at `line` (tools/kvtools/coverage_gate.py). So this list only shrinks: take
# an outcome (a machine rule, a shape, a target) or argue it unreachable, then delete its entry.
# One [[gap]] per arc as coverage.py names it: `line` is the decision, `to` the line it goes to
# (negative: leaves the function starting at that line), `code` the decision's source line.
# Regenerate (after moving code): python -m kvtools coverage --merge DIR --write-gaps
"""

Sources = Callable[[str], list[str]]
"""Package-relative file name (``kvimpl/block_pool.py``) -> its source lines."""


@dataclass(frozen=True, order=True)
class KnownGap:
    """One listed gap: file (package-relative), arc, and the source line it leaves from."""

    file: str
    line: int
    to: int
    code: str


def merge_runs(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' branch reports as one: an outcome is a gap (or a listed
    outcome) only if no run took it, an entry is stale if any run found it
    stale; exit codes take the worst, seconds add up."""
    if len(reports) == 1:
        return reports[0]
    files: dict[str, dict[str, Any]] = {}
    for name in sorted({n for r in reports for n in r["files"]}):
        per = [r["files"][name] for r in reports if name in r["files"]]
        common = [{tuple(a) for a in d["gaps"]} for d in per]
        listed = [{tuple(a) for a in d["unreachable"]} for d in per]
        gaps, unreachable = set.intersection(*common), set.intersection(*listed)
        total, import_time = per[0]["outcomes"], min(d["import_time"] for d in per)
        files[name] = {
            "outcomes": total,
            "taken": total - import_time - len(gaps) - len(unreachable),
            "import_time": import_time,
            "unreachable": [list(a) for a in sorted(unreachable)],
            "gaps": [list(a) for a in sorted(gaps)],
        }
    stale = sorted({s for r in reports for s in r["stale"]})
    merged: dict[str, Any] = {
        "totals": totals_of(files, stale),
        "stale": stale,
        "files": files,
        "exit": max(r["exit"] for r in reports),
        "seconds": round(sum(r["seconds"] for r in reports), 1),
    }
    if any("config_properties" in r for r in reports):
        merged["config_properties"] = sorted({c for r in reports for c in r.get("config_properties", ())})
    return merged


def totals_of(files: dict[str, dict[str, Any]], stale: list[str]) -> dict[str, int]:
    """The sums of a report's files (the ``totals`` of a branch report)."""
    fs = files.values()
    return {
        "outcomes": sum(f["outcomes"] for f in fs),
        "taken": sum(f["taken"] for f in fs),
        "import_time": sum(f["import_time"] for f in fs),
        "unreachable": sum(len(f["unreachable"]) for f in fs),
        "gaps": sum(len(f["gaps"]) for f in fs),
        "stale": len(stale),
    }


def gaps_of(report: dict[str, Any], sources: Sources) -> list[KnownGap]:
    """A (merged) report's gaps as list entries, each with its decision's source line."""
    out = []
    for name, d in report["files"].items():
        src = sources(name)
        for a, b in d["gaps"]:
            out.append(KnownGap(name, a, b, src[a - 1].strip() if 0 < a <= len(src) else ""))
    return sorted(out)


def gate(report: dict[str, Any], known: Iterable[KnownGap], sources: Sources) -> list[str]:
    """Why a merged report fails the ratchet (empty: it passes).

    Fails on: a run that did not exit 0, a configuration class no run took
    (:data:`kvref.config_coverage.PROPERTIES`), a stale entry of
    ``unreachable_branches.toml``, a gap not in ``known``, a known gap that
    is no longer a gap (taken, or listed unreachable) and a known gap whose
    line no longer reads as recorded.
    """
    problems = [f"a lockstep run exited {report['exit']} (a divergence, or nothing checked)"] if report["exit"] else []
    if "config_properties" in report:  # reports of runs that recorded their configuration classes
        problems += [f"configuration class not taken by any run: {c}" for c in missing(report["config_properties"])]
    problems += [f"stale entry of kit/kvref/unreachable_branches.toml: {s}" for s in report["stale"]]
    gaps = {(g.file, g.line, g.to): g for g in gaps_of(report, sources)}
    listed: set[tuple[str, int, int]] = set()
    for k in sorted(known):
        key = (k.file, k.line, k.to)
        listed.add(key)
        src = sources(k.file)
        code = src[k.line - 1].strip() if 0 < k.line <= len(src) else None
        arc = f"{k.file}:{k.line}->{_to(k.to)}  {k.code}"
        if code != k.code:
            problems.append(f"stale known gap {arc}: line {k.line} now reads {code!r} (regenerate the list)")
        elif key not in gaps:
            problems.append(f"known gap closed {arc}: taken now (or listed unreachable); delete its entry")
    for key, g in sorted(gaps.items()):
        if key not in listed:
            problems.append(f"new gap {g.file}:{g.line}->{_to(g.to)}  {g.code}: take it or argue it unreachable")
    return problems


def load_gaps(path: Path = GAPS_FILE) -> list[KnownGap]:
    """The listed gaps (``[[gap]]`` tables: file, line, to, code); none if the file is absent."""
    if not path.exists():
        return []
    entries = tomllib.loads(path.read_text()).get("gap", [])
    return [KnownGap(e["file"], int(e["line"]), int(e["to"]), e["code"]) for e in entries]


def write_gaps(gaps: Iterable[KnownGap], path: Path = GAPS_FILE) -> None:
    """Write the list, sorted by file and arc (``code`` as a TOML basic string)."""
    parts = [HEADER]
    for g in sorted(gaps):
        code = json.dumps(g.code, ensure_ascii=False)  # a JSON string is a TOML basic string
        parts.append(f'\n[[gap]]\nfile = "{g.file}"\nline = {g.line}\nto = {g.to}\ncode = {code}\n')
    path.write_text("".join(parts))


def _to(to: int) -> str:
    return str(to) if to > 0 else "exit"


def relocate(path: Path, sources: Sources) -> list[str]:
    """Move each ``[[...]]`` entry of a reviewed outcome list (``unreachable_branches.toml`` or
    ``coverage_gaps.toml``) whose ``code`` no longer reads at ``line`` to a line that reads it,
    shifting ``to`` by the same amount (a negative ``to``, a function exit, names the function's
    first line and shifts with it). Where the code reads at several lines, the one whose shift is
    closest to that of the nearest entry of the same file that moved without doubt. Entries whose
    code is nowhere are left as they are, for a reviewer; the file's other text is kept. Returns
    one line per entry moved or lost."""
    text = path.read_text()
    blocks = re.split(r"(?=^\[\[)", text, flags=re.M)
    entries: list[tuple[str, int, int, str, list[int]] | None] = []
    certain: dict[str, list[tuple[int, int]]] = {}
    for block in blocks:
        fields = {m.group(1): m.group(0) for m in re.finditer(r"^(file|line|to|code) = .*$", block, flags=re.M)}
        if set(fields) != {"file", "line", "to", "code"}:
            entries.append(None)
            continue
        entry = tomllib.loads("\n".join(fields.values()))
        name, line, to, code = str(entry["file"]), int(entry["line"]), int(entry["to"]), str(entry["code"])
        lines = [s.strip() for s in sources(name)]
        hits = [i + 1 for i, s in enumerate(lines) if s == code]
        if line in hits:
            hits = [line]
        if len(hits) == 1:
            certain.setdefault(name, []).append((line, hits[0] - line))
        entries.append((name, line, to, code, hits))
    notes: list[str] = []
    out: list[str] = []
    for block, parsed in zip(blocks, entries, strict=True):
        if parsed is None or parsed[4] == [parsed[1]]:
            out.append(block)
            continue
        name, line, to, code, hits = parsed
        if not hits:
            notes.append(f"{name}:{line}: {code!r} is gone (review the entry)")
            out.append(block)
            continue
        known = certain.get(name, [])
        expected = min(known, key=lambda k: abs(k[0] - line))[1] if known else 0
        new = min(hits, key=lambda h: (abs(h - line - expected), h))
        shift = new - line
        new_to = to + shift if to > 0 else to - shift
        moved = re.sub(r"^line = .*$", f"line = {new}", block, count=1, flags=re.M)
        out.append(re.sub(r"^to = .*$", f"to = {new_to}", moved, count=1, flags=re.M))
        notes.append(f"{name}:{line}->{to} moved to {new}->{new_to}" + (" (of several)" if len(hits) > 1 else ""))
    path.write_text("".join(out))
    return notes
