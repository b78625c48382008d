"""``kvref fuzz``: coverage-guided long runs of the lockstep machine (HypoFuzz).

``kvref check`` runs the machine for a step goal from a seed; ``kvref fuzz``
hands the same machine (:func:`kvref.stateful.make_lockstep_machine`, the
target against the reference) to HypoFuzz, which keeps a corpus of the
histories that reached new branches of the code and mutates them, for as long
as it is left running (``--budget`` seconds, or until Ctrl-C). Every new
failure is saved as a trace in ``--out`` (``fuzz-<operation>-<aspect>.jsonl``,
one per divergence class, the lockstep's history up to the divergence; the
shortest one seen, as shrinking goes on, as ``kvref check`` saves its shrunk
traces), so ``kvref replay`` reruns it; the corpus lives in
``<out>/hypothesis-db`` and a later run continues from it. With
``--database redis://host:port/N`` it lives in Hypothesis's Redis example
database instead, shared by every worker that names it: the machine's test has
the same database key wherever the same kvref and Hypothesis run it, so the
failures one worker saved are replayed first by every worker that starts
later, and by a plain Hypothesis run of the machine (``kvref campaign`` runs one
worker per vLLM release that way).

HypoFuzz is an optional extra (``pip install 'kvref[fuzz]'``); without it the
command says so and exits 2. It collects tests through pytest, so the command
writes a one-line test module into ``<out>`` that builds the machine from
environment variables (``KVREF_FUZZ_*``) and runs ``hypothesis fuzz`` on it,
with the Hypothesis command line of kvref's own interpreter (not whichever
``hypothesis`` comes first on ``PATH``, which may lack HypoFuzz).

A fuzzing run never passes vacuously: each fuzzing process writes how many
machine runs and lockstep steps it has done (``<out>/progress/``), the
command prints the totals, and it exits 2, with the end of the fuzzer's log
(``<out>/fuzz.log``), when no machine run happened or when the fuzzer
stopped on its own, before the budget, without saving a failure. What it
printed is also written as ``<out>/fuzz-report.json`` (:data:`REPORT`), with
how many machine runs replayed a failure or a corpus entry that the database
held (HypoFuzz's own queue says which; ``kvref campaign`` merges these).

NOTE: HypoFuzz runs each example as one machine run and shrinks what fails;
the lockstep writes the history of each divergence, and the machine's
teardown keeps it when it is the first or the shortest of its class, so a
failure found again, or shrunk, is still one file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvref.exits import USAGE, InputError

ENV_TARGET, ENV_AGAINST, ENV_SEMANTICS, ENV_OUT, ENV_DATABASE = (
    "KVREF_FUZZ_TARGET", "KVREF_FUZZ_AGAINST", "KVREF_FUZZ_SEMANTICS", "KVREF_FUZZ_OUT", "KVREF_FUZZ_DATABASE",
)  # fmt: skip
REPORT = "fuzz-report.json"
"""The run's summary in ``--out``: target, against, semantics, database, seconds,
runs, steps, the replay counts (:data:`REPLAY_COUNTS`), new traces, problem, exit."""
REPLAY_COUNTS = ("replayed_failures", "replayed_failures_failed", "replayed_corpus")
"""Machine runs whose choices HypoFuzz took from a failure the database held (and
how many of them failed again), and from the saved corpus or another worker's."""
DATABASE_SCHEMES = ("redis", "rediss", "unix")
TEST_MODULE = """\
# Written by kvref fuzz: the lockstep machine HypoFuzz runs (kvref.cli.fuzz).
from kvref.cli.fuzz import machine_from_environment

TestFuzz = machine_from_environment().TestCase
"""


def add_parser(sub: Any) -> None:
    """Register ``fuzz`` on the subcommand parser ``sub``."""
    fuzz = sub.add_parser("fuzz", help="coverage-guided long runs of the lockstep machine (HypoFuzz)")
    fuzz.add_argument("--target", default="impl", help="impl, impl-batch, spec, vllm or module:factory")
    fuzz.add_argument("--against", default="spec", help="the reference (default spec)")
    fuzz.add_argument("--semantics", default=None, metavar="PROFILE", help="semantics profile (default: the newest)")
    fuzz.add_argument("--out", type=Path, default=Path("kvref-fuzz"), help="traces, the corpus and the test module")
    fuzz.add_argument("--budget", type=float, default=None, help="stop after this many seconds (default: Ctrl-C)")
    fuzz.add_argument("--workers", type=int, default=1, help="fuzzing processes (default 1)")
    fuzz.add_argument(
        "--database",
        default=None,
        metavar="URL",
        help="Hypothesis's Redis example database, redis://host:port/N, shared by every worker that names it "
        "(default: <out>/hypothesis-db)",
    )
    fuzz.set_defaults(run=run)


GROUP_GRACE_S = 30.0
"""Seconds a stopped process group has to exit after SIGTERM before SIGKILL."""


def stop_process_group(proc: subprocess.Popen[Any], grace_s: float = GROUP_GRACE_S) -> None:
    """Stop ``proc``, started with ``start_new_session=True``, and every process
    of its group: SIGTERM, up to ``grace_s`` seconds for the leader to exit, then
    SIGKILL to whatever of the group is left (worker processes whose parent has
    exited included). A group already gone is no error."""
    try:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace_s)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """Within the block, SIGTERM raises ``SystemExit(143)`` so that the caller's
    ``finally`` clauses run (``kvref campaign`` stops its workers with SIGTERM);
    outside the main thread, where no handler can be set, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_on_term(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace) -> int:
    """Fuzz until the budget ends; 1 when a failure was saved, 0 when none, 2
    without HypoFuzz or when the fuzzer ran nothing or stopped early for no failure.

    Raises:
        InputError: For a ``--database`` that is not a Redis URL, or a Redis
            server that does not answer (before anything is written).
    """
    if not _has_hypofuzz():
        print("kvref fuzz: HypoFuzz is not installed; pip install 'kvref[fuzz]'", file=sys.stderr)
        return USAGE
    if args.database is not None:
        open_database(args.database)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "test_kvref_fuzz.py").write_text(TEST_MODULE)
    progress = out / "progress"
    shutil.rmtree(progress, ignore_errors=True)
    progress.mkdir()
    before = {p: p.read_text() for p in out.glob("fuzz-*.jsonl")}
    env = dict(os.environ)
    env.update({ENV_TARGET: args.target, ENV_AGAINST: args.against, ENV_OUT: str(out)})
    if args.semantics:
        env[ENV_SEMANTICS] = args.semantics
    if args.database is not None:
        env[ENV_DATABASE] = args.database
    cmd = [sys.executable, "-c", HYPOTHESIS_CLI, "fuzz", "--no-dashboard", "-n", str(args.workers), "--",
           str(out / "test_kvref_fuzz.py"), "-p", "no:cacheprovider", "-q"]  # fmt: skip
    start = time.monotonic()
    stopped_by_us = False
    # The fuzzer runs in a process group of its own: HypoFuzz's worker processes outlive their
    # parent when only it is stopped, and went on fuzzing for as long as the machine ran.
    with (
        (out / "fuzz.log").open("w") as log,
        subprocess.Popen(cmd, env=env, cwd=out, stdout=log, stderr=log, start_new_session=True) as proc,
        _terminate_as_exit(),
    ):
        try:
            proc.wait(timeout=args.budget)
        except subprocess.TimeoutExpired:
            stopped_by_us = True
        finally:
            stop_process_group(proc)
    new = sorted(p for p in out.glob("fuzz-*.jsonl") if before.get(p) != p.read_text())
    seconds = time.monotonic() - start
    counts = read_counts(progress)
    runs, steps = counts["runs"], counts["steps"]
    replayed = ""
    if counts["replayed_failures"] or counts["replayed_corpus"]:
        replayed = (
            f", {counts['replayed_failures']} replaying a saved failure ({counts['replayed_failures_failed']} failed"
            f" again), {counts['replayed_corpus']} replaying the corpus"
        )
    print(
        f"kvref fuzz: {args.target} vs {args.against}, {seconds:.0f} s, {runs} machine runs{replayed}, "
        f"{steps} lockstep steps: {len(new)} new or shorter failure trace(s)"
    )
    for path in new:
        print(f"  {path.name}: kvref replay {path} --target {args.target}")
    problem = None
    if runs == 0:
        problem = "the fuzzer ran no machine run"
    elif not stopped_by_us and not new:
        problem = f"the fuzzer stopped after {seconds:.0f} s (exit code {proc.returncode}) without a failure"
    code = USAGE if problem is not None else 1 if new else 0
    report = {
        "format": "kvref-fuzz-report",
        "target": args.target,
        "against": args.against,
        "semantics": args.semantics,
        "database": args.database or str(out / "hypothesis-db"),
        "seconds": round(seconds, 1),
        **counts,
        "new_traces": [p.name for p in new],
        "problem": problem,
        "exit": code,
    }
    (out / REPORT).write_text(json.dumps(report, indent=1) + "\n")
    if problem is not None:
        tail = (out / "fuzz.log").read_text().splitlines()[-15:]
        print(f"kvref fuzz: {problem}; the end of {out / 'fuzz.log'}:", *tail, sep="\n  ", file=sys.stderr)
    return code


HYPOTHESIS_CLI = "from hypothesis.extra.cli import main; main()"
"""The ``hypothesis`` command of this interpreter (HypoFuzz adds ``fuzz`` to it)."""


def read_progress(folder: Path) -> tuple[int, int]:
    """Machine runs and lockstep steps that the fuzzing processes reported (:class:`Progress`)."""
    counts = read_counts(folder)
    return counts["runs"], counts["steps"]


def read_counts(folder: Path) -> dict[str, int]:
    """Every count the fuzzing processes reported (:class:`Progress`), added up:
    ``runs``, ``steps`` and :data:`REPLAY_COUNTS` (0 where a process wrote none)."""
    counts = dict.fromkeys(("runs", "steps", *REPLAY_COUNTS), 0)
    for path in folder.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being rewritten right now: a process's count is a lower bound anyway
        for name in counts:
            counts[name] += int(data.get(name, 0))
    return counts


def open_database(url: str) -> Any:
    """Hypothesis's Redis example database at ``url`` (``redis://host:port/N``,
    ``rediss://`` or ``unix://``), after the server answered a ping.

    Raises:
        InputError: For another scheme, a URL the Redis client refuses, a
            missing ``redis`` package, or a server that does not answer.
    """
    scheme = url.partition("://")[0] if "://" in url else ""
    if scheme not in DATABASE_SCHEMES:
        raise InputError(
            f"--database {url!r} is not a Redis URL: it must start with one of "
            f"{', '.join(s + '://' for s in DATABASE_SCHEMES)} (e.g. redis://localhost:6379/0)"
        )
    try:
        import redis  # noqa: PLC0415 - an optional dependency (the fuzz extra)
        from hypothesis.extra.redis import RedisExampleDatabase  # noqa: PLC0415
    except ImportError:
        raise InputError("--database needs the redis package; pip install 'kvref[fuzz]'") from None
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=30)
        client.ping()
    except ValueError as exc:
        raise InputError(f"--database {url!r}: the Redis client refuses it: {exc}") from None
    except redis.RedisError as exc:
        why = f"{type(exc).__name__}: {exc}"
        raise InputError(f"--database {url!r}: no answer from Redis ({why}); is the server running?") from None
    return RedisExampleDatabase(client)


class Progress:
    """A fuzzing process's count of machine runs and lockstep steps, written to
    ``<folder>/<pid>.json`` after its first run and then at most once a second
    (a process the budget stops may lose its last second)."""

    def __init__(self, folder: Path) -> None:
        """Count into ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{os.getpid()}.json"
        self.written = 0.0

        self.replays = dict.fromkeys(REPLAY_COUNTS, 0)

    def update(self, runs: int, steps: int) -> None:
        """Record the totals so far (and :attr:`replays`)."""
        now = time.monotonic()
        if self.written and now - self.written < 1.0:
            return
        self.written = now
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"runs": runs, "steps": steps, **self.replays}))
        tmp.replace(self.path)


def machine_from_environment() -> Any:
    """The lockstep machine class the written test module runs (see the module docstring).

    Its settings: the ``ci`` profile's, with the corpus database in
    ``<out>/hypothesis-db`` (or the Redis database ``KVREF_FUZZ_DATABASE``
    names) loaded as the default (HypoFuzz requires the test's database to be
    the default one) and the nested-given health check on.
    """
    from hypothesis import HealthCheck, settings  # noqa: PLC0415 - imported by the fuzzing process only
    from hypothesis.database import DirectoryBasedExampleDatabase  # noqa: PLC0415

    from kvref.adapters import load_factory  # noqa: PLC0415
    from kvref.settings import profile_settings  # noqa: PLC0415
    from kvref.stateful import MachineSetup, make_lockstep_machine  # noqa: PLC0415
    from kvspec.profiles import NEWEST, profile_named  # noqa: PLC0415

    out = Path(os.environ.get(ENV_OUT, "kvref-fuzz"))
    url = os.environ.get(ENV_DATABASE)
    db = open_database(url) if url else DirectoryBasedExampleDatabase(str(out / "hypothesis-db"))
    # HypoFuzz skips a test that suppresses the nested-given check (it cannot observe nested tests).
    quiet = [h for h in HealthCheck if h is not HealthCheck.nested_given]
    settings.register_profile("kvref-fuzz", profile_settings("ci"), database=db, suppress_health_check=quiet)
    settings.load_profile("kvref-fuzz")
    semantics = os.environ.get(ENV_SEMANTICS)
    profile = profile_named(semantics) if semantics else NEWEST
    factories = [load_factory(os.environ.get(ENV_AGAINST, "spec")), load_factory(os.environ.get(ENV_TARGET, "impl"))]
    failures = out / "failures"
    failures.mkdir(parents=True, exist_ok=True)
    setup = MachineSetup(factories, failure_dir=failures, profile=profile)
    base = make_lockstep_machine(setup)

    progress = Progress(out / "progress")

    class FuzzMachine(base):  # type: ignore[misc, valid-type]  # a class built at run time
        def teardown(self) -> None:
            try:
                super().teardown()
            finally:
                _count_replay(progress, failed=setup.stats.last_failure is not None)
                _keep_failure(setup, out)
                progress.update(setup.stats.runs, setup.stats.steps)

    FuzzMachine.TestCase.settings = settings.get_profile("kvref-fuzz")
    return FuzzMachine


def database_key(machine: Any) -> str:
    """The key (hex) under which Hypothesis and HypoFuzz keep the examples of
    ``machine``'s test: the digest of Hypothesis's state-machine test function
    and of the machine class's source, so it is the same wherever the same kvref
    and Hypothesis run it (as HypoFuzz computes it when it collects the test)."""
    from hypothesis.internal.reflection import function_digest  # noqa: PLC0415
    from hypothesis.stateful import get_state_machine_test  # noqa: PLC0415

    test: Any = get_state_machine_test(machine, settings=machine.TestCase.settings)  # @given adds .hypothesis
    return function_digest(test.hypothesis.inner_test).hex()


def _count_replay(progress: Progress, *, failed: bool) -> None:
    """Count the run in ``progress.replays`` when HypoFuzz took its choices from
    the database: a saved failure (``FAILURE_*`` in its queue) or the saved or
    another worker's corpus (``COVERING*``).

    NOTE: HypoFuzz says where a run's choices came from only in its provider's
    current state (``HypofuzzProvider._state.priority``, HypoFuzz 25.11.1); a
    HypoFuzz without it counts no replay, and the counts read 0, not a guess.
    """
    try:
        from hypothesis.control import current_build_context  # noqa: PLC0415

        provider = current_build_context().data.provider
    except Exception:  # outside a Hypothesis test, or a HypoFuzz without a provider: nothing to count
        return
    priority = getattr(getattr(getattr(provider, "_state", None), "priority", None), "name", "")
    if priority.startswith("FAILURE_"):
        progress.replays["replayed_failures"] += 1
        progress.replays["replayed_failures_failed"] += int(failed)
    elif priority.startswith("COVERING"):
        progress.replays["replayed_corpus"] += 1


def _keep_failure(setup: Any, out: Path) -> None:
    """Keep the run's failure trace (if any) in ``out``: one file per
    divergence class (operation and aspect), the shortest history seen."""
    path, key = setup.stats.last_failure, setup.stats.last_failure_key
    setup.stats.last_failure = None
    if path is None or not Path(path).exists():
        return
    text = Path(path).read_text()
    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in str(key or "unknown"))
    target = out / f"fuzz-{name}.jsonl"
    if not target.exists() or len(text.splitlines()) < len(target.read_text().splitlines()):
        target.write_text(text)


def _has_hypofuzz() -> bool:
    try:
        import hypofuzz  # noqa: F401, PLC0415 - only probing
    except ImportError:
        return False
    return True
