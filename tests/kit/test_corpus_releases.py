"""The corpus of the oldest modelled release, vLLM 0.16.0, replays on the spec and on kvimpl.

``ci/test.sh`` replays every release's corpus with ``kvref replay``; this test
keeps a small slice of the 0.16.0 golden corpus inside pytest, on the spec and
on kvimpl, and checks that the corpus sits where its header says
(``tests/kit/test_corpus.py`` checks the folder of every stored trace). Real
vLLM 0.16.0 is not installed in CI: its replay of this corpus is run by hand
(``traces/README.md``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvref.adapters import load_factory
from kvref.traces import load, replay
from kvspec.profiles import VLLM_0_16_0

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "traces" / f"vllm-{VLLM_0_16_0.release}"
GOLDEN = sorted((CORPUS / "golden").glob("*.jsonl"))
PLAIN = [p for p in GOLDEN if "@dcp" not in p.name]
SAMPLE = PLAIN[:: max(1, len(PLAIN) // 10)][:10]
"""Ten golden traces without context parallelism, spread over the shapes (the files sort by shape name)."""
CP_SAMPLE = [p for p in GOLDEN if "@dcp" in p.name][::4]
"""One golden trace of each context-parallel shape (four files each)."""


def test_corpus_is_present() -> None:
    assert len(GOLDEN) >= 100, f"no golden corpus for {VLLM_0_16_0.name}"
    assert len({load(p).meta["shape"] for p in GOLDEN}) >= 15


def test_corpus_names_its_profile() -> None:
    """Every trace under ``traces/vllm-0.16.0/`` runs under the 0.16.0 profile."""
    paths = sorted(CORPUS.glob("*/*.jsonl"))
    assert paths
    wrong = [p.name for p in paths if load(p).config.profile != VLLM_0_16_0]
    assert not wrong, wrong[:5]


@pytest.mark.parametrize("engine", ["spec", "impl"])
@pytest.mark.parametrize("path", SAMPLE, ids=lambda p: p.name)
def test_golden_trace_replays(path: Path, engine: str) -> None:
    trace = load(path)
    result = replay(trace, load_factory(engine), str(path))
    assert result.ok, result.skipped or result.message
    assert result.steps == len(trace.steps)


@pytest.mark.parametrize("path", CP_SAMPLE, ids=lambda p: p.name)
@pytest.mark.parametrize("engine", ["spec", "impl"])
def test_context_parallel_trace_replays(path: Path, engine: str) -> None:
    """kvspec and kvimpl (its pure-Python manager; the native core declines
    context parallelism) replay the context-parallel traces."""
    trace = load(path)
    assert trace.config.dcp_world_size * trace.config.pcp_world_size > 1
    result = replay(trace, load_factory(engine), str(path))
    assert result.ok, result.skipped or result.message
    assert result.steps == len(trace.steps)
