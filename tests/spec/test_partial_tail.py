"""Partial-tail cache entries (vLLM 0.26.0 on, ``kvspec.partial_tail``): one
minimal scenario per rule, each failing if its rule is wrong.

The block ids, free queues and event sequences are what real vLLM 0.26.0 and
0.32.0 produce for the same calls.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvspec.block_pool import BlockId
from kvspec.config import FullAttention, KVCacheConfig, SlidingWindow
from kvspec.events import BlockRemoved, BlockStored, KVCacheEvent
from kvspec.hashing import external_block_hash, make_key
from kvspec.kv_cache_manager import KVCacheManager
from kvspec.partial_tail import cache_partial_block, fa_tail_boundary
from kvspec.profiles import VLLM_0_25_1, VLLM_0_26_0, VLLM_0_31_0, VLLM_0_32_0, SemanticsProfile
from kvspec.request import Request, RequestBlockHasher


def setup(
    profile: SemanticsProfile, eagle: bool = False, events: bool = True
) -> tuple[KVCacheManager, RequestBlockHasher]:
    """FA(8) + SWA(4, window 4): hash block 4, scheduler block 8, 20 blocks."""
    cfg = KVCacheConfig(
        num_blocks=20,
        groups=(FullAttention(8), SlidingWindow(4, 4)),
        max_model_len=64,
        use_eagle=eagle,
        enable_kv_cache_events=events,
        profile=profile,
    )
    return KVCacheManager(cfg), RequestBlockHasher.for_config(cfg)


def decode(kv: KVCacheManager, hasher: RequestBlockHasher, req: Request, upto: int) -> Request:
    """Append one token at a time and allocate it, until ``upto`` tokens."""
    while req.num_tokens < upto:
        req = replace(hasher.with_output_tokens(req, [req.num_tokens]), num_computed_tokens=req.num_tokens)
        assert kv.allocate_slots(req, 1) is not None
        kv.check_invariants()
    return req


def ext(req: Request, tokens: int) -> bytes | int:
    """The event form of the request's hash at ``tokens`` (a multiple of 4)."""
    return external_block_hash(req.block_hashes[tokens // 4 - 1], True)


def shape(events: list[KVCacheEvent]) -> list[tuple[str, tuple[object, ...], int | None, int | None]]:
    """(type, hashes, block size, group) of each event."""
    return [
        (type(e).__name__, e.block_hashes, e.block_size if isinstance(e, BlockStored) else None, e.group_idx)
        for e in events
        if isinstance(e, BlockStored | BlockRemoved)
    ]


def test_full_block_gets_a_second_key_at_the_prompt_tail() -> None:
    """13-token prompt: at 16 tokens block 2 is cached under h16 and h12, the
    partial entry with its own one-unit BlockStored after the full one."""
    kv, hasher = setup(VLLM_0_26_0)
    a = hasher.new_request("a", list(range(13)))
    assert kv.allocate_slots(a, 13) == ((1, 2), (3, 4, 5, 6))
    kv.take_events()
    a = decode(kv, hasher, a, 16)
    assert shape(kv.take_events()) == [
        ("BlockStored", (ext(a, 16),), 8, 0),
        ("BlockStored", (ext(a, 12),), 4, 0),
        ("BlockStored", (ext(a, 16),), 4, 1),
    ]
    pool = kv.block_pool
    assert pool.keys_of(BlockId(2)) == [make_key(a.block_hashes[3], 0), make_key(a.block_hashes[2], 0)]
    assert pool.cached[make_key(a.block_hashes[2], 0)] == [2]


def test_partial_event_fields() -> None:
    """The partial BlockStored: parent is the previous hash unit, tokens the
    last unit, block size the hash block, extra keys a one-element list."""
    kv, hasher = setup(VLLM_0_26_0)
    a = hasher.new_request("a", list(range(13)))
    kv.allocate_slots(a, 13)
    kv.take_events()
    a = decode(kv, hasher, a, 16)
    partial = kv.take_events()[1]
    assert isinstance(partial, BlockStored)
    assert partial.parent_block_hash == ext(a, 8)
    assert partial.token_ids == (8, 9, 10, 11)
    assert partial.block_size == 4 and partial.extra_keys == (None,)
    assert partial.kv_cache_spec_kind == "full_attention"


def test_eviction_removes_every_key_of_a_block() -> None:
    """Evicting block 2 emits one BlockRemoved per key, primary first."""
    kv, hasher = setup(VLLM_0_26_0)
    a = hasher.new_request("a", list(range(13)))
    kv.allocate_slots(a, 13)
    a = decode(kv, hasher, a, 16)
    kv.free("a")
    kv.take_events()
    kv.evict_blocks([2])
    assert shape(kv.take_events()) == [
        ("BlockRemoved", (ext(a, 16),), None, 0),
        ("BlockRemoved", (ext(a, 12),), None, 0),
    ]
    assert kv.block_pool.keys_of(BlockId(2)) == []
    kv.check_invariants()


def test_baseline_has_no_partial_entries() -> None:
    """vLLM 0.25.1: the same history caches block 2 under h16 only."""
    kv, hasher = setup(VLLM_0_25_1)
    a = hasher.new_request("a", list(range(13)))
    kv.allocate_slots(a, 13)
    kv.take_events()
    a = decode(kv, hasher, a, 16)
    assert [s[2] for s in shape(kv.take_events())] == [8, 4]
    assert kv.block_pool.keys_of(BlockId(2)) == [make_key(a.block_hashes[3], 0)]


def test_only_key_of_a_partial_block_sends_it_to_the_queue_tail() -> None:
    """EAGLE caches up to 13 tokens, so block 2 (not full) gets the partial
    entry as its only key; freed, it goes to the tail, not the front."""
    for profile, queue in (
        (VLLM_0_25_1, (6, 2, *range(7, 20), 1, 5, 4, 3)),
        (VLLM_0_26_0, (*range(6, 20), 2, 1, 5, 4, 3)),
    ):
        kv, hasher = setup(profile, eagle=True)
        a = hasher.new_request("a", list(range(13)))
        assert kv.allocate_slots(a, 13) == ((1, 2), (3, 4, 5, 6))
        kv.free("a")
        assert kv.to_view().free_queue == queue, profile.name


def test_promotion_removes_the_partial_key_then_stores_both() -> None:
    """EAGLE: block 2 holds only h12; when it becomes full it loses h12
    (BlockRemoved before the call's BlockStored), gets h16, then h12 again."""
    kv, hasher = setup(VLLM_0_26_0, eagle=True)
    a = hasher.new_request("a", list(range(13)))
    kv.allocate_slots(a, 13)
    assert shape(kv.take_events())[1] == ("BlockStored", (ext(a, 12),), 4, 0)
    assert kv.block_pool.block_hash[2] == make_key(a.block_hashes[2], 0)
    a = decode(kv, hasher, a, 16)
    assert shape(kv.take_events())[:3] == [
        ("BlockRemoved", (ext(a, 12),), None, 0),
        ("BlockStored", (ext(a, 16),), 8, 0),
        ("BlockStored", (ext(a, 12),), 4, 0),
    ]
    assert kv.block_pool.keys_of(BlockId(2)) == [make_key(a.block_hashes[3], 0), make_key(a.block_hashes[2], 0)]


@pytest.mark.parametrize(
    ("profile", "prompt", "eagle", "boundary"),
    [
        (VLLM_0_31_0, 12, False, 12),
        (VLLM_0_32_0, 12, False, 8),
        (VLLM_0_32_0, 12, True, 12),
        (VLLM_0_32_0, 13, False, 12),
        (VLLM_0_31_0, 8, False, 8),
        (VLLM_0_32_0, 8, False, 4),
        (VLLM_0_32_0, 0, False, 0),
    ],
)
def test_tail_boundary(profile: SemanticsProfile, prompt: int, eagle: bool, boundary: int) -> None:
    """From vLLM 0.32.0 on the tail is the last hash boundary below the
    prompt's last token (EAGLE groups: at or below the prompt's end)."""
    assert fa_tail_boundary(prompt, 4, eagle, profile.fa_tail_below_last_token) == boundary


def test_tail_boundary_moves_in_0_32() -> None:
    """An 8-token prompt: 0.31.0 registers nothing (8 is a block boundary),
    0.32.0 registers the entry at 4 tokens on block 1."""
    for profile, stored in ((VLLM_0_31_0, [8, 4]), (VLLM_0_32_0, [8, 4, 4])):
        kv, hasher = setup(profile)
        a = hasher.new_request("a", list(range(8)))
        kv.allocate_slots(a, 8)
        assert [s[2] for s in shape(kv.take_events())] == stored, profile.name


def test_registering_again_is_silent() -> None:
    """A block already cached under the key is left alone: no event."""
    kv, hasher = setup(VLLM_0_26_0)
    a = hasher.new_request("a", list(range(13)))
    kv.allocate_slots(a, 13)
    a = decode(kv, hasher, a, 16)
    kv.take_events()
    key = cache_partial_block(kv.block_pool, a, BlockId(2), 12, 0)
    assert key == make_key(a.block_hashes[2], 0) and kv.block_pool.events == []


def test_a_longer_entry_replaces_every_shorter_key() -> None:
    """A block whose primary key stands for fewer tokens loses all its keys
    (one BlockRemoved each) before the longer entry becomes its key."""
    kv, hasher = setup(VLLM_0_26_0, eagle=True)
    a = hasher.new_request("a", list(range(13)))
    kv.allocate_slots(a, 13)  # block 2: primary h12
    kv.take_events()
    b = hasher.new_request("b", list(range(16)))
    key = cache_partial_block(kv.block_pool, b, BlockId(2), 16, 0)
    assert shape(kv.take_events()) == [("BlockRemoved", (ext(a, 12),), None, 0), ("BlockStored", (ext(b, 16),), 4, 0)]
    assert kv.block_pool.keys_of(BlockId(2)) == [key] and kv.block_pool.hash_num_tokens[2] == 16


def test_reset_forgets_secondary_keys() -> None:
    """``reset_prefix_cache`` clears the partial entries too."""
    kv, hasher = setup(VLLM_0_26_0)
    a = hasher.new_request("a", list(range(13)))
    kv.allocate_slots(a, 13)
    decode(kv, hasher, a, 16)
    kv.free("a")
    assert kv.reset_prefix_cache()
    assert kv.block_pool.secondary == {} and kv.to_view().cached == ()
    kv.check_invariants()
