"""``kvref install-vllm``: the shipped installer is found and refuses what it cannot do."""

from __future__ import annotations

import subprocess

import pytest

from kvref.cli import main
from kvref.cli.install_vllm import SCRIPT


def test_installer_ships_in_the_package() -> None:
    assert SCRIPT.is_file()
    syntax = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert syntax.returncode == 0, syntax.stderr


def test_unknown_release_is_an_input_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["install-vllm", "0.24.0", "--venv", "/nonexistent-venv"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvref install-vllm: vLLM 0.24.0 is not supported; supported: 0.16.0, 0.25.1")
    assert "\n" not in err


def test_script_refuses_an_unknown_release_itself(tmp_path: object) -> None:
    run = subprocess.run(["bash", str(SCRIPT), "9.9.9", str(tmp_path)], capture_output=True, text=True, check=False)
    assert run.returncode == 2, run.stdout + run.stderr
