"""Run the cheap replays before the lockstep runs, whatever order the node ids came in."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Golden replays first, then batched and device replays, then lockstep runs; each in shape order (stable)."""
    items.sort(key=lambda item: 0 if item.name.startswith("test_golden_replay") else 1)
