"""kvimpl's device tables equal vLLM's own worker tables (``InputBatch`` and
its ``MultiGroupBlockTable``) under the same scheduler outputs, over the shape
catalog, context parallelism included, on both builds
(:mod:`kvtools.worker_tables` says what is compared). Runs with the installed
vLLM release (CI: 0.25.1 in ``.venv``; the newest release's venv runs it too
with ``pytest tests/conformance/test_worker_tables.py``).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from kvimpl.native import native_module
from kvref.adapters.vllm import vllm_available
from kvtools.worker_tables import has_v1_worker

pytestmark = [
    pytest.mark.skipif(not vllm_available(), reason="no supported vLLM is installed"),
    pytest.mark.skipif(not has_v1_worker(), reason="the installed vLLM has no v1 worker InputBatch (0.34.0 on)"),
    # vLLM's worker BlockTable asks for its context-parallel group and falls back to no group on the
    # AssertionError of get_pcp_group(); under python -O that assert is gone and the call returns None
    pytest.mark.skipif(sys.flags.optimize > 0, reason="vLLM's worker tables need assertions (not under python -O)"),
]
pytest.importorskip("torch")

if vllm_available():
    from kvtools.worker_tables import catalog, check_shape, release_profile

    SHAPE_NAMES = [s.name for s in catalog()]
else:
    SHAPE_NAMES = []

BUILDS = [False, True] if native_module() is not None else [False]


@pytest.mark.parametrize("native", BUILDS, ids=lambda n: "native" if n else "python")
@pytest.mark.parametrize("shape", SHAPE_NAMES)
def test_tables_equal_vllm_worker(shape: str, native: bool) -> None:
    profile = release_profile()
    checked = 0
    for seed in range(6):
        report = check_shape(next(s for s in catalog() if s.name == shape), profile, seed, native=native)
        if report is not None:
            assert report.steps == 40 and report.rows > 0
            checked += report.slots + report.entries
    if checked == 0:
        pytest.skip(f"{shape}: no configuration of it constructs under {profile.name}")


def _fails_somewhere(shape: str, seeds: int = 6) -> str:
    profile = release_profile()
    for seed in range(seeds):
        try:
            check_shape(next(s for s in catalog() if s.name == shape), profile, seed, native=False)
        except AssertionError as exc:
            return str(exc)
    return ""


def test_a_row_policy_unlike_vllm_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Moving the last row into a freed row at once (kvimpl's earlier policy)
    instead of leaving a hole until the commit gives other rows than vLLM's."""
    from kvimpl.device_tables import BlockTable  # noqa: PLC0415

    original = BlockTable.remove

    def remove_now(self: Any, request_id: str) -> None:
        original(self, request_id)
        self._condense()

    monkeypatch.setattr(BlockTable, "remove", remove_now)
    assert "rows:" in _fails_somewhere("full")


def test_a_slot_formula_unlike_vllm_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Context-parallel slots that ignore the interleaving rank are caught."""
    from kvimpl.device_tables import BlockTable  # noqa: PLC0415

    monkeypatch.setattr(BlockTable, "cp_rank", property(lambda self: 0, lambda self, v: None), raising=False)
    assert "slots" in _fails_somewhere("full@dcp2")
