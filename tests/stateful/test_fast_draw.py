"""``kvref.hypothesis_compat``'s draws make the choices ``DataObject.draw`` makes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture.data import ConjectureData
from hypothesis.strategies._internal.core import DataObject

from kvref.hypothesis_compat import boolean, byte_string, choose, draw, integer


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


def _replay(choices: list[Any], use_primitives: bool) -> tuple[Any, ...]:
    """Read ``choices`` as the machine's primitives, or as the strategies they stand for."""
    data = DataObject(ConjectureData.for_choices(choices))
    if use_primitives:
        n = integer(data, 0, 5)
        return (n, boolean(data), choose(data, "abc"), byte_string(data, 1, 12), integer(data, -1, n))
    n = data.draw(st.integers(0, 5))
    return (
        n, data.draw(st.booleans()), data.draw(st.sampled_from("abc")),
        data.draw(st.binary(min_size=1, max_size=12)), data.draw(st.integers(-1, n)),
    )  # fmt: skip


@settings(max_examples=200, database=None)
@given(st.integers(0, 5), st.booleans(), st.integers(0, 2), st.binary(min_size=1, max_size=12), st.integers(-1, 5))
def test_primitive_choices_match_their_strategies(n: int, b: bool, i: int, raw: bytes, m: int) -> None:
    """``integer``, ``boolean``, ``choose`` and ``byte_string`` read a choice
    sequence as the strategy they stand for reads it (one choice each), so a
    failing run shrinks and replays alike."""
    choices: list[Any] = [n, b, i, raw, min(m, n)]
    assert _replay(choices, True) == _replay(choices, False) == (n, b, "abc"[i], raw, min(m, n))


def test_primitive_choices_shrink_like_their_strategies() -> None:
    """A failure found through the primitives shrinks to the simplest values."""
    seen: list[tuple[int, bool, str, bytes]] = []

    @settings(max_examples=200, database=None)
    @given(st.data())
    def run(data: st.DataObject) -> None:
        values = (integer(data, 2, 9), boolean(data), choose(data, "xyz"), byte_string(data, 1, 4))
        seen.append(values)
        assert values[0] < 5

    test: Callable[[], None] = run
    with pytest.raises(AssertionError):
        test()
    assert seen[-1] == (5, False, "x", b"\x00")


def test_choose_refuses_an_empty_sequence() -> None:
    @settings(max_examples=1, database=None)
    @given(st.data())
    def run(data: st.DataObject) -> None:
        choose(data, ())

    test: Callable[[], None] = run
    with pytest.raises(ValueError, match="nothing to choose from"):
        test()
