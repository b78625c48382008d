"""kvimpl's partial-tail cache entries (``kvimpl.partial_tail``) against kvspec's.

The scenarios of ``tests/spec/test_partial_tail.py``, each run on kvspec and
on kvimpl with the same pinned block ids, keys and events, then a longer
history driven through both managers call for call, comparing results,
views and events after each call (evictions, promotions, frees, resets and
a hit on a block that carries a partial entry included).
"""

from __future__ import annotations

from dataclasses import replace
from types import ModuleType
from typing import Any

import pytest

import kvimpl.partial_tail
import kvspec.partial_tail
from kvimpl.block_pool import BlockPool, TailBlockPool
from kvimpl.kv_cache_manager import KVCacheManager as ImplManager
from kvspec.block_pool import BlockId
from kvspec.config import MLA, FullAttention, KVCacheConfig, SinkFullAttention, SlidingWindow
from kvspec.events import BlockRemoved, BlockStored, KVCacheEvent
from kvspec.hashing import external_block_hash, make_key
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.profiles import VLLM_0_25_1, VLLM_0_26_0, VLLM_0_31_0, VLLM_0_32_0, VLLM_0_33_0, SemanticsProfile
from kvspec.request import Request, RequestBlockHasher

Observed = tuple[object, Any, list[KVCacheEvent]]
"""A call's result, the view after it and the events it emitted."""

SIDES: dict[str, tuple[type[Any], ModuleType]] = {
    "spec": (SpecManager, kvspec.partial_tail),
    "impl": (ImplManager, kvimpl.partial_tail),
}


def setup(
    side: str, profile: SemanticsProfile, eagle: bool = False, events: bool = True
) -> tuple[Any, RequestBlockHasher]:
    """FA(8) + SWA(4, window 4): hash block 4, scheduler block 8, 20 blocks."""
    cfg = KVCacheConfig(
        num_blocks=20,
        groups=(FullAttention(8), SlidingWindow(4, 4)),
        max_model_len=64,
        use_eagle=eagle,
        enable_kv_cache_events=events,
        profile=profile,
    )
    return SIDES[side][0](cfg), RequestBlockHasher.for_config(cfg)


def decode(kv: Any, hasher: RequestBlockHasher, req: Request, upto: int) -> Request:
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


@pytest.mark.parametrize("side", SIDES)
def test_full_block_gets_a_second_key_at_the_prompt_tail(side: str) -> None:
    """13-token prompt: at 16 tokens block 2 is cached under h16 and h12, the
    partial entry with its own one-unit BlockStored after the full one."""
    kv, hasher = setup(side, VLLM_0_26_0)
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
    assert pool.block_hash[2] == make_key(a.block_hashes[3], 0) and pool.hash_num_tokens[2] == 16


@pytest.mark.parametrize("side", SIDES)
def test_partial_event_fields(side: str) -> None:
    """The partial BlockStored: parent is the previous hash unit, tokens the
    last unit, block size the hash block, extra keys a one-element list."""
    kv, hasher = setup(side, VLLM_0_26_0)
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


@pytest.mark.parametrize("side", SIDES)
def test_eviction_removes_every_key_of_a_block(side: str) -> None:
    """Evicting block 2 emits one BlockRemoved per key, primary first."""
    kv, hasher = setup(side, VLLM_0_26_0)
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
    assert make_key(a.block_hashes[2], 0) not in kv.block_pool.cached
    kv.check_invariants()


@pytest.mark.parametrize("side", SIDES)
def test_reuse_of_a_block_evicts_every_key(side: str) -> None:
    """A freed block with a primary and a partial key that the free queue
    hands out again loses both keys, one BlockRemoved each, primary first."""
    kv, hasher = setup(side, VLLM_0_26_0)
    a = hasher.new_request("a", list(range(13)))
    kv.allocate_slots(a, 13)
    a = decode(kv, hasher, a, 16)
    kv.free("a")
    kv.take_events()
    assert kv.to_view().free_queue == (5, 3, *range(7, 20), 4, 2, 1, 6)
    b = hasher.new_request("b", [99] * 44)  # 6 + 11 blocks: up to block 2
    assert kv.allocate_slots(b, 44) == ((5, 3, 7, 8, 9, 10), (11, 12, 13, 14, 15, 16, 17, 18, 19, 4, 2))
    assert [s for s in shape(kv.take_events()) if s[0] == "BlockRemoved"] == [
        ("BlockRemoved", (ext(a, 8),), None, 1),
        ("BlockRemoved", (ext(a, 16),), None, 0),
        ("BlockRemoved", (ext(a, 12),), None, 0),
    ]
    assert kv.block_pool.keys_of(BlockId(2)) == [] and kv.block_pool.hash_num_tokens[2] is None
    kv.check_invariants()


@pytest.mark.parametrize("side", SIDES)
def test_baseline_has_no_partial_entries(side: str) -> None:
    """vLLM 0.25.1: the same history caches block 2 under h16 only."""
    kv, hasher = setup(side, VLLM_0_25_1)
    a = hasher.new_request("a", list(range(13)))
    kv.allocate_slots(a, 13)
    kv.take_events()
    a = decode(kv, hasher, a, 16)
    assert [s[2] for s in shape(kv.take_events())] == [8, 4]
    assert kv.block_pool.keys_of(BlockId(2)) == [make_key(a.block_hashes[3], 0)]


@pytest.mark.parametrize("side", SIDES)
def test_only_key_of_a_partial_block_sends_it_to_the_queue_tail(side: str) -> None:
    """EAGLE caches up to 13 tokens, so block 2 (not full) gets the partial
    entry as its only key; freed, it goes to the tail, not the front."""
    for profile, queue in (
        (VLLM_0_25_1, (6, 2, *range(7, 20), 1, 5, 4, 3)),
        (VLLM_0_26_0, (*range(6, 20), 2, 1, 5, 4, 3)),
    ):
        kv, hasher = setup(side, profile, eagle=True)
        a = hasher.new_request("a", list(range(13)))
        assert kv.allocate_slots(a, 13) == ((1, 2), (3, 4, 5, 6))
        kv.free("a")
        assert kv.to_view().free_queue == queue, profile.name


@pytest.mark.parametrize("side", SIDES)
def test_promotion_removes_the_partial_key_then_stores_both(side: str) -> None:
    """EAGLE: block 2 holds only h12; when it becomes full it loses h12
    (BlockRemoved before the call's BlockStored), gets h16, then h12 again."""
    kv, hasher = setup(side, VLLM_0_26_0, eagle=True)
    a = hasher.new_request("a", list(range(13)))
    kv.allocate_slots(a, 13)
    assert shape(kv.take_events())[1] == ("BlockStored", (ext(a, 12),), 4, 0)
    assert kv.block_pool.block_hash[2] == make_key(a.block_hashes[2], 0)
    assert kv.block_pool.hash_num_tokens[2] == 12
    a = decode(kv, hasher, a, 16)
    assert shape(kv.take_events())[:3] == [
        ("BlockRemoved", (ext(a, 12),), None, 0),
        ("BlockStored", (ext(a, 16),), 8, 0),
        ("BlockStored", (ext(a, 12),), 4, 0),
    ]
    assert kv.block_pool.keys_of(BlockId(2)) == [make_key(a.block_hashes[3], 0), make_key(a.block_hashes[2], 0)]


@pytest.mark.parametrize("side", SIDES)
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
        (VLLM_0_32_0, 1, False, 0),
    ],
)
def test_tail_boundary(side: str, profile: SemanticsProfile, prompt: int, eagle: bool, boundary: int) -> None:
    """From vLLM 0.32.0 on the tail is the last hash boundary below the
    prompt's last token (EAGLE groups: at or below the prompt's end)."""
    mod = SIDES[side][1]
    assert mod.fa_tail_boundary(prompt, 4, eagle, profile.fa_tail_below_last_token) == boundary


@pytest.mark.parametrize("side", SIDES)
def test_tail_boundary_moves_in_0_32(side: str) -> None:
    """An 8-token prompt: 0.31.0 registers nothing (8 is a block boundary),
    0.32.0 registers the entry at 4 tokens on block 1."""
    for profile, stored in ((VLLM_0_31_0, [8, 4]), (VLLM_0_32_0, [8, 4, 4])):
        kv, hasher = setup(side, profile)
        a = hasher.new_request("a", list(range(8)))
        kv.allocate_slots(a, 8)
        assert [s[2] for s in shape(kv.take_events())] == stored, profile.name


@pytest.mark.parametrize("side", SIDES)
def test_registering_again_is_silent(side: str) -> None:
    """A block already cached under the key is left alone: no event."""
    kv, hasher = setup(side, VLLM_0_26_0)
    a = hasher.new_request("a", list(range(13)))
    kv.allocate_slots(a, 13)
    a = decode(kv, hasher, a, 16)
    kv.take_events()
    key = SIDES[side][1].cache_partial_block(kv.block_pool, a, BlockId(2), 12, 0)
    assert key == make_key(a.block_hashes[2], 0) and kv.block_pool.events == []
    assert SIDES[side][1].cache_partial_block(kv.block_pool, a, BlockId(0), 12, 0) is None


@pytest.mark.parametrize("side", SIDES)
def test_a_longer_entry_replaces_every_shorter_key(side: str) -> None:
    """A block whose primary key stands for fewer tokens loses all its keys
    (one BlockRemoved each) before the longer entry becomes its key."""
    kv, hasher = setup(side, VLLM_0_26_0, eagle=True)
    a = hasher.new_request("a", list(range(13)))
    kv.allocate_slots(a, 13)  # block 2: primary h12
    kv.take_events()
    b = hasher.new_request("b", list(range(16)))
    key = SIDES[side][1].cache_partial_block(kv.block_pool, b, BlockId(2), 16, 0)
    assert shape(kv.take_events()) == [("BlockRemoved", (ext(a, 12),), None, 0), ("BlockStored", (ext(b, 16),), 4, 0)]
    assert kv.block_pool.keys_of(BlockId(2)) == [key] and kv.block_pool.hash_num_tokens[2] == 16


@pytest.mark.parametrize("side", SIDES)
def test_reset_forgets_secondary_keys(side: str) -> None:
    """``reset_prefix_cache`` clears the partial entries too."""
    kv, hasher = setup(side, VLLM_0_26_0)
    a = hasher.new_request("a", list(range(13)))
    kv.allocate_slots(a, 13)
    decode(kv, hasher, a, 16)
    kv.free("a")
    assert kv.reset_prefix_cache()
    assert kv.block_pool.secondary == {} and kv.to_view().cached == ()
    assert all(n is None for n in kv.block_pool.hash_num_tokens)
    kv.check_invariants()


def test_only_configurations_with_tails_get_the_tail_pool() -> None:
    """The pool with secondary keys is built only where a group registers
    tails: a cached coarse full-attention kind from vLLM 0.26.0 on."""
    for groups, profile, caching, tails in (
        ((FullAttention(8), SlidingWindow(4, 4)), VLLM_0_26_0, True, True),
        ((MLA(8), SlidingWindow(4, 4)), VLLM_0_33_0, True, True),
        ((SinkFullAttention(8, 8), SlidingWindow(4, 4)), VLLM_0_33_0, True, True),
        ((FullAttention(8), SlidingWindow(4, 4)), VLLM_0_26_0, False, False),
        ((FullAttention(8), SlidingWindow(4, 4)), VLLM_0_25_1, True, False),
        ((FullAttention(4), SlidingWindow(8, 4)), VLLM_0_33_0, True, False),
        ((FullAttention(4),), VLLM_0_33_0, True, False),
    ):
        cfg = KVCacheConfig(num_blocks=20, groups=groups, max_model_len=64, enable_caching=caching, profile=profile)
        pool = ImplManager(cfg).block_pool
        assert isinstance(pool, TailBlockPool) == tails, (groups, profile.name, caching)
        assert type(pool) is (TailBlockPool if tails else BlockPool)


def history(kv: Any, hasher: RequestBlockHasher) -> list[Observed]:
    """Prompts sharing prefixes, chunked prefill, decode across block ends, a
    hit on a block that carries a partial entry, frees, an eviction of held
    blocks, reuse of freed keyed blocks and a reset; the result of every
    call with the view and events after it."""
    seen: list[Observed] = []

    def note(result: object) -> None:
        kv.check_invariants()
        seen.append((result, kv.to_view(), kv.take_events()))

    a = hasher.new_request("a", list(range(21)))
    note(kv.allocate_slots(a, 10))
    a = replace(a, num_computed_tokens=10)
    note(kv.allocate_slots(a, 11))
    a = replace(a, num_computed_tokens=21)
    a = decode(kv, hasher, a, 26)
    note(None)
    b = hasher.new_request("b", [*range(18), 77, 78, 79])
    hits, n = kv.get_computed_blocks(b)
    note((hits, n))
    note(kv.allocate_slots(b, b.num_tokens - n, n, hits if n else None))
    b = replace(b, num_computed_tokens=b.num_tokens)
    note(kv.evict_blocks([1, 2, 3, 9, 10]))
    b = decode(kv, hasher, b, 27)
    note(None)
    note(kv.free("a"))
    c = hasher.new_request("c", [*range(13), 5, 5, 5])
    hits, n = kv.get_computed_blocks(c)
    note((hits, n))
    note(kv.allocate_slots(c, c.num_tokens - n, n, hits if n else None))
    note(kv.free("b"))
    d = hasher.new_request("d", [50] * 40)
    note(kv.allocate_slots(d, 40))
    note(kv.free("c"))
    note(kv.free("d"))
    note(kv.reset_prefix_cache())
    return seen


@pytest.mark.parametrize("profile", [VLLM_0_26_0, VLLM_0_31_0, VLLM_0_32_0, VLLM_0_33_0], ids=lambda p: str(p.name))
@pytest.mark.parametrize("eagle", [False, True])
@pytest.mark.parametrize("kind", ["full", "mla"])
def test_impl_agrees_with_spec_call_for_call(profile: SemanticsProfile, eagle: bool, kind: str) -> None:
    """The same history on kvspec and kvimpl: equal results, views and events after every call."""
    first = FullAttention(8) if kind == "full" else MLA(8)
    cfg = KVCacheConfig(
        num_blocks=24,
        groups=(first, SlidingWindow(4, 4)),
        max_model_len=64,
        use_eagle=eagle,
        enable_kv_cache_events=True,
        profile=profile,
    )
    spec = history(SpecManager(cfg), RequestBlockHasher.for_config(cfg))
    impl = history(ImplManager(cfg), RequestBlockHasher.for_config(cfg))
    assert len(spec) == len(impl)
    for i, (want, got) in enumerate(zip(spec, impl, strict=True)):
        assert got == want, f"call {i}: kvimpl {got} != kvspec {want}"
    assert any(isinstance(e, BlockStored) and e.block_size == 4 and e.group_idx == 0 for _, _, ev in spec for e in ev)


@pytest.mark.parametrize("side", SIDES)
def test_a_held_block_evicted_then_rekeyed_at_the_tail(side: str) -> None:
    """``evict_blocks`` uncaches block 2 while the request holds it (a full
    block whose keys are h16 and the partial h12); at the next allocation the
    tail entry registers again, now as the block's only (primary) key for 12
    tokens, although the block is full and counted as cached. The invariant
    on a cached block's key accepts such a key (it once demanded the full
    key and failed here, after vLLM 0.33.0 and kvspec agreed on every result
    of the lockstep run that reached it)."""
    kv, hasher = setup(side, VLLM_0_33_0)
    a = hasher.new_request("a", list(range(15)))
    kv.allocate_slots(a, 15)
    a = decode(kv, hasher, a, 16)
    assert kv.block_pool.keys_of(BlockId(2)) == [make_key(a.block_hashes[3], 0), make_key(a.block_hashes[2], 0)]
    kv.evict_blocks([2])
    assert kv.block_pool.keys_of(BlockId(2)) == []
    kv.take_events()
    a = decode(kv, hasher, a, 17)
    assert kv.block_pool.keys_of(BlockId(2)) == [make_key(a.block_hashes[2], 0)]
    assert kv.block_pool.hash_num_tokens[2] == 12
    assert shape(kv.take_events()) == [("BlockStored", (ext(a, 12),), 4, 0)]
    kv.check_invariants()
