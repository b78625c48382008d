"""The pytest plugin leaves other projects alone unless asked.

A small external project with its own Hypothesis profile runs in a child
pytest: without ``--kvref-target`` its settings are untouched and nothing
else is collected; with it, its own tests still run next to kvref's
conformance test.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROJECT_TEST = '''
from hypothesis import given, settings, strategies as st

settings.register_profile("mine", max_examples=7, deadline=1234)
settings.load_profile("mine")
SEEN = []


@given(st.integers())
def test_mine(x):
    SEEN.append(x)
    assert settings.default.max_examples == 7
    assert settings.default.deadline.total_seconds() * 1000 == 1234


def test_ran_seven_examples():
    SEEN.clear()
    test_mine()
    assert len(SEEN) == 7
'''


DEFAULTS_TEST = '''
from hypothesis import settings


def test_hypothesis_defaults_untouched():
    assert settings.default.max_examples == 100
    assert settings.default.deadline is not None
'''

CONFTEST = '''
from hypothesis import settings


def pytest_configure(config):
    settings.register_profile("from-conftest", max_examples=3)
    settings.load_profile("from-conftest")
'''


def _pytest(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=project,
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "HYPOTHESIS_PROFILE": "dev"},
    )


def test_plugin_is_inert_without_a_target(tmp_path: Path) -> None:
    (tmp_path / "test_mine.py").write_text(PROJECT_TEST)
    done = _pytest(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def test_plugin_loads_no_profile(tmp_path: Path) -> None:
    (tmp_path / "test_defaults.py").write_text(DEFAULTS_TEST)
    done = _pytest(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_project_profile_from_conftest_wins(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_three.py").write_text(
        "from hypothesis import settings\n\ndef test_three():\n    assert settings.default.max_examples == 3\n"
    )
    for extra in ((), ("--kvref-target=spec",)):
        done = _pytest(tmp_path, *extra)
        assert done.returncode == 0, done.stdout + done.stderr


def test_target_adds_the_conformance_test_and_keeps_the_project_tests(tmp_path: Path) -> None:
    (tmp_path / "test_mine.py").write_text(PROJECT_TEST)
    done = _pytest(tmp_path, "--kvref-target=spec", "--kvref-against=spec")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout
