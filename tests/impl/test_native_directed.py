"""Directed situations of the native core that the lockstep does not line up.

Each test drives one situation kvref's generator does not produce (a request
hashed under another hash function, a request whose hashes cannot be read, a
Mamba step that caches many states) and checks the native core against the
documented contract: a caller error is refused whole, with a typed error and
no change; the Mamba step guard refuses a hit on every state cached in the
step, as kvimpl's Python build does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvimpl import native
from kvimpl.kv_cache_manager import KVCacheManager as PythonManager
from kvimpl.native import NativeKVCacheManager
from kvimpl.request import Request as MutableRequest
from kvimpl.request import RequestHasher
from kvspec.config import FullAttention, KVCacheConfig, Mamba
from kvspec.errors import InvalidRequestError
from kvspec.hashing import BlockHash
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.profiles import VLLM_0_25_1, VLLM_0_32_0, VLLM_0_33_0
from kvspec.request import RequestBlockHasher, RequestStatus

needs_build = pytest.mark.skipif(native.native_module() is None, reason="the native core is not built")

CONFIG = KVCacheConfig(num_blocks=64, groups=(FullAttention(4),), max_model_len=64, profile=VLLM_0_33_0)
OTHER_HASH = dataclasses.replace(CONFIG, hash_function="xxhash")
"""The same model hashed by xxhash (16-byte digests) instead of SHA-256 (32)."""
OTHER_LENGTH = r"holds 16-byte hashes|is b.*, expected 32 bytes"
"""The refusal of a C request (its digest length) or of a Python one (its first hash)."""


def state(mgr: NativeKVCacheManager) -> object:
    """Everything a refused call must leave as it was."""
    return (mgr.get_num_free_blocks(), mgr._free_order(), mgr._tables(), mgr._cached(), mgr._ref_counts().tolist())


@needs_build
@pytest.mark.parametrize("c_request", [True, False], ids=["c-request", "python-request"])
def test_a_request_hashed_under_another_function_is_refused_whole(c_request: bool) -> None:
    """A request whose hashes have another digest length than the manager's hash function gives is
    refused with InvalidRequestError by the lookup, by allocate_slots and by a batch that holds it,
    before anything changes (the blocks of an allocation were once taken before the refusal)."""
    mgr = NativeKVCacheManager(CONFIG)
    good = mgr.new_request("good", list(range(40)))
    bad = RequestHasher.for_config(OTHER_HASH, native=c_request).new_request("bad", list(range(100, 140)))
    assert len(bad.block_hashes[0]) == 16
    before = state(mgr)
    with pytest.raises(InvalidRequestError, match=OTHER_LENGTH):
        mgr.get_computed_blocks(bad)
    with pytest.raises(InvalidRequestError, match=OTHER_LENGTH):
        mgr.allocate_slots(bad, 40)
    assert state(mgr) == before
    with pytest.raises(InvalidRequestError, match=OTHER_LENGTH):
        mgr.allocate_slots_batch([good, bad], [40, 40])
    assert state(mgr) == before, "the batch allocated its first request before refusing the second"
    mgr.check_invariants()
    assert mgr.allocate_slots_batch([good], [40]) == [(tuple(range(1, 11)),)]


@needs_build
def test_cache_blocks_refuses_a_bad_hash_before_caching_any_block() -> None:
    """cache_blocks of a request one of whose later hashes has the wrong length caches none of its
    blocks (it once cached the blocks before the bad hash, then raised); allocate_slots of a request
    whose first hash has the wrong length allocates nothing."""
    mgr = NativeKVCacheManager(CONFIG)
    hasher = RequestBlockHasher.for_config(CONFIG)
    req = hasher.new_request("r", list(range(16)))
    assert mgr.allocate_slots(req, 16, delay_cache_blocks=True) is not None
    hashes = list(req.block_hashes)
    bad = dataclasses.replace(req, block_hashes=(*hashes[:-1], BlockHash(hashes[-1][:16])))
    before = state(mgr)
    with pytest.raises(InvalidRequestError, match=r"block hash 3 .* expected 32 bytes"):
        mgr.cache_blocks(bad, 16)
    assert state(mgr) == before
    mgr.cache_blocks(req, 16)
    assert len(mgr._cached()) == 4
    other = hasher.new_request("s", list(range(100, 116)))
    hashes = list(other.block_hashes)
    first_bad = dataclasses.replace(other, block_hashes=(BlockHash(hashes[0][:16]), *hashes[1:]))
    before = state(mgr)
    with pytest.raises(InvalidRequestError, match=r"block hash 0 .* expected 32 bytes"):
        mgr.allocate_slots(first_bad, 16)
    assert state(mgr) == before, "the blocks were allocated before the first hash was refused"


class UnreadableHashes(MutableRequest):
    """A kvimpl request whose ``block_hashes`` raises when read (a caller's broken request type)."""

    __slots__ = ()

    @property
    def block_hashes(self) -> tuple[BlockHash, ...]:
        raise RuntimeError("block_hashes cannot be read")


@needs_build
def test_an_error_reading_the_hashes_reaches_the_caller_and_changes_nothing() -> None:
    """A Python request whose ``block_hashes`` raises: allocate_slots and cache_blocks pass that
    error on (not another error raised after reading no hashes) and leave the state as it was."""
    mgr = NativeKVCacheManager(CONFIG)
    req = RequestHasher.for_config(CONFIG, native=False).new_request("r", list(range(16)))
    assert type(req) is MutableRequest
    req.__class__ = UnreadableHashes
    before = state(mgr)
    with pytest.raises(RuntimeError, match="block_hashes cannot be read"):
        mgr.allocate_slots(req, 16)
    assert state(mgr) == before
    assert mgr.allocate_slots(req, 16, delay_cache_blocks=True) is not None  # reads no hash
    before = state(mgr)
    with pytest.raises(RuntimeError, match="block_hashes cannot be read"):
        mgr.cache_blocks(req, 16)
    assert state(mgr) == before


def mamba_step(mgr: Any, n: int) -> list[object]:
    """In one step, admit ``n`` requests of distinct 9-token prompts (each caches two Mamba states,
    ``2 n`` keys in the step's key set, so that some collide there), then for each a sibling that hits
    its 8-token state: the step guard must refuse every sibling."""
    h = RequestBlockHasher.for_config(mgr.config)
    mgr.new_step_starts()
    for i in range(n):
        req = h.new_request(f"a{i}", [1000 * i + j for j in range(9)])
        assert mgr.allocate_slots(req, 9) is not None
    out: list[object] = []
    for i in range(n):
        sib = h.new_request(f"b{i}", [*(1000 * i + j for j in range(8)), 99, 98])
        hits, hit = mgr.get_computed_blocks(sib)
        out.append((hit, mgr.allocate_slots(sib, 2, hit, hits)))
    return out


@needs_build
def test_the_mamba_step_guard_sees_every_state_cached_in_the_step() -> None:
    """48 states cached in one step: each sibling's hit is refused by the step guard on the native
    core exactly as on the Python build (a key the core's step set misplaced after a collision would
    let its sibling in)."""
    config = KVCacheConfig(num_blocks=256, groups=(Mamba(4, "all", 0),), max_model_len=64, profile=VLLM_0_25_1)
    assert config.profile.mamba_step_guard
    native_out = mamba_step(NativeKVCacheManager(config), 24)
    assert native_out == mamba_step(PythonManager(config), 24)
    assert native_out == [(8, None)] * 24


def test_requests_here_are_waiting() -> None:
    """The scenarios above admit fresh requests: the hasher makes them WAITING."""
    req = RequestBlockHasher.for_config(CONFIG).new_request("r", [1, 2, 3])
    assert req.status is RequestStatus.WAITING


@needs_build
def test_a_pool_of_the_null_block_alone_is_built_and_fits_nothing() -> None:
    """``num_blocks=1`` (the null block only) is a valid configuration: the native core is built and
    answers as the Python manager does (nothing fits, the free queue is empty)."""
    config = KVCacheConfig(num_blocks=1, groups=(FullAttention(4),), max_model_len=64, profile=VLLM_0_33_0)
    out = []
    for mgr in (NativeKVCacheManager(config), PythonManager(config)):
        req = RequestBlockHasher.for_config(config).new_request("r", [1, 2, 3])
        out.append((mgr.allocate_slots(req, 3), mgr.to_view().free_queue))
        mgr.check_invariants()
    assert out[0] == out[1] == (None, ())


@needs_build
def test_a_request_with_fewer_hashes_than_full_blocks_raises_as_kvspec_does() -> None:
    """A request with fewer block hashes than full blocks: under vLLM 0.32.0 (where it breaks
    kvspec's Request invariant) the native core raises the IndexError kvspec and the Python build
    raise (not a SystemError); from 0.33.0 on, where look-ahead hashes lag the tokens, all three
    cache only the hashed blocks.

    NOTE: all three allocate before caching reaches the missing hash; kvspec does not check the
    hash count of a request it is given."""
    old = dataclasses.replace(CONFIG, profile=VLLM_0_32_0)
    for config in (old, CONFIG):
        hasher = RequestBlockHasher.for_config(config)
        req = hasher.new_request("r", list(range(16)))
        short = dataclasses.replace(req, block_hashes=req.block_hashes[:2])
        errors, views = [], []
        for mgr in (NativeKVCacheManager(config), PythonManager(config), SpecManager(config)):
            if config is old:
                with pytest.raises(IndexError) as info:
                    mgr.allocate_slots(short, 16)
                errors.append(type(info.value))
            else:
                assert mgr.allocate_slots(short, 16) is not None
                views.append(mgr.to_view())
        assert errors == ([IndexError] * 3 if config is old else [])
        assert views == [] or (views[0] == views[1] == views[2] and len(views[0].cached) == 2)
