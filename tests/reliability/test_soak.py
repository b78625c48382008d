"""The soak (kvref.soak) passes on the spec and catches a slow leak."""

from __future__ import annotations

import random

import pytest

from kvref.adapters import load_factory
from kvref.adapters.spec import SpecAdapter
from kvref.cli import main
from kvref.soak import SoakFailure, add_request, admit, leaked_blocks, new_lane, run_soak, soak_configs
from kvspec.block_pool import BlockId
from kvspec.config import KVCacheConfig
from kvspec.profiles import VLLM_0_33_0


class LeaksOnDeferredFree(SpecAdapter):
    """``pop_blocks_for_free`` forgets to hand back the request's last block,
    so it keeps one reference forever (a slow leak)."""

    name = "leaks"

    def pop_blocks_for_free(self, request_id: str) -> tuple[BlockId, ...]:
        """The spec's blocks minus the last one."""
        return super().pop_blocks_for_free(request_id)[:-1]


def leaky_factory(config: object) -> LeaksOnDeferredFree:
    """Factory for ``--target tests...:leaky_factory`` style use."""
    return LeaksOnDeferredFree(config)  # type: ignore[arg-type]  # any KVCacheConfig


def test_short_soak_on_the_spec_is_clean() -> None:
    """20,000 operations: no error, no leak, resets and preemptions happen."""
    res = run_soak("spec", ops=20_000, seed=3, check_every=5_000, rss_tolerance=1.0)
    assert res.ops >= 20_000
    assert res.errors == 0 and res.leaked_blocks == 0
    assert res.preemptions > 0 and res.resets > 0


def test_soak_finds_a_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    """A block that is never returned fails the soak at the end."""
    monkeypatch.setattr("kvref.soak.load_factory", lambda target: leaky_factory)
    # The leak shows either when an idle lane cannot reset or in the final check.
    with pytest.raises(SoakFailure, match=r"leak after draining|reset_prefix_cache on an idle manager"):
        run_soak("leaky", ops=5_000, seed=0, check_every=100_000, rss_tolerance=1.0)


def test_final_check_reports_held_blocks() -> None:
    """``leaked_blocks`` counts blocks that a drained lane still holds."""
    name, cfg = soak_configs()[0]
    assert isinstance(cfg, KVCacheConfig)
    lane = new_lane(name, cfg, load_factory("spec")(cfg), random.Random(0))
    assert leaked_blocks(lane) == (0, [])
    add_request(lane)
    admit(lane)
    lane.call({"op": "pop_blocks_for_free", "rid": lane.running[0]})  # never freed
    leaked, problems = leaked_blocks(lane)
    assert leaked > 0
    assert any("not free" in p for p in problems) and any("pending" in p for p in problems)


def test_lanes_the_profile_refuses_are_named() -> None:
    """Under vLLM 0.33.0 the cached Mamba lanes are refused (all mode; align is not modelled there)."""
    res = run_soak("spec", ops=3_000, seed=0, check_every=10_000, rss_tolerance=1.0, profile=VLLM_0_33_0)
    assert res.refused and all("mamba" in r for r in res.refused)
    assert res.lanes + len(res.refused) == len(soak_configs())


def test_cli_prints_figures(capsys: pytest.CaptureFixture[str]) -> None:
    """``kvref soak`` prints ops/s, leaked blocks and RSS."""
    assert main(["soak", "--ops", "3000", "--rss-tolerance", "1.0"]) == 0
    out = capsys.readouterr().out
    assert "ops/s" in out and "leaked blocks: 0" in out and "KiB at the end" in out
