"""A pool too small for the SinkFull groups' sink blocks is refused.

vLLM's ``SinkFullAttentionManager`` pops its sink blocks off the free queue
when the managers are built, and ``FreeKVCacheBlockQueue.popleft_n`` asserts
when fewer are free (vLLM 0.25.1 and 0.33.0): the engine cannot start. kvspec
used to take what was there and run with fewer sink blocks; found by the
lockstep against vLLM 0.25.1 once the machine drew pools of one to three
blocks (a one-block pool with a ``sink@dcp2`` group)."""

from __future__ import annotations

import pytest

from kvspec.config import FullAttention, KVCacheConfig, SinkFullAttention
from kvspec.errors import ConfigError
from kvspec.profiles import PROFILES, VLLM_0_25_1

SINK = SinkFullAttention(2, 4)  # two sink blocks, one under decode context parallelism 2


@pytest.mark.parametrize(
    ("num_blocks", "dcp", "ok"), [(1, 1, False), (2, 1, False), (3, 1, True), (1, 2, False), (2, 2, True)]
)
def test_the_pool_must_hold_the_sink_blocks(num_blocks: int, dcp: int, ok: bool) -> None:
    def build() -> KVCacheConfig:
        return KVCacheConfig(num_blocks=num_blocks, groups=(SINK,), max_model_len=32, dcp_world_size=dcp,
                             profile=VLLM_0_25_1)  # fmt: skip

    if ok:
        build()
    else:
        with pytest.raises(
            ConfigError, match=r"take [0-9] blocks for good .* the pool has [0-9] besides the null block"
        ):
            build()


def test_two_sink_groups_add_up() -> None:
    with pytest.raises(ConfigError, match="take 4 blocks"):
        KVCacheConfig(num_blocks=4, groups=(SINK, SINK), max_model_len=32, profile=VLLM_0_25_1, enable_caching=False)
    KVCacheConfig(num_blocks=5, groups=(SINK, SINK), max_model_len=32, profile=VLLM_0_25_1, enable_caching=False)


def test_releases_that_reserve_no_sink_blocks_need_no_room() -> None:
    unreserved = [p for p in PROFILES.values() if not p.sink_blocks_reserved]
    assert unreserved
    for profile in unreserved:
        KVCacheConfig(num_blocks=1, groups=(SINK, FullAttention(2)), max_model_len=32, profile=profile)
