"""The prefix-cache retention interval: the masks, the reachable boundaries and
the validation, on worked examples (each checked against real vLLM 0.25.1 and
0.34.0 by the lockstep and ``tests/conformance/test_examples_reference.py``),
and kvimpl's functions against kvspec's on every small input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvimpl import retention as impl_retention
from kvimpl import single_type_kv_cache_manager as impl_stm
from kvspec.config import FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.errors import ConfigError, UnsupportedByProfileError
from kvspec.profiles import PROFILES, profile_named
from kvspec.retention import reachable_boundaries, retention_applies
from kvspec.single_type_kv_cache_manager import retention_block_mask


def kept(mask: list[bool] | None, start: int, end: int) -> list[int]:
    """The block indices a mask keeps (all of them for None)."""
    return list(range(start, end)) if mask is None else [start + i for i, m in enumerate(mask) if m]


@pytest.mark.parametrize(
    ("retention", "eagle", "bounds", "expected"),
    [
        (0, False, (69,), [14, 15]),
        (32, False, (69,), [6, 7, 14, 15]),
        (0, True, (69,), [14, 15, 16]),
        (32, True, (69,), [6, 7, 8, 14, 15, 16]),
        (0, True, (48,), [10, 11, 12]),  # vLLM 0.30.0 on: the EAGLE replay position 48
        (8, False, (69,), None),  # a segment of two blocks: every block is needed anyway
    ],
)
def test_window_mask(retention: int, eagle: bool, bounds: tuple[int, ...], expected: list[int] | None) -> None:
    """SlidingWindow(4, window 8) under a scheduler block of 16, 70 tokens (17
    blocks cached under EAGLE, 16 without)."""
    end = 17 if eagle else 16
    mask = retention_block_mask(SlidingWindow(4, 8), 0, end, 16, eagle, retention, bounds)
    assert (mask is None) == (expected is None)
    if expected is not None:
        assert kept(mask, 0, end) == expected


def test_mamba_mask() -> None:
    """Mamba(4): the state blocks ending on a multiple of the interval, and the
    one ending at each boundary aligned down; an interval of one block keeps all."""
    assert kept(retention_block_mask(Mamba(4, "all"), 0, 6, 4, False, 8, (25,)), 0, 6) == [1, 3, 5]
    assert kept(retention_block_mask(Mamba(4, "all"), 0, 6, 4, False, 0, (25,)), 0, 6) == [5]
    assert kept(retention_block_mask(Mamba(4, "all"), 2, 6, 4, False, 0, (9, 25)), 2, 6) == [5]
    assert retention_block_mask(Mamba(4, "all"), 0, 6, 4, False, 4, (25,)) is None
    assert retention_block_mask(FullAttention(4), 0, 6, 4, False, 0, (25,)) is None


def test_boundaries_by_release() -> None:
    """The prompt's last token; from 0.26.0 the junction; from 0.30.0 the EAGLE
    replay positions; from 0.33.0 one block below the junction in an EAGLE group."""
    args = (70, 16, True, 40, True, 4)
    assert reachable_boundaries(profile_named("vllm-0.25.1"), *args) == (69,)
    assert reachable_boundaries(profile_named("vllm-0.29.0"), *args) == (69, 40)
    assert reachable_boundaries(profile_named("vllm-0.32.0"), *args) == (48, 40)
    assert reachable_boundaries(profile_named("vllm-0.34.0"), *args) == (48, 40, 36)
    # a block-aligned prompt: a resend resumes one block lower than a longer sibling
    assert reachable_boundaries(profile_named("vllm-0.34.0"), 64, 16, True, 0, True, 4) == (32, 48)
    assert reachable_boundaries(profile_named("vllm-0.34.0"), 64, 16, False, 0, False, 4) == (63,)


def test_which_groups_and_releases() -> None:
    assert not retention_applies(SlidingWindow(4, 8), profile_named("vllm-0.22.1"))
    assert retention_applies(SlidingWindow(4, 8), profile_named("vllm-0.23.0"))
    assert not retention_applies(Mamba(4, "all"), profile_named("vllm-0.23.0"))
    assert retention_applies(Mamba(4, "all"), profile_named("vllm-0.24.0"))
    assert not retention_applies(FullAttention(4), profile_named("vllm-0.34.0"))


@pytest.mark.parametrize(
    ("release", "groups", "retention", "error"),
    [
        ("vllm-0.22.1", (SlidingWindow(4, 8),), 0, UnsupportedByProfileError),
        ("vllm-0.23.0", (FullAttention(4), Mamba(4, "align")), 4, ConfigError),
        ("vllm-0.24.0", (FullAttention(4), Mamba(4, "align")), 4, None),
        ("vllm-0.28.0", (FullAttention(4),), 0, ConfigError),
        ("vllm-0.29.0", (FullAttention(4),), 0, None),
        ("vllm-0.29.0", (FullAttention(4),), 4, ConfigError),
        ("vllm-0.34.0", (FullAttention(8), SlidingWindow(4, 8)), 12, ConfigError),
        ("vllm-0.34.0", (FullAttention(8), SlidingWindow(4, 8)), -8, ConfigError),
        ("vllm-0.34.0", (FullAttention(8), SlidingWindow(4, 8)), 16, None),
    ],
)
def test_validation(release: str, groups: tuple[object, ...], retention: int, error: type[Exception] | None) -> None:
    def make() -> KVCacheConfig:
        return KVCacheConfig(
            num_blocks=16, groups=groups, max_model_len=64, profile=profile_named(release),  # type: ignore[arg-type]  # kinds
            prefix_cache_retention_interval=retention,
        )  # fmt: skip

    if error is None:
        assert make().prefix_cache_retention_interval == retention
    else:
        with pytest.raises(error, match="retention"):
            make()


@given(
    kind=st.sampled_from(
        [SlidingWindow(2, 1), SlidingWindow(2, 5), SlidingWindow(4, 8), Mamba(2, "all"), Mamba(4, "align")]
    ),
    span=st.tuples(st.integers(0, 12), st.integers(0, 12)).map(sorted),
    alignment_blocks=st.integers(1, 4),
    eagle=st.booleans(),
    retention_blocks=st.integers(0, 6),
    bounds=st.lists(st.integers(-4, 60), max_size=3),
)
def test_impl_mask_equals_spec(
    kind: SlidingWindow | Mamba,
    span: list[int],
    alignment_blocks: int,
    eagle: bool,
    retention_blocks: int,
    bounds: list[int],
) -> None:
    start, end = span
    alignment = alignment_blocks * kind.block_size
    retention = retention_blocks * alignment
    args = (kind, start, end, alignment, eagle, retention, bounds)
    assert impl_stm.retention_block_mask(*args) == retention_block_mask(*args)


@given(
    release=st.sampled_from(sorted(PROFILES)),
    prompt=st.integers(1, 80),
    sched=st.sampled_from([2, 4, 8]),
    eagle_model=st.booleans(),
    junction=st.integers(0, 80),
    group_eagle=st.booleans(),
)
def test_impl_boundaries_equal_spec(
    release: str, prompt: int, sched: int, eagle_model: bool, junction: int, group_eagle: bool
) -> None:
    p = profile_named(release)
    args = (p, prompt, sched, eagle_model, junction, group_eagle, 2)
    assert tuple(impl_retention.reachable_boundaries(*args)) == reachable_boundaries(*args)
    for kind in (SlidingWindow(2, 3), Mamba(2, "all"), FullAttention(2)):
        assert impl_retention.retention_applies(kind, p) == retention_applies(kind, p)
