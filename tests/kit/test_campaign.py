"""``kvref campaign``: HypoFuzz workers over two vLLM release venvs sharing a Redis example database.

The end-to-end test needs ``redis-server`` (Debian's ``redis-server``; ``ci/setup.sh``
installs it), HypoFuzz and a second venv with another vLLM release and kvref[fuzz]
(``.venv-vllm-newest``, made by ``ci/setup.sh --with-vllm-newest``, or the path in
``KVREF_CAMPAIGN_VENV``); the unit tests need none of them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvref.cli import build_parser, campaign, fuzz
from kvref.cli.campaign import Worker, WorkerResult
from kvref.exits import InputError
from kvspec.config import KVCacheConfig
from kvtools.processes import processes_naming

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PLANTED_RELEASE = "KVREF_TEST_PLANTED_RELEASE"


def planted_fault(config: KVCacheConfig) -> Any:
    """kvimpl (pure Python), with a fault planted only under the semantics
    profile of the release ``KVREF_TEST_PLANTED_RELEASE`` names: its view lists
    the free queue backwards, which the lockstep sees at the first step of
    nearly every run (the campaign's target, ``test_campaign:planted_fault``)."""
    from kvref.adapters.impl import make_impl_python_adapter  # noqa: PLC0415 - loaded by the workers too

    adapter = make_impl_python_adapter(config)
    if config.profile.release == os.environ.get(PLANTED_RELEASE):
        view = adapter.to_view

        def backwards() -> Any:
            honest = view()
            return dataclasses.replace(honest, free_queue=honest.free_queue[::-1])

        adapter.to_view = backwards  # type: ignore[method-assign]  # the planted fault: one method of one instance
    return adapter


# --- end to end ----------------------------------------------------------------


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A throwaway Redis server on a free local port, without persistence."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server; ci/setup.sh does it)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    folder = tmp_path / "redis"
    folder.mkdir()
    cmd = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(folder)]
    with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT) as proc:
        try:
            _wait_for_port(port, proc)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_a_failure_planted_in_one_release_is_replayed_by_the_other_worker(redis_url: str, tmp_path: Path) -> None:
    """Campaign 1: the worker of the release with the planted fault saves a
    failure in the shared database; the other release's worker finds none.
    Campaign 2: the other release's worker replays that failure and passes it;
    under the planted release the worker fails again.
    Each campaign gets 60 s: a worker's start-up (pytest collection, vLLM's
    import) counts against it; 30 s passed here under load, 60 s leaves a margin."""
    pytest.importorskip("hypofuzz")
    pytest.importorskip("redis")
    venv_a, venv_b = _release_venvs()
    release_a = _vllm_release(venv_a)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    env[PLANTED_RELEASE] = release_a

    first = _campaign(env, [venv_a, venv_b], redis_url, tmp_path / "first", budget=60)
    a, b = _workers(first, release_a)
    assert first["exit"] == 1 and a["failures"] and a["exit"] == 1, first
    assert not b["failures"] and b["runs"] > 0 and b["exit"] == 0, first

    second = _campaign(env, [venv_a, venv_b], redis_url, tmp_path / "second", budget=60)
    a2, b2 = _workers(second, release_a)
    assert b2["replayed_failures"] >= 1 and b2["replayed_failures_failed"] == 0, second
    assert not b2["failures"] and b2["exit"] == 0, second
    # the planted release fails again. NOTE: not necessarily on the saved example: replaying its choices
    # in a fresh worker once took another path and passed (CI, 1 replay, 0 failed again, 103 runs that
    # failed on fresh examples); the machine keeps state across the runs of a process (learned skips)
    assert a2["exit"] == 1 and set(a2["failures"]) & set(a["failures"]), a2
    assert second["exit"] == 1


def _campaign(env: dict[str, str], venvs: list[Path], url: str, out: Path, budget: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "kvref", "campaign", "--redis", url, "--budget", str(budget), "--out", str(out)]
    cmd += ["--target", "test_campaign:planted_fault"]
    for venv in venvs:
        cmd += ["--venv", str(venv)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=budget + 600)
    assert (out / campaign.SUMMARY).exists(), (done.stdout, done.stderr)
    summary: dict[str, Any] = json.loads((out / campaign.SUMMARY).read_text())
    assert summary["exit"] == done.returncode, (done.stdout, done.stderr)
    left = processes_naming(out)
    assert not left, f"processes of the campaign outlived it: {left}"
    print(done.stdout)
    return summary


def _workers(summary: dict[str, Any], release_a: str) -> tuple[dict[str, Any], dict[str, Any]]:
    by_release = {w["release"]: w for w in summary["workers"]}
    (other,) = set(by_release) - {release_a}
    return by_release[release_a], by_release[other]


def _release_venvs() -> tuple[Path, Path]:
    """This interpreter's venv and a second one with another vLLM release."""
    here = Path(sys.prefix)
    other = Path(os.environ.get("KVREF_CAMPAIGN_VENV", ROOT / ".venv-vllm-newest"))
    if not (other / "bin" / "kvref").exists():
        pytest.skip(f"no second release venv at {other} (ci/setup.sh --with-vllm-newest, or KVREF_CAMPAIGN_VENV)")
    if _vllm_release(here) is None:
        pytest.skip("no vLLM in this venv (ci/setup.sh --with-vllm)")
    return here, other


def _vllm_release(venv: Path) -> Any:
    code = "import importlib.metadata as m; print(m.version('vllm'))"
    done = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def _wait_for_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"redis-server exited {proc.returncode}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"redis-server did not listen on port {port} within 30 s")


# --- arguments and probes ----------------------------------------------------------


def _args(tmp_path: Path, *extra: str) -> Any:
    argv = ["campaign", "--redis", "redis://127.0.0.1:1/0", "--budget", "5", "--out", str(tmp_path / "out"), *extra]
    return build_parser().parse_args(argv)


def test_campaign_is_a_subcommand(tmp_path: Path) -> None:
    args = _args(tmp_path, "--venv", "a", "--venv", "b")
    assert (args.venv, args.target, args.against, args.budget) == ([Path("a"), Path("b")], "impl", "spec", 5.0)


def test_a_budget_that_is_not_positive_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--budget must be a positive"):
        campaign.run(_args(tmp_path, "--venv", str(tmp_path), "--budget", "0"))
    assert not (tmp_path / "out").exists()


def test_a_path_that_is_not_a_venv_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a virtual environment"):
        campaign.run(_args(tmp_path, "--venv", str(tmp_path / "nowhere")))
    assert not (tmp_path / "out").exists()


def test_a_venv_without_kvref_is_refused(tmp_path: Path) -> None:
    (tmp_path / "bare" / "bin").mkdir(parents=True)
    (tmp_path / "bare" / "bin" / "python").symlink_to(sys.executable)
    with pytest.raises(InputError, match="no kvref installed"):
        campaign.run(_args(tmp_path, "--venv", str(tmp_path / "bare")))


def test_an_unreachable_redis_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """This venv's probe pings the server (port 1: nothing listens there)."""
    pytest.importorskip("redis")
    with pytest.raises(InputError, match="no answer from Redis"):
        campaign.run(_args(tmp_path, "--venv", sys.prefix))
    assert not (tmp_path / "out").exists()


def test_fuzz_refuses_a_database_that_is_not_a_redis_url(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is not a Redis URL"):
        fuzz.open_database(str(tmp_path / "db"))
    args = build_parser().parse_args(["fuzz", "--database", "redis://localhost:6379/3"])
    assert args.database == "redis://localhost:6379/3"


def _worker(release: str, key: str = "k" * 32) -> Worker:
    return Worker(Path(f"/venvs/{release}"), release, f"vllm-{release}", "0.1.0", "6.170.27", key)


def test_two_venvs_of_one_release_are_refused() -> None:
    with pytest.raises(InputError, match=r"both hold vLLM 0\.25\.1"):
        campaign.check_workers([_worker("0.25.1"), _worker("0.34.0"), _worker("0.25.1")])


def test_venvs_whose_tests_have_different_database_keys_are_refused() -> None:
    with pytest.raises(InputError, match="would not share examples"):
        campaign.check_workers([_worker("0.25.1", "a" * 32), _worker("0.34.0", "b" * 32)])
    campaign.check_workers([_worker("0.25.1"), _worker("0.34.0")])


# --- the merged report -----------------------------------------------------------


def _report(folder: Path, **fields: Any) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    data = {"runs": 10, "steps": 200, "replayed_failures": 1, "replayed_failures_failed": 0, "replayed_corpus": 3,
            "new_traces": [], "problem": None, "exit": 0}  # fmt: skip
    data.update(fields)
    (folder / fuzz.REPORT).write_text(json.dumps(data))


def test_a_report_is_read_with_its_counts(tmp_path: Path) -> None:
    _report(tmp_path, new_traces=["fuzz-x.jsonl"])
    r = campaign.read_result(_worker("0.25.1"), tmp_path, 1, None)
    assert (r.runs, r.steps, r.failures, r.replayed_failures, r.replayed_corpus, r.problem) == (
        10, 200, ("fuzz-x.jsonl",), 1, 3, None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "exit_code", "start_problem", "why"),
    [
        (None, 2, None, "wrote no fuzz-report.json"),
        ({"runs": 0}, 0, None, "no machine run"),
        ({"problem": "the fuzzer stopped after 3 s"}, 2, None, "stopped after 3 s"),
        ({}, 130, None, "exited 130"),
        (None, None, "it could not start: no such file", "could not start"),
    ],
)
def test_a_worker_that_checked_nothing_has_a_problem(
    tmp_path: Path, fields: dict[str, Any] | None, exit_code: int | None, start_problem: str | None, why: str
) -> None:
    if fields is not None:
        _report(tmp_path, **fields)
    r = campaign.read_result(_worker("0.25.1"), tmp_path, exit_code, start_problem)
    assert r.problem is not None and why in r.problem


def _result(release: str, failures: tuple[str, ...] = (), problem: str | None = None) -> WorkerResult:
    return WorkerResult(release, f"vllm-{release}", "/v", 0, 5, 50, failures, 0, 0, 0, problem)


def test_merge_exit_codes_and_totals() -> None:
    clean = [_result("0.25.1"), _result("0.34.0")]
    summary, code = campaign.merge(clean)
    assert code == 0 and (summary["runs"], summary["steps"], summary["failures"]) == (10, 100, 0)
    assert [w["release"] for w in summary["workers"]] == ["0.25.1", "0.34.0"]
    idle = [_result("0.25.1"), _result("0.34.0", problem="it ran no machine run")]
    assert campaign.merge(idle)[1] == 2 and campaign.merge(idle)[0]["checked_nothing"] == ["0.34.0"]
    failed = [_result("0.25.1", failures=("fuzz-a.jsonl",)), _result("0.34.0", problem="it could not start")]
    assert campaign.merge(failed)[1] == 1  # a saved failure outranks a worker that checked nothing
