"""A native engine that crashes the process it runs in: with ``--isolate`` the
adapter lives in a child process, ``kvref check`` reports the crash as a
divergence (exit 1) with a shrunk trace, and ``kvref replay --isolate`` of
that trace reports the crash at its step instead of dying."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvref.adapters.impl import ImplAdapter, NativeImplAdapter, make_impl_adapter
from kvref.isolation import AdapterCrashed, isolated
from kvspec.config import FullAttention, KVCacheConfig

ROOT = Path(__file__).resolve().parents[2]


def _segfault() -> None:
    ctypes.string_at(0)  # a read of address 0: SIGSEGV, as a corrupted native core would


class _CrashOnFree:
    """Mixin: the second ``free`` of a run crashes the process (a planted native fault)."""

    _frees = 0

    def free(self, request_id: str) -> None:
        self._frees += 1
        if self._frees == 2:
            _segfault()
        super().free(request_id)  # type: ignore[misc]  # the manager class mixed in after this one


class _PyCrash(_CrashOnFree, ImplAdapter):
    pass


class _NativeCrash(_CrashOnFree, NativeImplAdapter):
    pass


def make_crashing(config: KVCacheConfig) -> Any:
    """Factory of kvimpl's manager with the planted crash."""
    adapter = make_impl_adapter(config)
    adapter.__class__ = _NativeCrash if isinstance(adapter, NativeImplAdapter) else _PyCrash
    return adapter


def test_a_crash_in_the_child_is_an_error_of_the_call() -> None:
    config = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=64)
    adapter: Any = isolated(make_crashing)(config)
    assert adapter.name in ("impl", "impl-native")
    adapter.free("a")
    with pytest.raises(AdapterCrashed, match="SIGSEGV"):
        adapter.free("b")


def test_check_reports_a_native_crash_with_a_trace_that_replays_it(tmp_path: Path) -> None:
    env = {**os.environ, "KVREF_FAILURE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT / "tests" / "reliability")}
    target = "test_isolation:make_crashing"
    check = subprocess.run(
        [sys.executable, "-m", "kvref", "check", "--target", target, "--against", "spec", "--isolate",
         "--shapes", "full", "--min-steps", "2000", "--seed", "0"],
        capture_output=True, text=True, env=env, timeout=900, check=False,
    )  # fmt: skip
    assert check.returncode == 1, check.stdout + check.stderr
    assert "SIGSEGV" in check.stdout + check.stderr
    traces = sorted(tmp_path.glob("*.jsonl"))
    assert traces, check.stdout + check.stderr
    steps = len(traces[-1].read_text().splitlines()) - 1
    assert steps < 40, f"the crash trace was not shrunk: {steps} steps"
    assert json.loads(traces[-1].read_text().splitlines()[0])
    replay = subprocess.run(
        [sys.executable, "-m", "kvref", "replay", str(traces[-1]), "--target", target, "--isolate"],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert "crashed: AdapterCrashed" in replay.stdout and "SIGSEGV" in replay.stdout
