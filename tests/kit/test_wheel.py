"""The built wheel is self-contained: typed packages, the trace corpus, the
vLLM installer, no project tooling; run from the wheel, the kit finds its
corpus and a seeded check takes exactly the steps it takes from the checkout.

The wheel is built once per session with ``pip wheel --no-deps`` (hatchling
from the index or the local wheel cache) and unpacked into a temporary folder
that comes first on ``PYTHONPATH``, ahead of the editable install.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        pytest.skip(f"cannot build the wheel here (no build backend available?): {built.stderr[-300:]}")
    return next(out.glob("kvref-*.whl"))


@pytest.fixture(scope="module")
def unpacked(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(dest)
    return dest


def _kvref(site: Path | None, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HYPOTHESIS_PROFILE")}
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return subprocess.run(
        [sys.executable, "-m", "kvref", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def test_wheel_contents(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "kvspec/py.typed",
        "kvimpl/py.typed",
        "kvref/py.typed",
        "kvref/scripts/install-vllm.sh",
        "kvref/traces/schema/trace.schema.json",
        "kvref/traces/vectors/hash-vectors.json",
        "kvref/divergences.toml",
    ):
        assert required in names, required
    corpus = [n for n in names if re.fullmatch(r"kvref/traces/vllm-[^/]+/[^/]+/[^/]+\.jsonl", n)]
    in_checkout = list((ROOT / "traces").glob("vllm-*/*/*.jsonl"))
    assert len(corpus) == len(in_checkout) > 0
    assert not [n for n in names if n.split("/")[0] in ("kvtools", "kvproofs", "tests", "spec", "impl", "kit")]


def test_the_wheel_finds_its_own_corpus(unpacked: Path, tmp_path: Path) -> None:
    listing = _kvref(unpacked, tmp_path, "corpus")
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.splitlines()[0] == str(unpacked / "kvref" / "traces")
    replayed = _kvref(unpacked, tmp_path, "replay", "--corpus", "vllm-0.25.1/divergences", "--target", "spec")
    assert replayed.returncode == 0, replayed.stdout[-500:] + replayed.stderr[-500:]
    assert "6/6 traces as expected against spec" in replayed.stdout


def test_seeded_check_takes_the_same_steps_from_the_wheel(unpacked: Path, tmp_path: Path) -> None:
    args = ["check", "--target", "impl", "--against", "spec", "--profile", "dev", "--seed", "5"]
    args += ["--semantics", "vllm-0.25.1", "--min-steps", "600"]
    steps = []
    for site in (unpacked, None):
        run = _kvref(site, tmp_path, *args)
        assert run.returncode == 0, run.stdout[-800:] + run.stderr[-800:]
        found = re.search(r"steps run: ([\d,]+)", run.stdout)
        assert found, run.stdout[-800:]
        steps.append(int(found.group(1).replace(",", "")))
    assert steps[0] == steps[1]


def test_the_wheel_carries_the_native_core(wheel: Path, unpacked: Path, tmp_path: Path) -> None:
    """Where the checkout's build compiled the native core, the wheel has the
    compiled module (a platform wheel, no C sources) and kvimpl uses it from there."""
    from kvimpl.native import native_module  # noqa: PLC0415

    if native_module() is None:
        pytest.skip("the native core is not built here (no compiler at install time)")
    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if re.fullmatch(r"kvimpl/_kvnative\..*(so|pyd)", n)]
    assert not [n for n in names if n.endswith((".c", ".h"))]
    assert not wheel.name.endswith("-none-any.whl")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KVREF_NATIVE")}
    env["PYTHONPATH"] = str(unpacked)
    code = "import kvimpl.native as n; print(n.__file__); print(n.build_description())"
    cmd = [sys.executable, "-c", code]
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    path, build = run.stdout.splitlines()
    assert path.startswith(str(unpacked))
    assert build.startswith("native core")
