"""``kvref install-vllm``: the shipped installer is found, installs any release,
and takes its light dependencies from the release's own metadata."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kvref.cli import main
from kvref.cli.install_vllm import SCRIPT

DEPS = SCRIPT.parent / "vllm_deps.py"


def _deps_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_deps", DEPS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_installer_ships_in_the_package() -> None:
    assert SCRIPT.is_file() and DEPS.is_file()
    syntax = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert syntax.returncode == 0, syntax.stderr


@pytest.mark.parametrize("version", ["0.24.0", "0.34.0", "0.99.1"])
def test_any_release_goes_to_the_installer(version: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A release without a semantics profile (one newer than every profile
    included) is never refused: the installer gets it."""
    calls: list[list[str]] = []

    def call(cmd: list[str], **_: Any) -> int:
        calls.append(cmd)
        return 0

    monkeypatch.setattr(subprocess, "call", call)
    assert main(["install-vllm", version, "--venv", str(tmp_path)]) == 0
    assert calls == [["bash", str(SCRIPT), version, str(tmp_path)]]


def test_a_version_that_is_no_release_number_is_an_input_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["install-vllm", "latest", "--venv", "/nonexistent-venv"]) == 2
    err = capsys.readouterr().err.strip()
    assert "is not a vLLM release number" in err and "\n" not in err


def test_script_usage_error() -> None:
    run = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert run.returncode == 2, run.stdout + run.stderr


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs an installed vLLM's metadata")
def test_the_dependency_plan_comes_from_the_release_metadata() -> None:
    """The installed release's Requires-Dist, minus the known exclusions:
    no torch family, Triton, CUDA or kernel package; xgrammar without its
    dependencies; the rest (transformers, msgspec, ...) as the release lists them."""
    deps = _deps_module()
    wanted, no_deps = deps.plan()
    names = {deps.normalize(r.name) for r in wanted}
    assert "msgspec" in names and "transformers" in names
    assert not any(deps.EXCLUDED.match(n) or deps.FORBIDDEN.match(n) for n in names)
    assert [deps.normalize(r.name) for r in no_deps] == ["xgrammar"]
    assert all(r.marker is None for r in wanted)


def test_forbidden_packages_are_traced_to_the_requirement_that_pulls_them() -> None:
    deps = _deps_module()
    report = {
        "install": [
            {"metadata": {"name": "kernels", "requires_dist": ["helper", "triton; sys_platform == 'linux'"]}},
            {"metadata": {"name": "helper", "requires_dist": []}},
            {"metadata": {"name": "triton", "requires_dist": []}},
            {"metadata": {"name": "plain", "requires_dist": ["helper"]}},
        ]
    }
    reqs = [deps.Requirement("kernels>=1"), deps.Requirement("plain")]
    bad = deps.forbidden_pulls(report, reqs)
    pulled = {"triton"} if sys.platform == "linux" else set()
    assert bad == ({"kernels>=1": pulled} if pulled else {})
