"""Worked examples of the per-kind rules under the vLLM 0.16.0 profile.

Each example runs on kvspec, on kvimpl's pure-Python manager and, when vLLM
0.16.0 itself is installed, on real vLLM through kvref's adapter (skipped
otherwise). With that release installed, ``python
tests/conformance/test_vllm_0_16_0_examples.py`` runs them on real vLLM only,
without pytest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvimpl.kv_cache_manager import KVCacheManager as ImplManager
from kvimpl.request import RequestHasher
from kvspec.config import AttentionKind, ChunkedLocal, FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.profiles import VLLM_0_16_0
from kvspec.request import RequestBlockHasher


def _vllm_0_16_0() -> bool:
    try:
        from kvref.adapters.vllm import installed_vllm_version  # noqa: PLC0415 - optional dependency
    except ImportError:
        return False
    return installed_vllm_version() == "0.16.0"


SIDES = ["spec", "impl", pytest.param("vllm", marks=pytest.mark.skipif(not _vllm_0_16_0(), reason="needs vLLM 0.16.0"))]


def build(side: str, kind: AttentionKind, caching: bool) -> tuple[Any, Any]:
    """A 12-block manager of one ``kind`` on ``side`` and its request factory."""
    config = KVCacheConfig(
        num_blocks=12, groups=(kind,), max_model_len=64, enable_caching=caching, profile=VLLM_0_16_0
    )
    if side == "spec":
        return SpecManager(config), RequestBlockHasher.for_config(config)
    if side == "impl":
        return ImplManager(config), RequestHasher.for_config(config, native=False)
    from kvref.adapters.vllm import make_vllm_adapter  # noqa: PLC0415 - only with vLLM installed

    return make_vllm_adapter(config), RequestBlockHasher.for_config(config)


def table(mgr: Any, rid: str) -> tuple[int, ...]:
    """The request's block table in its one group."""
    return tuple(mgr.get_block_ids(rid)[0])


@pytest.mark.parametrize("side", SIDES)
def test_sliding_window_skips_tokens_outside_the_window(side: str) -> None:
    """Window 4, 7 computed tokens: the next token attends to tokens 3..6
    (the window counts the token itself), so tokens 0..3 are skipped: with
    2-token blocks the first two blocks become null."""
    mgr, hasher = build(side, SlidingWindow(2, 4), caching=False)
    mgr.allocate_slots(hasher.new_request("a", list(range(8))), 8)
    assert table(mgr, "a") == (1, 2, 3, 4)
    mgr.remove_skipped_blocks("a", 7)
    assert table(mgr, "a") == (0, 0, 3, 4)


@pytest.mark.parametrize("side", SIDES)
def test_sliding_window_hit_scans_from_the_right(side: str) -> None:
    """Window 4 with 2-token blocks needs ceil(3 / 2) = 2 contiguous cached
    blocks. A request sharing 8 cached tokens (hit at most 9 of its 10) finds
    blocks 3 and 4 from the right and pads the rest with the null block."""
    mgr, hasher = build(side, SlidingWindow(2, 4), caching=True)
    mgr.allocate_slots(hasher.new_request("a", list(range(9))), 9)
    hit, n = mgr.get_computed_blocks(hasher.new_request("b", [*range(8), 50, 51]))
    assert (tuple(map(tuple, hit)), n) == (((0, 0, 3, 4),), 8)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize(("computed", "table_after"), [(13, (0, 0, 3, 4)), (8, (0, 0, 3, 4)), (7, (1, 2, 3, 4))])
def test_chunked_local_skips_whole_chunks(side: str, computed: int, table_after: tuple[int, ...]) -> None:
    """Chunk 8: 13 and 8 computed tokens skip the first chunk (tokens 0..7,
    two 4-token blocks); 7 computed tokens are still inside it."""
    mgr, hasher = build(side, ChunkedLocal(4, 8), caching=False)
    mgr.allocate_slots(hasher.new_request("a", list(range(16))), 16)
    mgr.remove_skipped_blocks("a", computed)
    assert table(mgr, "a") == table_after


@pytest.mark.parametrize("side", SIDES)
def test_chunked_local_hit_starts_at_the_current_chunk(side: str) -> None:
    """Chunk 8, a request of 13 tokens sharing 12 cached ones: the hit may
    cover at most 12 tokens, whose chunk starts at 8, so blocks before it are
    null and the scan starts at block 2 (cached as block 3)."""
    mgr, hasher = build(side, ChunkedLocal(4, 8), caching=True)
    mgr.allocate_slots(hasher.new_request("a", list(range(13))), 13)
    hit, n = mgr.get_computed_blocks(hasher.new_request("b", [*range(12), 70]))
    assert (tuple(map(tuple, hit)), n) == (((0, 0, 3),), 12)


@pytest.mark.parametrize("side", SIDES)
def test_full_attention_hit_scans_from_the_left(side: str) -> None:
    """Full attention: the hit is the longest cached prefix of whole blocks
    (below the request's last token)."""
    mgr, hasher = build(side, FullAttention(4), caching=True)
    mgr.allocate_slots(hasher.new_request("a", list(range(12))), 12)
    hit, n = mgr.get_computed_blocks(hasher.new_request("b", [*range(8), 40, 41, 42, 43, 44]))
    assert (tuple(map(tuple, hit)), n) == (((1, 2),), 8)


@pytest.mark.parametrize("side", SIDES)
def test_full_attention_hit_in_a_hybrid_drops_eagle_then_aligns_to_the_lcm(side: str) -> None:
    """Full attention in a hybrid, under EAGLE: the left-to-right scan finds
    four blocks of 4 (16 tokens), the EAGLE block is dropped (12) and the hit
    is cut to a multiple of the LCM of the block sizes, 8; the Mamba group
    (block 8) then finds its state at 8 tokens."""
    config = KVCacheConfig(
        num_blocks=16, groups=(FullAttention(4), Mamba(8, "all")), max_model_len=64, use_eagle=True,
        profile=VLLM_0_16_0,
    )  # fmt: skip
    if side == "spec":
        mgr: Any = SpecManager(config)
        hasher: Any = RequestBlockHasher.for_config(config)
    elif side == "impl":
        mgr, hasher = ImplManager(config), RequestHasher.for_config(config, native=False)
    else:
        from kvref.adapters.vllm import make_vllm_adapter  # noqa: PLC0415 - only with vLLM installed

        mgr, hasher = make_vllm_adapter(config), RequestBlockHasher.for_config(config)
    mgr.allocate_slots(hasher.new_request("a", list(range(17))), 17)
    hit, n = mgr.get_computed_blocks(hasher.new_request("b", [*range(17), 99]))
    assert (tuple(map(tuple, hit)), n) == (((1, 2), (6,)), 8)


EXAMPLES: list[Callable[..., None]] = [
    test_sliding_window_skips_tokens_outside_the_window,
    test_sliding_window_hit_scans_from_the_right,
    test_chunked_local_hit_starts_at_the_current_chunk,
    test_full_attention_hit_scans_from_the_left,
    test_full_attention_hit_in_a_hybrid_drops_eagle_then_aligns_to_the_lcm,
]

if __name__ == "__main__":
    for example in EXAMPLES:
        example("vllm")
        print(f"vllm 0.16.0: {example.__name__} ok")
    for computed, after in ((13, (0, 0, 3, 4)), (8, (0, 0, 3, 4)), (7, (1, 2, 3, 4))):
        test_chunked_local_skips_whole_chunks("vllm", computed, after)
        print(f"vllm 0.16.0: test_chunked_local_skips_whole_chunks[{computed}] ok")
