"""Report mode "full" (``kv_cache_report_mode``, vLLM 0.26.0 on): a lookup that
hits announces the hit again, one ``BlockStored`` per group with hit blocks.

The expected events were confirmed on real vLLM 0.34.0 (this file under that
release's venv) and, for the release that ignores the mode, on 0.25.1.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvref.testing import KV, make_kv
from kvspec.config import AttentionKind, FullAttention, SlidingWindow
from kvspec.errors import InvalidRequestError
from kvspec.events import BlockStored
from kvspec.hashing import external_block_hash
from kvspec.profiles import VLLM_0_25_1, VLLM_0_34_0, SemanticsProfile
from kvspec.request import Request, RequestBlockHasher

N = 0  # the null block


def _kv(target: str, profile: SemanticsProfile, *groups: AttentionKind) -> KV:
    return make_kv(target, *groups, profile=profile, num_blocks=16, enable_kv_cache_events=True)


def _full(kv: KV, rid: str, prompt: range) -> Request:
    return kv.hasher.new_request(rid, list(prompt), kv_cache_report_mode="full")


def _cached_then_freed(kv: KV, prompt: range) -> None:
    """A first request computes ``prompt``, is cached and freed; its events are drained."""
    a = kv.req("a", prompt)
    assert kv.admit(a) is not None
    kv.a.free(a.request_id)
    kv.a.take_events()


def _hashes(kv: KV, request: Request, n: int) -> tuple[Any, ...]:
    return tuple(external_block_hash(h, kv.config.int_block_hashes) for h in request.block_hashes[:n])


@pytest.mark.semantics(VLLM_0_34_0.name)
def test_full_mode_announces_each_groups_hit(target: str) -> None:
    """A 12-token hit (13-token prompt, blocks of 4) of a hybrid: both groups
    announce three blocks, the window group's null entries included, with no
    parent and the request's own tokens; allocating the hit adds no event."""
    kv = _kv(target, VLLM_0_34_0, FullAttention(4), SlidingWindow(4, 4))
    _cached_then_freed(kv, range(13))
    b = _full(kv, "b", range(13))
    hits, n = kv.a.get_computed_blocks(b)
    assert n == 12
    assert len(hits[0]) == 3 and tuple(hits[1][:2]) == (N, N)
    events = kv.a.take_events()
    assert [type(e) for e in events] == [BlockStored, BlockStored]
    for gid, ev in enumerate(events):
        assert isinstance(ev, BlockStored)
        assert ev.group_idx == gid
        assert ev.block_hashes == _hashes(kv, b, 3)
        assert ev.parent_block_hash is None
        assert ev.token_ids == tuple(range(12))
        assert ev.block_size == 4
    window_event = events[1]
    assert isinstance(window_event, BlockStored) and window_event.kv_cache_spec_sliding_window == 4
    assert kv.a.allocate_slots(b, 1, n, hits) is not None
    assert kv.a.take_events() == []


@pytest.mark.semantics(VLLM_0_34_0.name)
def test_incremental_mode_and_misses_announce_nothing(target: str) -> None:
    """The default mode announces nothing; a full-mode request that misses neither."""
    kv = _kv(target, VLLM_0_34_0, FullAttention(4))
    _cached_then_freed(kv, range(9))
    b = kv.req("b", range(9))
    assert kv.a.get_computed_blocks(b)[1] == 8
    c = _full(kv, "c", range(100, 109))
    assert kv.a.get_computed_blocks(c)[1] == 0
    assert kv.a.take_events() == []


@pytest.mark.semantics(VLLM_0_34_0.name)
def test_full_mode_names_the_requests_hashes_after_eviction_of_nothing(target: str) -> None:
    """Two lookups of one full-mode request announce the hit twice (the mode
    reports every lookup, not the first only)."""
    kv = _kv(target, VLLM_0_34_0, FullAttention(4))
    _cached_then_freed(kv, range(9))
    b = _full(kv, "b", range(9))
    kv.a.get_computed_blocks(b)
    kv.a.get_computed_blocks(b)
    events = kv.a.take_events()
    assert len(events) == 2 and events[0] == events[1]


@pytest.mark.semantics(VLLM_0_25_1.name)
def test_release_before_the_mode_ignores_it(target: str) -> None:
    """vLLM 0.25.1 has no report mode: a full-mode request's hit is not announced."""
    kv = _kv(target, VLLM_0_25_1, FullAttention(4))
    _cached_then_freed(kv, range(9))
    b = _full(kv, "b", range(9))
    assert kv.a.get_computed_blocks(b)[1] == 8
    assert kv.a.take_events() == []


def test_unknown_report_mode_is_refused() -> None:
    hasher = RequestBlockHasher("sha256", "0", 4, VLLM_0_34_0)
    with pytest.raises(InvalidRequestError, match="kv_cache_report_mode"):
        hasher.new_request("a", [1, 2], kv_cache_report_mode="all")  # type: ignore[arg-type]  # the broken argument
