"""The scheduler's two ways of keeping a delayed connector load's blocks out of
the zeroing list: ``get_zeroing_block_ids_in_range`` (vLLM 0.26.0 to 0.31.0: the
scheduler asks for the ids and leaves them out itself) and
``allocate_slots(skip_zeroing_group_ids=...)`` (0.32.0 on: the listed groups do
not list their external-token blocks). kvspec, kvimpl's pure-Python manager and
its native core give the same answers and refuse the same calls the same way,
changing nothing when they refuse."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvimpl.kv_cache_manager import KVCacheManager as ImplManager
from kvimpl.native import NativeKVCacheManager, native_unsupported
from kvspec.config import FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.errors import GroupCountError, InvalidRequestError, InvalidTokenCountError, UnsupportedOperationError
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.profiles import NEWEST, VLLM_0_25_1, VLLM_0_29_0, VLLM_0_31_0, VLLM_0_32_0, SemanticsProfile
from kvspec.request import Request, RequestBlockHasher

Factory = Callable[[KVCacheConfig], Any]
MANAGERS: dict[str, Factory] = {"spec": SpecManager, "impl": ImplManager, "native": NativeKVCacheManager}


def _config(profile: SemanticsProfile, caching: bool = True) -> KVCacheConfig:
    # full attention (block 4), a sliding window of 4 (block 4) and a Mamba group: the attention
    # groups list their fresh blocks for zeroing; the window skips blocks below it
    groups = (FullAttention(4), SlidingWindow(4, 4), Mamba(4, mode="align"))
    return KVCacheConfig(num_blocks=48, groups=groups, max_model_len=64, profile=profile, enable_caching=caching)


def _manager(name: str, config: KVCacheConfig) -> Any:
    if name == "native" and native_unsupported(config):
        pytest.skip(f"native core: {native_unsupported(config)}")
    return MANAGERS[name](config)


def _request(config: KVCacheConfig, rid: str, tokens: int) -> Request:
    hasher = RequestBlockHasher(config.hash_function, config.hash_seed, config.resolved_hash_block_size())
    return hasher.new_request(rid, list(range(100, 100 + tokens)))


def _load(m: Any, config: KVCacheConfig, external: int, **kwargs: Any) -> Any:
    """Admit a request of 20 tokens whose first ``external`` a connector loads later."""
    request = _request(config, "r1", 20)
    out = m.allocate_slots(
        request, 20 - external, num_external_computed_tokens=external, delay_cache_blocks=True, **kwargs
    )
    assert out is not None
    return out


@pytest.mark.parametrize("name", sorted(MANAGERS))
@pytest.mark.parametrize("profile", [VLLM_0_29_0, VLLM_0_31_0], ids=lambda p: p.name)
def test_the_range_is_the_attention_tables_over_the_tokens(name: str, profile: SemanticsProfile) -> None:
    config = _config(profile, caching=False)
    m = _manager(name, config)
    _load(m, config, 12)
    full, window, _ = (list(t) for t in m.get_block_ids("r1"))
    assert len(full) == len(window) == 5 and window[:2] == [0, 0]  # the window skipped two blocks (tokens 0-7)
    # [1, 13): full attention blocks 0-3, the window's 0-3 (its skipped null entry included)
    assert m.get_zeroing_block_ids_in_range("r1", 1, 13) == full[0:4] + window[0:4]
    assert m.get_zeroing_block_ids_in_range("r1", 12, 12) == []
    assert m.get_zeroing_block_ids_in_range("r1", 16, 99) == full[4:] + window[4:]
    assert m.get_zeroing_block_ids_in_range("nobody", 0, 8) == []
    # the scheduler's use: what the allocation listed, less the load's destinations
    listed = m.take_new_block_ids()
    assert listed == full + window[2:]
    loaded = set(m.get_zeroing_block_ids_in_range("r1", 0, 12))
    assert [b for b in listed if b not in loaded] == [full[3], full[4], window[3], window[4]]


@pytest.mark.parametrize("name", sorted(MANAGERS))
@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((7, 0, 4), InvalidRequestError),
        (("r1", -1, 4), InvalidTokenCountError),
        (("r1", 4, 3), InvalidTokenCountError),
        (("r1", 0, 4.0), InvalidTokenCountError),
        (("r1", True, 4), InvalidTokenCountError),
    ],
)
def test_the_range_refuses_bad_arguments(name: str, args: tuple[Any, ...], error: type[Exception]) -> None:
    config = _config(VLLM_0_29_0, caching=False)
    m = _manager(name, config)
    _load(m, config, 12)
    before = (m.get_block_ids("r1"), m.usage)
    with pytest.raises(error):
        m.get_zeroing_block_ids_in_range(*args)
    assert (m.get_block_ids("r1"), m.usage) == before


@pytest.mark.parametrize("name", sorted(MANAGERS))
@pytest.mark.parametrize("profile", [VLLM_0_25_1, VLLM_0_32_0, NEWEST], ids=lambda p: p.name)
def test_the_range_exists_from_0_26_0_to_0_31_0(name: str, profile: SemanticsProfile) -> None:
    m = _manager(name, _config(profile, caching=False))
    with pytest.raises(UnsupportedOperationError):
        m.get_zeroing_block_ids_in_range("r1", 0, 4)


@pytest.mark.parametrize("name", sorted(MANAGERS))
@pytest.mark.parametrize("profile", [VLLM_0_32_0, NEWEST], ids=lambda p: p.name)
@pytest.mark.parametrize("skip", [(), (0,), (1,), (0, 1, 2)])
def test_skipped_groups_do_not_list_their_external_blocks(
    name: str, profile: SemanticsProfile, skip: tuple[int, ...]
) -> None:
    config = _config(profile, caching=False)
    m = _manager(name, config)
    new = _load(m, config, 12, skip_zeroing_group_ids=skip)
    full, window, _ = (list(t) for t in m.get_block_ids("r1"))
    # the external phase takes blocks 0-2 (the window: 2), the new tokens' phase the rest
    assert list(new[0]) == full[3:] and list(new[1]) == window[3:]
    external = {0: full[:3], 1: window[2:3]}
    want = [b for g, table in ((0, full), (1, window)) for b in table if g not in skip or b not in external[g]]
    assert m.take_new_block_ids() == [b for b in want if b]


@pytest.mark.parametrize("name", sorted(MANAGERS))
@pytest.mark.parametrize(
    ("profile", "skip", "error"),
    [
        (VLLM_0_31_0, (0,), UnsupportedOperationError),
        (VLLM_0_32_0, (3,), GroupCountError),
        (VLLM_0_32_0, (-1,), GroupCountError),
        (VLLM_0_32_0, ("0",), GroupCountError),
        (VLLM_0_32_0, 0, GroupCountError),
        (VLLM_0_32_0, None, GroupCountError),
    ],
    ids=lambda v: getattr(v, "name", repr(v)),
)
def test_bad_skip_groups_are_refused_first(
    name: str, profile: SemanticsProfile, skip: object, error: type[Exception]
) -> None:
    config = _config(profile, caching=False)
    m = _manager(name, config)
    request = _request(config, "r1", 20)
    free = m.usage
    with pytest.raises(error):  # checked before the token counts (-1 new tokens)
        m.allocate_slots(request, -1, num_external_computed_tokens=12, skip_zeroing_group_ids=skip)
    assert m.get_block_ids("r1") == ((), (), ())
    assert (m.usage, m.take_new_block_ids()) == (free, [])


@pytest.mark.parametrize("name", sorted(MANAGERS))
def test_an_empty_skip_is_accepted_before_0_32_0(name: str) -> None:
    config = _config(VLLM_0_29_0, caching=False)
    m = _manager(name, config)
    _load(m, config, 12, skip_zeroing_group_ids=[])
    assert len(m.take_new_block_ids()) == 8
