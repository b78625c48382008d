"""``python -m kvtools cmutants``: plant, build and hunt mutants of kvimpl's native core.

For every selected mutant (:mod:`kvtools.cmutants.generate`) the runner
recompiles the mutated file, relinks the extension into a staging copy of
kvimpl (:mod:`kvtools.cmutants.build`) and hunts it in child processes
(:mod:`kvtools.cmutants.child`), each under a wall-clock guard:

1. the fast tier: kvimpl's unit tests that drive the native core
   (:data:`FAST_TESTS`: ``pytest tests/impl/test_native.py
   tests/impl/test_every_operation.py tests/impl/test_validation.py ... -x``,
   Hypothesis seed 0);
2. for a survivor, the memcheck tier (:mod:`kvtools.cmutants.memcheck`): the
   same tests on the mutant built with AddressSanitizer and UBSan; a
   sanitizer report kills (``--no-memcheck`` leaves the tier out);
3. for a survivor, the lockstep: ``kvref check --target T --against spec
   --profile ci --seed 0 --budget 60`` (``--semantics S`` with ``--semantics``) for T in ``impl-native``,
   ``impl-array``, ``impl-batch-native``,
   stopping at the first kill.

Each tier runs only where the mutant's function is on its path
(:mod:`kvtools.cmutants.reach`; the memcheck tier runs the fast tier's tests,
so it has the fast tier's reach).

NOTE: the memcheck tier runs before the lockstep, because that order costs
less. Either order runs both tiers on a mutant that survives both; the order
decides which tier a kill of the other saves. Of the 17 survivors of the fast
tier in the sample of 60 (seed 0) the lockstep killed none, and its three
targets cost 60-100 s a mutant (about 150 s on 2 loaded cores); the memcheck
tier costs about 3 times the fast tier's pass (median 46 s against 16 s on
that sample: a sanitized object, then the tests at ASan's pace; the report's
cost section) and each of its kills saves the lockstep's minutes. A mutant
that no lockstep target enters gets the memcheck tier instead.

A mutant that does not compile or link is *invalid* (not counted). A child
that fails a test or diverges kills it; so does one that dies by a signal
(a crash, said as such), one whose extension no longer imports, and one that
runs past its guard (a *timeout*, listed apart and counted as killed). The
results go to ``docs/reports/cmutants.json`` after every mutant (a campaign
can stop and resume: results of unchanged files are reused) and the report
to ``docs/reports/cmutants.md`` (:mod:`kvtools.cmutants.report`).

Everything is built in a temporary folder (``--workdir`` to keep one); the
checkout's own extension is never touched. ``--sample N --seed S`` draws a
deterministic sample stratified by file (each file's share in proportion to
its mutants; each file's draw a prefix of one seeded permutation, so a larger
sample contains a smaller one); ``--files`` restricts the campaign to some
files; mutant ids as arguments run exactly those (again, if they have results).
With ``--sample`` or ``--files`` the report covers that selection; the results file
keeps every result. ``--semantics`` pins the lockstep's profile (the tiers must
pass on the unmutated core; kvref check's default is the newest release).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from kvtools.cmutants import memcheck
from kvtools.cmutants.build import ROOT, SOURCES, Stage, sources_digest
from kvtools.cmutants.child import NOT_LOADED, WRONG_STAGE
from kvtools.cmutants.generate import Mutant, mutants
from kvtools.cmutants.reach import TierReach, measure
from kvtools.cmutants.report import TRIAGE, write_report

RESULTS = ROOT / "docs" / "reports" / "cmutants.json"
MARKDOWN = ROOT / "docs" / "reports" / "cmutants.md"
FAST_TESTS = (
    "tests/impl/test_native.py",
    "tests/impl/test_native_directed.py",
    "tests/impl/test_every_operation.py",
    "tests/impl/test_validation.py",
    "tests/impl/test_block_table.py",
    "tests/impl/test_cache_blocks_bounds.py",
    "tests/impl/test_context_parallel.py",
    "tests/impl/test_mamba_tail.py",
    "tests/impl/test_native_hint.py",
    "tests/impl/test_partial_hits.py",
    "tests/impl/test_partial_hits_traces.py",
    "tests/impl/test_profiles.py",
    "tests/impl/test_record_blocks_for_zeroing.py",
    "tests/impl/test_ring.py",
)
"""The fast tier: kvimpl's unit tests that drive the native core (the two of the core itself first)."""
TARGETS = ("impl-native", "impl-array", "impl-batch-native")
FAST = "fast"
MEMCHECK = "memcheck"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvtools cmutants``: run the campaign and write the reports."""
    args = build_parser(argparse.ArgumentParser(prog="python -m kvtools cmutants")).parse_args(argv)
    return run(args)


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the runner's options to ``parser``."""
    parser.add_argument("--files", default="", help="comma-separated C files of impl/kvimpl/_native (default: all)")
    parser.add_argument("--sample", type=int, default=None, help="hunt a stratified sample of N mutants")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds of each lockstep run (default 60)")
    parser.add_argument("--targets", default=",".join(TARGETS), help="lockstep targets, in order")
    parser.add_argument(
        "--semantics",
        default=None,
        help="the lockstep's semantics profile, e.g. vllm-0.33.0 (default: kvref check's, the newest release)",
    )
    parser.add_argument("--fast-tests", default=",".join(FAST_TESTS), help="the fast tier's test files")
    parser.add_argument("--fast-guard", type=float, default=240.0, help="hang guard of the fast tier, seconds")
    parser.add_argument(
        "--no-memcheck",
        action="store_true",
        help="leave out the memcheck tier (the fast tier's tests under AddressSanitizer and UBSan)",
    )
    parser.add_argument("--memcheck-guard", type=float, default=600.0, help="hang guard of the memcheck tier, seconds")
    parser.add_argument(
        "--lockstep-guard", type=float, default=None, help="hang guard of a lockstep run (default: budget + 360 s)"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="keep the build here (default: a temporary folder)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results file (read, then extended)")
    parser.add_argument("--markdown", type=Path, default=MARKDOWN)
    parser.add_argument("--triage", type=Path, default=TRIAGE)
    parser.add_argument("--fresh", action="store_true", help="forget earlier results")
    parser.add_argument("--report-only", action="store_true", help="only rewrite the report from the results")
    parser.add_argument("--list", action="store_true", help="print the selected mutants' ids and changes, run nothing")
    parser.add_argument("--limit", type=int, default=None, help="stop after hunting this many mutants")
    parser.add_argument(
        "ids", nargs="*", help="hunt exactly these mutants (file:line:col:operator), again if they have results"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Select, hunt what has no result yet, and report."""
    files = [f.strip() for f in args.files.split(",") if f.strip()]
    every = {p.name: mutants(p) for p in sorted(SOURCES.glob("*.c")) if not files or p.name in files}
    unknown = sorted(set(files) - set(every))
    if unknown:
        print(f"kvtools cmutants: no such C file: {', '.join(unknown)}", file=sys.stderr)
        return 2
    try:
        chosen = select(every, args.ids, args.sample, args.seed)
    except KeyError as exc:
        print(f"kvtools cmutants: {exc.args[0]}", file=sys.stderr)
        return 2
    if args.list:
        for m in chosen:
            print(f"{m.id}\t{m.function}\t{m.describe()}")
        return 0
    all_mutants = {p.name: mutants(p) for p in sorted(SOURCES.glob("*.c"))}
    data = load_results(args.results, all_mutants, fresh=args.fresh)
    if not args.report_only:
        hunt = tiers_setting(args)
        todo = to_hunt(chosen, data["results"], hunt, named=bool(args.ids))
        if args.limit is not None:
            todo = todo[: args.limit]
        print(
            f"kvtools cmutants: {len(chosen)} mutants selected, {len(chosen) - len(todo)} with results, "
            f"{len(todo)} to hunt"
        )
        data["campaigns"].append(_campaign(args, len(chosen)))
        if todo:
            rc = hunt_all(args, todo, data)
            if rc != 0:
                return rc
    # A sample or some files: the report covers that selection (the results file keeps every result).
    selected = {m.id for m in chosen} if args.sample is not None or files else None
    report = (
        data if selected is None else {**data, "results": {k: r for k, r in data["results"].items() if k in selected}}
    )
    write_report(report, all_mutants, args.triage, args.markdown)
    data["summary"] = report["summary"]
    save_results(args.results, data)
    print(f"kvtools cmutants: wrote {args.markdown} and {args.results}")
    return 0


def to_hunt(chosen: Sequence[Mutant], results: dict[str, Any], setting: dict[str, Any], named: bool) -> list[Mutant]:
    """The chosen mutants without a result, and survivors hunted by other tiers (a kill stands:
    the tiers only grow); mutants named by id (``named``) are hunted again whatever their
    results, say after new tests in a fast-tier file (whose name, not content, is the setting)."""
    return [
        m
        for m in chosen
        if named
        or m.id not in results
        or (results[m.id]["status"] == "survived" and results[m.id].get("setting") != setting)
    ]


def tiers_setting(args: argparse.Namespace) -> dict[str, Any]:
    """What a result was hunted with (the fast tier's tests, the targets, the budget, the semantics)."""
    setting: dict[str, Any] = {
        "fast_tests": [t.strip() for t in args.fast_tests.split(",") if t.strip()],
        "targets": [t.strip() for t in args.targets.split(",") if t.strip()],
        "budget": float(args.budget),
    }
    if getattr(args, "semantics", None):
        setting["semantics"] = args.semantics
    if not getattr(args, "no_memcheck", True):
        setting["memcheck"] = list(memcheck.CFLAGS)
    return setting


def missing_tiers(record: dict[str, Any], setting: dict[str, Any]) -> list[str] | None:
    """The tiers a survivor still needs when ``setting`` only adds tiers to its own (today: the
    memcheck tier to a result hunted without it), else None (hunt it again from the start)."""
    old = record.get("setting") or {}
    if record.get("status") != "survived" or "memcheck" in old or "memcheck" not in setting:
        return None
    return [MEMCHECK] if old == {k: v for k, v in setting.items() if k != "memcheck"} else None


# --- selection --------------------------------------------------------------------------------


def select(every: dict[str, list[Mutant]], ids: Sequence[str], sample: int | None, seed: int) -> list[Mutant]:
    """The mutants to hunt: ``ids`` if given, else a stratified sample of ``sample``, else all.

    Raises:
        KeyError: If an id names no mutant.
    """
    if ids:
        by_id = {m.id: m for ms in every.values() for m in ms}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise KeyError(f"no such mutant: {', '.join(missing)} (python -m kvtools cmutants --list)")
        return [by_id[i] for i in ids]
    if sample is None:
        return [m for ms in every.values() for m in ms]
    return stratified_sample(every, sample, seed)


def stratified_sample(every: dict[str, list[Mutant]], n: int, seed: int) -> list[Mutant]:
    """``n`` mutants, each file's share in proportion to its count (largest remainders), in source order.

    Each file's draw is a prefix of one permutation seeded by ``seed`` and the
    file name, so that a larger ``n`` contains a smaller one's draw.
    """
    total = sum(len(ms) for ms in every.values())
    if n >= total:
        return [m for ms in every.values() for m in ms]
    quotas = {f: n * len(ms) / total for f, ms in every.items()}
    counts = {f: int(q) for f, q in quotas.items()}
    for f in sorted(quotas, key=lambda f: (counts[f] - quotas[f], f))[: n - sum(counts.values())]:
        counts[f] += 1
    chosen: list[Mutant] = []
    for f, ms in every.items():
        chosen += sorted(permutation(ms, seed)[: counts[f]], key=lambda m: (m.start, m.operator))
    return chosen


def permutation(ms: Sequence[Mutant], seed: int) -> list[Mutant]:
    """The file's mutants in the order of its seeded permutation (the sampling order)."""
    order = list(ms)
    if order:
        random.Random(f"cmutants/{seed}/{order[0].file}").shuffle(order)
    return order


# --- results ----------------------------------------------------------------------------------


def load_results(path: Path, all_mutants: dict[str, list[Mutant]], fresh: bool) -> dict[str, Any]:
    """The results file, less results whose C file changed since (or whose id is gone)."""
    digests = {f: _file_digest(SOURCES / f) for f in all_mutants}
    data: dict[str, Any] = {"results": {}, "reach": None, "campaigns": []}
    if path.exists() and not fresh:
        data = json.loads(path.read_text())
    ids = {m.id for ms in all_mutants.values() for m in ms}
    data["results"] = {
        k: r for k, r in data.get("results", {}).items() if k in ids and r.get("file_sha256") == digests[r["file"]]
    }
    if data.get("reach") and data["reach"].get("sources") != sources_digest():
        data["reach"] = None
    data.setdefault("campaigns", [])
    data["file_sha256"] = digests
    return data


def save_results(path: Path, data: dict[str, Any]) -> None:
    """Write the results file (atomically: a stopped campaign leaves a whole file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ordered = dict(sorted(data["results"].items(), key=lambda kv: _id_key(kv[0])))
    text = json.dumps({**data, "results": ordered}, indent=1, sort_keys=False) + "\n"
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text)
    partial.replace(path)


def _id_key(mutant_id: str) -> tuple[str, int, int, str]:
    file, line, col, op = mutant_id.split(":")
    return file, int(line), int(col), op


def fast_tests_digest(files: Sequence[str]) -> str:
    """One digest of the fast tier's test files' contents (an edited test may enter other functions)."""
    h = hashlib.sha256()
    for f in files:
        path = ROOT / f
        h.update(f.encode() + b"\0" + (path.read_bytes() if path.exists() else b"") + b"\0")
    return h.hexdigest()[:16]


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _campaign(args: argparse.Namespace, selected: int) -> dict[str, Any]:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    argv = sys.argv[2:] if sys.argv[1:2] == ["cmutants"] else []
    return {
        "command": " ".join(["python -m kvtools cmutants", *_without_paths(argv)]),
        "files": args.files or "all",
        "sample": args.sample,
        "seed": args.seed,
        "ids": len(args.ids),
        "selected": selected,
        "budget": args.budget,
        "semantics": getattr(args, "semantics", None),
        "targets": args.targets,
        "commit": commit.stdout.strip() or None,
        "started": time.strftime("%Y-%m-%d %H:%M"),
    }


def _without_paths(argv: Sequence[str]) -> list[str]:
    """The command line less ``--workdir`` and its folder (a path of this machine; it changes no result)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--workdir":
            skip = True
        elif not a.startswith("--workdir="):
            out.append(a)
    return out


# --- hunting ----------------------------------------------------------------------------------


class Hunter:
    """Runs the tiers of one campaign on the staged build (see the module docstring)."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.work = work
        self.budget = float(args.budget)
        self.semantics: str | None = getattr(args, "semantics", None)
        self.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
        self.fast_tests = [t.strip() for t in args.fast_tests.split(",") if t.strip()]
        self.fast_guard = float(args.fast_guard)
        self.lockstep_guard = float(args.lockstep_guard or self.budget + 360)
        self.memcheck_guard = float(getattr(args, "memcheck_guard", 600.0))
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        # The memcheck tier: its runtime (checked here: no hunt without it) and its own stage.
        self.preload: list[Path] | None = None
        self.memcheck_stage: Stage | None = None
        if not getattr(args, "no_memcheck", True):
            self.preload = memcheck.runtime()
            self.memcheck_stage = Stage(work / "memcheck", cflags=memcheck.CFLAGS, ldflags=memcheck.LDFLAGS)

    def tiers(self) -> list[str]:
        """The fast tier, the memcheck tier (unless left out), then the lockstep targets."""
        return [FAST, *([MEMCHECK] if self.memcheck_stage is not None else []), *self.targets]

    def command(self, stage_root: Path, tier: str, budget: float | None) -> list[str]:
        """The child's command line for ``tier``."""
        head = [sys.executable, "-m", "kvtools.cmutants.child", str(stage_root), tier]
        if tier in (FAST, MEMCHECK):
            flags = ["-x", "-q", "-p", "no:cacheprovider", "--hypothesis-seed=0", "-o", "console_output_style=classic"]
            flags += list(memcheck.PYTEST_FLAGS) if tier == MEMCHECK else []
            return [*head[:-1], "fast", *self.fast_tests, *flags]
        check = ["check", "--target", tier, "--against", "spec", "--profile", "ci", "--seed", "0"]
        check += ["--semantics", self.semantics] if self.semantics else []
        return [*head[:-1], "lockstep", *check, *(["--budget", f"{budget:g}"] if budget is not None else [])]

    def run_tier(
        self, stage_root: Path, tier: str, budget: float | None, log: Path, sanitized: bool = True
    ) -> tuple[int | None, float]:
        """Run one tier in a child process; (exit code or None past the guard, seconds). Output goes to
        ``log``. The memcheck tier preloads the sanitizer runtime unless ``sanitized`` is false (its
        tests on a build without the sanitizers: the gcov reach)."""
        env = {k: v for k, v in os.environ.items() if k not in ("KVREF_NATIVE", "HYPOTHESIS_PROFILE")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(stage_root), os.environ.get("PYTHONPATH", "")) if p)
        env["PYTHONHASHSEED"] = "0"
        env["KVREF_FAILURE_DIR"] = str(self.work / "failures")
        env["COLUMNS"] = "100"
        if tier == MEMCHECK and sanitized:
            env = memcheck.environment(self.preload or [], env)
        guard = {FAST: self.fast_guard, MEMCHECK: self.memcheck_guard}.get(tier, self.lockstep_guard)
        cwd = ROOT if tier in (FAST, MEMCHECK) else self.work
        start = time.monotonic()
        with log.open("w") as out:
            proc = subprocess.Popen(
                self.command(stage_root, tier, budget),
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: the guard ends the tests' children too
            )
            try:
                code: int | None = proc.wait(timeout=guard)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
        return code, round(time.monotonic() - start, 1)

    def reach_runner(self) -> Any:
        """``measure``'s tier runner: a tier on a staged package, without a time budget."""

        def run(stage_root: Path, tier: str) -> tuple[int, str]:
            log = self.logs / f"reach-{tier}.log"
            code, _ = self.run_tier(stage_root, tier, None, log, sanitized=False)
            return (-999 if code is None else code), log.read_text(errors="replace")

        return run

    def hunt(
        self,
        stage: Stage,
        mutant: Mutant,
        reach: dict[str, TierReach],
        previous: dict[str, Any] | None = None,
        only: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """Build and hunt one mutant; its result record. With ``previous`` (a survivor's record) and
        ``only`` (:func:`missing_tiers`), run only those tiers and add them to that record."""
        record: dict[str, Any] = {
            "file": mutant.file,
            "line": mutant.line,
            "col": mutant.col,
            "operator": mutant.operator,
            "function": mutant.function,
            "change": mutant.describe(),
        }
        tiers: dict[str, Any] = {}
        if previous is not None and only is not None:
            record["build_seconds"] = previous["build_seconds"]
            tiers.update(previous["tiers"])
            wanted = list(only)
        else:
            built = stage.build(mutant)
            record["build_seconds"] = round(built.seconds, 1)
            if not built.ok:
                return {**record, "status": "invalid", "how": built.error, "tiers": {}}
            wanted = self.tiers()
        record["reached"] = sorted(t for t, r in reach.items() if mutant.line in r.lines.get(mutant.file, ()))
        record["tiers"] = tiers
        # A seeded tier that never enters the mutated function runs exactly as on the unmutated core.
        plan = [t for t in wanted if mutant.function in reach[t].functions.get(mutant.file, ())]
        skipped = [*(previous or {}).get("skipped_tiers", []), *(t for t in wanted if t not in plan)]
        record["skipped_tiers"] = [t for t in self.tiers() if t in skipped]
        for tier in plan:
            log = self.logs / f"{mutant.id.replace(':', '_')}-{tier}.log"
            extra: dict[str, Any] = {}
            root = stage.root
            if tier == MEMCHECK:
                assert self.memcheck_stage is not None  # MEMCHECK is a tier only with its stage
                built = self.memcheck_stage.build(mutant)
                extra["build_seconds"] = round(built.seconds, 1)
                if not built.ok:  # it compiled without the sanitizers: the runner's fault, no verdict
                    how = f"{tier}: the sanitized build fails: {built.error}"
                    return {**record, "status": "error", "how": how, "killed_by": tier}
                root = self.memcheck_stage.root
            code, seconds = self.run_tier(root, tier, None if tier in (FAST, MEMCHECK) else self.budget, log)
            verdict, how = judge(tier, code, log.read_text(errors="replace"))
            total = round(seconds + extra.get("build_seconds", 0.0), 1)
            tiers[tier] = {"exit": code, "seconds": total, "verdict": verdict, **extra}
            if verdict == "survived":
                continue
            return {**record, "status": verdict, "how": how, "killed_by": tier}
        ran = [t for t in self.tiers() if t in tiers]
        return {**record, "status": "survived", "how": "" if ran else f"no tier enters {mutant.function}"}


def judge(tier: str, code: int | None, output: str) -> tuple[str, str]:
    """(verdict, how) of one tier's child from its exit code and output.

    Verdicts: ``killed``, ``timeout`` (past the guard: counted as killed),
    ``survived``, ``error`` (the runner's fault or a usage error: no verdict).
    """
    if code is None:
        return "timeout", f"{tier}: still running at the hang guard (killed by the runner)"
    if code < 0:
        name = signal.Signals(-code).name if -code in {s.value for s in signal.Signals} else str(-code)
        return "killed", f"{tier}: crash ({name})"
    if code == NOT_LOADED:
        return "killed", f"{tier}: the extension does not import ({_last(output, 'does not import')})"
    if code == WRONG_STAGE:
        return "error", f"{tier}: {_last(output, 'cmutants child')}"
    if tier == MEMCHECK:
        report = memcheck.first_report(output)
        if report is not None:
            return "killed", f"{tier}: {report}"
        if code == memcheck.EXIT:
            return "killed", f"{tier}: sanitizer exit {code} (no report found in the output)"
        # A test that fails at -O1 under the sanitizers but passed the fast tier: still this mutant's fault.
        verdict, how = judge(FAST, code, output)
        return verdict, how.replace(f"{FAST}:", f"{tier}:", 1)
    if tier == FAST:
        if code == 0:
            return "survived", ""
        if code in (1, 2):  # failed tests; errors at collection (an import-time failure of the mutant)
            failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
            crashed = re.search(r"Fatal Python error: (\w+)", output)
            what = failed[0] if failed else (f"fatal error {crashed.group(1)}" if crashed else f"pytest exit {code}")
            return "killed", f"{tier}: {what}"
        return "error", f"{tier}: pytest exit {code}: {_last(output, '')}"
    if code == 0:
        return "survived", ""
    if code == 1:
        return "killed", f"{tier}: divergence: {_divergence(output)}"
    if code == 4:
        return "killed", f"{tier}: adapter hang (kvref's op watchdog, exit 4)"
    if code == 3:
        return "killed", f"{tier}: nothing checked (every configuration refused, exit 3)"
    return "error", f"{tier}: kvref exit {code}: {_last(output, '')}"


def _last(output: str, needle: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if needle in ln and ln.strip()]
    return (lines[-1] if lines else "")[:240]


def _divergence(output: str) -> str:
    """The first line that says what differed in a ``kvref check`` report."""
    for ln in output.splitlines():
        s = ln.strip(" │┃")
        if re.search(r"(?i)diverg|differ|!=|assert|error|invariant", s) and "kvref check:" not in s:
            return s.strip()[:240]
    return _last(output, "")


@contextlib.contextmanager
def workdir(path: Path | None) -> Iterator[Path]:
    """``path`` (created), or a temporary folder removed afterwards."""
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path.resolve()
        return
    with tempfile.TemporaryDirectory(prefix="kvref-cmutants-") as tmp:
        yield Path(tmp)


def hunt_all(args: argparse.Namespace, todo: Sequence[Mutant], data: dict[str, Any]) -> int:
    """Prepare the stage, check the unmutated core passes every tier (gcov reach), hunt ``todo``."""
    with workdir(args.workdir) as work:
        try:
            hunter = Hunter(args, work)
        except memcheck.RuntimeMissing as exc:
            print(f"kvtools cmutants: {exc}", file=sys.stderr)
            return 2
        stage = Stage(work)
        stage.prepare()
        if not stage.build(None).ok:
            print("kvtools cmutants: the unmutated core does not link", file=sys.stderr)
            return 2
        reach = _reach(hunter, stage, data, args)
        if reach is None:
            return 2
        code, seconds = hunter.run_tier(stage.root, FAST, None, hunter.logs / "unmutated-fast.log")
        if code != 0:
            print(
                f"kvtools cmutants: the fast tier fails on the unmutated build (exit {code}); see "
                f"{hunter.logs / 'unmutated-fast.log'}",
                file=sys.stderr,
            )
            return 2
        print(f"kvtools cmutants: the unmutated build passes the fast tier ({seconds:.0f} s)", flush=True)
        if hunter.memcheck_stage is not None and not _unmutated_memcheck(hunter):
            return 2
        setting = tiers_setting(args)
        start = time.monotonic()
        for n, mutant in enumerate(todo, 1):
            previous = data["results"].get(mutant.id)
            only = missing_tiers(previous, setting) if previous is not None and not args.ids else None
            record = hunter.hunt(stage, mutant, reach, previous if only else None, only)
            record["file_sha256"] = data["file_sha256"][mutant.file]
            record["setting"] = setting
            record["hunted"] = time.strftime("%Y-%m-%d %H:%M")
            data["results"][mutant.id] = record
            save_results(args.results, data)
            spent = sum(t["seconds"] for t in record["tiers"].values()) + record["build_seconds"]
            print(
                f"[{n}/{len(todo)}] {mutant.id} {record['status']} {record['how'][:90]} ({spent:.0f} s; "
                f"{time.monotonic() - start:.0f} s so far)",
                flush=True,
            )
            if record["status"] == "error":
                print(f"kvtools cmutants: a runner error, stopping: {record['how']}", file=sys.stderr)
                return 2
    return 0


def _unmutated_memcheck(hunter: Hunter) -> bool:
    """Whether the unmutated core, built with the sanitizers, passes the memcheck tier (said either way)."""
    assert hunter.memcheck_stage is not None
    hunter.memcheck_stage.prepare()
    built = hunter.memcheck_stage.build(None)
    if not built.ok:
        print(f"kvtools cmutants: the sanitized unmutated core does not link: {built.error}", file=sys.stderr)
        return False
    log = hunter.logs / "unmutated-memcheck.log"
    code, seconds = hunter.run_tier(hunter.memcheck_stage.root, MEMCHECK, None, log)
    if code != 0:
        report = memcheck.first_report(log.read_text(errors="replace")) or f"exit {code}"
        print(f"kvtools cmutants: the memcheck tier fails on the unmutated core ({report}); see {log}", file=sys.stderr)
        return False
    print(f"kvtools cmutants: the unmutated build passes the memcheck tier ({seconds:.0f} s)", flush=True)
    return True


def _reach(hunter: Hunter, stage: Stage, data: dict[str, Any], args: argparse.Namespace) -> dict[str, TierReach] | None:
    """The gcov reach of every tier (cached in the results while the sources and tiers are unchanged).
    The memcheck tier runs the fast tier's tests with the same seed: it has the fast tier's reach."""
    measured = [t for t in hunter.tiers() if t != MEMCHECK]
    key = {
        "sources": sources_digest(),
        "tiers": measured,
        "fast_tests": hunter.fast_tests,
        "fast_tests_sha256": fast_tests_digest(hunter.fast_tests),
        "semantics": hunter.semantics,
    }
    cached = data.get("reach")
    if cached and all(cached.get(k) == v for k, v in key.items()):
        return _with_memcheck({t: TierReach.from_json(r) for t, r in cached["tiers_reach"].items()}, hunter)
    print("kvtools cmutants: measuring what each tier runs on the unmutated core (gcov; a few minutes)", flush=True)
    start = time.monotonic()
    try:
        reach = measure(stage, measured, hunter.reach_runner())
    except RuntimeError as exc:
        print(f"kvtools cmutants: {exc}", file=sys.stderr)
        return None
    data["reach"] = {
        **key,
        "seconds": round(time.monotonic() - start),
        "tiers_reach": {t: r.to_json() for t, r in reach.items()},
    }
    save_results(args.results, data)
    return _with_memcheck(reach, hunter)


def _with_memcheck(reach: dict[str, TierReach], hunter: Hunter) -> dict[str, TierReach]:
    return {**reach, MEMCHECK: reach[FAST]} if MEMCHECK in hunter.tiers() else reach
