"""``kvref.hypothesis_compat.draw`` makes the choices ``DataObject.draw`` makes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given, seed, settings
from hypothesis import strategies as st

from kvref.hypothesis_compat import draw


def _values(use_fast: bool) -> list[Any]:
    out: list[Any] = []

    def pick(data: st.DataObject, strategy: st.SearchStrategy[Any]) -> Any:
        return draw(data, strategy) if use_fast else data.draw(strategy)

    @seed(7)
    @settings(max_examples=30, database=None)
    @given(st.data())
    def run(data: st.DataObject) -> None:
        n = pick(data, st.integers(0, 5))
        out.append((n, pick(data, st.lists(st.integers(0, 3), max_size=n)), pick(data, st.sampled_from("abc"))))

    test: Callable[[], None] = run
    test()
    return out


def test_fast_draw_matches_data_draw() -> None:
    assert _values(True) == _values(False)
