"""What vLLM's scheduler reads from the manager besides the facade's
allocation results: ``get_block_ids_for_computed_tokens`` (0.25.1 on) and
``estimate_cached_tokens`` (0.26.0 on).

``get_block_ids_for_computed_tokens``: the tables cut to the computed tokens.

vLLM's scheduler (0.25.1 on) hands a KV connector each group's blocks that
hold a request's computed tokens: ``cdiv(num_computed_tokens, block_size)``
blocks of every attention group, in the block size the group is configured
with (under context parallelism that is the unscaled size, so the cut keeps
more blocks than the scaled table uses), and the whole table of a Mamba or
cross-attention group.

``estimate_cached_tokens``: per group the longest prefix a keyed block of the
request's table stands for, the smallest over the groups (cross attention
left out, and from 0.30.0 the groups that are not prefix cacheable).

Every case runs on kvspec, both kvimpl builds and, where it is installed,
the real vLLM, and they must agree exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvimpl.kv_cache_manager import KVCacheManager as ImplManager
from kvimpl.native import create_manager
from kvref.adapters.spec import make_spec_adapter
from kvref.adapters.vllm import installed_vllm_version, make_vllm_adapter, vllm_available
from kvref.ops import RequestBook, execute
from kvspec.config import CircularBuffer, CrossAttention, FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.errors import InvalidRequestError, InvalidTokenCountError, UnsupportedOperationError
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.kv_cache_manager import clip_to_computed
from kvspec.profiles import VLLM_0_16_0, profile_named
from kvspec.request import RequestBlockHasher
from kvspec.view import BlockIds

Factory = Callable[[KVCacheConfig], Any]
BUILDS: dict[str, Factory] = {"spec": SpecManager, "impl-python": ImplManager, "impl": create_manager}


def _installed_profile() -> str | None:
    """The profile of the installed vLLM, if the adapter drives it."""
    if not vllm_available():
        return None
    return f"vllm-{installed_vllm_version()}"


def _hybrid(profile: str = "vllm-0.31.0") -> KVCacheConfig:
    """Full attention, sliding window and Mamba align (cached: before the
    Mamba tail entries of 0.32.0, which the native core does not model)."""
    return KVCacheConfig(
        num_blocks=32,
        groups=(FullAttention(4), SlidingWindow(4, 5), Mamba(4, "align")),
        max_model_len=64,
        profile=profile_named(profile),
    )


def _run(m: Any, cfg: KVCacheConfig, calls: list[tuple[str, int]]) -> list[BlockIds]:
    """Allocate 10 tokens of ``a``, then cut its tables at each count."""
    a = RequestBlockHasher.for_config(cfg).new_request("a", list(range(10)))
    m.get_computed_blocks(a)
    assert m.allocate_slots(a, 10) is not None
    return [m.get_block_ids_for_computed_tokens(rid, n) for rid, n in calls]


CASES = [("a", 0), ("a", 1), ("a", 4), ("a", 5), ("a", 10), ("a", 99), ("nobody", 3)]
EXPECTED = [
    ((), (), (0, 0, 7)),  # Mamba keeps its whole table (its state blocks)
    ((1,), (4,), (0, 0, 7)),
    ((1,), (4,), (0, 0, 7)),
    ((1, 2), (4, 5), (0, 0, 7)),
    ((1, 2, 3), (4, 5, 6), (0, 0, 7)),
    ((1, 2, 3), (4, 5, 6), (0, 0, 7)),  # a count past the tables cuts nothing
    ((), (), ()),  # an unknown request has empty tables
]


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_cut_per_group(build: str) -> None:
    cfg = _hybrid()
    m = BUILDS[build](cfg)
    assert _run(m, cfg, CASES) == EXPECTED
    m.check_invariants()


@pytest.mark.skipif(_installed_profile() is None, reason="no supported vLLM is installed")
def test_cut_per_group_on_real_vllm() -> None:
    profile = _installed_profile()
    assert profile is not None
    cfg = _hybrid(profile)
    assert _run(make_vllm_adapter(cfg), cfg, CASES) == _run(SpecManager(cfg), cfg, CASES) == EXPECTED


def test_cross_attention_is_whole() -> None:
    cfg = KVCacheConfig(
        num_blocks=16, groups=(FullAttention(4), CrossAttention(4)), max_model_len=64, enable_caching=False
    )
    for build, factory in BUILDS.items():
        m = factory(cfg)
        a = RequestBlockHasher.for_config(cfg).new_request("a", list(range(6)))
        assert m.allocate_slots(a, 6, num_encoder_tokens=8) == ((1, 2), (3, 4)), build
        assert m.get_block_ids_for_computed_tokens("a", 1) == ((1,), (3, 4)), build


def test_context_parallel_cut_counts_in_the_unscaled_block_size() -> None:
    """DCP 2 doubles the manager block (4 -> 8 tokens): 12 tokens fill two
    blocks, but the cut counts cdiv(5, 4) = 2 blocks of the unscaled size."""
    cfg = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=64, dcp_world_size=2)
    m = SpecManager(cfg)
    a = RequestBlockHasher.for_config(cfg).new_request("a", list(range(12)))
    assert m.allocate_slots(a, 12) == ((1, 2),)
    assert m.get_block_ids_for_computed_tokens("a", 1) == ((1,),)
    assert m.get_block_ids_for_computed_tokens("a", 5) == ((1, 2),)
    assert clip_to_computed(((1, 2),), cfg.manager_groups(), 5) == ((1,),)  # what the scaled size would give


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_bad_calls_are_refused_and_change_nothing(build: str) -> None:
    cfg = _hybrid()
    m = BUILDS[build](cfg)
    _run(m, cfg, [])
    before = m.to_view()
    for n in (-1, 1.5, True):
        with pytest.raises(InvalidTokenCountError, match="num_computed_tokens"):
            m.get_block_ids_for_computed_tokens("a", n)
    with pytest.raises(InvalidRequestError):
        m.get_block_ids_for_computed_tokens(7, 1)
    assert m.to_view() == before


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_not_in_vllm_0_16_0(build: str) -> None:
    cfg = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=64, profile=VLLM_0_16_0)
    m = BUILDS[build](cfg)
    with pytest.raises(UnsupportedOperationError, match="get_block_ids_for_computed_tokens"):
        m.get_block_ids_for_computed_tokens("a", 0)


def test_the_kit_operation() -> None:
    """The protocol operation: ids as JSON lists, caller errors by class name,
    and an adapter without the method reports the operation unsupported."""
    cfg = _hybrid()
    m: Any = make_spec_adapter(cfg)  # kvspec's ids are BlockId, the protocol says int
    book = RequestBook(cfg)
    book.apply({"op": "add_request", "rid": "a", "prompt": list(range(10))})
    assert execute(m, book, {"op": "allocate_slots", "rid": "a", "num_new_tokens": 10}) == [
        [1, 2, 3],
        [4, 5, 6],
        [0, 0, 7],
    ]
    op = {"op": "get_block_ids_for_computed_tokens", "rid": "a", "num_computed_tokens": 5}
    assert execute(m, book, op) == [[1, 2], [4, 5], [0, 0, 7]]
    assert execute(m, book, {**op, "num_computed_tokens": -1}) == {"error": "InvalidTokenCountError"}

    class Bare:
        name = "bare"

    with pytest.raises(UnsupportedOperationError, match="bare has no get_block_ids_for_computed_tokens"):
        bare: Any = Bare()  # an adapter lacking the optional method
        execute(bare, book, op)


def _estimates(m: Any, cfg: KVCacheConfig) -> list[int]:
    """``a`` (14 tokens) runs, ``b`` shares its first 10 and runs after it."""
    h = RequestBlockHasher.for_config(cfg)
    a, b = h.new_request("a", list(range(14))), h.new_request("b", [*range(10), 99, 98])
    out = [m.estimate_cached_tokens(a)]
    assert m.allocate_slots(a, 14) is not None
    out.append(m.estimate_cached_tokens(a))
    hits, n = m.get_computed_blocks(b)
    assert m.allocate_slots(b, 12 - n, n, hits if n else None) is not None
    out += [m.estimate_cached_tokens(b), m.estimate_cached_tokens(h.new_request("nobody", [1]))]
    m.evict_blocks([1])  # a connector lost block 1: its key goes
    out.append(m.estimate_cached_tokens(a))
    m.check_invariants()
    return out


ESTIMATE_CASES = [
    # before any allocation, after a's 14 tokens (3 full blocks of 4), b's hit plus its own full
    # block (8 + 4), an unknown request, a after its first block lost its key (the last key counts)
    ("vllm-0.33.0", (FullAttention(4), SlidingWindow(4, 5)), [0, 12, 12, 0, 12]),
    ("vllm-0.33.0", (FullAttention(4), CrossAttention(4)), [0, 0, 0, 0, 0]),  # caching off: nothing keyed
    ("vllm-0.29.0", (FullAttention(4), CircularBuffer(2)), [0, 0, 0, 0, 0]),  # the ring group is never keyed
    ("vllm-0.30.0", (FullAttention(4), CircularBuffer(2)), [0, 12, 12, 0, 12]),  # and is left out
]


@pytest.mark.parametrize("build", sorted(BUILDS))
@pytest.mark.parametrize(("profile", "groups", "want"), ESTIMATE_CASES)
def test_estimate_cached_tokens(build: str, profile: str, groups: tuple[Any, ...], want: list[int]) -> None:
    caching = not any(isinstance(k, CrossAttention) for k in groups)
    cfg = KVCacheConfig(
        num_blocks=32, groups=groups, max_model_len=64, enable_caching=caching, profile=profile_named(profile)
    )
    assert _estimates(BUILDS[build](cfg), cfg) == want


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_estimate_is_not_in_vllm_0_25_1(build: str) -> None:
    cfg = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=64, profile=profile_named("0.25.1"))
    m = BUILDS[build](cfg)
    with pytest.raises(UnsupportedOperationError, match="estimate_cached_tokens"):
        m.estimate_cached_tokens(RequestBlockHasher.for_config(cfg).new_request("a", [1, 2]))
    with pytest.raises((UnsupportedOperationError, InvalidRequestError)):
        m.estimate_cached_tokens("a")


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_estimate_needs_a_request(build: str) -> None:
    cfg = _hybrid()
    with pytest.raises(InvalidRequestError):
        BUILDS[build](cfg).estimate_cached_tokens("a")


@pytest.mark.skipif(_installed_profile() is None, reason="no supported vLLM is installed")
def test_estimate_on_real_vllm() -> None:
    """Where the installed vLLM has the method it agrees; else the adapter reports it unsupported."""
    profile = _installed_profile()
    assert profile is not None
    cfg = KVCacheConfig(
        num_blocks=32, groups=(FullAttention(4), SlidingWindow(4, 5)), max_model_len=64, profile=profile_named(profile)
    )
    adapter = make_vllm_adapter(cfg)
    if not profile_named(profile).estimate_cached_tokens_op:
        with pytest.raises(UnsupportedOperationError, match="estimate_cached_tokens"):
            adapter.estimate_cached_tokens(RequestBlockHasher.for_config(cfg).new_request("a", [1, 2]))
        return
    assert _estimates(adapter, cfg) == _estimates(SpecManager(cfg), cfg) == [0, 12, 12, 0, 12]
