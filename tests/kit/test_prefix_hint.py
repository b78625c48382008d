"""The scheduler's prefix hint (``get_prefix_hint``) and the chunk it cuts.

vLLM's hybrid coordinator notes, at each lookup, how far one attention kind's
hit reached beyond the reconciled hit (``num_uncached_common_prefix_tokens``);
the scheduler of a model with a Mamba ``align`` group stops the admission
chunk there so the shared prefix's state gets cached. Up to vLLM 0.25.1 the
scheduler reads the coordinator attribute; from 0.26.0 on the lookup returns
``shared_prefix_boundary`` (hit plus that value) and the request keeps it.

NOTE: the recorded golden traces of Mamba hybrids cannot have their chunk
sizes recomputed: the machine drew each wanted chunk (``n``) at random and a
trace keeps only the chunk scheduled from it. The chunk rule is therefore
checked against vLLM's own ``Scheduler._mamba_block_aligned_split`` below.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from kvimpl.kv_cache_manager import KVCacheManager as ImplManager
from kvimpl.native import create_manager
from kvref.scheduler_chunks import cap_at_junction
from kvspec.config import FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.profiles import profile_named
from kvspec.request import RequestBlockHasher

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _config(profile: str, caching: bool = True) -> KVCacheConfig:
    return KVCacheConfig(
        num_blocks=64,
        groups=(FullAttention(block_size=4), Mamba(block_size=4, mode="align")),
        max_model_len=64,
        enable_caching=caching,
        profile=profile_named(profile),
    )


def _managers(cfg: KVCacheConfig) -> list[Any]:
    return [SpecManager(cfg), ImplManager(cfg), create_manager(cfg)]


def _two_chunk_then_sibling(m: Any, cfg: KVCacheConfig) -> tuple[Any, Any, int]:
    """``a`` (17 tokens) runs in chunks of 8 and 9, so its Mamba state is
    cached at 8 and 16; ``b`` shares 12 tokens: full attention hits 12,
    Mamba 8, so 4 tokens are an uncached common prefix."""
    h = RequestBlockHasher.for_config(cfg)
    a = h.new_request("a", list(range(17)))
    m.get_computed_blocks(a)
    m.allocate_slots(a, 8)
    a = replace(a, num_computed_tokens=8)
    m.allocate_slots(a, 9)
    b = h.new_request("b", [*range(12), 99, 98, 97, 96, 95])
    _, hit = m.get_computed_blocks(b)
    return a, b, hit


@pytest.mark.parametrize(("profile", "hint_b", "hint_a"), [("vllm-0.25.1", 4, 4), ("vllm-0.26.0", 12, 0)])
def test_hint_per_release(profile: str, hint_b: int, hint_a: int) -> None:
    """0.25.1: the coordinator's value of the last lookup, whichever request;
    0.26.0: the request's boundary (hit 8 + 4), 0 for a request whose lookup found none."""
    cfg = _config(profile)
    for m in _managers(cfg):
        a, b, hit = _two_chunk_then_sibling(m, cfg)
        assert hit == 8, type(m).__name__
        assert (m.get_prefix_hint(b), m.get_prefix_hint(a)) == (hint_b, hint_a), type(m).__name__


@pytest.mark.parametrize("profile", ["vllm-0.25.1", "vllm-0.26.0"])
def test_skipped_lookup_keeps_or_clears(profile: str) -> None:
    """A lookup that skips the search (``skip_reading_prefix_cache``) leaves
    0.25.1's coordinator value as it was; from 0.26.0 on its boundary is 0."""
    cfg = _config(profile)
    for m in _managers(cfg):
        _, b, _ = _two_chunk_then_sibling(m, cfg)
        skip = replace(b, skip_reading_prefix_cache=True)
        assert m.get_computed_blocks(skip)[1] == 0
        expected = 4 if profile == "vllm-0.25.1" else 0
        assert m.get_prefix_hint(skip) == expected, type(m).__name__


def test_no_hint_without_a_hybrid() -> None:
    """One group, or caching off: always 0."""
    for cfg in (
        replace(_config("vllm-0.25.1"), groups=(FullAttention(block_size=4),)),
        _config("vllm-0.25.1", caching=False),
        _config("vllm-0.26.0", caching=False),
    ):
        for m in _managers(cfg):
            _, b, _ = _two_chunk_then_sibling(m, cfg)
            assert m.get_prefix_hint(b) == 0


def test_sliding_window_hybrid_hint() -> None:
    """Full attention and a sliding window: the window drops the blocks it no
    longer reads, so a sibling's window hit can stop short of full attention."""
    cfg = KVCacheConfig(
        num_blocks=64,
        groups=(FullAttention(block_size=4), SlidingWindow(block_size=4, window=4)),
        max_model_len=64,
        profile=profile_named("vllm-0.25.1"),
    )
    hints = []
    for m in _managers(cfg):
        h = RequestBlockHasher.for_config(cfg)
        a = h.new_request("a", list(range(17)))
        m.allocate_slots(a, 17)
        a = replace(a, num_computed_tokens=17)
        m.remove_skipped_blocks("a", 17, 17)
        m.free("a")
        b = h.new_request("b", list(range(13)))
        _, hit = m.get_computed_blocks(b)
        hints.append((hit, m.get_prefix_hint(b)))
    assert len(set(hints)) == 1, hints


# -- the chunk rule ----------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "start", "n", "hint", "admission", "expected"),
    [
        ("vllm-0.25.1", 8, 20, 4, True, 4),  # cut to the hint floored to a block
        ("vllm-0.25.1", 8, 20, 6, True, 4),
        ("vllm-0.25.1", 8, 20, 3, True, 20),  # under one block: no cut
        ("vllm-0.25.1", 8, 4, 6, True, 4),  # the chunk does not pass it
        ("vllm-0.25.1", 8, 20, 4, False, 20),  # only the admission's chunk
        ("vllm-0.26.0", 8, 20, 12, True, 4),  # boundary 12 from 8
        ("vllm-0.26.0", 8, 20, 14, False, 4),  # any chunk; floored
        ("vllm-0.26.0", 8, 20, 10, True, 20),  # floored to the start: no cut
        ("vllm-0.26.0", 8, 4, 12, True, 4),  # the chunk ends at the boundary
    ],
)
def test_cap_at_junction(profile: str, start: int, n: int, hint: int, admission: bool, expected: int) -> None:
    assert cap_at_junction(_config(profile), start, n, hint, admission) == expected


def test_cap_needs_mamba_align() -> None:
    cfg = replace(_config("vllm-0.25.1"), groups=(FullAttention(block_size=4), SlidingWindow(block_size=4, window=8)))
    assert cap_at_junction(cfg, 8, 20, 4, True) == 20


@pytest.mark.skipif(not HAS_VLLM, reason="needs vLLM 0.25.1")
def test_cap_matches_vllm_scheduler() -> None:
    """vLLM 0.25.1's own ``Scheduler._mamba_block_aligned_split`` (called
    with a stand-in scheduler) cuts an aligned admission chunk exactly as
    :func:`cap_at_junction` does, for every hit, chunk and hint on a grid."""
    from vllm.v1.core.sched.scheduler import Scheduler  # noqa: PLC0415 - optional dependency

    if not hasattr(Scheduler, "_mamba_block_aligned_split"):
        pytest.skip("this vLLM has no _mamba_block_aligned_split")
    import inspect  # noqa: PLC0415

    if "num_uncached_common_prefix_tokens" not in inspect.signature(Scheduler._mamba_block_aligned_split).parameters:
        pytest.skip("this vLLM's split takes no prefix hint")
    cfg = _config("vllm-0.25.1")
    fake = SimpleNamespace(cache_config=SimpleNamespace(block_size=4), use_eagle=False)
    total = 40
    checked = 0
    for hit in (0, 4, 8):
        for n in range(4, total - hit, 4):
            if hit + n >= total - total % 4:
                continue  # vLLM forces the last cacheable chunk there: schedule_chunk's rule, not this cap's
            for hint in range(0, 21):
                req = SimpleNamespace(num_computed_tokens=0, num_prompt_tokens=total, num_tokens=total)
                theirs = Scheduler._mamba_block_aligned_split(fake, req, n, hit, 0, hint)  # type: ignore[arg-type]  # a stand-in scheduler
                assert cap_at_junction(cfg, hit, n, hint, True) == theirs, (hit, n, hint)
                checked += 1
    assert checked > 500
