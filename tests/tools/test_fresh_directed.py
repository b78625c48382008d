"""The fresh faults the seeded ci hunt does not reach: a hand-built history
kills each, or a property shows it equivalent (kvtools.zoo.fresh)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvimpl.block_pool import BlockId, BlockPool
from kvref.adapters import load_factory
from kvref.lockstep import Lockstep, LockstepFailure, RunStats
from kvref.ops import ABSENT
from kvspec.config import FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.profiles import NEWEST, VLLM_0_25_1, VLLM_0_26_0


def _lockstep(cfg: KVCacheConfig, name: str, tmp_path: Path) -> Lockstep:
    return Lockstep(cfg, [load_factory("spec"), load_factory(f"kvtools.zoo.fresh:{name}")], RunStats(), tmp_path)


def _admit(lock: Lockstep, rid: str, prompt: list[int], **extra: Any) -> Any:
    lock.request_op({"op": "add_request", "rid": rid, "prompt": prompt})
    hit = lock.call({"op": "get_computed_blocks", "rid": rid})
    op = {"op": "allocate_slots", "rid": rid, "num_new_tokens": len(prompt) - hit["num_tokens"], **extra}
    if hit["num_tokens"]:
        op.update(num_new_computed_tokens=hit["num_tokens"], new_computed_blocks=hit["blocks"])
    return lock.call(op)


def test_skipped_blocks_one_early_is_killed(tmp_path: Path) -> None:
    """A window of 3 tokens over blocks of 2: after 7 computed tokens 2 blocks
    are out of the window, after 8 three; the mutant frees the third one early."""
    cfg = KVCacheConfig(profile=VLLM_0_25_1, num_blocks=12, groups=(SlidingWindow(2, 3),), max_model_len=32)
    lock = _lockstep(cfg, "skipped_blocks_one_early", tmp_path)
    _admit(lock, "a", [1, 2, 3, 0, 1, 2, 3, 0])
    with pytest.raises(LockstepFailure, match="remove_skipped_blocks"):
        lock.call({"op": "remove_skipped_blocks", "rid": "a", "total_computed_tokens": 7})


def test_new_step_ignored_is_killed(tmp_path: Path) -> None:
    """A Mamba state cached in one step is usable from the next on (before it,
    an allocation on that hit fails); without the step boundary the second
    request of the same prompt cannot be admitted on its hit."""
    cfg = KVCacheConfig(
        profile=VLLM_0_25_1, num_blocks=16, groups=(FullAttention(2), Mamba(2, "align", 0)), max_model_len=32
    )
    lock = _lockstep(cfg, "new_step_ignored", tmp_path)
    prompt = [1, 2, 3, 0, 1, 2, 3, 0]
    _admit(lock, "a", prompt)
    lock.call({"op": "new_step_starts"})
    lock.request_op({"op": "add_request", "rid": "b", "prompt": [*prompt, 1]})
    hit = lock.call({"op": "get_computed_blocks", "rid": "b"})
    assert hit["num_tokens"] == 8
    op = {"op": "allocate_slots", "rid": "b", "num_new_tokens": 1, "num_new_computed_tokens": 8,
          "new_computed_blocks": hit["blocks"]}  # fmt: skip
    with pytest.raises(LockstepFailure, match="new_step_ignored returned None, spec returned"):
        lock.call(op)


@pytest.mark.parametrize("profile", [VLLM_0_25_1, VLLM_0_26_0])
def test_hits_recorded_in_blocks_is_equivalent_before_0_27(profile: Any, tmp_path: Path) -> None:
    """Before vLLM 0.27.0 lookups record the statistics and the scheduler never
    calls ``record_prefix_cache_stats`` (it raises UnsupportedOperationError),
    so a fault inside it cannot show."""
    assert profile.stats_at_lookup
    cfg = KVCacheConfig(profile=profile, num_blocks=8, groups=(FullAttention(2),), max_model_len=16, log_stats=True)
    lock = _lockstep(cfg, "hits_recorded_in_blocks", tmp_path)
    _admit(lock, "a", [1, 2, 3])
    op = {"op": "record_prefix_cache_stats", "rid": "a", "num_hits": 2}
    lock.call(op)
    assert lock.stats.left_out["record_prefix_cache_stats"] == 1, "record_prefix_cache_stats should not exist here"
    assert lock.call_absent(op) == ABSENT  # sent on purpose, both sides refuse it: the fault cannot show
    assert lock.stats.unexplained == 0


def test_hits_recorded_in_blocks_is_killed_from_0_27(tmp_path: Path) -> None:
    """From vLLM 0.27.0 the scheduler records each admission's hit in tokens."""
    cfg = KVCacheConfig(profile=NEWEST, num_blocks=12, groups=(FullAttention(2),), max_model_len=32, log_stats=True)
    lock = _lockstep(cfg, "hits_recorded_in_blocks", tmp_path)
    prompt = [1, 2, 3, 0, 1, 2, 3]
    _admit(lock, "a", prompt)
    lock.request_op({"op": "add_request", "rid": "b", "prompt": prompt})
    hit = lock.call({"op": "get_computed_blocks", "rid": "b"})
    assert hit["num_tokens"] == 6
    op = {"op": "allocate_slots", "rid": "b", "num_new_tokens": 1, "num_new_computed_tokens": 6,
          "new_computed_blocks": hit["blocks"]}  # fmt: skip
    lock.call(op)
    lock.call({"op": "record_prefix_cache_stats", "rid": "b", "num_hits": 6})
    with pytest.raises(LockstepFailure, match=r"'hits': 3.*spec returned .*'hits': 6"):
        lock.call({"op": "make_prefix_cache_stats"})


@given(
    taken=st.lists(st.integers(1, 9), max_size=9, unique=True),
    touched=st.lists(st.integers(0, 9), max_size=12),
)
def test_touch_reversed_is_equivalent(taken: list[int], touched: list[int]) -> None:
    """``touch`` in either order leaves the same pool: each element changes only
    its own block (one more reference; off the free queue at the first), and
    taking elements out of a linked queue leaves the others in their order
    whichever goes first. So ``touch_reversed`` cannot be killed."""
    pools = [BlockPool(10, True, 2), BlockPool(10, True, 2)]
    for pool, order in zip(pools, (touched, touched[::-1]), strict=True):
        got = pool.get_new_blocks(len(taken))
        pool.free_blocks([got[i] for i in sorted(range(len(got)), key=lambda i: taken[i])])
        pool.touch([BlockId(b) for b in order])
        pool.check_invariants()
    assert pools[0].free_order() == pools[1].free_order()
    assert list(pools[0].ref_cnt) == list(pools[1].ref_cnt)
