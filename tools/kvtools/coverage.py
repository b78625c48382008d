"""``python -m kvtools coverage``: branch coverage of kvspec and kvimpl under the ci lockstep.

Runs ``kvref check --target T --against spec --profile ci --coverage`` once
per seed and target (``--targets``, default ``impl`` as CI runs it and
``impl-batch``, the pure-Python manager driven through its batch API, with
device tables, :mod:`kvref.adapters.impl_batch`) and merges each seed's
runs (an outcome is taken if any run took it); each run in its own process,
so that every seed starts from the same state and takes the same steps as it
does in CI. Then it writes
docs/reports/coverage.md and coverage.json: per seed the outcomes, taken,
listed unreachable (kit/kvref/unreachable_branches.toml) and gaps, and every
gap with its decision's source line.

``--check`` exits 1 when a seed leaves a gap or the list has a stale entry
(the target; see docs/reports/coverage.md for how far it is).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvref.branches import PACKAGES

ROOT = Path(__file__).resolve().parents[2]
REPORT_DIR = ROOT / "docs" / "reports"
DEFAULT_TARGETS = "impl,impl-batch"
"""What CI's lockstep runs (``impl``: the native core where it applies) and the batch API with device tables."""


def main(argv: list[str]) -> int:
    """Run the seeds, write the reports; with ``--check`` exit 1 on a gap."""
    parser = argparse.ArgumentParser(prog="python -m kvtools coverage")
    parser.add_argument("--seeds", default="0-4", help="seeds, e.g. 0-4 or 0,2 (default 0-4)")
    parser.add_argument(
        "--targets",
        default=DEFAULT_TARGETS,
        help=f"kvimpl targets, comma-separated, merged per seed (default {DEFAULT_TARGETS})",
    )
    parser.add_argument("--semantics", default=None, help="semantics profile (default: the newest)")
    parser.add_argument("--min-steps", type=int, default=None, help="override the ci profile's step goal")
    parser.add_argument("--out", type=Path, default=REPORT_DIR, help="where coverage.md and coverage.json go")
    parser.add_argument("--check", action="store_true", help="exit 1 when a seed leaves a gap or an entry is stale")
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    runs: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            per_target = [
                run_seed(seed, Path(tmp), args.semantics, args.min_steps, target) for target in args.targets.split(",")
            ]
            runs[seed] = merge_runs(per_target)
            t = runs[seed]["totals"]
            print(f"seed {seed}: {t['taken']}/{t['outcomes']} taken, {t['gaps']} gaps ({runs[seed]['seconds']:.0f} s)")
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"command": command_line(args), "seeds": {str(s): r for s, r in runs.items()}}
    (args.out / "coverage.json").write_text(json.dumps(summary, indent=1) + "\n")
    (args.out / "coverage.md").write_text(render_markdown(runs, command_line(args)))
    bad = [s for s, r in runs.items() if r["totals"]["gaps"] or r["totals"]["stale"] or r["exit"]]
    return 1 if args.check and bad else 0


def parse_seeds(text: str) -> list[int]:
    """``0-4`` -> [0, 1, 2, 3, 4]; ``0,2`` -> [0, 2]."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def merge_runs(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One seed's reports of several targets as one: an outcome is a gap (or a
    listed outcome) only if no run took it, an entry is stale if any run found
    it stale; exit codes and seconds add up."""
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
    fs = files.values()
    totals = {
        "outcomes": sum(f["outcomes"] for f in fs),
        "taken": sum(f["taken"] for f in fs),
        "import_time": sum(f["import_time"] for f in fs),
        "unreachable": sum(len(f["unreachable"]) for f in fs),
        "gaps": sum(len(f["gaps"]) for f in fs),
        "stale": len(stale),
    }
    return {
        "totals": totals,
        "stale": stale,
        "files": files,
        "exit": max(r["exit"] for r in reports),
        "seconds": round(sum(r["seconds"] for r in reports), 1),
    }


def run_seed(
    seed: int, tmp: Path, semantics: str | None, min_steps: int | None, target: str = "impl"
) -> dict[str, Any]:
    """One ``kvref check --coverage`` run; its branch report, exit code and seconds."""
    out = tmp / f"seed-{seed}-{target}.json"
    cmd = [sys.executable, "-m", "kvref", "check", "--target", target, "--against", "spec", "--profile", "ci",
           "--seed", str(seed), "--coverage-json", str(out)]  # fmt: skip
    if semantics:
        cmd += ["--semantics", semantics]
    if min_steps:
        cmd += ["--min-steps", str(min_steps)]
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=tmp)
    seconds = time.monotonic() - start
    if not out.exists():
        raise SystemExit(f"seed {seed}: kvref check wrote no branch report (exit {done.returncode}):\n{done.stderr}")
    report: dict[str, Any] = json.loads(out.read_text())
    report.update(exit=done.returncode, seconds=round(seconds, 1))
    return report


def command_line(args: argparse.Namespace) -> str:
    """How to regenerate the report."""
    extra = f" --targets {args.targets}" if args.targets != DEFAULT_TARGETS else ""
    extra += f" --semantics {args.semantics}" if args.semantics else ""
    extra += f" --min-steps {args.min_steps}" if args.min_steps else ""
    return f"python -m kvtools coverage --seeds {args.seeds}{extra}"


def render_markdown(runs: dict[int, dict[str, Any]], command: str) -> str:
    """docs/reports/coverage.md."""
    lines = [
        "# Branch coverage of kvspec and kvimpl under the ci lockstep",
        "",
        f"Generated by `{command}` (kvimpl against kvspec, `--profile ci`, one process per seed and",
        "target: `impl` as CI runs it, and `impl-batch`, the batch API and device tables; a seed's runs merged).",
        "An *outcome* is one arc out of a decision, as coverage.py (branch=True) counts them. *At import*:",
        "decisions at module or class level, which ran before measurement started. *Listed*: outcomes",
        "argued unreachable through the public API in `kit/kvref/unreachable_branches.toml`. A *gap* is",
        "an outcome inside a function that the run did not take and nobody showed unreachable: a fault",
        "behind it is invisible to this run.",
        "",
        "| seed | outcomes | taken | at import | listed | gaps | stale entries | exit | seconds |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for seed, r in sorted(runs.items()):
        t = r["totals"]
        lines.append(f"| {seed} | {t['outcomes']} | {t['taken']} | {t['import_time']} | {t['unreachable']} | "
                     f"{t['gaps']} | {t['stale']} | {r['exit']} | {r['seconds']:.0f} |")  # fmt: skip
    first = min(runs)
    gap_sets = [{(f, tuple(a)) for f, d in r["files"].items() for a in d["gaps"]} for r in runs.values()]
    everywhere = set.intersection(*gap_sets) if gap_sets else set()
    lines += ["", f"Gaps at every seed: {len(everywhere)}.", "", f"## Gaps at seed {first}, by file", ""]
    lines += ["| file | outcomes | taken | gaps |", "|---|---:|---:|---:|"]
    files = runs[first]["files"]
    for name, d in sorted(files.items()):
        if d["gaps"]:
            lines.append(f"| {name} | {d['outcomes']} | {d['taken']} | {len(d['gaps'])} |")
    lines += ["", "Every gap (`line -> to`; `exit` = leaves the function), with its decision:", "", "```"]
    for name, d in sorted(files.items()):
        src = _source(name)
        for a, b in sorted(d["gaps"]):
            code = src[a - 1].strip() if 0 < a <= len(src) else ""
            lines.append(f"{name}:{a} -> {b if b > 0 else 'exit'}  {code}")
    lines += ["```", ""]
    for r in runs.values():
        lines += [f"stale: {s}" for s in r["stale"]]
    return "\n".join(lines) + "\n"


def _source(name: str) -> list[str]:
    root = {"kvspec": ROOT / "spec", "kvimpl": ROOT / "impl"}
    pkg = name.split("/", 1)[0]
    path = root[pkg] / name if pkg in PACKAGES else Path(name)
    return path.read_text().splitlines() if path.exists() else []
