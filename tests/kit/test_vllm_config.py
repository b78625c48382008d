"""kvref.vllm_config: kvspec configurations from vLLM's own objects and names.

With vLLM installed, every shape of the kit's catalog is built as real vLLM
objects (the adapter's construction, the one the lockstep runs against) and
translated back; without it, stand-in dataclasses with vLLM's class and field
names exercise the same code, including every refusal.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from typing import Any

import pytest

from kvref.shapes import SHAPES, Shape, build_kinds
from kvref.vllm_config import config_from_vllm, kind_from_vllm_spec, status_from_vllm
from kvspec.config import ChunkedLocal, CircularBuffer, FullAttention, KpoolTail, KVCacheConfig, Mamba, SlidingWindow
from kvspec.errors import ConfigError
from kvspec.profiles import PROFILES, VLLM_0_25_1, VLLM_0_33_0
from kvspec.request import RequestStatus

HAS_VLLM = importlib.util.find_spec("vllm") is not None


# --------------------------------------------------------------- stand-ins


@dataclass
class FullAttentionSpec:
    block_size: int
    num_kv_heads: int = 1
    head_size: int = 8
    sliding_window: int | None = None


@dataclass
class SlidingWindowSpec:
    block_size: int
    sliding_window: int
    num_kv_heads: int = 1
    head_size: int = 8
    extra_retained_tokens: int = 0


@dataclass
class ChunkedLocalAttentionSpec:
    block_size: int
    attention_chunk_size: int
    num_kv_heads: int = 1
    head_size: int = 8


@dataclass
class MambaSpec:
    block_size: int
    shapes: tuple[tuple[int, ...], ...] = ((2, 4),)
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0
    num_prefill_checkpoint_blocks: int = 0  # vLLM 0.29.0 on
    prefill_checkpoint_alignment: int | None = None  # vLLM 0.30.0 on


@dataclass
class CircularBufferSpec:
    block_size: int
    num_kv_heads: int = 1
    head_size: int = 8


@dataclass
class KpoolTailSpec(SlidingWindowSpec):
    pass


@dataclass
class TQFullAttentionSpec(FullAttentionSpec):
    tq_slot_size: int = 0


@dataclass
class KVCacheGroupSpec:
    layer_names: list[str]
    kv_cache_spec: Any
    is_eagle_group: bool = False


@dataclass
class KVCacheConfigStandIn:
    num_blocks: int
    kv_cache_groups: list[KVCacheGroupSpec]
    kv_cache_tensors: list[Any] = field(default_factory=list)
    prefix_cache_retention_interval: int | None = None


def standin(*specs: Any, num_blocks: int = 64, eagle: tuple[int, ...] = ()) -> KVCacheConfigStandIn:
    groups = [KVCacheGroupSpec([f"layer.{i}"], s, i in eagle) for i, s in enumerate(specs)]
    return KVCacheConfigStandIn(num_blocks=num_blocks, kv_cache_groups=groups)


MANAGER: dict[str, Any] = {"max_model_len": 256, "scheduler_block_size": 16, "hash_block_size": 16}


def test_a_hybrid_config_translates_under_the_releases_names() -> None:
    kvc = standin(FullAttentionSpec(16), SlidingWindowSpec(16, 64), MambaSpec(16, mamba_cache_mode="align"), eagle=(0,))
    got = config_from_vllm(
        kvc, release="0.33.0", max_in_flight_tokens=128, enable_caching=False, use_eagle=True, **MANAGER
    )
    assert got == KVCacheConfig(
        num_blocks=64,
        groups=(FullAttention(16), SlidingWindow(16, 64), Mamba(16, "align")),
        max_model_len=256,
        max_num_batched_tokens=128,
        enable_caching=False,
        use_eagle=True,
        eagle_groups=(0,),
        hash_block_size=16,
        profile=VLLM_0_33_0,
    )
    # 0.25.1 calls the step budget max_num_batched_tokens; 0.33.0's name is unknown there.
    old = config_from_vllm(kvc, release="0.25.1", max_num_batched_tokens=128, enable_caching=False, **MANAGER)
    assert old.max_num_batched_tokens == 128 and old.profile is VLLM_0_25_1
    with pytest.raises(ConfigError, match="max_in_flight_tokens"):
        config_from_vllm(kvc, release="0.25.1", max_in_flight_tokens=128, **MANAGER)


def test_mamba_defaults_to_vllms_mode() -> None:
    """vLLM's MambaSpec defaults to mamba_cache_mode 'none'; so does kvspec's Mamba."""
    assert kind_from_vllm_spec(MambaSpec(16), release="0.25.1") == Mamba(16) == Mamba(16, "none", 0)


@pytest.mark.parametrize(
    ("kvc", "kwargs", "message"),
    [
        (standin(TQFullAttentionSpec(16)), {}, "TQFullAttentionSpec has no kvspec kind"),
        (standin(FullAttentionSpec(16)), {"dcp_world_size": 2}, "context-parallel manager block size 32"),
        (standin(FullAttentionSpec(16), SlidingWindowSpec(16, 32)), {"dcp_world_size": 2}, "several KV-cache groups"),
        (standin(FullAttentionSpec(16)), {"enable_mamba_shared_prefix_checkpoint": True}, "shared_prefix"),
        (standin(FullAttentionSpec(16)), {"max_num_seqs": 8}, "takes no keyword 'max_num_seqs'"),
        (standin(FullAttentionSpec(16), FullAttentionSpec(16, head_size=16)), {}, "differ"),
        (
            standin(FullAttentionSpec(16), SlidingWindowSpec(8, 32)),
            {"scheduler_block_size": 8, "enable_caching": False},
            "derives 16",
        ),
        (standin(), {}, "empty"),
    ],
)
def test_what_kvspec_cannot_express_is_refused_by_name(kvc: Any, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_vllm(kvc, release="0.33.0", **{**MANAGER, **kwargs})


def test_multi_module_mtp_inputs_translate_from_0_28_0() -> None:
    """``num_prefill_lookahead`` and ``SlidingWindowSpec.extra_retained_tokens``
    are config values from vLLM 0.28.0 on; before, the translation refuses them."""
    kvc = standin(FullAttentionSpec(16), SlidingWindowSpec(16, 64, extra_retained_tokens=2))
    got = config_from_vllm(kvc, release="0.33.0", num_prefill_lookahead=3, **MANAGER)
    assert got.num_prefill_lookahead == 3
    assert got.groups == (FullAttention(16), SlidingWindow(16, 64, extra_retained_tokens=2))
    with pytest.raises(ConfigError, match="extra_retained_tokens=2 is not modelled"):
        config_from_vllm(kvc, release="0.27.1", **MANAGER)
    with pytest.raises(ConfigError, match="takes no keyword 'num_prefill_lookahead'"):
        config_from_vllm(standin(FullAttentionSpec(16)), release="0.27.1", num_prefill_lookahead=2, **MANAGER)


def test_prefill_checkpoint_fields_translate_from_their_releases() -> None:
    """``MambaSpec.num_prefill_checkpoint_blocks`` is a config value from vLLM 0.29.0
    on and ``prefill_checkpoint_alignment`` from 0.30.0 on; before, the translation
    refuses them (and kvspec refuses the alignment under 0.29.0's profile)."""
    kvc = standin(FullAttentionSpec(16), MambaSpec(16, mamba_cache_mode="align", num_prefill_checkpoint_blocks=1))
    got = config_from_vllm(kvc, release="0.29.0", **MANAGER)
    assert got.groups == (FullAttention(16), Mamba(16, "align", num_prefill_checkpoint_blocks=1))
    with pytest.raises(ConfigError, match="num_prefill_checkpoint_blocks=1 is not modelled"):
        config_from_vllm(kvc, release="0.28.0", **MANAGER)
    aligned = standin(MambaSpec(16, mamba_cache_mode="align", prefill_checkpoint_alignment=8))
    assert config_from_vllm(aligned, release="0.33.0", **MANAGER).groups == (
        Mamba(16, "align", prefill_checkpoint_alignment=8),
    )
    with pytest.raises(ConfigError, match="prefill_checkpoint_alignment=8 is not modelled"):
        config_from_vllm(aligned, release="0.29.0", **MANAGER)


def test_look_ahead_hashes_translate_from_0_33_0() -> None:
    """``num_hash_lookahead_tokens`` is a config value from vLLM 0.33.0 on."""
    got = config_from_vllm(standin(FullAttentionSpec(16)), release="0.33.0", num_hash_lookahead_tokens=2, **MANAGER)
    assert got.num_hash_lookahead_tokens == 2
    with pytest.raises(ConfigError, match="takes no keyword 'num_hash_lookahead_tokens'"):
        config_from_vllm(standin(FullAttentionSpec(16)), release="0.32.0", num_hash_lookahead_tokens=1, **MANAGER)


def test_context_parallel_sizes_pass_through() -> None:
    """The engine gives the manager block sizes scaled by DCP (and, up to
    0.25.1, PCP); kvspec derives the same and keeps the world sizes."""
    kvc = standin(FullAttentionSpec(16))
    new = config_from_vllm(kvc, release="0.33.0", **{**MANAGER, "hash_block_size": 32, "dcp_world_size": 2,
                                                     "pcp_world_size": 2, "scheduler_block_size": 32})  # fmt: skip
    assert (new.dcp_world_size, new.pcp_world_size, new.scheduler_block_size) == (2, 2, 32)
    old = config_from_vllm(kvc, release="0.25.1", **{**MANAGER, "hash_block_size": 64, "dcp_world_size": 2,
                                                     "pcp_world_size": 2, "scheduler_block_size": 64})  # fmt: skip
    assert old.scheduler_block_size == 64


def test_retention_interval_is_translated() -> None:
    """The 0.29 era's ``KVCacheConfig`` field, and the environment variable
    the coordinator of the releases before it reads; kvspec's validation
    applies to both (30 is not a multiple of the scheduler block, 16)."""
    kvc = standin(FullAttentionSpec(16), SlidingWindowSpec(16, 32))
    kvc.prefix_cache_retention_interval = 32
    assert config_from_vllm(kvc, release="0.29.0", **MANAGER).prefix_cache_retention_interval == 32
    kvc.prefix_cache_retention_interval = 30
    with pytest.raises(ConfigError, match="prefix_cache_retention_interval=30"):
        config_from_vllm(kvc, release="0.29.0", **MANAGER)
    old = standin(FullAttentionSpec(16), SlidingWindowSpec(16, 32))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_PREFIX_CACHE_RETENTION_INTERVAL", "0")
        assert config_from_vllm(old, release="0.25.1", **MANAGER).prefix_cache_retention_interval == 0
        mp.setenv("VLLM_PREFIX_CACHE_RETENTION_INTERVAL", "x")
        with pytest.raises(ConfigError, match="not an int"):
            config_from_vllm(old, release="0.25.1", **MANAGER)
    assert config_from_vllm(old, release="0.25.1", **MANAGER).prefix_cache_retention_interval is None


def test_config_fields_and_missing_keywords_are_refused() -> None:
    with pytest.raises(ConfigError, match="hash_block_size"):
        config_from_vllm(standin(FullAttentionSpec(16)), release="0.29.0", max_model_len=64)
    with pytest.raises(ConfigError, match=r"no semantics profile for vLLM 0\.26\.1"):
        config_from_vllm(standin(FullAttentionSpec(16)), release="0.26.1", **MANAGER)
    with pytest.raises(ConfigError, match=r"0\.16\.0's KVCacheManager takes no keyword 'scheduler_block_size'"):
        config_from_vllm(standin(FullAttentionSpec(16)), release="0.16.0", **MANAGER)
    with pytest.raises(ConfigError, match="not a release the adapter drives"):
        config_from_vllm(standin(FullAttentionSpec(16)), release="0.9.0", **MANAGER)


def test_a_full_attention_spec_standing_in_for_a_window_is_full_attention() -> None:
    """With the hybrid allocator off vLLM sizes windowed layers as FullAttentionSpec(sliding_window=...)."""
    got = config_from_vllm(standin(FullAttentionSpec(16, sliding_window=64)), release="0.33.0", **MANAGER)
    assert got.groups == (FullAttention(16),)
    assert kind_from_vllm_spec(ChunkedLocalAttentionSpec(8, 32), release="0.33.0") == ChunkedLocal(8, 32)


def test_ring_specs_translate_on_the_releases_that_have_them() -> None:
    """CircularBufferSpec from vLLM 0.29.0; KpoolTailSpec in 0.30.0 and 0.31.0 only."""
    kvc = standin(FullAttentionSpec(16), CircularBufferSpec(8))
    got = config_from_vllm(kvc, release="0.29.0", **MANAGER)
    assert got.groups == (FullAttention(16), CircularBuffer(8)) and got.resolved_hash_block_size() == 16
    with pytest.raises(ConfigError, match="CircularBufferSpec has no kvspec kind"):
        config_from_vllm(kvc, release="0.28.0", **MANAGER)
    assert kind_from_vllm_spec(KpoolTailSpec(8, 64), release="0.31.0") == KpoolTail(8, 64)
    with pytest.raises(ConfigError, match="KpoolTailSpec has no kvspec kind"):
        kind_from_vllm_spec(KpoolTailSpec(8, 64), release="0.33.0")


def test_statuses_keep_vllms_names() -> None:
    for name in ("WAITING", "FINISHED_ABORTED", "WAITING_FOR_FSM", "FINISHED_REPETITION"):
        assert status_from_vllm(name).name == name
    assert status_from_vllm(RequestStatus.PREEMPTED) is RequestStatus.PREEMPTED
    assert RequestStatus.FINISHED_LENGTH_CAPPED.is_finished() and not RequestStatus.PREEMPTED.is_finished()
    with pytest.raises(ConfigError, match="unknown vLLM request status"):
        status_from_vllm("DONE")


# ------------------------------------------------------------ real vLLM


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (bash ci/setup.sh --with-vllm)")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
@pytest.mark.parametrize("caching", [True, False])
def test_every_catalog_shape_round_trips_through_real_vllm_objects(shape: Shape, caching: bool) -> None:
    from kvref.adapters.vllm import loaded_api  # noqa: PLC0415 - imports vLLM
    from kvref.adapters.vllm.construct import make_attention_spec  # noqa: PLC0415 - imports vLLM

    api = loaded_api()
    profile = PROFILES[f"vllm-{api.version}"]
    groups = build_kinds(shape, 16, window=40, spec_blocks=1)
    eagle = (0,) if len(groups) > 1 else ()
    try:
        config = KVCacheConfig(
            num_blocks=96,
            groups=groups,
            max_model_len=512,
            max_num_batched_tokens=64,
            enable_caching=caching,
            use_eagle=True,
            eagle_groups=eagle,
            enable_kv_cache_events=True,
            log_stats=True,
            profile=profile,
        )
    except ConfigError:
        pytest.skip(f"{shape.name} is refused with caching={caching}")
    try:
        api.check_config(config)
    except ConfigError:
        pytest.skip(f"vLLM {api.version} cannot construct {shape.name} with caching={caching}")
    hbs = config.resolved_hash_block_size()
    vllm_groups = [
        api.group_spec(f"layer.{i}", make_attention_spec(api, kind), i in config.eagle_groups)
        for i, kind in enumerate(config.groups)
    ]
    kvc = api.kv_cache_config(config.num_blocks, vllm_groups)
    kwargs = api.manager_kwargs(config, hbs)
    got = config_from_vllm(kvc, release=api.version, **kwargs)
    assert got == dataclasses.replace(config, hash_block_size=hbs)
    for kind, group in zip(config.groups, vllm_groups, strict=True):
        assert kind_from_vllm_spec(group.kv_cache_spec) == kind


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (bash ci/setup.sh --with-vllm)")
def test_vllms_own_defaults_translate_to_kvspecs_defaults() -> None:
    """Specs built with vLLM's constructors and only the required arguments."""
    import torch  # noqa: PLC0415 - installed with vLLM
    from vllm.v1 import kv_cache_interface as kci  # noqa: PLC0415 - imports vLLM

    mamba = kci.MambaSpec(block_size=16, shapes=((2, 4),), dtypes=(torch.float16,))
    assert kind_from_vllm_spec(mamba) == Mamba(16)
    swa = kci.SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float16, sliding_window=128)
    assert kind_from_vllm_spec(swa) == SlidingWindow(16, 128)
    from vllm.v1.request import RequestStatus as VllmStatus  # noqa: PLC0415 - imports vLLM

    assert status_from_vllm(VllmStatus.FINISHED_ABORTED) is RequestStatus.FINISHED_ABORTED
