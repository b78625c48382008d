"""A lone upstream target (``kvref check --target vllm --level safety`` runs
real vLLM alone) that crashes as a registered halting divergence says it does:
the run names the divergence and stops there instead of failing, as a
comparison with kvspec does."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvref.adapters import load_factory
from kvref.adapters.vllm import installed_vllm_version
from kvref.lockstep import Lockstep, RunStats
from kvref.ops import REQUEST_OPS
from kvref.traces import load

ROOT = Path(__file__).resolve().parents[2]


def test_real_vllm_alone_names_its_registered_crash(tmp_path: Path) -> None:
    if installed_vllm_version() is None:
        pytest.skip("needs vLLM")
    path = ROOT / "traces/vllm-0.25.1/divergences/mamba-align-external-estimate.jsonl"
    trace = load(path)
    lock = Lockstep(trace.config, [load_factory("vllm")], RunStats(), tmp_path)
    outs = []
    for op in trace.steps:
        clean = {k: v for k, v in op.items() if k not in ("expect", "view")}
        if clean["op"] in REQUEST_OPS:
            lock.request_op(clean)
        elif "op" in clean:
            outs.append(lock.call(clean))
    assert outs[-1] == {"crash": "ValueError"}, outs  # real vLLM runs out of blocks half-way
    assert lock.stats.known["mamba-align-external-estimate"] == 1 and lock.halted
