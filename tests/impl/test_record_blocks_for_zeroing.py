"""``record_blocks_for_zeroing`` (vLLM 0.26.0 on): kvspec, kvimpl's pure-Python
manager and its native core list the same blocks, refuse the same calls the same
way, and change nothing when they refuse."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvimpl.kv_cache_manager import KVCacheManager as ImplManager
from kvimpl.native import NativeKVCacheManager, native_unsupported
from kvspec.config import FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.errors import InvalidRequestError, InvalidTokenCountError, UnsupportedOperationError
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.profiles import NEWEST, VLLM_0_25_1, VLLM_0_26_0, VLLM_0_29_0, SemanticsProfile
from kvspec.request import RequestBlockHasher

Factory = Callable[[KVCacheConfig], Any]
MANAGERS: dict[str, Factory] = {"spec": SpecManager, "impl": ImplManager, "native": NativeKVCacheManager}


def _config(profile: SemanticsProfile = VLLM_0_29_0) -> KVCacheConfig:
    # full attention (block 4) and a Mamba group: fresh attention blocks are listed for zeroing
    # (vLLM 0.29.0's profile: the native core declines the Mamba tail entries of 0.32.0 on)
    return KVCacheConfig(
        num_blocks=32, groups=(FullAttention(4), Mamba(4, mode="align")), max_model_len=64, profile=profile
    )


def _running(name: str, config: KVCacheConfig, tokens: int) -> Any:
    if name == "native" and native_unsupported(config):
        pytest.skip(f"native core: {native_unsupported(config)}")
    m = MANAGERS[name](config)
    hasher = RequestBlockHasher(config.hash_function, config.hash_seed, config.resolved_hash_block_size())
    request = hasher.new_request("r1", list(range(tokens)))
    assert m.allocate_slots(request, tokens) is not None
    return m


@pytest.mark.parametrize("name", sorted(MANAGERS))
@pytest.mark.parametrize("profile", [VLLM_0_29_0, NEWEST], ids=lambda p: p.name)
def test_lists_the_table_from_the_start_block_on(name: str, profile: SemanticsProfile) -> None:
    config = _config(profile)
    m = _running(name, config, 10)
    table = list(m.get_block_ids("r1")[0])
    assert len(table) == 3
    assert m.take_new_block_ids() == table  # the allocation listed them once
    m.record_blocks_for_zeroing("r1", 4)
    assert m.take_new_block_ids() == table[1:]
    m.record_blocks_for_zeroing("r1", 0)
    m.record_blocks_for_zeroing("nobody", 4)  # an unknown request has empty tables
    assert m.take_new_block_ids() == table
    assert m.take_new_block_ids() == []


@pytest.mark.parametrize("name", sorted(MANAGERS))
@pytest.mark.parametrize(
    ("request_id", "start", "error"),
    [("r1", 2, InvalidTokenCountError), ("r1", -4, InvalidTokenCountError), ("r1", 4.0, InvalidTokenCountError),
     (7, 4, InvalidRequestError)],
)  # fmt: skip
def test_refusals_list_nothing(name: str, request_id: Any, start: Any, error: type[Exception]) -> None:
    m = _running(name, _config(), 10)
    m.take_new_block_ids()
    with pytest.raises(error):
        m.record_blocks_for_zeroing(request_id, start)
    assert m.take_new_block_ids() == []


@pytest.mark.parametrize("name", sorted(MANAGERS))
def test_before_0_26_0_there_is_no_such_operation(name: str) -> None:
    m = _running(name, _config(VLLM_0_25_1), 10)
    with pytest.raises(UnsupportedOperationError):
        m.record_blocks_for_zeroing("r1", 4)
    assert _config(VLLM_0_26_0).profile.record_zeroing_op and not VLLM_0_25_1.record_zeroing_op


@pytest.mark.parametrize("name", sorted(MANAGERS))
def test_groups_that_list_nothing_are_left_alone(name: str) -> None:
    """Without a Mamba group, vLLM 0.26.0 on lists no fresh block: the call lists
    nothing, and a start inside a block is no error (no group asserts it)."""
    config = KVCacheConfig(num_blocks=32, groups=(FullAttention(4), SlidingWindow(4, 8)), max_model_len=64)
    m = _running(name, config, 10)
    m.record_blocks_for_zeroing("r1", 2)
    assert m.take_new_block_ids() == []
