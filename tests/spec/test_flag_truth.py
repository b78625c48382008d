"""A flag argument whose truth value cannot be taken is a caller error that leaves the manager as
it was: ``allocate_slots`` reads ``delay_cache_blocks`` before it changes anything."""

from __future__ import annotations

import pytest

from kvspec.config import FullAttention, KVCacheConfig
from kvspec.kv_cache_manager import KVCacheManager
from kvspec.request import RequestBlockHasher


class NoTruth:
    """An argument whose ``bool()`` raises."""

    def __bool__(self) -> bool:
        raise ValueError("no truth value")


def test_a_flag_without_a_truth_value_changes_nothing() -> None:
    config = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=64)
    manager = KVCacheManager(config)
    request = RequestBlockHasher.for_config(config).new_request("a", list(range(10)))
    before = manager.to_view()
    with pytest.raises(ValueError, match="no truth value"):
        manager.allocate_slots(request, 10, delay_cache_blocks=NoTruth())  # type: ignore[arg-type]  # the broken flag
    assert manager.to_view() == before
    manager.check_invariants()
