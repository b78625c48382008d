"""kvimpl's Mamba align tail entries (``kvimpl.mamba_tail``) against kvspec's.

The scenarios of ``tests/spec/test_mamba_tail.py``, each run on kvspec and on
kvimpl with the same pinned results, then longer histories (EAGLE, spare
blocks, evictions of held states, same-step hits) driven through both
managers call for call, comparing results, views and events after each
call. A tail inside a block (a group coarser than the hash block) leaves a
partial-hit record (feature ``partial-hash-hits``, ``kvimpl.partial_hits``):
the pure-Python manager models it, the native core declines it by name.
"""

from __future__ import annotations

from dataclasses import replace
from types import ModuleType
from typing import Any

import pytest

import kvimpl.mamba_tail
import kvspec.mamba_tail
from kvimpl.block_pool import BlockPool, TailBlockPool
from kvimpl.kv_cache_manager import KVCacheManager as ImplManager
from kvspec.block_pool import BlockId
from kvspec.config import FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.events import BlockStored, KVCacheEvent
from kvspec.hashing import make_key
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.profiles import VLLM_0_28_0, VLLM_0_30_0, VLLM_0_31_0, VLLM_0_32_0, VLLM_0_33_0, SemanticsProfile
from kvspec.request import Request, RequestBlockHasher, RequestStatus

Observed = tuple[object, Any, list[KVCacheEvent]]
"""A call's result, the view after it and the events it emitted."""

SIDES: dict[str, tuple[type[Any], ModuleType]] = {
    "spec": (SpecManager, kvspec.mamba_tail),
    "impl": (ImplManager, kvimpl.mamba_tail),
}


def setup(side: str, profile: SemanticsProfile) -> tuple[Any, RequestBlockHasher]:
    """FA(4) + Mamba(4, align): 24 blocks, events on."""
    cfg = KVCacheConfig(
        num_blocks=24,
        groups=(FullAttention(4), Mamba(4, "align")),
        max_model_len=64,
        enable_kv_cache_events=True,
        profile=profile,
    )
    return SIDES[side][0](cfg), RequestBlockHasher.for_config(cfg)


def step(kv: Any, req: Request, n: int) -> Request:
    """Allocate ``n`` new tokens and advance the request past them."""
    assert kv.allocate_slots(req, n) is not None
    kv.check_invariants()
    return replace(req, num_computed_tokens=req.num_computed_tokens + n, status=RequestStatus.RUNNING)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize(
    ("prompt", "eagle", "below", "boundary"),
    [
        (10, False, True, 8),
        (12, False, True, 8),
        (13, False, True, 12),
        (10, True, True, 4),
        (12, True, True, 8),
        (3, False, True, 0),
        (3, True, True, 0),
        (0, False, True, 0),
        (4, True, True, 0),
        (8, True, True, 4),
        (12, False, False, 12),
        (13, True, False, 8),
    ],
)
def test_tail_boundary(side: str, prompt: int, eagle: bool, below: bool, boundary: int) -> None:
    """The last hash boundary below the prompt's last token (before vLLM
    0.32.0 at or below its end); under EAGLE the last one at or below the
    prompt's end, one hash unit lower, never below 0."""
    assert SIDES[side][1].mamba_tail_boundary(prompt, 4, eagle, below_last=below) == boundary


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize(("profile", "recached"), [(VLLM_0_31_0, False), (VLLM_0_32_0, True), (VLLM_0_33_0, True)])
def test_state_evicted_while_held_is_cached_again(side: str, profile: SemanticsProfile, recached: bool) -> None:
    """``a`` (10-token prompt) holds its state at 8 tokens in block 3; evicted,
    it is keyed again (with a BlockStored) when the next step caches up to
    the tail boundary 8, and a sibling hits it."""
    kv, hasher = setup(side, profile)
    a = step(kv, hasher.new_request("a", list(range(10))), 8)
    kv.new_step_starts()
    kv.take_events()
    kv.evict_blocks([3])
    step(kv, a, 2)
    stored = [e for e in kv.take_events() if isinstance(e, BlockStored) and e.group_idx == 1]
    assert len(stored) == (1 if recached else 0)
    assert (kv.block_pool.block_hash[BlockId(3)] is not None) == recached
    if recached:
        assert stored[0].block_size == 4 and stored[0].token_ids == (4, 5, 6, 7)
        assert kv.block_pool.keys_of(BlockId(3)) == [make_key(a.block_hashes[1], 1)]
        assert kv.block_pool.hash_num_tokens[3] == 8
    kv.new_step_starts()
    _, hit = kv.get_computed_blocks(hasher.new_request("b", [*range(9), 99]))
    assert hit == (8 if recached else 0)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize(("profile", "admitted"), [(VLLM_0_31_0, True), (VLLM_0_32_0, False), (VLLM_0_33_0, True)])
def test_hit_keyed_again_defers_siblings_in_0_32(side: str, profile: SemanticsProfile, admitted: bool) -> None:
    """``b`` hits ``a``'s state block 3 at 8 tokens and caches up to 8: vLLM
    0.32.0 marks block 3 cached in this step again, so ``c``, hitting it in
    the same step, is refused; 0.33.0 skips a block already keyed there."""
    kv, hasher = setup(side, profile)
    a = step(kv, hasher.new_request("a", list(range(10))), 8)
    kv.new_step_starts()
    step(kv, a, 2)
    kv.new_step_starts()
    b = hasher.new_request("b", [*range(9), 99])
    hit_b, n = kv.get_computed_blocks(b)
    assert (hit_b, n) == (((1, 2), (0, 3)), 8)
    assert kv.allocate_slots(b, 2, n, hit_b) == ((6,), (7,))
    c = hasher.new_request("c", [*range(9), 98])
    hit_c, n = kv.get_computed_blocks(c)
    assert (kv.allocate_slots(c, 2, n, hit_c) is not None) == admitted
    kv.check_invariants()


@pytest.mark.parametrize(
    ("profile", "use_eagle", "group_eagle", "shift"),
    [
        (VLLM_0_28_0, True, True, False),
        (VLLM_0_30_0, True, False, False),
        (VLLM_0_30_0, True, True, True),
        (VLLM_0_31_0, True, False, True),
        (VLLM_0_33_0, False, False, False),
        (VLLM_0_33_0, True, False, True),
    ],
)
def test_tail_eagle_shift_follows_the_profile(
    profile: SemanticsProfile, use_eagle: bool, group_eagle: bool, shift: bool
) -> None:
    """``mamba_tail_eagle``: none before 0.30.0, the group's own EAGLE flag
    in 0.30.x, the model's ``use_eagle`` from 0.31.0 on; kvimpl's managers
    answer as kvspec's."""
    cfg = KVCacheConfig(
        num_blocks=24, groups=(FullAttention(4), Mamba(4, "align")), max_model_len=64, use_eagle=use_eagle,
        profile=profile,
    )  # fmt: skip
    got = []
    for side, (make, mod) in SIDES.items():
        manager = make(cfg).coordinator.managers[1]
        manager.use_eagle = group_eagle
        got.append((side, mod.tail_eagle_shift(manager)))
    assert got == [("spec", shift), ("impl", shift)]


def test_only_configurations_with_tails_get_the_tail_pool() -> None:
    """The pool with secondary keys is built only where a cached align group
    registers tails (vLLM 0.32.0 on)."""
    for groups, profile, caching, tails in (
        ((FullAttention(4), Mamba(4, "align")), VLLM_0_32_0, True, True),
        ((Mamba(4, "align"),), VLLM_0_33_0, True, True),
        ((FullAttention(4), Mamba(4, "align")), VLLM_0_31_0, True, False),
        ((FullAttention(4), Mamba(4, "align")), VLLM_0_33_0, False, False),
        ((FullAttention(4), Mamba(4, "all")), VLLM_0_31_0, True, False),
    ):
        cfg = KVCacheConfig(num_blocks=24, groups=groups, max_model_len=64, enable_caching=caching, profile=profile)
        pool = ImplManager(cfg).block_pool
        assert type(pool) is (TailBlockPool if tails else BlockPool), (groups, profile.name, caching)


def history(kv: Any, hasher: RequestBlockHasher, spare: int) -> list[Observed]:
    """Requests sharing prefixes through several steps: chunked prefill up to
    and past the tail boundary, same-step hits, an eviction of a held state,
    preemption-free frees and reuse; every call's result with the view and
    events after it."""
    seen: list[Observed] = []

    def note(result: object) -> None:
        kv.check_invariants()
        seen.append((result, kv.to_view(), kv.take_events()))

    def admit(req: Request, chunk: int) -> Request:
        hits, n = kv.get_computed_blocks(req)
        note((hits, n))
        first = min(chunk, req.num_tokens - n)
        note(kv.allocate_slots(req, first, n, hits if n else None))
        return replace(req, num_computed_tokens=n + first, status=RequestStatus.RUNNING)

    def run(req: Request, n: int) -> Request:
        got = kv.allocate_slots(req, n, num_lookahead_tokens=spare)
        note(got)
        return req if got is None else replace(req, num_computed_tokens=req.num_computed_tokens + n)

    a = admit(hasher.new_request("a", list(range(18))), 8)
    kv.new_step_starts()
    a = run(a, 8)
    b = admit(hasher.new_request("b", [*range(17), 40]), 16)
    kv.new_step_starts()
    a = run(a, 2)
    note(kv.evict_blocks(range(1, 24)))
    b = run(b, 2)
    kv.new_step_starts()
    c = admit(hasher.new_request("c", [*range(16), 41, 42, 43]), 32)
    d = admit(hasher.new_request("d", [*range(16), 41, 42, 44]), 32)
    kv.new_step_starts()
    note(kv.free("a"))
    e = admit(hasher.new_request("e", list(range(13))), 32)
    for req in (b, c, d, e):
        run(req, 1)
    kv.new_step_starts()
    note(kv.free("b"))
    note(kv.free("c"))
    note(kv.free("d"))
    note(kv.free("e"))
    return seen


@pytest.mark.parametrize("profile", [VLLM_0_31_0, VLLM_0_32_0, VLLM_0_33_0], ids=lambda p: str(p.name))
@pytest.mark.parametrize("eagle", [False, True])
@pytest.mark.parametrize("spare", [0, 1])
@pytest.mark.parametrize("third", [False, True])
def test_impl_agrees_with_spec_call_for_call(profile: SemanticsProfile, eagle: bool, spare: int, third: bool) -> None:
    """The same history on kvspec and kvimpl: equal results, views and events after every call."""
    groups = (FullAttention(4), Mamba(4, "align", spare))
    cfg = KVCacheConfig(
        num_blocks=48,
        groups=(*groups, SlidingWindow(4, 6)) if third else groups,
        max_model_len=64,
        use_eagle=eagle,
        enable_kv_cache_events=True,
        profile=profile,
    )
    spec = history(SpecManager(cfg), RequestBlockHasher.for_config(cfg), spare)
    impl = history(ImplManager(cfg), RequestBlockHasher.for_config(cfg), spare)
    assert len(spec) == len(impl)
    for i, (want, got) in enumerate(zip(spec, impl, strict=True)):
        assert got == want, f"call {i}: kvimpl {got} != kvspec {want}"
    lookups = [r for r, _, _ in spec if isinstance(r, tuple) and len(r) == 2 and isinstance(r[1], int)]
    assert any(n > 0 for _, n in lookups), "the history never hits"
