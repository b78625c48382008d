"""Fault injection on the ``kvref`` command: interrupted at random points and
run side by side, it exits with the documented codes and loses no trace.

Each case runs ``python -m kvref`` in a subprocess in a temporary folder.
Truncated traces (exit 2, one line) have their own tests in
``tests/kit/test_cli_errors.py``; the hanging factory and the hanging
operation are here, timed against the command's own start-up.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvref.exits import DIVERGENCE, HANG, INTERRUPTED, NOTHING_CHECKED, OK, interruptible, watchdog
from kvref.traces import load

RNG = random.Random(20261201)
"""The interrupt delays are random but the same on every run of the suite."""


@pytest.fixture(autouse=True)
def _sigint_not_ignored() -> Iterator[None]:
    """Children get SIGINT as under an interactive shell.

    NOTE: a shell without job control starts background commands with SIGINT
    ignored, and an ignored signal stays ignored across ``exec`` (Python then
    installs no KeyboardInterrupt handler): a suite run as ``pytest ... &``
    would send its interrupts into the void and wait. A handled signal is
    reset to the default across ``exec``, so while a test runs this process
    handles SIGINT (Python's own handler) and every child starts with the default.
    """
    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _start(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    base = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_PROFILE"}
    return subprocess.Popen(
        [sys.executable, "-m", "kvref", *args],
        cwd=cwd,
        env={**base, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _interrupt_after(proc: subprocess.Popen[str], seconds: float) -> tuple[int, str, str]:
    time.sleep(seconds)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out, err


def _whole_traces(folder: Path) -> list[Path]:
    """Every file in ``folder`` is a complete trace (``load`` refuses a cut one); no temporary file is left."""
    names = sorted(folder.iterdir()) if folder.exists() else []
    assert not [p.name for p in names if p.name.startswith(".")], names
    for path in names:
        load(path)
    return names


@pytest.mark.parametrize("delay", [*(round(RNG.uniform(0.2, 6.0), 2) for _ in range(3)), 15.0])
def test_check_interrupted_ends_with_130_and_the_summary(tmp_path: Path, delay: float) -> None:
    """Early interrupts may land while the command is still importing or setting up (one line); later
    ones print the summary so far. Either way the exit code is 130 and no traceback is printed; the 15 s
    case is past start-up even on a loaded machine."""
    args = ("check", "--target", "spec", "--against", "none", "--profile", "dev", "--min-steps", "10000000")
    proc = _start(tmp_path, *args)
    code, out, err = _interrupt_after(proc, delay)
    assert code == INTERRUPTED, (code, out[-500:], err[-500:])
    assert "Traceback" not in err, err[-800:]
    if delay >= 15.0:
        assert "steps run" in out, out[-800:]
    else:
        early = ("kvref: interrupted during start-up; nothing ran", "kvref check: interrupted")
        assert "steps run" in out or any(line in err for line in early), (out[-800:], err[-500:])


@pytest.mark.parametrize("delay", [round(RNG.uniform(2.0, 8.0), 2) for _ in range(3)])
def test_recording_interrupted_leaves_only_whole_traces(tmp_path: Path, delay: float) -> None:
    out_dir = tmp_path / "rec"
    proc = _start(tmp_path, "traces", "record", "--out", str(out_dir), "--count", "100000", "--shape", "full")
    code, out, err = _interrupt_after(proc, delay)
    assert code in (INTERRUPTED, OK), (code, out[-500:], err[-500:])
    _whole_traces(out_dir)


def test_replay_interrupted_reports_the_files_so_far(tmp_path: Path) -> None:
    corpus = Path(__file__).resolve().parents[2] / "traces" / "vllm-0.25.1" / "golden"
    files = [str(p) for p in sorted(corpus.glob("*.jsonl"))] * 20
    proc = _start(tmp_path, "replay", *files, "--target", "spec")
    code, out, err = _interrupt_after(proc, round(RNG.uniform(2.0, 4.0), 2))
    assert code == INTERRUPTED, (out[-500:], err[-1500:])
    assert "interrupted after" in out and "traces as expected" in out, out[-500:]


def test_two_recorders_sharing_a_folder_keep_every_trace(tmp_path: Path) -> None:
    out_dir = tmp_path / "shared"
    args = ("traces", "record", "--out", str(out_dir), "--count", "4", "--shape", "full")
    procs = [_start(tmp_path, *args, "--seed", str(seed)) for seed in (1, 2)]
    for proc in procs:
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == OK, err[-500:]
    traces = _whole_traces(out_dir)
    assert len(traces) == 8, [p.name for p in traces]  # both numbered from 1: none overwritten


def test_two_failing_checks_at_once_keep_both_failure_traces(tmp_path: Path) -> None:
    failures = tmp_path / "failures"
    args = ("check", "--target", "kvtools.zoo:unhashed_freed_to_tail", "--against", "spec", "--profile", "dev")
    env = {"KVREF_FAILURE_DIR": str(failures)}
    procs = [_start(tmp_path, *args, "--seed", str(seed), "--semantics", "vllm-0.25.1", env=env) for seed in (0, 1)]
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == DIVERGENCE, (proc.returncode, out[-500:], err[-500:])
    traces = _whole_traces(failures)
    assert len(traces) == 2, [p.name for p in traces]
    for path in traces:
        assert "failure" in load(path).meta


def test_a_swallowed_interrupt_is_raised_again_at_the_next_adapter_operation() -> None:
    """Python only prints an interrupt raised inside a finaliser; the command's latch raises it again."""
    with interruptible():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
        except KeyboardInterrupt:
            pass  # swallowed, as inside a __del__ or a weakref callback
        with pytest.raises(KeyboardInterrupt), watchdog(None, "allocate_slots"):
            pass
    with watchdog(None, "allocate_slots"):  # a new command starts with the latch cleared
        pass


_FINALISER_SCRIPT = """
import os, signal, time
from kvref.exits import interruptible, watchdog

class Finalised:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)  # the handler runs here, inside the finaliser, where Python swallows what it raises

with interruptible():
    obj = Finalised()
    del obj  # Python hands the KeyboardInterrupt to sys.unraisablehook and goes on
    try:
        with watchdog(None, "allocate_slots"):
            pass
    except KeyboardInterrupt:
        print("raised again")
"""


def test_an_interrupt_inside_a_finaliser_is_not_printed_and_is_raised_again() -> None:
    """Run outside pytest, whose own unraisable hook would hide what Python prints."""
    script = [sys.executable, "-c", _FINALISER_SCRIPT]
    done = subprocess.run(script, check=False, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "raised again", (done.stdout, done.stderr)
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr


HANGING = """
import os, time
from kvref.adapters.spec import SpecAdapter

class Spins(SpecAdapter):
    name = "spins"
    def allocate_slots(self, *args, **kwargs):
        with open("entered", "a") as out:
            out.write("allocate_slots\\n")
        while True:  # a busy loop: the watchdog interrupts it between two bytecodes
            pass

def spins(config):
    return Spins(config)

def hangs(config):
    with open("entered", "a") as out:
        out.write("factory\\n")
    time.sleep(600)

def refuses(config):
    from kvref import Unsupported
    raise Unsupported("this engine runs no configuration")
"""
OP_TIMEOUT = 5.0
"""The watchdog of the hang cases (seconds): large beside the noise of a loaded machine."""


def _timed(cwd: Path, *args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_PROFILE"}
    env["KVREF_FAILURE_DIR"] = str(cwd / "failures")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "kvref", *args], cwd=cwd, env=env, check=False,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    return time.monotonic() - started, done


@pytest.mark.parametrize("factory", ["hangs", "spins"])
def test_a_hang_ends_the_check_at_once_with_exit_4(tmp_path: Path, factory: str) -> None:
    """A factory that hangs at start-up, or an operation that spins, ends the check with exit 4 within twice the
    watchdog past the command's start-up (a check whose target refuses every configuration, timed just before), and
    the hanging call was entered once: never replayed, never shrunk. The operation's trace ends before it."""
    (tmp_path / "hanging.py").write_text(HANGING)
    startup, refused = _timed(tmp_path, "check", "--target", "hanging:refuses", "--against", "spec")
    assert refused.returncode == NOTHING_CHECKED, refused.stdout[-500:] + refused.stderr[-500:]
    args = ("check", "--target", f"hanging:{factory}", "--against", "spec", "--op-timeout", f"{OP_TIMEOUT:g}")
    elapsed, done = _timed(tmp_path, *args)
    assert done.returncode == HANG, done.stdout[-800:] + done.stderr[-800:]
    assert "Traceback" not in done.stderr, done.stderr[-800:]
    assert elapsed < startup + 2 * OP_TIMEOUT, (elapsed, startup)
    entered = (tmp_path / "entered").read_text().splitlines()
    assert entered == (["factory"] if factory == "hangs" else ["allocate_slots"])
    if factory == "spins":
        (trace,) = (tmp_path / "failures").glob("failure-*.jsonl")
        assert "did not return within 5 s" in load(trace).meta["failure"]
        assert f"trace up to the hanging call (allocate_slots): {trace}" in done.stderr
