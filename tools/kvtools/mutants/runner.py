"""The mutmut runner: stage kvimpl and the kill test, run mutmut, collect and shrink the results.

``python -m kvtools mutants`` (or ``ci/mutants.sh``) stages kvimpl for mutmut,
runs ``mutmut run --max-children 1`` with ``tests/tools/mutation`` as the kill
test, re-runs every lockstep kill with shrinking, and hands the rows to
:mod:`kvtools.mutants.report`, which writes ``docs/reports/mutants.md`` and
``docs/reports/mutants.json``.

NOTE: why a staging folder. mutmut 3 names a mutant after its file path
relative to the folder it runs in (stripping only ``src.``), records test hits
under the module's import name, and removes that folder from ``sys.path``.
Run at the repository root, our source roots break all three: the mutants
would be named ``impl.kvimpl...`` while the tests hit ``kvimpl...`` (mutmut
stops: "no recorded key matches any mutant key"), and ``kvref`` (imported
from the root) could no longer be imported. So the runner copies
``impl/kvimpl`` to ``<workdir>/src/kvimpl`` and ``tests/tools/mutation`` to
``<workdir>/tests/mutation``, writes a ``pyproject.toml`` there holding the
repository's ``[tool.mutmut]`` table, and runs mutmut in ``<workdir>``;
``kvspec``, ``kvref`` and ``kvtools`` (the kill test's lockstep stage,
:mod:`kvtools.killtest`) still come from the editable install. impl/ is
never touched. Results are cached in ``<workdir>/mutants`` (mutmut's own
cache) and thrown away whenever kvimpl or the kill test changes.
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
import subprocess
import sys
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvref.lockstep import LockstepFailure
from kvtools.killtest import lockstep_kill
from kvtools.mutants.report import (
    DETECTED,
    STATUS,
    TRIAGE,
    apply_triage,
    load_triage,
    summarize,
    write_markdown,
)

ROOT = Path(__file__).resolve().parents[3]
MODULES = ("block_pool", "single_type_kv_cache_manager", "kv_cache_coordinator", "kv_cache_manager", "block_table")
"""kvimpl's modules in the order they are mutated (the core first)."""
CORE = MODULES[:4]
KILL_TEST = (
    ROOT / "tests" / "tools" / "mutation",
    ROOT / "tools" / "kvtools" / "killtest.py",
    ROOT / "traces" / "vllm-0.25.1" / "golden",
    ROOT / "traces" / "vllm-0.25.1" / "directed",
)
"""Everything the kill test runs: its folder, its lockstep stage and the trace corpora it replays."""


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvtools mutants``: run mutmut over kvimpl and write the reports."""
    args = build_parser(argparse.ArgumentParser(prog="python -m kvtools mutants")).parse_args(argv)
    return run(args)


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the runner's options to ``parser``."""
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
        print(f"kvtools mutants: unknown kvimpl modules {unknown}; choose from {', '.join(MODULES)}", file=sys.stderr)
        return 2
    work: Path = args.workdir.resolve()
    seconds = None
    if not args.report_only:
        if shutil.which("mutmut", path=str(Path(sys.executable).parent)) is None:
            print("kvtools mutants: mutmut is not installed (pip install -e '.[dev]')", file=sys.stderr)
            return 2
        tests_changed = stage(work, modules, fresh=args.fresh)
        names = list(args.names)
        if tests_changed and not names:
            # mutmut given names runs only those: name the unchecked ones too.
            names = [r["name"] for r in collect(work, modules) if r["status"] not in DETECTED]
            print(f"kvtools mutants: the kill test changed; running the {len(names)} mutants it has not detected")
        start = time.monotonic()
        rc = run_mutmut(work, args.max_children, names)
        seconds = round(time.monotonic() - start, 1)
        if rc not in (0, 1):
            print(f"kvtools mutants: mutmut exited with {rc}; see {work / 'mutmut.log'}", file=sys.stderr)
            return rc
    rows = collect(work, MODULES)  # everything mutmut has results for, not only this run's modules
    if not rows:
        print(f"kvtools mutants: no results under {work / 'mutants'}", file=sys.stderr)
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
        f"kvtools mutants: {summary['total']} mutants, {summary['killed']} killed, {summary['timeout']} timeouts, "
        f"{summary['survived']} survived ({summary['equivalent']} equivalent), score {summary['score']}",
    )
    return 0


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
    # The kill test runs its lockstep stage from kvtools and reads the trace corpora from the
    # repository: they are part of it.
    test = _fingerprint(KILL_TEST)
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
        "import sys; from pathlib import Path; from kvtools.mutants.runner import shrink_child; "
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
        where = None if path is None else str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
        print(json.dumps({"shrunk_trace_ops": ops, "shrunk_trace": where}))  # repository-relative in the report
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
