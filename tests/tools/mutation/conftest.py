"""Run the cheap replays before the lockstep runs, whatever order the node ids came in."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Directed replays and API edges first, then golden replays, then the other replays, then lockstep runs.

    The sort is stable: within a stage, shape order.
    """
    first = ("test_directed_replay", "test_api_edges", "test_golden_replay")
    items.sort(key=lambda item: next((i for i, name in enumerate(first) if item.name.startswith(name)), len(first)))
