"""Generic mutants of kvimpl (mutmut), killed by kvref's lockstep kill test.

``kvref mutants`` (or ``ci/mutants.sh``) stages kvimpl for mutmut, runs
``mutmut run --max-children 1`` with ``tests/mutation`` as the kill test,
and writes ``docs/reports/mutants.md`` (a table and a summary) and
``docs/reports/mutants.json`` (one row per mutant: status, seconds, the kill test
and the trace length).

NOTE: why a staging folder. mutmut 3 names a mutant after its file path
relative to the folder it runs in (stripping only ``src.``), records test hits
under the module's import name, and removes that folder from ``sys.path``.
Run at the repository root, our three source roots break all three: the
mutants would be named ``impl.kvimpl...`` while the tests hit ``kvimpl...``
(mutmut stops: "no recorded key matches any mutant key"), and ``kvref``
(imported from the root) could no longer be imported. So the runner copies
``impl/kvimpl`` to ``<workdir>/src/kvimpl`` and ``tests/mutation`` to
``<workdir>/tests/mutation``, writes a ``pyproject.toml`` there holding the
repository's ``[tool.mutmut]`` table, and runs mutmut in ``<workdir>``;
``kvspec`` and ``kvref`` still come from the editable install. impl/ is never
touched. Results are cached in ``<workdir>/mutants`` (mutmut's own cache) and
thrown away whenever kvimpl or the kill test changes.

Equivalent mutants and known gaps are listed, with reasons, in
``kvref/mutants_triage.toml`` keyed by mutmut's mutant name.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import difflib
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import tomllib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvref.adapters import load_factory
from kvref.hypothesis_compat import seed_machine
from kvref.lockstep import LockstepFailure, RunStats
from kvref.shapes import SHAPES
from kvref.stateful import MachineSetup, make_lockstep_machine
from kvspec.profiles import VLLM_0_25_1

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("block_pool", "single_type_kv_cache_manager", "kv_cache_coordinator", "kv_cache_manager", "block_table")
"""kvimpl's modules in the order they are mutated (the core first)."""
CORE = MODULES[:4]
TRIAGE = Path(__file__).with_name("mutants_triage.toml")
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
KILL_EXAMPLES = 12
"""Lockstep machine runs per shape in the kill test (each up to ``KILL_STEPS`` rules)."""
KILL_STEPS = 50
KILL_SEED = 20_251_129
"""Hypothesis seed of the kill test's lockstep run for the first shape (+ the shape's index)."""


@dataclass(frozen=True)
class Triage:
    """Mutants judged equivalent (name -> reason) and known gaps (name -> what would catch it)."""

    equivalent: dict[str, str]
    gaps: dict[str, str]
    notes: str = ""


def main(argv: Sequence[str] | None = None) -> int:
    """``kvref mutants``: run mutmut over kvimpl and write the reports."""
    args = build_parser(argparse.ArgumentParser(prog="kvref mutants")).parse_args(argv)
    return run(args)


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``kvref mutants``'s options to ``parser`` (shared with the CLI)."""
    parser.add_argument(
        "--modules",
        default=",".join(CORE),
        help=f"comma-separated kvimpl modules to mutate, in order (default: {','.join(CORE)}; also: block_table)",
    )
    parser.add_argument("--workdir", type=Path, default=ROOT / "build" / "mutmut", help="mutmut's staging folder")
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "reports" / "mutants.json")
    parser.add_argument("--markdown", type=Path, default=ROOT / "docs" / "reports" / "mutants.md")
    parser.add_argument("--triage", type=Path, default=TRIAGE)
    parser.add_argument("--fresh", action="store_true", help="drop mutmut's cached results first")
    parser.add_argument("--report-only", action="store_true", help="only re-read the results and rewrite the reports")
    parser.add_argument("--max-children", type=int, default=1, help="parallel mutmut workers (default 1)")
    parser.add_argument(
        "--shrink",
        type=float,
        default=60.0,
        help="seconds to shrink each lockstep kill's failing run to a minimal trace (0: skip)",
    )
    parser.add_argument("names", nargs="*", help="rerun only these mutants (mutmut names or globs)")
    return parser


def run(args: argparse.Namespace) -> int:
    """Stage, run mutmut (unless ``--report-only``), collect and report."""
    modules = [m.strip() for m in args.modules.split(",") if m.strip()]
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        print(f"kvref mutants: unknown kvimpl modules {unknown}; choose from {', '.join(MODULES)}", file=sys.stderr)
        return 2
    work: Path = args.workdir.resolve()
    seconds = None
    if not args.report_only:
        if shutil.which("mutmut", path=str(Path(sys.executable).parent)) is None:
            print("kvref mutants: mutmut is not installed (pip install -e '.[dev]')", file=sys.stderr)
            return 2
        tests_changed = stage(work, modules, fresh=args.fresh)
        names = list(args.names)
        if tests_changed and not names:
            # mutmut given names runs only those: name the unchecked ones too.
            names = [r["name"] for r in collect(work, modules) if r["status"] not in DETECTED]
            print(f"kvref mutants: the kill test changed; running the {len(names)} mutants it has not detected")
        start = time.monotonic()
        rc = run_mutmut(work, args.max_children, names)
        seconds = round(time.monotonic() - start, 1)
        if rc not in (0, 1):
            print(f"kvref mutants: mutmut exited with {rc}; see {work / 'mutmut.log'}", file=sys.stderr)
            return rc
    rows = collect(work, MODULES)  # everything mutmut has results for, not only this run's modules
    if not rows:
        print(f"kvref mutants: no results under {work / 'mutants'}", file=sys.stderr)
        return 2
    previous = json.loads(args.json.read_text()).get("mutants", []) if args.json.exists() else []
    add_diffs(work, rows, {r["name"]: r["diff"] for r in previous if r.get("diff")})
    if args.shrink > 0:
        shrink(work, rows, args.shrink)
    triage = load_triage(args.triage)
    apply_triage(rows, triage)
    summary = summarize(rows, [m for m in MODULES if any(r["module"] == m for r in rows)], seconds, args)
    summary["modules_run"] = modules
    summary["notes"] = triage.notes
    summary["kvimpl_sha256"] = {
        m: hashlib.sha256((work / "src" / "kvimpl" / f"{m}.py").read_bytes()).hexdigest()[:12]
        for m in summary["modules"]
    }
    args.json.write_text(json.dumps({"summary": summary, "mutants": rows}, indent=1, ensure_ascii=False) + "\n")
    write_markdown(rows, summary, args.markdown)
    print(
        f"kvref mutants: {summary['total']} mutants, {summary['killed']} killed, {summary['timeout']} timeouts, "
        f"{summary['survived']} survived ({summary['equivalent']} equivalent), score {summary['score']}",
    )
    return 0


def lockstep_kill(
    shape: str,
    failure_dir: Path,
    shrink: bool = False,
    seed_offset: int = 0,
    examples: int = KILL_EXAMPLES,
    skip_rules: Sequence[str] = (),
) -> None:
    """The kill test's lockstep stage for one shape: kvspec and kvimpl in
    lockstep over ``KILL_EXAMPLES`` seeded machine runs.

    ``skip_rules`` names machine rules (or helpers) made no-ops (for configurations they do
    not fit). Without ``shrink`` (the kill test) the first failing run is reported as it
    is; with it (the runner, after mutmut) Hypothesis shrinks it first. Either
    way the failing history is in ``failure_dir`` (see :class:`kvref.lockstep.Lockstep`).

    Raises:
        LockstepFailure: On the first difference.
    """
    names = [s.name for s in SHAPES]
    shapes = tuple(s for s in SHAPES if s.name == shape)
    setup = MachineSetup(
        [load_factory("spec"), load_factory("impl")], RunStats(), failure_dir, shapes=shapes, profile=VLLM_0_25_1
    )
    machine = make_lockstep_machine(setup)
    if skip_rules:  # a plain method shadows the rule of the same name
        machine = type(machine.__name__, (machine,), dict.fromkeys(skip_rules, _not_a_rule))
    seed_machine(machine, KILL_SEED + names.index(shape) + seed_offset)
    phases = [Phase.explicit, Phase.generate, *([Phase.shrink] if shrink else [])]
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=KILL_STEPS,
            deadline=None,
            database=None,
            print_blob=False,
            report_multiple_bugs=False,
            suppress_health_check=list(HealthCheck),
            phases=phases,
        ),
    )


def _not_a_rule(*args: object, **kwargs: object) -> None:
    """Stands in for a machine rule that a configuration cannot take."""


# --- staging and running ----------------------------------------------------------------------


def stage(work: Path, modules: Sequence[str], fresh: bool) -> bool:
    """Copy kvimpl and the kill test into ``work``; write its pyproject.toml.

    mutmut's cache (``work/mutants``) is dropped when ``fresh`` or when the
    mutmut settings changed; a kvimpl module that changed since it was staged
    loses its mutants and results (mutmut makes them again), the others keep
    theirs. Returns whether the kill test changed since the last run (then
    the mutants it did not detect must run again: a kill stands, the test only
    grows).
    """
    src, tests = ROOT / "impl" / "kvimpl", ROOT / "tests" / "tools" / "mutation"
    config = dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"])
    config_stamp, code_stamp, test_stamp = work / "config.json", work / "kvimpl.json", work / "kill-test.sha256"
    config_text = json.dumps(config, sort_keys=True)
    if fresh or not config_stamp.exists() or config_stamp.read_text() != config_text:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    code = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(src.glob("*.py"))}
    old = json.loads(code_stamp.read_text()) if code_stamp.exists() else {}
    for name in sorted(set(old) | set(code)):
        if old.get(name) != code.get(name):
            for stale in (work / "mutants" / "src" / "kvimpl").glob(f"{name}*"):
                stale.unlink()
            for record in (work / "records").glob(f"kvimpl.{name[:-3]}.*"):
                record.unlink()
    for m in modules:
        # mutmut keeps a plain copy of a module it was not asked to mutate: drop it, and drop
        # mutmut's test-coverage stats, which never saw this module's trampolines.
        copied = work / "mutants" / "src" / "kvimpl" / f"{m}.py"
        if copied.exists() and not copied.with_name(f"{m}.py.meta").exists():
            copied.unlink()
            (work / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    # The kill test reads the trace corpora from the repository: they are part of it.
    test = _fingerprint([tests, ROOT / "traces" / "golden", ROOT / "traces" / "directed"])
    tests_changed = test_stamp.exists() and test_stamp.read_text() != test
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for source, target in ((src, work / "src" / "kvimpl"), (tests, work / "tests" / "mutation")):
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target, ignore=ignore)
    config["only_mutate"] = [f"src/kvimpl/{m}.py" for m in modules]
    lines = ["# Written by kvtools.mutants from the repository's [tool.mutmut]; do not edit.", "[tool.mutmut]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in config.items()]
    lines += [
        "",
        "[tool.pytest.ini_options]",
        'addopts = ["--import-mode=importlib", "-p", "no:cacheprovider", "-p", "no:randomly"]',
        "",
    ]
    (work / "pyproject.toml").write_text("\n".join(lines))
    config_stamp.write_text(config_text)
    code_stamp.write_text(json.dumps(code, indent=1) + "\n")
    test_stamp.write_text(test)
    return tests_changed


def _fingerprint(paths: Sequence[Path]) -> str:
    digest = hashlib.sha256()
    for base in paths:
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.suffix in (".py", ".jsonl"))
        for path in files:
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def run_mutmut(work: Path, max_children: int, names: Sequence[str]) -> int:
    """``mutmut run`` in ``work``; its (spinner-heavy) output goes to ``work/mutmut.log``."""
    exe = shutil.which("mutmut", path=str(Path(sys.executable).parent)) or "mutmut"
    env = {
        **os.environ,
        "KVREF_MUTANT_RECORDS": str(work / "records"),
        "KVREF_MUTANT_TRACES": str(work / "traces"),
        "PYTHONHASHSEED": "0",
    }
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            (work / "records" / f"{name}.json").unlink()
    with (work / "mutmut.log").open("w") as log:
        cmd = [exe, "run", "--max-children", str(max_children), *names]
        return subprocess.run(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, check=False).returncode


# --- results ----------------------------------------------------------------------------------


def collect(work: Path, modules: Sequence[str]) -> list[dict[str, Any]]:
    """One row per mutant of ``modules`` from mutmut's meta files and the kill records."""
    rows: list[dict[str, Any]] = []
    for module in modules:
        meta_path = work / "mutants" / "src" / "kvimpl" / f"{module}.py.meta"
        if not meta_path.exists():
            continue
        meta = json.loads(meta_path.read_text())
        for name, code in sorted(meta["exit_code_by_key"].items(), key=lambda kv: _natural(kv[0])):
            status = "not checked" if code is None else STATUS.get(code, "suspicious")
            record_path = work / "records" / f"{name}.json"
            record = json.loads(record_path.read_text()) if record_path.exists() else {}
            duration = meta["durations_by_key"].get(name)
            rows.append(
                {
                    "name": name,
                    "module": module,
                    "function": name.split(".", 2)[-1].rpartition("__mutmut_")[0],
                    "status": status,
                    "exit_code": code,
                    "seconds": None if duration is None else round(float(duration), 2),
                    "killed_by": record.get("test") if status == "killed" else None,
                    "stage": record.get("stage") if status == "killed" else None,
                    "trace_ops": record.get("trace_ops") if status == "killed" else None,
                    "message": record.get("message") if status == "killed" else None,
                }
            )
    return rows


def shrink(work: Path, rows: list[dict[str, Any]], budget: float) -> None:
    """Shrink the failing run of every lockstep kill (cached in ``work/shrunk``).

    Each mutant is re-run outside mutmut in a child process with
    ``MUTANT_UNDER_TEST`` set and mutmut's copy of kvimpl first on the path,
    with Hypothesis' shrink phase on, for at most ``budget`` seconds.
    """
    code = (
        "import sys; from pathlib import Path; from kvtools.mutants import shrink_child; "
        "sys.exit(shrink_child(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])))"
    )
    mutated = work / "mutants" / "src"
    for row in rows:
        if row["stage"] != "lockstep" or not str(row["killed_by"]).startswith("test_lockstep["):
            continue  # the edge-configuration runs live in the kill test, not here: left unshrunk
        cache = work / "shrunk" / f"{row['name']}.json"
        if cache.exists():
            row.update(json.loads(cache.read_text()))
            continue
        shape = row["killed_by"].partition("[")[2].rstrip("]")
        env = {
            **os.environ,
            "MUTANT_UNDER_TEST": row["name"],
            "PYTHONHASHSEED": "0",
            "PYTHONPATH": os.pathsep.join(p for p in (str(mutated), os.environ.get("PYTHONPATH", "")) if p),
        }
        out = work / "shrunk" / row["name"]
        cmd = [sys.executable, "-c", code, shape, str(out), str(mutated)]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=budget, check=False)
        except subprocess.TimeoutExpired:
            result: dict[str, Any] = {"shrunk_trace_ops": None, "shrink": f"not done in {budget:g} s"}
        else:
            last = (proc.stdout.strip().splitlines() or ["{}"])[-1]
            result = json.loads(last) if last.startswith("{") else {"shrink": f"child failed: {proc.stderr[-300:]}"}
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(result) + "\n")
        row.update(result)


def shrink_child(shape: str, failure_dir: Path, mutated: Path) -> int:
    """In the child process of :func:`shrink`: rerun the lockstep stage with
    shrinking and print the shrunk trace's length as JSON."""
    import kvimpl  # noqa: PLC0415 - must come from mutmut's copy, checked here

    if not Path(kvimpl.__file__).resolve().is_relative_to(mutated.resolve()):
        print(json.dumps({"shrink": f"kvimpl was imported from {kvimpl.__file__}, not from {mutated}"}))
        return 1
    try:
        lockstep_kill(shape, failure_dir, shrink=True)
    except LockstepFailure as exc:
        path = exc.trace_path
        ops = len(path.read_text().splitlines()) - 1 if path and path.exists() else None
        print(json.dumps({"shrunk_trace_ops": ops, "shrunk_trace": str(path) if path else None}))
        return 0
    print(json.dumps({"shrink": "the lockstep run did not fail again outside mutmut"}))
    return 1


def _natural(name: str) -> tuple[str, int]:
    head, _, number = name.rpartition("__mutmut_")
    return head, int(number) if number.isdigit() else 0


def add_diffs(work: Path, rows: list[dict[str, Any]], known: dict[str, str]) -> None:
    """The mutation (changed lines) of every mutant that was not detected,
    read from mutmut's mutated module (the same text ``mutmut show`` prints);
    ``known`` (the last report's diffs) covers a module mutmut has since
    replaced by its plain copy (it does so when it is not asked to mutate it)."""
    functions: dict[str, dict[str, str]] = {}
    for row in rows:
        if row["status"] in (*DETECTED, "not checked"):
            continue
        module = row["module"]
        if module not in functions:
            path = work / "mutants" / "src" / "kvimpl" / f"{module}.py"
            text = path.read_text()
            lines = text.splitlines()
            functions[module] = {
                node.name: "\n".join(lines[node.lineno - 1 : node.end_lineno])
                for node in ast.walk(ast.parse(text))
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and "__mutmut_" in node.name
            }
        local = row["name"].rsplit(".", 1)[-1]
        mangled = local.rpartition("__mutmut_")[0]
        orig = functions[module].get(f"{mangled}__mutmut_orig", "").splitlines()[1:]
        mutant = functions[module].get(local, "").splitlines()[1:]
        if not orig and row["name"] in known:
            row["diff"] = known[row["name"]]
            continue
        diff = difflib.unified_diff(orig, mutant, lineterm="", n=0)
        row["diff"] = "\n".join(
            ln.strip() if ln[:1] == " " else ln[0] + " " + ln[1:].strip()
            for ln in diff
            if ln[:1] in "+-" and not ln.startswith(("+++", "---"))
        )


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
        "table says how many were checked), each run against",
        "the kill test `tests/mutation/test_kill.py`, which stops at the first difference from kvspec: the directed",
        "traces (`traces/directed`: boundary values, caller errors, protocol defaults, pool-size sweeps) and the",
        "golden traces replayed on kvimpl (kvspec's recorded outputs and view digests, kvimpl's invariants after",
        "every step), again through the batched step API (batches of one, and runs of steps merged into",
        "multi-request batches) and with CPU device block tables; a seeded scheduler loop whose every step is one",
        "multi-request `allocate_slots_batch`, checked against kvspec's sequential calls; then seeded",
        "kvspec-vs-kvimpl lockstep runs on configurations the machine never or rarely draws (block size 1, two",
        "sink groups, pools of 1 to 3 and of at most 10 blocks) and on every configuration shape. Regenerate",
        "with `kvref mutants`",
        "(or `ci/mutants.sh`); equivalent mutants are triaged, with the reason, in `kvref/mutants_triage.toml`.",
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


if __name__ == "__main__":
    raise SystemExit(main())
