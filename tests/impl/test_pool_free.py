"""kvimpl's ``BlockPool.free_blocks`` and ``touch`` against a list model.

``free_blocks`` checks, drops references and links in one pass and undoes
the pass when an id turns out bad; ``touch`` unlinks inline. The model is
the spec's rule written over plain lists (every id checked first, then the
counts; released blocks requeued with :func:`kvspec.block_pool.requeue`), so
the test pins the order, the counts, the error classes and an unchanged
state after every error.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvimpl.block_pool import NULL_BLOCK, BlockId, BlockPool
from kvspec.block_pool import requeue
from kvspec.errors import DoubleFreeError, InvalidBlockIdError
from kvspec.hashing import BlockHash, make_key

N = 12

ops = st.lists(
    st.one_of(
        st.tuples(st.just("take"), st.integers(0, 4)),
        st.tuples(st.just("touch"), st.lists(st.integers(0, N - 1), max_size=5)),
        st.tuples(st.just("hash"), st.integers(1, N - 1)),
        st.tuples(st.just("free"), st.lists(st.integers(-2, N + 1), max_size=8)),
    ),
    max_size=30,
)


class Model:
    """The pool's observable state as plain lists."""

    def __init__(self, unhashed_first: bool) -> None:
        self.ref = [0] * N
        self.free = list(range(1, N))
        self.hashed: set[int] = set()
        self.unhashed_first = unhashed_first

    def free_blocks(self, ids: list[int]) -> type[Exception] | None:
        if any(not 0 <= b < N for b in ids):
            return InvalidBlockIdError
        real = [b for b in ids if b != NULL_BLOCK]
        if any(self.ref[b] < n for b, n in Counter(real).items()):
            return DoubleFreeError
        released = []
        for b in real:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                released.append(b)
        self.free = requeue(self.free, released, [b in self.hashed for b in released], self.unhashed_first)
        return None


def _hash(pool: BlockPool, model: Model, b: int) -> None:
    """Cache block ``b`` under a key of its own (as cache_full_blocks would)."""
    if pool.block_hash[b] is None:
        key = make_key(BlockHash(bytes([b]) * 32), 0)
        pool.block_hash[b] = key
        pool.cached[key] = [BlockId(b)]
        model.hashed.add(b)


def _state(pool: BlockPool) -> tuple[list[int], list[int], int]:
    return pool.free_order(), list(pool.ref_cnt), pool.get_num_free_blocks()


@pytest.mark.parametrize("unhashed_first", [True, False])
@settings(max_examples=300, deadline=None)
@given(ops=ops)
def test_free_and_touch_follow_the_model(unhashed_first: bool, ops: list[tuple[str, object]]) -> None:
    pool = BlockPool(N, True, 16, unhashed_first=unhashed_first)
    model = Model(unhashed_first)
    for op, arg in ops:
        if op == "take":
            assert isinstance(arg, int)
            if arg > len(model.free):
                continue
            got = pool.get_new_blocks(arg)
            assert got == model.free[:arg]
            for b in got:
                model.ref[b] = 1
                model.hashed.discard(b)
            model.free = model.free[arg:]
        elif op == "touch":
            assert isinstance(arg, list)
            pool.touch([BlockId(b) for b in arg])
            for b in arg:
                if b == NULL_BLOCK:
                    continue
                if model.ref[b] == 0:
                    model.free.remove(b)
                model.ref[b] += 1
        elif op == "hash":
            assert isinstance(arg, int)
            _hash(pool, model, arg)
        else:
            assert isinstance(arg, list)
            before = _state(pool)
            expected = model.free_blocks(arg)
            if expected is None:
                pool.free_blocks(iter([BlockId(b) for b in arg]))
            else:
                with pytest.raises(expected):
                    pool.free_blocks(iter([BlockId(b) for b in arg]))
                assert _state(pool) == before
        assert pool.free_order() == model.free
        assert pool.ref_cnt[1:] == model.ref[1:]
        assert pool.get_num_free_blocks() == len(model.free)
        pool.check_invariants()


def test_bad_id_after_a_double_free_is_reported_first() -> None:
    """Every id is checked before the counts, as if they were checked first."""
    pool = BlockPool(N, True, 16)
    a, b = pool.get_new_blocks(2)
    before = _state(pool)
    with pytest.raises(InvalidBlockIdError, match="outside"):
        pool.free_blocks([a, a, b, BlockId(N)])
    assert _state(pool) == before
    with pytest.raises(DoubleFreeError, match=f"block {a} has ref_cnt 1 but is freed 2"):
        pool.free_blocks([b, a, NULL_BLOCK, a])
    assert _state(pool) == before


@pytest.mark.parametrize("bad", [1.5, "3", None])
def test_a_non_int_id_changes_nothing(bad: object) -> None:
    """A value the pool cannot index with raises Python's own error, state unchanged."""
    pool = BlockPool(N, True, 16)
    held = pool.get_new_blocks(3)
    before = _state(pool)
    with pytest.raises(TypeError):
        pool.free_blocks([*held[:2], bad])  # type: ignore[list-item]  # a deliberately bad id
    assert _state(pool) == before
    pool.free_blocks(held)
    assert pool.get_num_free_blocks() == N - 1
