"""kvref bench: every engine must allocate identical blocks on the same workload.

No timing is asserted (timings are benchmark output, not test results).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvref.bench import (
    PHASES,
    Workload,
    available_engines,
    bench,
    plot_sweep,
    run,
    sweep,
    sweep_workloads,
)
from kvref.bench_engines import ImplEngine, SpecEngine
from kvref.cli import main
from kvspec.config import SlidingWindow

TINY = Workload(num_requests=12, max_running=4, num_blocks=256, prompt_len=(16, 96), decode_len=(2, 6))


@pytest.mark.parametrize("mix", ["full", "full+swa", "full+mamba-all"])
def test_engines_agree_on_a_small_workload(mix: str) -> None:
    """All installed engines (impl-batched included when kvimpl has the batch
    API) produce the same allocation results (bench raises otherwise)."""
    w = Workload(num_requests=12, max_running=4, num_blocks=256, prompt_len=(16, 96), decode_len=(2, 6), mix=mix)
    rows = bench(w, repeats=1)
    assert {r.engine for r in rows} == set(available_engines(w.config()))
    assert len({r.allocs for r in rows}) == 1
    assert len({r.request_steps for r in rows}) == 1
    assert all(r.request_steps > 0 for r in rows)
    assert all(r.total > 0 for r in rows)
    assert all(set(r.us) == set(PHASES) for r in rows)


@pytest.mark.parametrize("mix", ["full", "full+swa", "full+mamba-all"])
def test_batched_engine_matches_sequential_under_preemption(mix: str) -> None:
    """With a pool so small that requests are preempted mid-batch, the batched
    running phase makes the same decisions as the sequential one, in fewer calls."""
    blocks = {"full": 20, "full+swa": 20, "full+mamba-all": 36}[mix]
    w = Workload(num_requests=24, max_running=8, num_blocks=blocks, prompt_len=(32, 64), decode_len=(4, 12), mix=mix)
    builders = available_engines(w.config())
    names = [n for n in builders if n.startswith("impl-") and "+tables" not in n]
    seq = builders["impl-python"]()
    a = run(seq, w)
    assert a.preemptions > 0
    assert 0 < a.running_allocs < seq.allocs
    for name in names[1:]:
        bat = builders[name]()
        assert isinstance(bat, ImplEngine)
        b = run(bat, w)
        assert a.results == b.results, name
        assert (a.request_steps, a.steps, a.preemptions, a.running_allocs) == (
            b.request_steps, b.steps, b.preemptions, b.running_allocs
        ), name  # fmt: skip
        assert seq.allocs == bat.allocs
        if bat.api != "object":
            assert bat.calls < seq.calls
        bat.manager.check_invariants()


def test_workload_preempts_and_frees_everything() -> None:
    """The workload is not trivial: a small pool preempts, and every block is freed at the end."""
    w = Workload(num_requests=20, max_running=8, num_blocks=20, prompt_len=(32, 64), decode_len=(4, 8))
    engine = available_engines(w.config())["spec"]()
    assert isinstance(engine, SpecEngine)
    res = run(engine, w)
    assert res.preemptions > 0
    assert any(r is None for r in res.results)
    assert res.request_steps == sum(r is not None for r in res.results)
    view = engine.manager.to_view()
    assert view.ref_cnt == ()
    assert view.tables == ()
    assert view.cached


def test_swa_window_follows_the_prompts() -> None:
    """The full+swa window is the anchor's 1024 for long prompts, smaller for short ones, or as given."""
    assert Workload(mix="full+swa", prompt_len=(512, 2048)).groups()[1] == SlidingWindow(16, 1024)
    assert Workload(mix="full+swa", prompt_len=(128, 512)).groups()[1] == SlidingWindow(16, 256)
    assert Workload(mix="full+swa", window=64).groups()[1] == SlidingWindow(16, 64)
    assert Workload(prompt_len=(512, 4096), decode_len=(1, 256)).config().max_model_len >= 4096 + 256


def test_sweep_workloads() -> None:
    """Batch points get a pool that fits the batch; pool points keep the workload."""
    for b, w in sweep_workloads("batch", Workload()):
        assert w.max_running == b
        assert w.num_blocks >= b * (512 + 64) // 16
    assert [w.num_blocks for _, w in sweep_workloads("pool", Workload())] == [8192, 32768, 131072, 524288]
    with pytest.raises(ValueError, match="unknown sweep"):
        sweep_workloads("nope", Workload())


def test_tiny_sweep_and_plot(tmp_path: Path) -> None:
    """A two-point sweep runs every engine; the plot is written when matplotlib is installed."""
    base = Workload(prompt_len=(16, 64), decode_len=(2, 4))
    points = sweep("pool", base, repeats=1, points=[256, 512], only=["spec", "impl-python", "impl-python-batched"])
    assert [p.x for p in points] == [256, 512]
    assert all(p.rows for p in points)
    path = tmp_path / "sweep.png"
    if plot_sweep("pool", points, path, "test"):
        assert path.read_bytes()[:4] == b"\x89PNG"
    else:
        assert not path.exists()


def test_cli_bench(capsys: pytest.CaptureFixture[str]) -> None:
    """The command prints a table and the identity line."""
    argv = ["bench", "--requests", "6", "--max-running", "3", "--blocks", "128", "--prompt-len", "16:48"]
    argv += ["--decode-len", "2:3", "--prefixes", "2", "--repeats", "1", "--engines", "spec,impl-python"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "spec" in out
    assert "impl" in out
    assert "identical block ids" in out
    assert "load average" in out


def test_cli_steady_decode(capsys: pytest.CaptureFixture[str]) -> None:
    """Steady decode runs every kvimpl engine on identical blocks and prints the load average."""
    from kvref.bench_decode import report  # noqa: PLC0415

    assert report("full", 8, 4, 1) == 0
    out = capsys.readouterr().out
    assert "impl-python" in out
    assert "identical block ids" in out
    assert "load average" in out


@pytest.mark.parametrize("mix", ["full", "full+swa", "full+mamba-all", "mla+swa@2x"])
def test_paths_engines_agree(mix: str) -> None:
    """``kvref bench --paths``: every engine allocates the same blocks on every path (a small run)."""
    from kvref.bench_paths import PATHS, bench_paths  # noqa: PLC0415

    rows = bench_paths(mix, 1, ["spec", "impl-python", "impl-native"], requests=4)
    assert [r.engine for r in rows][:2] == ["spec", "impl-python"]
    assert all(set(r.us) == set(PATHS) for r in rows)


def test_cli_paths(capsys: pytest.CaptureFixture[str]) -> None:
    """The command prints one table per mix with the load average."""
    from kvref.bench_paths import PATHS  # noqa: PLC0415

    assert main(["bench", "--paths", "--repeats", "1", "--engines", "impl-python"]) == 0
    out = capsys.readouterr().out
    assert all(p in out for p in PATHS)
    assert "load average" in out


@pytest.mark.parametrize("device", ["cpu", "cpu-copy"])
def test_device_table_bench_runs(device: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``kvref bench --steady-decode R --device D`` runs its loop on the CPU
    (on a GPU: ``ci/gpu-check.sh``), with the slots of kvimpl and of the
    vLLM-worker-style path compared where vLLM is installed."""
    pytest.importorskip("torch")
    from kvref.bench_tables import report  # noqa: PLC0415

    assert report("full+swa", 16, 8, 1, device) == 0
    out = capsys.readouterr().out
    assert "impl-python-batched" in out and "µs per request-step" in out
