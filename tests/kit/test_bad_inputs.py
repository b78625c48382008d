"""Nineteen bad inputs that once ended in a hang, a traceback or a silent pass,
each with its documented exit code (:mod:`kvref.exits`) or its typed error and
one clear line.

The command-line cases run ``kvref`` in this process (its watchdog needs the
main thread, which pytest's is) against small target modules written into a
temporary folder. The hanging operation has its fault-injection test in
``tests/reliability/test_fault_injection.py`` (a child process, timed); the
pytest plugin's cases run a child pytest (``tests/kit/test_pytest_plugin.py``
holds the rest of its tests).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvref.cli import main
from kvref.exits import DIVERGENCE, HANG, USAGE
from kvspec.config import FullAttention, KVCacheConfig
from kvspec.errors import ConfigError

GOOD = Path(__file__).resolve().parents[2] / "traces" / "vllm-0.25.1" / "golden" / "full-0001.jsonl"
CFG = KVCacheConfig(num_blocks=8, groups=(FullAttention(4),), max_model_len=32)

MODULES = {
    "hangs_at_build": """
        import time
        def make(config):
            time.sleep(600)
    """,
    "bad_syntax": """
        def make(config)
            return None
    """,
    "exits": """
        import sys
        def make(config):
            sys.exit(7)
    """,
    "view_raises": """
        from kvref.adapters.spec import SpecAdapter
        class Broken(SpecAdapter):
            name = "broken-view"
            def to_view(self):
                if self.requests:
                    raise RuntimeError("the view is not ready")
                return super().to_view()
        def make(config):
            return Broken(config)
    """,
}


@pytest.fixture
def targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The target modules above, importable from the working folder; failures go to the temporary folder."""
    for name, text in MODULES.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("KVREF_FAILURE_DIR", str(tmp_path / "failures"))
    yield tmp_path
    for name in MODULES:
        sys.modules.pop(name, None)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# -- a factory that hangs: the start-up has a watchdog (3 cases) ------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--target", "hangs_at_build:make", "--against", "spec"],
        ["check", "--layer", "pool", "--target", "hangs_at_build:make", "--against", "spec"],
        ["replay", str(GOOD), "--target", "hangs_at_build:make"],
    ],
    ids=["check", "check-pool", "replay"],
)
def test_a_factory_that_hangs_ends_with_exit_4(
    targets: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    code, _, err = _run([*argv, "--op-timeout", "1"], capsys)
    assert code == HANG
    line = _one_line(err)
    assert "did not return within 1 s" in line and "hangs_at_build" in line
    assert time.monotonic() - started < 120  # a hang guard: the watchdog fires after 1 s


# -- targets that break at import or construction -----------------------------------------------


def test_a_target_with_a_syntax_error_is_one_line(targets: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["check", "--target", "bad_syntax:make", "--against", "spec"], capsys)
    assert code == USAGE
    line = _one_line(err)
    assert "cannot import 'bad_syntax': syntax error at" in line and "bad_syntax.py:2" in line


def test_a_factory_calling_sys_exit_is_one_line(targets: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["check", "--target", "exits:make", "--against", "spec"], capsys)
    assert code == USAGE
    assert "called sys.exit(7)" in _one_line(err)


def test_a_view_that_raises_is_a_divergence_with_its_trace(targets: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["check", "--target", "view_raises:make", "--against", "spec", "--shapes", "full",
                           "--min-steps", "200"], capsys)  # fmt: skip
    assert code == DIVERGENCE
    assert "Traceback" not in out + err
    assert "broken-view.to_view crashed after" in err and "RuntimeError: the view is not ready" in err
    (trace,) = (targets / "failures").glob("failure-*.jsonl")
    assert "to_view crashed" in json.loads(trace.read_text().splitlines()[0])["failure"]


# -- options ---------------------------------------------------------------------------------------


def test_a_facade_adapter_for_the_pool_layer_is_a_usage_error(
    targets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(["check", "--layer", "pool", "--target", "kvref.adapters.spec:make_spec_adapter",
                         "--against", "spec"], capsys)  # fmt: skip
    assert code == USAGE
    line = _one_line(err)
    assert "--layer pool" in line and "has no get_new_blocks" in line and "drop --layer pool" in line


def test_max_classes_0_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["check", "--target", "spec", "--against", "spec", "--max-classes", "0"], capsys)
    assert code == USAGE
    assert "--max-classes: must be above 0" in err


def test_an_unwritable_out_folder_is_refused_before_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, _, err = _run(["check", "--target", "spec", "--against", "spec", "--keep-going",
                         "--out", str(blocker / "classes")], capsys)  # fmt: skip
    assert code == USAGE
    line = _one_line(err)
    assert f"--out {blocker / 'classes'}: cannot write" in line


# -- kvimpl's constructors: a kvspec error naming what to pass ---------------------------------------


def _managers() -> list[tuple[str, Any]]:
    from kvimpl import KVCacheManager  # noqa: PLC0415 - kvimpl is optional for the kit's tests
    from kvimpl.native import NativeKVCacheManager, create_manager, native_module  # noqa: PLC0415

    found: list[tuple[str, Any]] = [("python", KVCacheManager), ("create_manager", create_manager)]
    try:
        native_module()
    except Exception:  # the native core is not built here: its constructor is not tried
        return found
    return [*found, ("native", NativeKVCacheManager)]


@pytest.mark.parametrize("build", ["python", "create_manager", "native"])
def test_a_manager_of_a_non_configuration_names_what_to_pass(build: str) -> None:
    managers = dict(_managers())
    if build not in managers:
        pytest.skip("the native core is not built")
    with pytest.raises(ConfigError, match=r"config must be a kvspec.config.KVCacheConfig, got int 5: build one with"):
        managers[build](5)


def test_a_device_torch_does_not_know_names_the_devices() -> None:
    pytest.importorskip("torch")
    from kvimpl import KVCacheManager  # noqa: PLC0415

    with pytest.raises(ConfigError, match=r"device 'nonsense' is not a torch device") as caught:
        KVCacheManager(CFG, device="nonsense")
    assert "'cpu'" in str(caught.value) and "'cpu-copy'" in str(caught.value)


def test_cuda_without_cuda_names_the_cpu_devices() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from kvimpl import KVCacheManager  # noqa: PLC0415

    with pytest.raises(ConfigError, match=r"device 'cuda': torch sees no CUDA device on this machine; pass 'cpu'"):
        KVCacheManager(CFG, device="cuda")


def test_native_must_be_a_bool() -> None:
    from kvimpl.native import create_manager  # noqa: PLC0415

    with pytest.raises(ConfigError, match=r"native must be True \(the C core\), False .* got 'yes'"):
        create_manager(CFG, native="yes")  # type: ignore[arg-type]  # the broken argument


@pytest.mark.parametrize("build", ["python", "create_manager", "native"])
def test_a_pool_too_large_for_kvimpl_names_the_limit(build: str) -> None:
    managers = dict(_managers())
    if build not in managers:
        pytest.skip("the native core is not built")
    huge = KVCacheConfig(num_blocks=10**12, groups=(FullAttention(4),), max_model_len=32)
    with pytest.raises(ConfigError, match=r"num_blocks 1000000000000 is more than kvimpl holds .*pass a smaller"):
        managers[build](huge)


# -- the pytest plugin: its own variable, no process-wide change to Hypothesis --------------------------


PROJECT_CONFTEST = """
import os

from hypothesis import settings
from hypothesis.internal.conjecture import providers

settings.register_profile("mine", max_examples=5)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
ORIGINAL = providers._get_local_constants


def pytest_sessionfinish(session, exitstatus):
    with open("after.txt", "w") as out:
        out.write(str(providers._get_local_constants is ORIGINAL))
"""

PROJECT_TEST = """
from hypothesis import given, settings, strategies as st


@given(st.integers())
def test_mine(x):
    assert settings.default.max_examples == 5
"""


def _child_pytest(project: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=project, check=False, capture_output=True, text=True, timeout=900,
        env={"PATH": "/usr/bin:/bin", **env},
    )  # fmt: skip


def test_the_plugin_ignores_a_users_hypothesis_profile(tmp_path: Path) -> None:
    """``HYPOTHESIS_PROFILE=mine`` names the user's own profile: the plugin neither reads it nor rejects it."""
    (tmp_path / "conftest.py").write_text(PROJECT_CONFTEST)
    (tmp_path / "test_mine.py").write_text(PROJECT_TEST)
    args = ("--kvref-target=spec", "--kvref-against=spec", "--kvref-steps=300")
    done = _child_pytest(tmp_path, *args, env={"HYPOTHESIS_PROFILE": "mine"})
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    assert "2 passed" in done.stdout


def test_the_plugin_leaves_hypothesis_internals_as_they_were(tmp_path: Path) -> None:
    """kvref pins Hypothesis's drawn constants for its own test only: at the end of the session (after kvref's
    test ran) Hypothesis is as the user's conftest found it."""
    (tmp_path / "conftest.py").write_text(PROJECT_CONFTEST)
    (tmp_path / "test_mine.py").write_text(PROJECT_TEST)
    args = ("--kvref-target=spec", "--kvref-against=spec", "--kvref-steps=300")
    done = _child_pytest(tmp_path, *args, env={"HYPOTHESIS_PROFILE": "mine"})
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    assert (tmp_path / "after.txt").read_text() == "True"
