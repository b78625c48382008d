"""Mamba align tail entries (vLLM 0.32.0 on, ``kvspec.mamba_tail``): one
minimal scenario per rule, each failing if its rule is wrong.

The outputs are what real vLLM 0.31.0, 0.32.0 and 0.33.0 return for the same
calls.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvspec.block_pool import BlockId
from kvspec.config import FullAttention, KVCacheConfig, Mamba
from kvspec.events import BlockStored
from kvspec.kv_cache_manager import KVCacheManager
from kvspec.mamba_tail import mamba_tail_boundary
from kvspec.profiles import VLLM_0_31_0, VLLM_0_32_0, VLLM_0_33_0, SemanticsProfile
from kvspec.request import Request, RequestBlockHasher, RequestStatus


def setup(profile: SemanticsProfile) -> tuple[KVCacheManager, RequestBlockHasher]:
    """FA(4) + Mamba(4, align): 24 blocks, events on."""
    cfg = KVCacheConfig(
        num_blocks=24,
        groups=(FullAttention(4), Mamba(4, "align")),
        max_model_len=64,
        enable_kv_cache_events=True,
        profile=profile,
    )
    return KVCacheManager(cfg), RequestBlockHasher.for_config(cfg)


def step(kv: KVCacheManager, req: Request, n: int) -> Request:
    """Allocate ``n`` new tokens and advance the request past them."""
    assert kv.allocate_slots(req, n) is not None
    kv.check_invariants()
    return replace(req, num_computed_tokens=req.num_computed_tokens + n, status=RequestStatus.RUNNING)


@pytest.mark.parametrize(
    ("prompt", "eagle", "boundary"),
    [(10, False, 8), (12, False, 8), (13, False, 12), (10, True, 4), (12, True, 8), (3, False, 0), (3, True, 0)],
)
def test_tail_boundary(prompt: int, eagle: bool, boundary: int) -> None:
    """The last hash boundary below the prompt's last token; under EAGLE the
    last one at or below the prompt's end, one hash unit lower."""
    assert mamba_tail_boundary(prompt, 4, eagle, below_last=True) == boundary


@pytest.mark.parametrize(("profile", "recached"), [(VLLM_0_31_0, False), (VLLM_0_32_0, True), (VLLM_0_33_0, True)])
def test_state_evicted_while_held_is_cached_again(profile: SemanticsProfile, recached: bool) -> None:
    """``a`` (10-token prompt) holds its state at 8 tokens in block 3; evicted,
    it is keyed again (with a BlockStored) when the next step caches up to
    the tail boundary 8, and a sibling hits it."""
    kv, hasher = setup(profile)
    a = step(kv, hasher.new_request("a", list(range(10))), 8)
    kv.new_step_starts()
    kv.take_events()
    kv.evict_blocks([3])
    step(kv, a, 2)
    stored = [e for e in kv.take_events() if isinstance(e, BlockStored) and e.group_idx == 1]
    assert len(stored) == (1 if recached else 0)
    assert (kv.block_pool.block_hash[BlockId(3)] is not None) == recached
    kv.new_step_starts()
    _, hit = kv.get_computed_blocks(hasher.new_request("b", [*range(9), 99]))
    assert hit == (8 if recached else 0)


@pytest.mark.parametrize(("profile", "admitted"), [(VLLM_0_31_0, True), (VLLM_0_32_0, False), (VLLM_0_33_0, True)])
def test_hit_keyed_again_defers_siblings_in_0_32(profile: SemanticsProfile, admitted: bool) -> None:
    """``b`` hits ``a``'s state block 3 at 8 tokens and caches up to 8: vLLM
    0.32.0 marks block 3 cached in this step again, so ``c``, hitting it in
    the same step, is refused; 0.33.0 skips a block already keyed there."""
    kv, hasher = setup(profile)
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
