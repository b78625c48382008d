"""kvref bench: every engine must allocate identical blocks on the same workload.

No timing is asserted (timings are benchmark output, not test results).
"""

from __future__ import annotations

import pytest

from kvref.bench import KvrefEngine, Workload, available_engines, bench, run


@pytest.mark.parametrize("mix", ["full", "full+swa", "full+mamba"])
def test_engines_agree_on_a_small_workload(mix: str) -> None:
    """All installed engines produce the same allocation results (bench raises otherwise)."""
    w = Workload(num_requests=12, max_running=4, num_blocks=256, prompt_len=(16, 96), decode_len=(2, 6), mix=mix)
    rows = bench(w, repeats=1)
    assert {r.engine for r in rows} == set(available_engines(w.config()))
    assert len({r.calls for r in rows}) == 1


def test_workload_preempts_and_frees_everything() -> None:
    """The workload is not trivial: a small pool preempts, and every block is freed at the end."""
    w = Workload(num_requests=20, max_running=8, num_blocks=20, prompt_len=(32, 64), decode_len=(4, 8))
    engine = available_engines(w.config())["spec"]()
    assert isinstance(engine, KvrefEngine)
    results = run(engine, w)
    assert any(r is None for r in results)
    view = engine.manager.to_view()
    assert view.ref_cnt == ()
    assert view.tables == ()
    assert view.cached
