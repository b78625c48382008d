"""``python -m kvtools coverage``: branch coverage of kvspec and kvimpl under the ci lockstep.

Runs ``kvref check --target T --against spec --profile ci --semantics P
--coverage`` once per seed, semantics profile P (``--profiles``: ``all``, the
default, every profile kvimpl follows; ``newest``; or a list) and target T
(``--targets``, default ``impl`` as CI runs it, ``impl-batch`` and
``impl-batch-native``, the pure-Python manager and the native core driven
through their batch API with device tables, :mod:`kvref.adapters.impl_batch`,
and ``impl-mutable``, kvimpl with its own mutable requests,
:mod:`kvref.adapters.impl_mutable`), each in its own process
so that every run starts from the same state and takes the same steps as it
does in CI, and merges each seed's runs: an outcome is taken if any
profile's or target's run took it (so code that only an older release runs
counts once some profile runs it). Then it writes docs/reports/coverage.md
and coverage.json: per seed the outcomes, taken, listed unreachable
(kit/kvref/unreachable_branches.toml) and gaps, the same per profile at the
first seed, and every merged gap with its decision's source line.

``--ci`` runs what CI's lockstep runs instead (:func:`ci_runs`; ``--ci-runs``
prints them one a line, which ``ci/test.sh`` reads). ``--merge FILE...``
runs nothing: it merges branch reports that ``kvref check --coverage-json``
wrote (CI's). ``--check`` exits 1 when the merged first seed fails the
ratchet of :mod:`kvtools.coverage_gate` (a gap not in
tools/kvtools/coverage_gaps.toml, a listed gap closed or moved, a stale
unreachable entry, a run that did not exit 0); ``--write-gaps`` rewrites
that list from the merged first seed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvref.branches import PACKAGES, UNREACHABLE_FILE
from kvref.config_coverage import NAMES, missing
from kvtools.coverage_gate import GAPS_FILE, gaps_of, gate, load_gaps, merge_runs, relocate, write_gaps

if TYPE_CHECKING:
    from kvspec.profiles import SemanticsProfile

ROOT = Path(__file__).resolve().parents[2]
REPORT_DIR = ROOT / "docs" / "reports"
DEFAULT_TARGETS = "impl,impl-batch,impl-batch-native,impl-mutable"
"""What CI's lockstep runs (``impl``: the native core where it applies), the batch API with device
tables on either build, and kvimpl's own mutable requests."""


@dataclass(frozen=True)
class Run:
    """One lockstep run: a semantics profile, a target, whether the native core may be used, the
    shapes, the step goal, and whether the scheduler keeps steps in flight."""

    profile: str
    target: str
    native: bool = True
    """False: ``KVREF_NATIVE=0`` (the pure-Python build)."""
    shapes: str | None = None
    """``--shapes`` (None: the machine's whole catalog)."""
    min_steps: int | None = None
    """``--min-steps`` (None: the ci profile's step goal)."""
    asynchronous: bool = False
    """``--async-scheduling`` (vLLM's asynchronous scheduler: steps in flight, draft tokens)."""

    @property
    def label(self) -> str:
        """``vllm-0.33.0/impl`` (``+pure-python`` for ``KVREF_NATIVE=0``, ``+async`` for
        ``--async-scheduling``, ``[wide]`` for ``--shapes wide``)."""
        shapes = f"[{self.shapes}]" if self.shapes else ""
        build = "" if self.native else "+pure-python"
        return f"{self.profile}/{self.target}{build}" + ("+async" if self.asynchronous else "") + shapes

    def ci_line(self) -> str:
        """The run as ``ci/test.sh`` reads it: profile, target, build, shapes, step goal (``-``: default)
        and scheduling (``sync``, or ``async`` for ``--async-scheduling``)."""
        build = "native" if self.native else "pure-python"
        scheduling = "async" if self.asynchronous else "sync"
        return f"{self.profile} {self.target} {build} {self.shapes or '-'} {self.min_steps or '-'} {scheduling}"


WIDE_STEPS = 200
"""The step goal of CI's run of the 65-group shape (a step touches every group; the
ci profile's machine runs still end far past it, at about 4,400 steps)."""


PCP_MAMBA_SHAPE = "mamba-align@dcp2-pcp2"
PCP_MAMBA_STEPS = 1000
"""A short run of a lone cached Mamba group under decode and prefill context parallelism: from
vLLM 0.29.0 its lookup is refused for the prefill size alone (the decode size does not scale a
Mamba group). In the full runs the shape is one of 34 and cached in two draws of three, and
seeds 1, 3 and 4 never looked it up; alone it does at seeds 0-4."""

PCP_MAMBA_DCP_PROFILE = "vllm-0.25.1"
"""The same shape under the last release that passes every group the process DCP size and still
builds a lone cached Mamba group under context parallelism (0.26.0-0.28.0 refuse that
configuration): its lookup is refused for the decode size first. The full runs draw it under
0.16.0 and 0.25.1 only; at seed 2 neither looked it up; alone (1,000 steps) it does at seeds 0-4."""


CHUNKED_SHAPES = "chunked,full+chunked"
CHUNKED_STEPS = 25000
"""A run of the two chunked-local shapes through the batch API on the pure-Python manager. The
native core serves every lookup and allocation of the other runs but two (the pure-Python build
under vLLM 0.25.1 and ``impl-batch``), where chunked-local shapes are 2 draws of 34: at seed 0
neither met a chunked-local hit of one block or more (kvimpl's ``chunked_local_hit`` loop never
ran) nor a sparse table of null blocks only (a delayed connector load whose tokens end on a chunk
boundary: every block it covers is skipped). Alone the two shapes meet the hit in their first
4,000 steps at seeds 0-4; the all-null table at seed 0 within 3,900 steps, at seeds 1-3 within
14,200 and at seed 4 within 27,400 (``kvref check --target impl-batch --shapes chunked,full+chunked
--min-steps N --coverage-json F`` with N = 400, 12,000 and 25,000: the ci profile's machine runs
end past the goal)."""


SINK_SHAPES = "sink,sink@dcp2"
SINK_PROFILE = "vllm-0.29.0"
SINK_STEPS = 45000
"""A run of the attention-sink shapes under the last release whose sink managers take their sink
blocks for good when they are built (vLLM 0.29.0; 0.30.0 stopped): a pool too small for them is a
configuration the release cannot start with, which kvspec refuses (``validate_sink_room``). The full
runs draw it only in a few of their sink configurations, and only under 0.16.0-0.29.0: at seed 1 no
run met it. Alone the two shapes meet it at seeds 0-2 and 4 within the ci profile's 20,000 steps,
at seed 3 within 45,500."""


RING_SHAPES = "full+ring,ring"
"""The ring-kind shapes under the newest profile: a lookup over a ring group (no hit: it is not
prefix cacheable) and a hit list sent for one (refused). The full runs draw them as 2 of 34
shapes: at seed 2 neither was met, at seeds 1 and 4 one of them. Alone the shapes meet both at
seeds 0-4 (the ci profile's 20,000 steps)."""

MAMBA_SHAPES = (
    "mamba-all,mamba-align,full+mamba-align,full+mamba-all,full@2x+mamba-align,full+mamba-align+mamba-align"
)
"""The Mamba shapes under the newest profile: a ``cache_blocks`` that reaches a prompt's Mamba tail
boundary where the state block holding it is null or not in the table (vLLM 0.32.0 on keys the
tail state of every align group; :mod:`kvspec.mamba_tail`). Missed at seeds 2 and 4 by the full
runs; met at seeds 0-4 by these shapes alone (20,000 steps)."""

REKEYED_SHAPES = "full@2x+swa,full@2x+mamba-align"
REKEYED_STEPS = 40000
"""Two coarse full-attention hybrids under the newest profile, for ``SchedulerMachine.rekeyed_tails``:
a partial-tail key put on a block whose key stands for fewer tokens, which is removed first
(``cache_partial_block``), and an eviction that removes one block of several under a key. The full
runs missed both at seed 1. Alone the two shapes meet both at seeds 1-4 within the ci profile's
20,000 steps and at seed 0 within 40,000."""

MTP_SHAPES = "full@mtp3,swa@mtp2,full+swa@mtp3,full+swa+mamba-align@mtp2"
"""The multi-module MTP shapes (:data:`kvref.shapes.MTP_SHAPES`) under the newest profile: caching
that lags the drafter's look-ahead, windows that keep extra tokens, the look-ahead refused past the
scheduler block under EAGLE, and their broken inputs (``MTP_BAD_CONFIGS``). Not drawn by the full
runs."""

CONNECTOR_NATIVE_PROFILE = "vllm-0.27.1"
"""The Mamba shapes again under a release whose connector lookups (0.27.0 on) the native core runs
(its cached Mamba groups need no tail entries before 0.32.0, and no prefill checkpoints are drawn
before 0.29.0): a request that skips the prefix cache reaches the native connector lookup's early
return, which the full runs meet at some seeds only."""

FINE_SWA_SHAPES = "full+swa@2x"
"""A hybrid whose window group's block is half the scheduler block, under the newest profile: its
hits are aligned down a block (``align_down`` drops one), which the full runs meet at some seeds only."""

ARRAY_PROFILE = "vllm-0.33.0"
"""The run of kvimpl's array API (``impl-array``) under the newest release whose requests fit the C
request: from vLLM 0.34.0 on a request holds a hit limit fixed at construction and token ids are
checked against 32 bits, which the C request does not do, so kvimpl makes Python requests there and
the array API (C requests only) refuses the release."""

EAGLE_WINDOW_PROFILE = "vllm-0.16.0"
EAGLE_WINDOW_SHAPES = "full@2x+swa,full@2x+mamba-align@2x+swa,full+swa,mla+swa"
"""Sliding-window hybrids under vLLM 0.16.0, the release whose sliding-window search under EAGLE
could find a hit the EAGLE drop then loses (met in ``full@2x+swa`` and
``full@2x+mamba-align@2x+swa`` with EAGLE and caching on), and which refuses EAGLE on chosen
groups. The full runs missed both at seed 4; these shapes alone meet both at seeds 0-4
(20,000 steps)."""


PAST_HASHES_SHAPES = "full+mamba-align+mamba-align"
PAST_HASHES_STEPS = 10000
"""A run of a hybrid with two Mamba align groups under the newest profile with asynchronous
scheduling (``--async-scheduling``), for the guards of the registered vLLM crash
``checkpoint-past-hashes-crash``: a step with draft tokens whose prefill checkpoint lies past the
request's hashes (kvspec and kvimpl leave its block alone). Only the asynchronous pipeline schedules
a step past the request's tokens, and it draws drafts only under EAGLE with speculative Mamba
blocks; from vLLM 0.32.0 on the checkpoint must also be one that stays cached (on a block boundary
that the retention mask keeps). The other runs are synchronous; this one meets it at seed 0 within
10,000 steps (not at seeds 1-4)."""

PROMPT_END_PROFILE = "vllm-0.31.0"
PROMPT_END_SHAPES = "full@2x+mamba-align"
PROMPT_END_STEPS = 3000
"""A run of a coarse full-attention hybrid with a Mamba align group under vLLM 0.31.0, for that
release's rule for a checkpoint that is neither the prompt's nor the junction's (a prefill chunk
before the prompt's last one that keeps a checkpoint: two blocks or more from a block boundary,
with no retention interval or one above 0). The full 0.31.0 run misses it at seed 0; this shape
alone meets it at seeds 0-4 within 3,000 steps."""


def behaviours(names: Iterable[str]) -> list[str]:
    """One profile of ``names`` per set of switches, oldest first: of the releases
    that share their switches (a release with no observable change shares its
    predecessor's), the newest; the others would repeat its run step for step."""
    from kvspec.profiles import PROFILES  # noqa: PLC0415

    wanted = set(names)
    kept: dict[str, SemanticsProfile] = {}
    for profile in PROFILES.values():
        if profile.name not in wanted:
            continue
        switches = replace(profile, name="", release="")
        for name, other in list(kept.items()):
            if replace(other, name="", release="") == switches:
                del kept[name]
        kept[profile.name] = profile
    return list(kept)


def ci_runs() -> list[Run]:
    """The impl-vs-spec locksteps ``ci/test.sh`` runs (each at seed 0 with ``--profile ci``):
    ``impl`` under every profile kvimpl follows, the pure-Python build under the
    baseline profile, and under the newest kvimpl's mutable requests and its
    batched step API with device tables, on the pure-Python manager
    (``impl-batch``: the only run that reaches most of kvimpl/step_api.py and
    kvimpl/device_tables.py) and on the native core (``impl-batch-native``:
    the core's batch entry points and host rows, the native manager's
    device-table calls and its constructor's refusals) and the native core's
    array API (``impl-array``); short runs of one
    shape each: :data:`kvref.shapes.WIDE` (65 groups, more than the native
    core takes), where kvimpl falls back to pure Python, and
    :data:`PCP_MAMBA_SHAPE` under the newest profile and under
    :data:`PCP_MAMBA_DCP_PROFILE`; and runs of a few shapes each, for
    situations the full runs meet at some seeds only: :data:`CHUNKED_SHAPES`
    through the batch API, :data:`SINK_SHAPES` under :data:`SINK_PROFILE`,
    :data:`RING_SHAPES`, :data:`MAMBA_SHAPES` (also under :data:`CONNECTOR_NATIVE_PROFILE`), :data:`EAGLE_WINDOW_SHAPES`
    under :data:`EAGLE_WINDOW_PROFILE`, :data:`REKEYED_SHAPES`, :data:`MTP_SHAPES`, :data:`FINE_SWA_SHAPES`,
    :data:`PROMPT_END_SHAPES` under :data:`PROMPT_END_PROFILE` and, with asynchronous
    scheduling, :data:`PAST_HASHES_SHAPES`. Profiles
    with the same switches take the same steps, so ``impl`` runs once per
    :func:`behaviours` group."""
    from kvref.adapters.impl import IMPL_PROFILES  # noqa: PLC0415 - imports kvimpl
    from kvspec.profiles import NEWEST, VLLM_0_25_1  # noqa: PLC0415

    runs = [Run(p, "impl") for p in behaviours(IMPL_PROFILES)]
    return [
        *runs,
        Run(VLLM_0_25_1.name, "impl", native=False),
        Run(NEWEST.name, "impl-mutable"),
        Run(NEWEST.name, "impl-batch"),
        Run(NEWEST.name, "impl-batch-native"),
        Run(ARRAY_PROFILE, "impl-array"),
        Run(NEWEST.name, "impl", shapes="wide", min_steps=WIDE_STEPS),
        Run(NEWEST.name, "impl", shapes=PCP_MAMBA_SHAPE, min_steps=PCP_MAMBA_STEPS),
        Run(PCP_MAMBA_DCP_PROFILE, "impl", shapes=PCP_MAMBA_SHAPE, min_steps=PCP_MAMBA_STEPS),
        Run(NEWEST.name, "impl-batch", shapes=CHUNKED_SHAPES, min_steps=CHUNKED_STEPS),
        Run(SINK_PROFILE, "impl", shapes=SINK_SHAPES, min_steps=SINK_STEPS),
        Run(NEWEST.name, "impl", shapes=RING_SHAPES),
        Run(NEWEST.name, "impl", shapes=MAMBA_SHAPES),
        Run(CONNECTOR_NATIVE_PROFILE, "impl", shapes=MAMBA_SHAPES),
        Run(EAGLE_WINDOW_PROFILE, "impl", shapes=EAGLE_WINDOW_SHAPES),
        Run(NEWEST.name, "impl", shapes=REKEYED_SHAPES, min_steps=REKEYED_STEPS),
        Run(NEWEST.name, "impl", shapes=MTP_SHAPES),
        Run(NEWEST.name, "impl", shapes=FINE_SWA_SHAPES),
        Run(PROMPT_END_PROFILE, "impl", shapes=PROMPT_END_SHAPES, min_steps=PROMPT_END_STEPS),
        Run(NEWEST.name, "impl", shapes=PAST_HASHES_SHAPES, min_steps=PAST_HASHES_STEPS, asynchronous=True),
    ]


def main(argv: list[str]) -> int:
    """Run (or merge) the seeds, write the reports; with ``--check`` exit 1 when the gate fails."""
    parser = argparse.ArgumentParser(prog="python -m kvtools coverage")
    parser.add_argument("--seeds", default="0-4", help="seeds, e.g. 0-4 or 0,2 (default 0-4)")
    parser.add_argument(
        "--targets",
        default=DEFAULT_TARGETS,
        help=f"kvimpl targets, comma-separated, merged per seed (default {DEFAULT_TARGETS})",
    )
    parser.add_argument("--profiles", default="all", help="semantics profiles: all (default), newest, or P,Q")
    parser.add_argument("--ci", action="store_true", help="run what CI's lockstep runs (see --ci-runs)")
    parser.add_argument("--ci-runs", action="store_true",
                        help="print CI's runs (profile target build shapes steps scheduling), then exit")  # fmt: skip
    parser.add_argument("--merge", nargs="+", type=Path, default=None, metavar="JSON",
                        help="run nothing: merge these kvref check --coverage-json reports (one seed)")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    parser.add_argument("--min-steps", type=int, default=None, help="override the ci profile's step goal")
    parser.add_argument("--out", type=Path, default=None, help="where coverage.md and coverage.json go "
                        "(default docs/reports; none with --merge)")  # fmt: skip
    parser.add_argument("--check", action="store_true", help="exit 1 when the first seed fails the gap ratchet")
    parser.add_argument("--write-gaps", action="store_true", help=f"rewrite {GAPS_FILE.name} from the first seed")
    parser.add_argument("--relocate", action="store_true",
                        help="run nothing: move listed entries to the line their code reads at now")  # fmt: skip
    args = parser.parse_args(argv)
    if args.relocate:
        for path in (UNREACHABLE_FILE, GAPS_FILE):
            for note in relocate(path, source_lines):
                print(f"{path.name}: {note}")
        return 0
    if args.ci_runs:
        for r in ci_runs():
            print(r.ci_line())
        return 0
    if args.merge is not None:
        reports = [_read_report(p) for p in args.merge]
        runs = {0: merge_runs(reports)}
        per_profile: dict[int, dict[str, dict[str, Any]]] = {}
        print(_summary_line(0, runs[0]))
    else:
        runs, per_profile = run_all(args, plan(args))
    out = args.out if args.out is not None or args.merge is not None else REPORT_DIR
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        profiles = {str(s): {p: r["totals"] for p, r in d.items()} for s, d in per_profile.items()}
        summary = {"command": command_line(args), "seeds": {str(s): r for s, r in runs.items()}, "profiles": profiles}
        (out / "coverage.json").write_text(json.dumps(summary, indent=1) + "\n")
        (out / "coverage.md").write_text(render_markdown(runs, per_profile, command_line(args)))
    first = runs[min(runs)]
    if args.write_gaps:
        found = gaps_of(first, source_lines)
        write_gaps(found)
        print(f"wrote {len(found)} known gaps to {GAPS_FILE.relative_to(ROOT)}")
    if not args.check:
        return 0
    problems = gate(first, load_gaps(), source_lines)
    for p in problems:
        print(f"coverage gate: {p}")
    known = len(load_gaps())
    verdict = f"{len(problems)} problem(s)" if problems else "passed"
    print(f"coverage gate: {verdict} ({first['totals']['gaps']} gaps, {known} known)")
    return 1 if problems else 0


def plan(args: argparse.Namespace) -> list[Run]:
    """The runs of each seed: CI's, or every chosen profile times every target."""
    if args.ci:
        return ci_runs()
    return [Run(p, t) for p in parse_profiles(args.profiles) for t in args.targets.split(",")]


def parse_profiles(text: str) -> list[str]:
    """``all`` -> every profile kvimpl follows (oldest first); ``newest``; else ``P,Q`` as given."""
    from kvref.adapters.impl import IMPL_PROFILES  # noqa: PLC0415 - imports kvimpl
    from kvspec.profiles import NEWEST, PROFILES  # noqa: PLC0415

    if text == "all":
        return [p for p in PROFILES if p in IMPL_PROFILES]
    if text == "newest":
        return [NEWEST.name]
    names = text.split(",")
    unknown = [n for n in names if n not in PROFILES]
    if unknown:
        raise SystemExit(f"unknown semantics profile(s) {', '.join(unknown)}; known: {', '.join(PROFILES)}")
    return names


def run_all(
    args: argparse.Namespace, runs: list[Run]
) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, dict[str, Any]]]]:
    """Every seed's runs: merged per seed, and per profile (its targets merged). With ``--out``
    each run's own report stays in its ``runs/`` folder (``--merge`` takes them again)."""
    merged: dict[int, dict[str, Any]] = {}
    per_profile: dict[int, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max(1, args.jobs)) as pool:
        where = Path(tmp) if args.out is None else args.out.resolve() / "runs"
        where.mkdir(parents=True, exist_ok=True)
        for seed in parse_seeds(args.seeds):
            reports = list(pool.map(lambda r, s=seed: run_seed(s, where, r, args.min_steps), runs))
            by_profile: dict[str, list[dict[str, Any]]] = {}
            for r, rep in zip(runs, reports, strict=True):
                by_profile.setdefault(r.profile, []).append(rep)
            per_profile[seed] = {p: merge_runs(reps) for p, reps in by_profile.items()}
            merged[seed] = merge_runs(reports)
            print(_summary_line(seed, merged[seed]))
    return merged, per_profile


def parse_seeds(text: str) -> list[int]:
    """``0-4`` -> [0, 1, 2, 3, 4]; ``0,2`` -> [0, 2]."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def run_seed(seed: int, tmp: Path, run: Run, min_steps: int | None) -> dict[str, Any]:
    """One ``kvref check --coverage`` run; its branch report, exit code and seconds."""
    sched = "-async" if run.asynchronous else ""
    out = tmp / f"seed-{seed}-{run.profile}-{run.target}-{'n' if run.native else 'p'}{sched}-{run.shapes or 'all'}.json"
    cmd = [sys.executable, "-m", "kvref", "check", "--target", run.target, "--against", "spec", "--profile", "ci",
           "--seed", str(seed), "--semantics", run.profile, "--coverage-json", str(out)]  # fmt: skip
    if run.shapes:
        cmd += ["--shapes", run.shapes]
    if run.min_steps or min_steps:
        cmd += ["--min-steps", str(run.min_steps or min_steps)]
    if run.asynchronous:
        cmd.append("--async-scheduling")
    env = dict(os.environ, **({} if run.native else {"KVREF_NATIVE": "0"}))
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=tmp, env=env)
    seconds = time.monotonic() - start
    if not out.exists():
        raise SystemExit(f"seed {seed} {run.label}: kvref check wrote no branch report (exit {done.returncode}):\n"
                         f"{done.stderr}")  # fmt: skip
    report: dict[str, Any] = json.loads(out.read_text())
    report.update(exit=done.returncode, seconds=round(seconds, 1))
    print(f"  seed {seed} {run.label}: {report['totals']['gaps']} gaps, exit {done.returncode} ({seconds:.0f} s)")
    return report


def _read_report(path: Path) -> dict[str, Any]:
    """A ``kvref check --coverage-json`` report (exit 0 and no seconds: CI checks each run's exit itself)."""
    report: dict[str, Any] = json.loads(path.read_text())
    report.setdefault("exit", 0)
    report.setdefault("seconds", 0.0)
    return report


def _summary_line(seed: int, r: dict[str, Any]) -> str:
    t = r["totals"]
    return f"seed {seed}: {t['taken']}/{t['outcomes']} taken, {t['gaps']} gaps ({r['seconds']:.0f} s)"


def command_line(args: argparse.Namespace) -> str:
    """How to regenerate the report."""
    if args.merge is not None:
        return "python -m kvtools coverage --merge " + " ".join(p.name for p in args.merge)
    if args.ci:
        extra = " --ci"
    else:
        extra = f" --profiles {args.profiles}" if args.profiles != "all" else ""
        extra += f" --targets {args.targets}" if args.targets != DEFAULT_TARGETS else ""
    extra += f" --min-steps {args.min_steps}" if args.min_steps else ""
    return f"python -m kvtools coverage --seeds {args.seeds}{extra}"


def render_markdown(
    runs: dict[int, dict[str, Any]], per_profile: dict[int, dict[str, dict[str, Any]]], command: str
) -> str:
    """docs/reports/coverage.md."""
    lines = [
        "# Branch coverage of kvspec and kvimpl under the ci lockstep",
        "",
        f"Generated by `{command}` (kvimpl against kvspec, `--profile ci`, one process per seed,",
        "semantics profile and target; a seed's runs merged: an outcome counts as taken if any run took it).",
        "An *outcome* is one arc out of a decision, as coverage.py (branch=True) counts them. *At import*:",
        "decisions at module or class level, which ran before measurement started. *Listed*: outcomes",
        "argued unreachable through the public API in `kit/kvref/unreachable_branches.toml`. A *gap* is",
        "an outcome inside a function that no run took and nobody showed unreachable: a fault",
        "behind it is invisible to the lockstep.",
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
    lines += ["", f"Gaps at every seed: {len(everywhere)}."]
    lines += ["", "Configuration classes (`kvref.config_coverage`: block sizes against the scheduler and hash",
              "blocks, windows and chunks in blocks, speculative blocks, EAGLE groups, pool sizes, context",
              "parallelism, switches) taken by a seed's runs:", ""]  # fmt: skip
    for seed, r in sorted(runs.items()):
        absent = missing(r.get("config_properties", ()))
        lines.append(
            f"- seed {seed}: {len(NAMES) - len(absent)} of {len(NAMES)}"
            + (f"; not: {', '.join(absent)}" if absent else "")
        )
    lines += _profile_table(runs[first], per_profile.get(first, {}), first)
    lines += ["", f"## Gaps at seed {first}, by file", ""]
    lines += ["| file | outcomes | taken | gaps |", "|---|---:|---:|---:|"]
    files = runs[first]["files"]
    for name, d in sorted(files.items()):
        if d["gaps"]:
            lines.append(f"| {name} | {d['outcomes']} | {d['taken']} | {len(d['gaps'])} |")
    lines += ["", "Every gap (`line -> to`; `exit` = leaves the function), with its decision:", "", "```"]
    for g in gaps_of(runs[first], source_lines):
        lines.append(f"{g.file}:{g.line} -> {g.to if g.to > 0 else 'exit'}  {g.code}")
    lines += ["```", ""]
    for r in runs.values():
        lines += [f"stale: {s}" for s in r["stale"]]
    return "\n".join(lines) + "\n"


def _profile_table(merged: dict[str, Any], profiles: dict[str, dict[str, Any]], seed: int) -> list[str]:
    """Per profile at ``seed``: taken and gaps alone, and how many outcomes only that profile takes."""
    if not profiles:
        return []
    gaps = {p: {(f, tuple(a)) for f, d in r["files"].items() for a in d["gaps"]} for p, r in profiles.items()}
    lines = ["", f"## Per semantics profile at seed {seed} (its targets merged)", "",
             "*Only here*: outcomes that this profile's runs take and no other profile's do.", "",
             "| profile | taken | gaps alone | only here | seconds |", "|---|---:|---:|---:|---:|"]  # fmt: skip
    for p, r in profiles.items():
        others = [g for q, g in gaps.items() if q != p]
        only = len(set.intersection(*others) - gaps[p]) if others else 0
        t = r["totals"]
        lines.append(f"| {p} | {t['taken']} | {t['gaps']} | {only} | {r['seconds']:.0f} |")
    t = merged["totals"]
    lines.append(f"| merged | {t['taken']} | {t['gaps']} | | {merged['seconds']:.0f} |")
    return lines


def source_lines(name: str) -> list[str]:
    """The source lines of a package-relative file (``kvimpl/block_pool.py``)."""
    root = {"kvspec": ROOT / "spec", "kvimpl": ROOT / "impl"}
    pkg = name.split("/", 1)[0]
    path = root[pkg] / name if pkg in PACKAGES else Path(name)
    return path.read_text().splitlines() if path.exists() else []
