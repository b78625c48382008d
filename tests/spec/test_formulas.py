"""The pure formulas of the worked examples, on the spec's own functions (spec only).

The example tests pin the worked examples; the property tests at the end
(``test_prop_*``) state the same rules over drawn inputs. They run with any
Hypothesis profile; ``HYPOTHESIS_PROFILE=crosshair`` runs them on the
hypothesis-crosshair backend (symbolic inputs), as ``ci/proofs.sh`` does.

The same examples run end to end on every target in
``tests/conformance/test_examples_design.py`` and
``tests/conformance/test_examples_reference.py``.
"""

from __future__ import annotations

from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvspec.block_pool import BlockId, requeue
from kvspec.config import (
    MLA,
    AttentionKind,
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    Mamba,
    SinkFullAttention,
    SlidingWindow,
    admission_cap,
)
from kvspec.hashing import BlockHash, ExtraKeySource, extend_block_hashes, make_key, split_key
from kvspec.single_type_kv_cache_manager import (
    align_down,
    blocks_to_allocate,
    cdiv,
    chunked_local_hit,
    common_prefix_length,
    contiguous_blocks_for_hit,
    full_attention_hit,
    mamba_hit,
    num_skipped_tokens,
    reachable_block_mask,
    sliding_window_hit,
)


def present(cached: set[int] | range, n: int = 10) -> list[bool]:
    """Which of ``n`` block positions are cached."""
    return [i in cached for i in range(n)]


# --------------------------------------------------------------------------- skipped tokens


@pytest.mark.parametrize(
    ("kind", "n", "skipped"),
    [
        (SlidingWindow(1, 4), 7, 4),
        (SlidingWindow(4, 4), 7, 4),
        (SlidingWindow(4, 8), 3, 0),
        (ChunkedLocal(4, 8), 13, 8),
        (ChunkedLocal(4, 8), 8, 8),
        (ChunkedLocal(4, 8), 7, 0),
        (Mamba(4, "all"), 10, 9),
        (Mamba(4, "all"), 0, -1),
        (FullAttention(4), 100, 0),
        (MLA(4), 100, 0),
        (SinkFullAttention(4, 8), 100, 0),
        (CrossAttention(4), 100, 0),
    ],
)
def test_num_skipped_tokens(kind: AttentionKind, n: int, skipped: int) -> None:
    """Get_num_skipped_tokens: window 4 / 7 computed -> 4; chunk 8: 13 -> 8, 8 -> 8, 7 -> 0; Mamba n-1."""
    assert num_skipped_tokens(kind, n) == skipped


def test_mamba_skipped_blocks_use_floor_division() -> None:
    """Mamba skips -1 tokens at 0 computed and -1 // bs == -1 (Python floor) is harmless."""
    skipped_blocks = num_skipped_tokens(Mamba(4, "all"), 0) // 4
    assert skipped_blocks == -1
    assert [0] * skipped_blocks == []
    assert (cdiv(-1, 4), cdiv(0, 4), cdiv(13, 4), cdiv(16, 4)) == (0, 0, 4, 4)


# --------------------------------------------------------------------------- SWA


@pytest.mark.parametrize(
    ("window", "bs", "eagle", "blocks"),
    [(8, 4, False, 2), (8, 4, True, 3), (13, 4, False, 3), (13, 4, True, 4), (16, 4, False, 4), (1, 4, False, 0)],
)
def test_contiguous_blocks_for_hit(window: int, bs: int, eagle: bool, blocks: int) -> None:
    """(sliding_window_contiguous_blocks = ceil((window - 1) / block_size), +1 with EAGLE)."""
    assert contiguous_blocks_for_hit(window, bs, eagle) == blocks


@pytest.mark.parametrize(
    ("cached", "window", "eagle", "alignment", "hit"),
    [
        (range(8), 8, False, 4, (6, 8)),
        ({0, 1, 2, 4, 5, 7}, 8, False, 4, (4, 6)),
        ({0}, 8, False, 4, (0, 1)),
        ({0, 1, 2, 4, 5, 6, 7}, 8, True, 4, (5, 7)),
        (range(7), 8, False, 8, (4, 6)),
    ],
    ids=["w8 cached 0-7", "w8 cached 0,1,2,4,5,7", "w8 cached 0", "w8 eagle cached 0-2,4-7", "w8 align 8 cached 0-6"],
)
def test_sliding_window_hit_examples(
    cached: set[int] | range, window: int, eagle: bool, alignment: int, hit: tuple[int, int]
) -> None:
    """SWA lookups (bs 4, 10 blocks) as (first real index, length in blocks)."""
    contiguous = contiguous_blocks_for_hit(window, 4, eagle)
    assert sliding_window_hit(present(cached), contiguous, eagle, 4, alignment) == hit


def test_sliding_window_hit_eagle_fallback() -> None:
    """Item 16: w13+EAGLE, align 8, cached {0,1,2}: spec 2 blocks (8 tokens)."""
    # divergence "swa-eagle-fallback": vLLM 0.25.1 returns [] here (aligns, pops the
    # EAGLE block, aligns again); the spec drops the EAGLE block and aligns once.
    contiguous = contiguous_blocks_for_hit(13, 4, True)
    assert contiguous == 4
    assert sliding_window_hit(present({0, 1, 2}, 9), contiguous, True, 4, 8) == (0, 2)


def test_sliding_window_hit_is_the_rightmost_run() -> None:
    """(SWA right-to-left scan: a miss resets the run; the first complete run from the right wins)."""
    assert sliding_window_hit(present(range(10)), 2, False, 4, 4) == (8, 10)
    assert sliding_window_hit(present(set(range(9)) - {7}), 2, False, 4, 4) == (5, 7)  # block 8 alone is too short
    assert sliding_window_hit(present(set()), 2, False, 4, 4) == (0, 0)


# --------------------------------------------------------------------------- full attention, alignment


@pytest.mark.parametrize(
    ("n", "bs", "alignment", "aligned"),
    [(3, 4, 8, 2), (2, 4, 8, 2), (1, 4, 8, 0), (5, 4, 4, 5), (7, 4, 16, 4), (0, 4, 8, 0)],
)
def test_align_down(n: int, bs: int, alignment: int, aligned: int) -> None:
    """(alignment_tokens: hybrid hits are cut to a multiple of the LCM block size)."""
    assert align_down(n, bs, alignment) == aligned


def test_full_attention_hit_is_downward_closed() -> None:
    """(FullAttentionManager: left-to-right until the first miss; downward closed; EAGLE drops one)."""
    assert full_attention_hit([True, False, True, True], False, 4, 4) == 1
    assert full_attention_hit([True] * 4, False, 4, 4) == 4
    assert full_attention_hit([True] * 4, True, 4, 4) == 3
    assert full_attention_hit([True] * 3, False, 4, 8) == 2
    assert full_attention_hit([False, True], False, 4, 4) == 0
    for k in range(5):  # every shorter prefix of a hit is a hit
        assert full_attention_hit([True] * k + [False], False, 4, 4) == k


# --------------------------------------------------------------------------- chunked local, Mamba


def test_chunked_local_hit_without_lookups() -> None:
    """Empty cache, 17 tokens (max 16), chunk 8, bs 4 -> 4 null blocks (16 tokens)."""
    assert chunked_local_hit(present(set(), 4), 16, 8, 4) == (4, 4)


def test_chunked_local_hit_scans_the_current_chunk() -> None:
    """(ChunkedLocal: nulls up to (max_length // chunk) * chunk, then left-to-right until a miss)."""
    assert chunked_local_hit(present({2}, 3), 12, 8, 4) == (2, 3)
    assert chunked_local_hit(present({0, 1}, 3), 12, 8, 4) == (2, 2)
    assert chunked_local_hit(present({0}, 1), 7, 8, 4) == (0, 1)
    assert chunked_local_hit([], 0, 8, 4) == (0, 0)


def test_mamba_hit_is_the_rightmost_aligned_state() -> None:
    """(MambaManager: right-to-left, the first hit wins); misaligned hits are skipped."""
    assert mamba_hit([True, True, False, True], 4, 4) == (3, 4)
    assert mamba_hit([True, True, True, False], 4, 8) == (1, 2)
    assert mamba_hit([False, False], 4, 4) == (0, 0)


# --------------------------------------------------------------------------- cache masks, caps, common prefix


def mask_pattern(mask: list[bool] | None) -> str | None:
    """``h`` for cacheable, ``-`` for masked blocks."""
    return None if mask is None else "".join("h" if m else "-" for m in mask)


def test_reachable_block_mask_examples() -> None:
    """Swa(4,8) with scheduler block 16: --hh… (EAGLE --hhh-hhh…)."""
    swa = SlidingWindow(4, 8)
    assert mask_pattern(reachable_block_mask(swa, 0, 16, 16, False)) == "--hh--hh--hh--hh"
    assert mask_pattern(reachable_block_mask(swa, 0, 17, 16, True)) == "--hhh-hhh-hhh-hhh"
    assert mask_pattern(reachable_block_mask(swa, 4, 8, 16, False)) == "--hh"


def test_reachable_block_mask_dense_and_degenerate() -> None:
    """(single group / need >= per -> None, dense) and (window 1 -> all masked)."""
    assert reachable_block_mask(SlidingWindow(4, 8), 0, 10, 4, False) is None
    assert reachable_block_mask(SlidingWindow(4, 13), 0, 10, 8, True) is None
    assert reachable_block_mask(FullAttention(4), 0, 10, 16, False) is None
    assert reachable_block_mask(Mamba(4, "all"), 0, 10, 16, False) is None
    assert mask_pattern(reachable_block_mask(SlidingWindow(4, 1), 0, 3, 4, False)) == "---"


def test_admission_caps_examples() -> None:
    """Swa(4,8), mnbt 8 -> cap 5; chunked local cdiv(min(chunk+mnbt, L), bs)."""
    assert admission_cap(SlidingWindow(4, 8), 8, 128) == 5
    assert admission_cap(ChunkedLocal(4, 8), 8, 128) == 4
    assert admission_cap(SlidingWindow(4, 8), 8, 10) == 4
    assert admission_cap(FullAttention(4), 8, 128) is None
    assert admission_cap(Mamba(4, "all"), 8, 128) is None


def test_common_prefix_length_examples() -> None:
    """Invariant 15: a [1,2,3], b [1,2,4] -> 2; with unrelated c [5,6,7] -> 0."""
    a, b, c = ([BlockId(i) for i in t] for t in ((1, 2, 3), (1, 2, 4), (5, 6, 7)))
    assert common_prefix_length(a, [a, b]) == 2
    assert common_prefix_length(a, [a, b, c]) == 0
    # divergence "common-prefix-pending": b popped (pending), c allocated -> the spec
    # counts tables only (0); vLLM's ref_cnt rule over-reports 2.
    assert common_prefix_length(a, [a, c]) == 0
    assert common_prefix_length(a, [a]) == 3


# --------------------------------------------------------------------------- properties (also under CrossHair)

_bools = st.lists(st.booleans(), max_size=6)


@given(st.integers(-50, 50), st.integers(1, 8))
def test_prop_cdiv(a: int, b: int) -> None:
    """Cdiv is the least ``q`` with ``q * b >= a``."""
    q = cdiv(a, b)
    assert q * b >= a > (q - 1) * b


@given(st.integers(0, 20), st.integers(1, 4), st.integers(1, 4))
def test_prop_align_down(n: int, bs: int, per: int) -> None:
    """Align_down drops to the largest multiple of ``per`` blocks."""
    assert align_down(n, bs, bs * per) == n - n % per


@given(st.sampled_from(["swa", "chunked", "mamba", "full"]), st.integers(1, 16), st.integers(0, 64), st.integers(0, 8))
def test_prop_skipped_tokens(tag: str, param: int, n: int, d: int) -> None:
    """Never more than ``n``, monotone in ``n``; the window's tokens are never skipped."""
    kinds: dict[str, AttentionKind] = {
        "swa": SlidingWindow(4, param),
        "chunked": ChunkedLocal(4, param),
        "mamba": Mamba(4, "all"),
        "full": FullAttention(4),
    }
    kind = kinds[tag]
    skipped = num_skipped_tokens(kind, n)
    assert skipped <= n and skipped <= num_skipped_tokens(kind, n + d)
    if isinstance(kind, SlidingWindow):
        assert n - skipped == min(n, param - 1)


@given(_bools, st.booleans(), st.integers(1, 3))
def test_prop_full_attention_hit(cached: list[bool], drop: bool, per: int) -> None:
    """Aligned, cached (with the dropped EAGLE block), and no longer aligned hit exists."""
    hit = full_attention_hit(cached, drop, 2, 2 * per)
    assert hit % per == 0 and all(cached[: hit + (1 if drop and hit else 0)])
    longer = hit + per + drop
    assert not (longer <= len(cached) and all(cached[:longer]))


@given(_bools, st.integers(1, 8), st.booleans())
def test_prop_sliding_window_hit(cached: list[bool], window: int, drop: bool) -> None:
    """The run is cached and long enough, or starts at block 0."""
    need = contiguous_blocks_for_hit(window, 2, drop)
    first, length = sliding_window_hit(cached, need, drop, 2, 2)
    assert 0 <= first <= length <= len(cached) and all(cached[first:length])
    assert first == 0 or length + drop - first >= need


@given(_bools, st.integers(1, 3))
def test_prop_mamba_hit(cached: list[bool], per: int) -> None:
    """The rightmost cached state at an aligned end, or none."""
    first, end = mamba_hit(cached, 2, 2 * per)
    later = [i for i in range(len(cached)) if cached[i] and (i + 1) % per == 0]
    assert (first, end) == ((later[-1], later[-1] + 1) if later else (0, 0))


@given(st.integers(0, 8), st.integers(0, 3), st.integers(-1, 8), _bools, st.data())
def test_prop_blocks_to_allocate(required: int, have: int, skipped: int, free: list[bool], data: st.DataObject) -> None:
    """A free hit costs one block exactly when it will be touched (not skipped)."""
    got = blocks_to_allocate(required, None, have, skipped, free, False)
    assert got >= 0
    if free:
        i = data.draw(st.integers(0, len(free) - 1))
        flipped = [*free[:i], not free[i], *free[i + 1 :]]
        delta = got - blocks_to_allocate(required, None, have, skipped, flipped, False)
        assert delta == ((1 if free[i] else -1) if i >= skipped - have else 0)


@given(st.lists(st.integers(1, 9), max_size=3), st.lists(st.tuples(st.integers(10, 19), st.booleans()), max_size=4))
def test_prop_requeue(queue: list[int], released: list[tuple[int, bool]]) -> None:
    """Unhashed released blocks first, then the old queue, then hashed ones."""
    got = requeue(queue, [b for b, _ in released], [h for _, h in released])
    assert got == [b for b, h in released if not h] + queue + [b for b, h in released if h]


@given(st.binary(max_size=8), st.integers(0, 2**32 - 1))
def test_prop_key_round_trip(digest: bytes, group: int) -> None:
    """Split_key inverts make_key."""
    assert split_key(make_key(BlockHash(digest), group)) == (digest, group)


def _identity(obj: Any) -> bytes:
    return cast(bytes, obj)


@given(st.lists(st.integers(0, 3), min_size=4, max_size=4), st.integers(0, 3), st.integers(0, 3))
def test_prop_hash_chain(tokens: list[int], pos: int, value: int) -> None:
    """Changing token ``pos`` changes exactly the hashes of its block and later
    ones (injective stand-in hash; see proofs/holds/chain.py)."""
    changed = [*tokens[:pos], value, *tokens[pos + 1 :]]
    a = extend_block_hashes(_identity, BlockHash(b"s"), 2, (), tokens, ExtraKeySource())
    b = extend_block_hashes(_identity, BlockHash(b"s"), 2, (), changed, ExtraKeySource())
    for j in range(len(a)):
        assert (a[j] == b[j]) == (value == tokens[pos] or j < pos // 2)
