"""Worked examples of the design, on every target (spec, kvimpl, real vLLM).

Two groups of examples, each pinning exact block ids:

* the per-kind managers (vLLM's ``single_type_kv_cache_manager.py``) —
  skipped tokens, reverse-order free, hit searches, Mamba align allocation,
  cross attention, SinkFull;
* the ``KVCacheManager`` facade (vLLM's ``kv_cache_manager.py``) — watermark,
  full-sequence admission, reserved blocks, delayed caching, the N=0/E=0
  error, the ``num_tokens - 1`` hit cap, skipping the prefix cache, reset,
  ``pop_blocks_for_free``, event annotation.

The pure formulas behind these examples are tested directly in
``test_formulas.py``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kvref.testing import KV, computed
from kvref.testing import make_kv as make_any_kv
from kvspec.config import (
    MLA,
    AttentionKind,
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    KVCacheConfig,
    Mamba,
    SinkFullAttention,
    SlidingWindow,
)
from kvspec.errors import ConfigError, InvalidTokenCountError, StaleHitError, UnexpectedPrefixHitError
from kvspec.events import AllBlocksCleared, BlockStored
from kvspec.hashing import external_block_hash
from kvspec.profiles import VLLM_0_25_1
from kvspec.request import RequestStatus

pytestmark = pytest.mark.semantics(VLLM_0_25_1.name)
"""Every example pins vLLM 0.25.1's behaviour (real vLLM: only that release)."""


def make_kv(target: str, *groups: AttentionKind, **kw: Any) -> KV:
    """:func:`kvref.testing.make_kv` under the 0.25.1 profile."""
    return make_any_kv(target, *groups, profile=VLLM_0_25_1, **kw)


N = 0  # the null block

# --------------------------------------------------------------------------- managers: MLA


def test_mla_is_managed_like_full_attention(target: str) -> None:
    """Spec_manager_map: MLAAttentionSpec -> FullAttentionManager: hits, free order, common prefix."""
    kv = make_kv(target, MLA(4), enable_kv_cache_events=True)
    assert kv.a.allocate_slots(kv.req("a", range(10)), 10) == ((1, 2, 3),)
    (ev,) = kv.a.take_events()
    assert isinstance(ev, BlockStored)
    assert (ev.kv_cache_spec_kind, ev.kv_cache_spec_sliding_window) == ("mla_attention", None)
    b = kv.req("b", [*range(9), 99])
    hits, n = kv.a.get_computed_blocks(b)
    assert (hits, n) == (((1, 2),), 8)
    assert kv.a.allocate_slots(b, 2, n, hits) == ((4,),)
    assert kv.a.get_num_common_prefix_blocks("b") == (2,)
    kv.a.free("b")
    assert kv.a.to_view().free_queue == (4, *range(5, 16))


# --------------------------------------------------------------------------- managers: skipped tokens


def test_swa_window_4_with_7_computed_skips_4(target: str) -> None:
    """SlidingWindowManager.get_num_skipped_tokens: window 4, 7 computed -> tokens 0-3 skipped."""
    kv = make_kv(target, SlidingWindow(2, 4))
    assert kv.a.allocate_slots(kv.req("a", range(8)), 8) == ((1, 2, 3, 4),)
    kv.a.remove_skipped_blocks("a", 7)
    assert kv.table("a") == ((N, N, 3, 4),)
    # remove_skipped_blocks frees from the highest index down; both are hashed -> tail.
    assert kv.a.to_view().free_queue == (*range(5, 16), 2, 1)
    kv.a.remove_skipped_blocks("a", 7)  # idempotent: the backward scan stops at a null
    assert kv.table("a") == ((N, N, 3, 4),)


@pytest.mark.parametrize(("computed_tokens", "skipped_blocks"), [(13, 2), (8, 2), (7, 0)])
def test_chunked_local_skips_whole_chunks(target: str, computed_tokens: int, skipped_blocks: int) -> None:
    """ChunkedLocalAttentionManager.get_num_skipped_tokens: chunk 8: 13 -> 8, 8 -> 8, 7 -> 0."""
    kv = make_kv(target, ChunkedLocal(4, 8))
    assert kv.a.allocate_slots(kv.req("a", range(16)), 16) == ((1, 2, 3, 4),)
    kv.a.remove_skipped_blocks("a", computed_tokens)
    assert kv.table("a") == ((*([N] * skipped_blocks), *range(1 + skipped_blocks, 5)),)


# --------------------------------------------------------------------------- managers: free order


def test_free_in_reverse_order_evicts_the_tail_first(target: str) -> None:
    """Free(): reversed for LRU: the request's last blocks are evicted first, the prefix survives."""
    kv = make_kv(target, FullAttention(4), num_blocks=6)
    prompt = list(range(16))
    assert kv.a.allocate_slots(kv.req("a", prompt), 16) == ((1, 2, 3, 4),)
    kv.a.free("a")
    assert kv.a.to_view().free_queue == (5, 4, 3, 2, 1)
    assert kv.a.allocate_slots(kv.req("c", range(100, 108)), 8) == ((5, 4),)  # evicts block 4
    assert kv.a.get_computed_blocks(kv.req("b", [*prompt, 16])) == (((1, 2, 3),), 12)


def test_free_of_an_unknown_request_is_a_no_op(target: str) -> None:
    """(free(): req_to_blocks.pop(request_id, [])): freeing an unknown request changes nothing."""
    kv = make_kv(target, FullAttention(4))
    before = kv.a.to_view()
    kv.a.free("nobody")
    assert kv.a.to_view() == before


# --------------------------------------------------------------------------- managers: hit searches


def test_full_attention_hit_stops_at_the_first_miss(target: str) -> None:
    """FullAttentionManager: left-to-right scan, downward closed: a miss at block 1 hides blocks 2-3."""
    kv = make_kv(target, FullAttention(4))
    prompt = list(range(16))
    assert kv.a.allocate_slots(kv.req("a", prompt), 16) == ((1, 2, 3, 4),)
    kv.a.evict_blocks([2])
    assert kv.hashed() == {1, 3, 4}
    assert kv.a.get_computed_blocks(kv.req("b", [*prompt, 16])) == (((1,),), 4)


def test_full_attention_eagle_drops_the_last_block(target: str) -> None:
    """FullAttentionManager.find_longest_cache_hit, EAGLE: the last hit block is dropped."""
    kv = make_kv(target, FullAttention(4), use_eagle=True)
    prompt = list(range(16))
    assert kv.a.allocate_slots(kv.req("a", prompt), 16) == ((1, 2, 3, 4),)
    assert kv.a.get_computed_blocks(kv.req("b", [*prompt, 16])) == (((1, 2, 3),), 12)


@pytest.mark.parametrize(
    ("evicted", "expected", "tokens"),
    [((), (N,) * 8 + (9, 10), 40), ((10,), (N,) * 7 + (8, 9), 36), ((9,), (N,) * 6 + (7, 8), 32)],
    ids=["all cached", "last evicted", "gap before last"],
)
def test_swa_right_to_left_contiguous_search(
    target: str, evicted: tuple[int, ...], expected: tuple[int, ...], tokens: int
) -> None:
    """SlidingWindowManager.find_longest_cache_hit: rightmost run of ceil((w-1)/bs) blocks, nulls before."""
    kv = make_kv(target, SlidingWindow(4, 8))
    prompt = list(range(41))
    assert kv.a.allocate_slots(kv.req("a", prompt), 41) == (tuple(range(1, 12)),)
    kv.a.evict_blocks(list(evicted))
    assert kv.a.get_computed_blocks(kv.req("b", prompt)) == ((expected,), tokens)


def test_swa_common_prefix_is_always_zero(target: str) -> None:
    """SlidingWindowManager.get_num_common_prefix_blocks: always 0; full attention counts shared blocks."""
    kv = make_kv(target, FullAttention(4), SlidingWindow(4, 8))
    prompt = list(range(10))
    assert kv.a.allocate_slots(kv.req("a", prompt), 10) == ((1, 2, 3), (4, 5, 6))
    b = kv.req("b", prompt)
    hits, n = kv.a.get_computed_blocks(b)
    assert (hits, n) == (((1, 2), (4, 5)), 8)
    assert kv.a.allocate_slots(b, 2, n, hits) == ((7,), (8,))
    assert kv.table("b") == ((1, 2, 7), (4, 5, 8))
    assert kv.a.get_num_common_prefix_blocks("b") == (2, 0)


def test_chunked_local_pads_nulls_before_the_current_chunk(target: str) -> None:
    """ChunkedLocalAttentionManager.find_longest_cache_hit: nulls before the chunk, left-to-right inside."""
    kv = make_kv(target, ChunkedLocal(4, 8))
    prompt = list(range(20))
    assert kv.a.allocate_slots(kv.req("a", prompt), 20) == ((1, 2, 3, 4, 5),)
    assert kv.a.get_computed_blocks(kv.req("b", [*prompt, 20])) == (((N, N, N, N, 5),), 20)


@pytest.mark.parametrize(
    ("groups", "use_eagle", "message"),
    [
        ((ChunkedLocal(4, 8),), True, "EAGLE"),
        ((ChunkedLocal(4, 8), FullAttention(8)), False, "share its block size"),
        ((SinkFullAttention(4, 6),), False, "multiple of the block size"),
    ],
    ids=["chunked-local+eagle", "chunked-local mixed block sizes", "sink_len not a multiple"],
)
def test_manager_constraints_are_config_errors(
    groups: tuple[AttentionKind, ...], use_eagle: bool, message: str
) -> None:
    """(constraints: chunked local without EAGLE or mixed block sizes; sink_len % block_size == 0)."""
    # Rejected when the configuration is built, before any target exists.
    with pytest.raises(ConfigError, match=message):
        KVCacheConfig(num_blocks=16, groups=groups, max_model_len=128, use_eagle=use_eagle, profile=VLLM_0_25_1)


def test_mamba_hit_is_the_last_state_only(target: str) -> None:
    """MambaManager.find_longest_cache_hit: rightmost hit only, nulls before it; then one new block."""
    kv = make_kv(target, Mamba(4, "all"))
    prompt = list(range(13))
    assert kv.a.allocate_slots(kv.req("a", prompt), 13) == ((1, 2, 3, 4),)
    assert kv.hashed() == {1, 2, 3}
    kv.a.new_step_starts()
    b = kv.req("b", [*prompt, 13, 14, 15])
    hits, n = kv.a.get_computed_blocks(b)
    assert (hits, n) == (((N, N, 3),), 12)
    assert kv.a.allocate_slots(b, 4, n, hits) == ((5,),)
    assert kv.table("b") == ((N, N, 3, 5),)


# --------------------------------------------------------------------------- managers: allocation


def test_hit_blocks_in_the_free_queue_count_as_needed(target: str) -> None:
    """Get_num_blocks_to_allocate slow path adds evictable hits: hits as the only free blocks -> None."""
    kv = make_kv(target, FullAttention(4), num_blocks=6)
    prompt = list(range(12))
    assert kv.a.allocate_slots(kv.req("a", prompt), 12) == ((1, 2, 3),)
    kv.a.free("a")
    assert kv.a.allocate_slots(kv.req("c", [70] * 4), 4) == ((4,),)
    assert kv.a.allocate_slots(kv.req("d", [80] * 4), 4) == ((5,),)
    assert kv.a.to_view().free_queue == (3, 2, 1)
    b = kv.req("b", [*prompt, 12])
    hits, n = kv.a.get_computed_blocks(b)
    assert (hits, n) == (((1, 2, 3),), 12)
    assert kv.a.allocate_slots(b, 1, n, hits) is None  # 1 new + 3 evictable > 3 free
    kv.a.free("c")
    assert kv.a.allocate_slots(b, 1, n, hits) == ((4,),)
    assert kv.table("b") == ((1, 2, 3, 4),)


def test_running_request_with_prefix_hits_is_a_caller_error(target: str) -> None:
    """Allocate_new_computed_blocks: RUNNING -> assert no new computed blocks: same error on both targets."""
    kv = make_kv(target, FullAttention(4))
    a = kv.req("a", range(8))
    assert kv.a.allocate_slots(a, 8) == ((1, 2),)
    a = computed(kv.out(a, 8), 8)
    before = kv.a.to_view()
    with pytest.raises(UnexpectedPrefixHitError):
        kv.a.allocate_slots(a, 1, 4, ((1,),))
    assert kv.a.to_view() == before


@pytest.mark.parametrize(("n_hit", "hits"), [(4, ((1, 2),)), (8, ((1,),)), (6, ((1,),))])
def test_hit_lists_must_cover_exactly_the_hit_tokens(target: str, n_hit: int, hits: tuple[tuple[int, ...]]) -> None:
    """A hit list of other than cdiv(hit tokens, block size) blocks is a
    caller error: no lookup returns one. vLLM accepts it (then counts tokens
    no hit block holds as computed); kvspec, kvimpl and the vLLM adapter
    raise StaleHitError and change nothing."""
    kv = make_kv(target, FullAttention(4))
    kv.a.allocate_slots(kv.req("a", range(12)), 12)
    before = kv.a.to_view()
    with pytest.raises(StaleHitError, match="hit tokens take"):
        kv.a.allocate_slots(kv.req("b", [*range(12), 5]), 2, n_hit, hits)
    assert kv.a.to_view() == before


def test_rejected_speculative_tokens_do_not_shrink_the_table(target: str) -> None:
    """Get_num_blocks_to_allocate fast path: num_req_blocks > required after rejection: 0 new blocks."""
    kv = make_kv(target, FullAttention(4))
    a = kv.req("a", range(4))
    assert kv.a.allocate_slots(a, 4, num_lookahead_tokens=8) == ((1, 2, 3),)
    a = computed(kv.out(a, 9), 4)
    assert kv.a.allocate_slots(a, 1) == ((),)
    assert kv.table("a") == ((1, 2, 3),)


def test_mamba_align_allocates_one_plus_speculative_then_one(target: str) -> None:
    """MambaManager align mode: a new request takes 1 + num_speculative_blocks blocks, a running one <= 1."""
    kv = make_kv(target, Mamba(4, "align", 2))
    a = kv.req("a", range(8))
    assert kv.a.allocate_slots(a, 8) == ((N, 1, 2, 3),)
    a = computed(kv.out(a, 8, 9, 10, 11), 8)
    assert kv.a.allocate_slots(a, 4) == ((4,),)
    assert kv.table("a") == ((N, 1, 2, 3, 4),)


def test_cross_attention_blocks_are_sized_by_the_encoder(target: str) -> None:
    """CrossAttentionManager: encoder blocks are allocated once from num_encoder_tokens, never grown."""
    kv = make_kv(target, FullAttention(4), CrossAttention(4), enable_caching=False)
    a = kv.req("a", range(5))
    assert kv.a.allocate_slots(a, 5, num_encoder_tokens=10) == ((1, 2), (3, 4, 5))
    a = computed(kv.out(a, 5), 5)
    assert kv.a.allocate_slots(a, 1) == ((), ())
    a = computed(kv.out(a, 6, 7, 8), 6)
    assert kv.a.allocate_slots(a, 3) == ((6,), ())
    assert kv.table("a") == ((1, 2, 6), (3, 4, 5))
    kv.a.free("a")
    assert kv.a.to_view().free_queue == (5, 4, 3, 6, 2, 1, *range(7, 16))


def test_sink_blocks_are_taken_at_construction(target: str) -> None:
    """(SinkFullAttentionManager: popleft_n(sink_len // block_size) at init, never freed)."""
    kv = make_kv(target, FullAttention(4), SinkFullAttention(4, 8), num_blocks=12)
    # divergence "sinkfull-ctor": vLLM 0.25.1's constructor raises TypeError; the vLLM
    # adapter applies its documented constructor shim, after which behaviour matches.
    assert kv.workaround == ("sinkfull-ctor" if kv.is_vllm else None)
    assert kv.a.to_view().free_queue == tuple(range(3, 12))
    assert kv.a.allocate_slots(kv.req("a", range(8)), 8) == ((3, 4), (5, 6))
    kv.a.free("a")
    assert set(kv.a.to_view().free_queue) == set(range(3, 12))
    assert kv.a.reset_prefix_cache() is False


# --------------------------------------------------------------------------- facade: admission


@pytest.mark.parametrize(
    ("status", "has_scheduled_reqs", "admitted"),
    [
        (RequestStatus.WAITING, True, False),
        (RequestStatus.PREEMPTED, True, False),
        (RequestStatus.RUNNING, True, True),
        (RequestStatus.WAITING, False, True),
    ],
    ids=["waiting", "preempted", "running", "waiting-nothing-scheduled"],
)
def test_watermark_only_for_waiting_and_preempted(
    target: str, status: RequestStatus, has_scheduled_reqs: bool, admitted: bool
) -> None:
    """Watermark only if has_scheduled_reqs and status in WAITING/PREEMPTED: 28 tokens, 3-block watermark."""
    kv = make_kv(target, FullAttention(4), num_blocks=10, watermark=0.3)
    req = replace(kv.req("a", [1] * 28), status=status)
    result = kv.a.allocate_slots(req, 28, has_scheduled_reqs=has_scheduled_reqs)
    assert result == (((1, 2, 3, 4, 5, 6, 7),) if admitted else None)


def test_full_sequence_must_fit(target: str) -> None:
    """(full_sequence_must_fit: the whole prompt must fit, else None before any side effect)."""
    kv = make_kv(target, FullAttention(4), num_blocks=8, max_num_batched_tokens=8)
    req = kv.req("a", range(100))
    before = kv.a.to_view()
    assert kv.a.allocate_slots(req, 8, full_sequence_must_fit=True) is None
    assert kv.a.to_view() == before
    assert kv.a.allocate_slots(req, 8) == ((1, 2),)


def test_reserved_blocks_refuse_allocation(target: str) -> None:
    """(reserved_blocks: required > free - reserved refuses the allocation)."""
    kv = make_kv(target, FullAttention(4), num_blocks=6)
    req = kv.req("a", range(16))
    assert kv.a.allocate_slots(req, 16, reserved_blocks=2) is None
    assert kv.a.allocate_slots(req, 16, reserved_blocks=1) == ((1, 2, 3, 4),)


# --------------------------------------------------------------------------- facade: caching


def test_delay_cache_blocks_defers_hashing(target: str) -> None:
    """(delay_cache_blocks: no hashing until the caller's cache_blocks; N=0 with E>0 is legal)."""
    kv = make_kv(target, FullAttention(4))
    a = kv.req("a", range(9))
    assert kv.a.allocate_slots(a, 9, delay_cache_blocks=True) == ((1, 2, 3),)
    assert kv.a.to_view().cached == ()
    kv.a.cache_blocks(a, 8)
    assert kv.hashed() == {1, 2}
    # An async KV load of 8 external tokens on an empty table
    # grows it to two blocks and returns nothing new.
    b = kv.req("b", range(100, 109))
    assert kv.a.allocate_slots(b, 0, num_external_computed_tokens=8, delay_cache_blocks=True) == ((),)
    assert kv.table("b") == ((4, 5),)
    assert kv.hashed() == {1, 2}
    kv.a.cache_blocks(b, 8)
    assert kv.hashed() == {1, 2, 4, 5}


def test_no_new_and_no_external_tokens_is_a_value_error(target: str) -> None:
    """(num_new_tokens == 0 without external tokens raises ValueError)."""
    kv = make_kv(target, FullAttention(4))
    before = kv.a.to_view()
    with pytest.raises(InvalidTokenCountError, match="num_new_tokens must be greater than 0") as info:
        kv.a.allocate_slots(kv.req("a", range(8)), 0)
    assert isinstance(info.value, ValueError)
    assert kv.a.to_view() == before


def test_hit_is_at_most_num_tokens_minus_one(target: str) -> None:
    """Max_cache_hit_length = num_tokens - 1: a fully cached 8-token prompt hits only 4 tokens."""
    kv = make_kv(target, FullAttention(4))
    prompt = list(range(8))
    assert kv.a.allocate_slots(kv.req("a", prompt), 8) == ((1, 2),)
    assert kv.a.get_computed_blocks(kv.req("b", prompt)) == (((1,),), 4)
    assert kv.a.get_computed_blocks(kv.req("c", [*prompt, 8])) == (((1, 2),), 8)


def test_skip_reading_prefix_cache_and_caching_off(target: str) -> None:
    """(skip_reading_prefix_cache or enable_caching=False: get_computed_blocks returns empty)."""
    kv = make_kv(target, FullAttention(4))
    prompt = list(range(9))
    assert kv.a.allocate_slots(kv.req("a", prompt), 9) == ((1, 2, 3),)
    skipping = kv.hasher.new_request("b", prompt, skip_reading_prefix_cache=True)
    assert kv.a.get_computed_blocks(skipping) == (((),), 0)
    assert kv.a.get_computed_blocks(kv.req("b", prompt)) == (((1, 2),), 8)

    off = make_kv(target, FullAttention(4), enable_caching=False)
    assert off.a.allocate_slots(off.req("a", prompt), 9) == ((1, 2, 3),)
    assert off.a.to_view().cached == ()
    assert off.a.get_computed_blocks(off.req("b", prompt)) == (((),), 0)


def test_reset_prefix_cache_needs_only_the_null_block_in_use(target: str) -> None:
    """(reset_prefix_cache fails unless only the null block is used; success -> AllBlocksCleared)."""
    kv = make_kv(target, FullAttention(4), enable_kv_cache_events=True)
    prompt = list(range(9))
    assert kv.a.allocate_slots(kv.req("a", prompt), 9) == ((1, 2, 3),)
    assert kv.a.reset_prefix_cache() is False
    popped = kv.a.pop_blocks_for_free("a")
    assert kv.a.reset_prefix_cache() is False  # pending deferred frees still hold blocks
    kv.a.free_blocks(list(reversed(popped)))
    queue = kv.a.to_view().free_queue
    kv.a.take_events()
    assert kv.a.reset_prefix_cache() is True
    assert kv.a.take_events() == [AllBlocksCleared()]
    view = kv.a.to_view()
    assert (view.free_queue, view.cached) == (queue, ())
    assert kv.a.get_computed_blocks(kv.req("b", prompt)) == (((),), 0)


def test_pop_blocks_for_free_does_not_return_blocks(target: str) -> None:
    """(pop_blocks_for_free: bookkeeping dropped, blocks stay used until the caller frees them reversed)."""
    kv = make_kv(target, FullAttention(4))
    assert kv.a.allocate_slots(kv.req("a", range(10)), 10) == ((1, 2, 3),)
    queue = kv.a.to_view().free_queue
    popped = kv.a.pop_blocks_for_free("a")
    assert popped == (1, 2, 3)
    view = kv.a.to_view()
    assert (view.tables, view.ref_cnt, view.free_queue) == ((), ((1, 1), (2, 1), (3, 1)), queue)
    assert kv.a.usage == pytest.approx(3 / 15)
    kv.a.free_blocks(list(reversed(popped)))
    assert kv.a.to_view().free_queue == (3, *range(4, 16), 2, 1)
    assert kv.a.usage == 0.0


def test_take_events_are_annotated_with_kind_and_window(target: str) -> None:
    """(take_events adds kind and sliding_window to BlockStored from the group index)."""
    kv = make_kv(target, FullAttention(4), SlidingWindow(4, 8), enable_kv_cache_events=True)
    a = kv.req("a", range(9))
    assert kv.a.allocate_slots(a, 9) == ((1, 2, 3), (4, 5, 6))
    hashes = tuple(external_block_hash(h, True) for h in a.block_hashes)
    expected = [
        BlockStored(hashes, None, tuple(range(8)), 4, None, "GPU", None, (None, None), group, kind, window)
        for group, kind, window in ((0, "full_attention", None), (1, "sliding_window", 8))
    ]
    assert kv.a.take_events() == expected
    assert kv.a.take_events() == []
