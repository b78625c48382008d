"""The mutants report: triage, summary and ``docs/reports/mutants.md``.

Equivalent mutants and known gaps are listed, with reasons, in
``tools/kvtools/mutants_triage.toml`` keyed by mutmut's mutant name; a
mutant counts as detected when it is killed or times out.
"""

from __future__ import annotations

import argparse
import statistics
import tomllib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRIAGE = Path(__file__).resolve().parents[1] / "mutants_triage.toml"
STATUS = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    37: "caught by type check",
    -24: "timeout",
    24: "timeout",
    152: "timeout",
    255: "timeout",
}
"""mutmut 3.8's exit codes (``mutmut.stats.status_by_exit_code``); others are "suspicious"."""
DETECTED = ("killed", "timeout")


@dataclass(frozen=True)
class Triage:
    """Mutants judged equivalent (name -> reason) and known gaps (name -> what would catch it)."""

    equivalent: dict[str, str]
    gaps: dict[str, str]
    notes: str = ""


def load_triage(path: Path) -> Triage:
    """The triage file (missing: nothing triaged)."""
    if not path.exists():
        return Triage({}, {}, "")
    data = tomllib.loads(path.read_text())
    return Triage(dict(data.get("equivalent", {})), dict(data.get("gap", {})), str(data.get("notes", "")))


def apply_triage(rows: list[dict[str, Any]], triage: Triage) -> None:
    """Mark survivors listed as equivalent or as known gaps (a killed mutant listed there is flagged stale)."""
    for row in rows:
        name = row["name"]
        if name in triage.equivalent:
            row["triage"] = "equivalent" if row["status"] not in DETECTED else "stale: now killed"
            row["reason"] = triage.equivalent[name]
        elif name in triage.gaps:
            row["triage"] = "gap" if row["status"] not in DETECTED else "stale: now killed"
            row["reason"] = triage.gaps[name]


def summarize(
    rows: Sequence[dict[str, Any]], modules: Sequence[str], seconds: float | None, args: argparse.Namespace
) -> dict[str, Any]:
    """Totals, per-module counts, the score after triage and the median time to kill."""
    counts = Counter(r["status"] for r in rows)
    equivalent = sum(1 for r in rows if r.get("triage") == "equivalent")
    detected = counts["killed"] + counts["timeout"]
    checked = len(rows) - counts["not checked"]
    scored = checked - equivalent
    kill_times = [r["seconds"] for r in rows if r["status"] == "killed" and r["seconds"] is not None]
    trace_ops = [r["trace_ops"] for r in rows if r["status"] == "killed" and r["trace_ops"] is not None]
    shrunk = [r["shrunk_trace_ops"] for r in rows if r.get("shrunk_trace_ops") is not None]
    present = [m for m in modules if any(r["module"] == m for r in rows)]
    per_module = {m: dict(Counter(r["status"] for r in rows if r["module"] == m)) for m in present}
    return {
        "tool": "mutmut 3.8.1",
        "modules": list(per_module),
        "modules_requested": list(modules),
        "per_module": per_module,
        "total": len(rows),
        "killed": counts["killed"],
        "timeout": counts["timeout"],
        "survived": counts["survived"],
        "no_tests": counts["no tests"],
        "not_checked": counts["not checked"],
        "other": len(rows) - sum(counts[s] for s in ("killed", "timeout", "survived", "no tests", "not checked")),
        "equivalent": equivalent,
        "gaps": sum(1 for r in rows if r.get("triage") == "gap"),
        "untriaged": sum(1 for r in rows if r["status"] not in (*DETECTED, "not checked") and "triage" not in r),
        "score": f"{detected}/{scored} = {100 * detected / scored:.1f}%" if scored else "-",
        "raw_score": f"{detected}/{checked} = {100 * detected / checked:.1f}%" if checked else "-",
        "checked": checked,
        "score_by_module": {m: _module_score(rows, m) for m in present},
        "median_seconds_to_kill": round(statistics.median(kill_times), 2) if kill_times else None,
        "median_trace_ops": statistics.median(trace_ops) if trace_ops else None,
        "lockstep_kills_shrunk": len(shrunk),
        "median_shrunk_trace_ops": statistics.median(shrunk) if shrunk else None,
        "killed_by_stage": dict(Counter(r["stage"] or "unrecorded" for r in rows if r["status"] == "killed")),
        "wall_seconds": seconds,
        "max_children": args.max_children,
    }


def _module_score(rows: Sequence[dict[str, Any]], module: str) -> str:
    mine = [r for r in rows if r["module"] == module and r["status"] != "not checked"]
    detected = sum(1 for r in mine if r["status"] in DETECTED)
    scored = len(mine) - sum(1 for r in mine if r.get("triage") == "equivalent")
    return f"{detected}/{scored} = {100 * detected / scored:.1f}%" if scored else "-"


def write_markdown(rows: Sequence[dict[str, Any]], s: dict[str, Any], path: Path) -> None:
    """docs/reports/mutants.md: summary, per-module counts, survivors with their triage, then every mutant."""
    lines = [
        "# Generic mutants of kvimpl",
        "",
        f"The mutants {s['tool']} makes of kvimpl's {', '.join(f'`{m}.py`' for m in s['modules'])} (the module",
        "table says how many were checked), each run against the kill test `tests/tools/mutation/test_kill.py`,",
        "which stops at the first difference from kvspec: the directed traces (`traces/vllm-0.25.1/directed`:",
        "boundary values, caller errors, protocol defaults, pool-size sweeps) and the golden traces replayed on",
        "kvimpl (kvspec's recorded outputs and view digests, kvimpl's invariants after every step), again through",
        "the batched step API (batches of one, and runs of steps merged into multi-request batches) and with CPU",
        "device block tables;",
        "a seeded scheduler loop whose every step is one multi-request `allocate_slots_batch`, checked against",
        "kvspec's sequential calls; then seeded kvspec-vs-kvimpl lockstep runs on configurations the machine never",
        "or rarely draws (block size 1, two sink groups, pools of 1 to 3 and of at most 10 blocks) and on every",
        "configuration shape. Regenerate with `python -m kvtools mutants` (or `ci/mutants.sh`); equivalent mutants",
        "are triaged, with the reason, in `tools/kvtools/mutants_triage.toml`.",
        "A mutant counts as detected when it is killed or times out (mutmut's CPU limit: an endless loop).",
        "",
        "## Summary",
        "",
        f"- mutants: **{s['total']}** ({', '.join(f'{m}: {sum(c.values())}' for m, c in s['per_module'].items())})",
        f"- killed: **{s['killed']}**, timeouts (counted as detected): {s['timeout']}",
        f"- survived: {s['survived']}, never run by the kill test (mutmut: no tests): {s['no_tests']}, "
        f"not checked yet: {s['not_checked']}, other: {s['other']}",
        f"- equivalent (triaged, with reasons): {s['equivalent']}; known gaps: {s['gaps']}; "
        f"untriaged: {s['untriaged']}",
        f"- **score after triage: {s['score']}** (detected / (checked - equivalent)); raw: {s['raw_score']}"
        f" (detected / checked); {s['checked']} of {s['total']} mutants checked",
        f"- median time to kill: {s['median_seconds_to_kill']} s (mutmut's per-mutant wall time, 1 worker);"
        f" median trace length of the kills: {s['median_trace_ops']} operations",
        f"- kills by stage: {', '.join(f'{k} {v}' for k, v in sorted(s['killed_by_stage'].items()))}",
        f"- lockstep kills shrunk outside mutmut (`--shrink`): {s['lockstep_kills_shrunk']}, median "
        f"{s['median_shrunk_trace_ops']} operations (the others did not fail again in a fresh process, see the notes)",
        f"- wall time of this `mutmut run`: {s['wall_seconds']} s with {s['max_children']} worker(s)"
        if s["wall_seconds"] is not None
        else "- wall time: see the notes (this report was re-rendered from mutmut's cached results)",
        "- kvimpl as mutated (sha256 of each module, first 12 hex digits): "
        + ", ".join(f"`{m}.py` {h}" for m, h in s.get("kvimpl_sha256", {}).items()),
        "",
        "| module | mutants | killed | timeout | survived | no tests | not checked | score after triage |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for module, c in s["per_module"].items():
        kinds = ("killed", "timeout", "survived", "no tests", "not checked")
        cells = [str(sum(c.values())), *(str(c.get(k, 0)) for k in kinds), s["score_by_module"][module]]
        lines.append(f"| `{module}.py` | " + " | ".join(cells) + " |")
    if s.get("notes"):
        lines += ["", "## Notes", "", *s["notes"].strip().splitlines()]
    left = [r for r in rows if r["status"] not in (*DETECTED, "not checked")]
    lines += ["", "## Not killed", "", "| mutant | status | triage | mutation | reason |", "|---|---|---|---|---|"]
    for r in left:
        diff = _cell(r.get("diff", "")).replace("\n", "<br>")
        triage, reason = r.get("triage", "**untriaged**"), _cell(r.get("reason", ""))
        lines.append(f"| `{r['name']}` | {r['status']} | {triage} | {diff} | {reason} |")
    lines += [
        "",
        "## Every mutant",
        "",
        "Trace ops: for a replay kill, the golden-trace prefix up to the failing step; for a lockstep kill, the",
        "operations of the failing (unshrunk) lockstep run.",
        "",
        "| mutant | status | seconds | killed by | trace ops | shrunk ops |",
        "|---|---|---:|---|---:|---:|",
    ]
    for r in rows:
        ops = "" if r["trace_ops"] is None else str(r["trace_ops"])
        secs = "" if r["seconds"] is None else str(r["seconds"])
        shrunk = "" if r.get("shrunk_trace_ops") is None else str(r["shrunk_trace_ops"])
        lines.append(f"| `{r['name']}` | {r['status']} | {secs} | {r['killed_by'] or ''} | {ops} | {shrunk} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")
