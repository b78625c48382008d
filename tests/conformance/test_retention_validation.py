"""The prefix-cache retention interval's validation against the installed vLLM.

kvspec refuses a broken interval when the configuration is made
(``kvspec.config.validate_retention``: ConfigError); vLLM raises ValueError
when its coordinator is built. For each case the two must agree, under the
installed release's profile: a model without a group the interval acts on
(sliding window; Mamba too from 0.24.0), an interval of 0 there (accepted from
0.29.0 on), a negative one, one that is not a multiple of the scheduler block.
Skipped without vLLM.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvref.adapters.vllm import installed_vllm_version, loaded_api, vllm_available
from kvref.adapters.vllm.construct import make_attention_spec
from kvspec.config import AttentionKind, FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.errors import ConfigError
from kvspec.profiles import PROFILES

pytestmark = pytest.mark.skipif(not vllm_available(), reason="needs an installed vLLM")

GROUPS: dict[str, tuple[AttentionKind, ...]] = {
    "full": (FullAttention(4),),
    "full+swa": (FullAttention(8), SlidingWindow(4, 8)),
    "full+mamba": (FullAttention(4), Mamba(4, "align")),
    "swa": (SlidingWindow(4, 8),),
}
INTERVALS = (None, 0, 4, 6, 8, -8, 16)


def _vllm_refuses(config: KVCacheConfig, retention: int | None) -> bool:
    """Whether the installed vLLM's manager construction raises ValueError for
    ``config`` with ``retention`` (set as that release takes it)."""
    api = loaded_api()
    groups = [api.group_spec(f"layer.{i}", make_attention_spec(api, k), False) for i, k in enumerate(config.groups)]
    kv_cache_config = api.kv_cache_config(config.num_blocks, groups, retention)
    kwargs = api.manager_kwargs(config, config.resolved_hash_block_size())
    api.apply_retention(retention)
    try:
        api.new_manager(kv_cache_config, kwargs)
    except ValueError:
        return True
    finally:
        api.apply_retention(None)
    return False


@pytest.mark.parametrize("shape", sorted(GROUPS))
def test_retention_refused_alike(shape: str) -> None:
    profile = PROFILES[f"vllm-{installed_vllm_version()}"]
    if profile.retention_kinds == "none":
        pytest.skip(f"{profile.name} has no retention interval")
    base = KVCacheConfig(num_blocks=32, groups=GROUPS[shape], max_model_len=128, profile=profile)
    for retention in INTERVALS:
        try:
            replace(base, prefix_cache_retention_interval=retention)
        except ConfigError:
            spec_refuses = True
        else:
            spec_refuses = False
        assert _vllm_refuses(base, retention) == spec_refuses, (shape, retention, profile.name)
