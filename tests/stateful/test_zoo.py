"""The upstream bug zoo (kvref.zoo): every entry builds, and the kit kills a
few representative mutants quickly (dev profile, no timing assertions)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvref.adapters import load_factory
from kvref.cli import main
from kvref.zoo import ZOO
from kvspec.config import CrossAttention, FullAttention, KVCacheConfig, Mamba, SlidingWindow

CONFIGS = (
    KVCacheConfig(num_blocks=8, groups=(FullAttention(4),), max_model_len=16),
    KVCacheConfig(num_blocks=16, groups=(FullAttention(4), SlidingWindow(2, 3)), max_model_len=32, use_eagle=True),
    KVCacheConfig(num_blocks=16, groups=(FullAttention(2), Mamba(2, "align", 1)), max_model_len=32),
    KVCacheConfig(num_blocks=16, groups=(FullAttention(2), CrossAttention(2)), max_model_len=32, enable_caching=False),
)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_entry_constructs(name: str) -> None:
    """Each registry entry is a loadable --target factory with an upstream reference."""
    entry = ZOO[name]
    assert entry.name == name and entry.upstream and entry.description
    factory = load_factory(f"kvref.zoo:{name}")
    assert getattr(factory, "__name__", None) == name
    for cfg in CONFIGS:
        adapter = factory(cfg)
        assert adapter.name == name
        adapter.to_view()


@pytest.mark.parametrize("name", ["constant_none_hash", "unhashed_freed_to_tail", "cross_attn_batch_budget"])
def test_kit_kills(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kvref check fails on the mutant and leaves a shrunk trace."""
    monkeypatch.setenv("KVREF_FAILURE_DIR", str(tmp_path))
    argv = ["check", "--target", f"kvref.zoo:{name}", "--against", "spec", "--profile", "dev", "--seed", "0"]
    assert main(argv) == 1
    assert list(tmp_path.glob("failure-*.jsonl"))
