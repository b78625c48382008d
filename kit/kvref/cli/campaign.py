"""``kvref campaign``: HypoFuzz workers over several vLLM releases, one Redis example database.

Each ``--venv`` is a virtual environment holding kvref (with the fuzz extra)
and one vLLM release. The campaign starts one ``kvref fuzz`` per venv, that
venv's own ``bin/kvref`` under the semantics profile of the release it holds
(:func:`kvspec.profiles.profile_for_release`, as ``kvref check`` runs real
vLLM), writing to ``<out>/<release>/`` and sharing Hypothesis's Redis example
database (``--redis``, ``kvref fuzz --database``). HypoFuzz replays the
failures and the corpus a database holds for a test before it generates
anything, and the corpus entries other workers add while it runs, so a failure
one worker saved is run first by every worker of the next campaign (and by a
plain Hypothesis run of the machine with that database, as in CI). The
campaign waits for the workers, merges their reports (``kvref fuzz``'s
``fuzz-report.json``) into one summary, prints it and writes it as
``<out>/campaign.json``.

Exit code: 1 when a worker saved a failure trace, else 2 when a worker could
not start, checked nothing (no machine run, or its fuzzer stopped early
without a failure: ``kvref fuzz``'s exit 2) or left no report, else 0. Before
anything starts, each venv is probed with its own interpreter
(:func:`describe_worker`); a venv without kvref, HypoFuzz, the ``redis``
package or vLLM, a Redis server that does not answer, two venvs of one
release, or venvs whose machine tests have different database keys (they
would not share examples) are refused with an :class:`~kvref.exits.InputError`.

NOTE: HypoFuzz loads the database's failures once, when a worker starts; a
failure found while the campaign runs reaches the other workers of the same
campaign only if a corpus entry carries it, and reaches every worker of the
next campaign for certain. A worker of a release where the failure does not
happen again moves it to HypoFuzz's "fixed" key, which workers still replay.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from kvref.cli import fuzz
from kvref.exits import OK, USAGE, InputError

SUMMARY = "campaign.json"
"""The merged summary in ``--out`` (:func:`merge`)."""
PROBE_TIMEOUT_S = 300.0
"""How long a venv's probe may take (it imports kvref, and vLLM when a side is ``vllm``)."""
HANG_GUARD_S = 300.0
"""Seconds past the budget after which a worker that has not exited is killed
(``kvref fuzz`` stops its fuzzer at the budget and waits at most 30 s for it)."""
WORKER_GRACE_S = 2 * fuzz.GROUP_GRACE_S
"""Seconds a worker has, after SIGTERM, to stop its own fuzzer's process group
(``kvref fuzz`` waits up to :data:`kvref.cli.fuzz.GROUP_GRACE_S` for it) before
the worker's group is killed."""
PROBE = """\
import json, sys
try:
    from kvref.cli.campaign import describe_worker
except ImportError as exc:
    print(json.dumps({"unsupported": str(exc)}))
else:
    print(json.dumps(describe_worker(*sys.argv[1:])))
"""


def add_parser(sub: Any) -> None:
    """Register ``campaign`` on the subcommand parser ``sub``."""
    campaign = sub.add_parser(
        "campaign", help="HypoFuzz workers over several vLLM release venvs sharing one Redis example database"
    )
    campaign.add_argument(
        "--venv", type=Path, action="append", required=True, metavar="PATH",
        help="a virtual environment with kvref[fuzz] and one vLLM release (repeat for each release)",
    )  # fmt: skip
    campaign.add_argument(
        "--redis", required=True, metavar="URL", help="the shared example database, redis://host:port/N"
    )
    campaign.add_argument("--budget", type=float, required=True, help="seconds each worker fuzzes")
    campaign.add_argument(
        "--out", type=Path, default=Path("kvref-campaign"), help="one folder per release and the summary"
    )
    campaign.add_argument("--target", default="impl", help="impl, impl-batch, spec, vllm or module:factory")
    campaign.add_argument("--against", default="spec", help="the reference (default spec)")
    campaign.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Probe every venv, run the workers for the budget, merge their reports.

    Raises:
        InputError: For a budget that is not positive or a venv the campaign
            cannot use (:func:`probe`, :func:`check_workers`); nothing has started then.
    """
    if not args.budget > 0:
        raise InputError(f"--budget must be a positive number of seconds, not {args.budget}")
    workers = [probe(venv, args.target, args.against, args.redis) for venv in args.venv]
    check_workers(workers)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"kvref campaign: {len(workers)} worker(s), {args.target} vs {args.against}, {args.budget:g} s each, "
        f"database {args.redis} (key {workers[0].database_key[:16]})"
    )
    exits = _run_workers(workers, args, out)
    results = [read_result(w, out / w.release, *exits[i]) for i, w in enumerate(workers)]
    summary, code = merge(results)
    summary.update({"redis": args.redis, "target": args.target, "against": args.against, "budget": args.budget})
    (out / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    print(render(results, args.target))
    print(f"kvref campaign: exit {code}; summary in {out / SUMMARY}")
    return code


@dataclass(frozen=True, slots=True)
class Worker:
    """A venv the probe accepted (:func:`describe_worker` ran in it)."""

    venv: Path
    release: str
    """The vLLM release it holds, e.g. ``0.25.1``: its folder under ``--out``."""
    semantics: str
    """The semantics profile the worker runs under, e.g. ``vllm-0.25.1``."""
    kvref: str
    hypothesis: str
    database_key: str
    """Where its machine test's examples live in the database (:func:`kvref.cli.fuzz.database_key`)."""


@dataclass(frozen=True, slots=True)
class WorkerResult:
    """What one worker did, from its ``fuzz-report.json`` and exit status."""

    release: str
    semantics: str
    venv: str
    exit: int | None
    """``kvref fuzz``'s exit status; None when it could not start or was killed."""
    runs: int
    steps: int
    failures: tuple[str, ...]
    """The failure traces it saved (new or shorter), in ``<out>/<release>/``."""
    replayed_failures: int
    replayed_failures_failed: int
    replayed_corpus: int
    problem: str | None
    """Why it counts as having checked nothing, or None."""


def describe_worker(target: str, against: str, database: str) -> dict[str, Any]:
    """What the campaign needs to know about this interpreter's venv, as JSON
    data; run in each venv by :data:`PROBE`. Its ``problems`` list says what
    keeps the venv from being a worker (empty when nothing does).

    Args:
        target: The worker's ``--target``.
        against: The worker's ``--against``.
        database: The Redis URL, pinged from here.
    """
    from kvref.adapters.vllm import installed_vllm_version  # noqa: PLC0415 - metadata only, no vLLM import
    from kvspec.profiles import profile_for_release  # noqa: PLC0415

    problems: list[str] = []
    release = installed_vllm_version()
    semantics = None
    if release is None:
        problems.append("no vLLM installed: a worker runs under its venv's vLLM release (kvref install-vllm VERSION)")
    else:
        try:
            semantics = profile_for_release(release).name
        except KeyError as exc:
            problems.append(str(exc.args[0]))
    if not fuzz._has_hypofuzz():
        problems.append("HypoFuzz is not installed; pip install 'kvref[fuzz]'")
    try:
        fuzz.open_database(database)
    except InputError as exc:
        problems.append(str(exc))
    key = None
    with tempfile.TemporaryDirectory() as scratch:
        os.environ.update({fuzz.ENV_TARGET: target, fuzz.ENV_AGAINST: against, fuzz.ENV_OUT: scratch})
        # the key depends on neither; the database was pinged above
        for name in (fuzz.ENV_DATABASE, fuzz.ENV_SEMANTICS):
            os.environ.pop(name, None)
        try:
            key = fuzz.database_key(fuzz.machine_from_environment())
        except (InputError, ValueError, ImportError) as exc:
            problems.append(f"the machine cannot be built: {exc}")
    return {
        "release": release,
        "semantics": semantics,
        "kvref": _version("kvref"),
        "hypothesis": _version("hypothesis"),
        "database_key": key,
        "problems": problems,
    }


def probe(venv: Path, target: str, against: str, database: str) -> Worker:
    """Ask ``venv``'s own interpreter what it holds (:func:`describe_worker`).

    Raises:
        InputError: For a path that is not a venv, one without kvref or with
            a kvref without ``kvref campaign``, or any problem the venv reports.
    """
    venv = venv.resolve()
    python, kvref = venv / "bin" / "python", venv / "bin" / "kvref"
    if not python.exists():
        raise InputError(f"--venv {venv}: not a virtual environment (it has no bin/python)")
    if not kvref.exists():
        raise InputError(f"--venv {venv}: no kvref installed in it (no bin/kvref); pip install 'kvref[fuzz]' there")
    try:
        done = subprocess.run(
            [str(python), "-c", PROBE, target, against, database],
            capture_output=True, text=True, check=False, timeout=PROBE_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise InputError(f"--venv {venv}: its interpreter did not answer within {PROBE_TIMEOUT_S:.0f} s") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise InputError(f"--venv {venv}: kvref does not load there ({why})")
    try:
        data = json.loads(lines[-1])
    except ValueError:
        raise InputError(f"--venv {venv}: its probe printed {lines[-1][:200]!r}, not the expected JSON") from None
    if "unsupported" in data:
        raise InputError(
            f"--venv {venv}: its kvref has no kvref campaign ({data['unsupported']}); install this kvref there"
        )
    if data["problems"]:
        raise InputError(f"--venv {venv}: " + "; ".join(data["problems"]))
    return Worker(
        venv=venv, release=data["release"], semantics=data["semantics"], kvref=data["kvref"],
        hypothesis=data["hypothesis"], database_key=data["database_key"],
    )  # fmt: skip


def check_workers(workers: list[Worker]) -> None:
    """Refuse a campaign whose workers would collide or not share examples.

    Raises:
        InputError: When two venvs hold the same vLLM release (they would write
            to one folder), or when the machine tests' database keys differ
            (a different kvref or Hypothesis: no worker would replay another's
            examples).
    """
    seen: dict[str, Worker] = {}
    for worker in workers:
        if worker.release in seen:
            raise InputError(
                f"--venv {seen[worker.release].venv} and --venv {worker.venv} both hold vLLM {worker.release}; "
                "a campaign runs one worker per release"
            )
        seen[worker.release] = worker
    if len({w.database_key for w in workers}) > 1:
        keys = "; ".join(
            f"{w.venv} (kvref {w.kvref}, Hypothesis {w.hypothesis}): {w.database_key[:16]}" for w in workers
        )
        raise InputError(
            f"the venvs' machine tests have different database keys, so they would not share examples: {keys}; "
            "install the same kvref and Hypothesis in each"
        )


def read_result(worker: Worker, folder: Path, exit_code: int | None, start_problem: str | None) -> WorkerResult:
    """One worker's result from ``folder/fuzz-report.json`` and its exit status."""
    data: dict[str, Any] = {}
    problem = start_problem
    if problem is None:
        try:
            data = json.loads((folder / fuzz.REPORT).read_text())
        except (OSError, ValueError):
            problem = f"it wrote no {fuzz.REPORT} (exit {exit_code}); see {folder / 'worker.log'}"
        else:
            problem = data.get("problem")
    if problem is None and exit_code not in (0, 1):
        problem = f"kvref fuzz exited {exit_code}; see {folder / 'worker.log'}"
    runs = int(data.get("runs", 0))
    if problem is None and runs == 0:
        problem = "it ran no machine run"
    return WorkerResult(
        release=worker.release, semantics=worker.semantics, venv=str(worker.venv), exit=exit_code,
        runs=runs, steps=int(data.get("steps", 0)),
        failures=tuple(data.get("new_traces", ())),
        replayed_failures=int(data.get("replayed_failures", 0)),
        replayed_failures_failed=int(data.get("replayed_failures_failed", 0)),
        replayed_corpus=int(data.get("replayed_corpus", 0)),
        problem=problem,
    )  # fmt: skip


def merge(results: list[WorkerResult]) -> tuple[dict[str, Any], int]:
    """The campaign's summary (totals and one entry per worker) and exit code:
    1 when a worker saved a failure, else 2 when one checked nothing, else 0."""
    failed = any(r.failures for r in results)
    idle = [r.release for r in results if r.problem is not None]
    code = 1 if failed else USAGE if idle else OK
    summary: dict[str, Any] = {
        "format": "kvref-campaign",
        "workers": [asdict(r) for r in results],
        "runs": sum(r.runs for r in results),
        "steps": sum(r.steps for r in results),
        "failures": sum(len(r.failures) for r in results),
        "checked_nothing": idle,
        "exit": code,
    }
    return summary, code


def render(results: list[WorkerResult], target: str) -> str:
    """The summary as printed: one line per worker, then the failure traces."""
    lines = [f"  {'release':<10} {'semantics':<13} {'runs':>6} {'steps':>8} {'replayed f/again/corpus':>24} "
             f"{'failures':>8} exit"]  # fmt: skip
    for r in results:
        replayed = f"{r.replayed_failures}/{r.replayed_failures_failed}/{r.replayed_corpus}"
        lines.append(
            f"  {r.release:<10} {r.semantics:<13} {r.runs:>6} {r.steps:>8} {replayed:>24} {len(r.failures):>8} {r.exit}"
            + (f"  ({r.problem})" if r.problem else "")
        )
    for r in results:
        for name in r.failures:
            lines.append(f"  {r.release}: {r.venv}/bin/kvref replay {r.release}/{name} --target {target}")
    return "\n".join(lines)


def _run_workers(workers: list[Worker], args: argparse.Namespace, out: Path) -> list[tuple[int | None, str | None]]:
    """Start one ``kvref fuzz`` per worker and wait for them all: each one's
    exit status (None when it did not start or was killed) and start problem."""
    procs: list[subprocess.Popen[bytes] | None] = []
    problems: list[str | None] = []
    try:
        for worker in workers:
            folder = out / worker.release
            folder.mkdir(parents=True, exist_ok=True)
            (folder / fuzz.REPORT).unlink(missing_ok=True)  # an earlier campaign's report must not count
            cmd = [
                str(worker.venv / "bin" / "kvref"), "fuzz", "--target", args.target, "--against", args.against,
                "--semantics", worker.semantics, "--out", str(folder), "--budget", f"{args.budget:g}",
                "--database", args.redis,
            ]  # fmt: skip
            with (folder / "worker.log").open("wb") as log:
                try:
                    procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
                    problems.append(None)
                except OSError as exc:
                    procs.append(None)
                    problems.append(f"it could not start: {exc}")
        deadline = time.monotonic() + args.budget + HANG_GUARD_S
        exits: list[tuple[int | None, str | None]] = []
        for proc, problem in zip(procs, problems, strict=True):
            if proc is None:
                exits.append((None, problem))
                continue
            try:
                exits.append((proc.wait(timeout=max(0.0, deadline - time.monotonic())), None))
            except subprocess.TimeoutExpired:
                fuzz.stop_process_group(proc, WORKER_GRACE_S)
                exits.append((None, f"it ran {HANG_GUARD_S:.0f} s past the budget and was killed"))
        return exits
    finally:
        for proc in procs:
            if proc is not None:
                fuzz.stop_process_group(proc, WORKER_GRACE_S)


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
