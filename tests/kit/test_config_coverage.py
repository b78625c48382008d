"""Configuration classes (kvref.config_coverage): what a configuration is in,
and that the machine's configuration strategy reaches every class."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, given, settings

from kvref.config_coverage import NAMES, missing, properties_of
from kvref.shapes import SHAPES
from kvref.stateful import configs
from kvspec.config import ChunkedLocal, FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.profiles import NEWEST, PROFILES


def test_a_hybrid_is_in_the_classes_of_its_groups() -> None:
    cfg = KVCacheConfig(
        num_blocks=7, groups=(FullAttention(4), SlidingWindow(8, 12)), max_model_len=64,
        watermark=0.1, use_eagle=True, eagle_groups=(1,), log_stats=True,
    )  # fmt: skip
    assert properties_of(cfg) == {
        "block = 1/2 scheduler block", "block = scheduler block", "block = hash block", "block = 2 hash blocks",
        "window in (1, 2) blocks", "eagle: some groups", "pool: 6 to 8 blocks",
        "prefix caching on, hybrid", "statistics on", "watermark above 0",
    }  # fmt: skip
    chunked = KVCacheConfig(num_blocks=40, groups=(FullAttention(4), ChunkedLocal(4, 12)), max_model_len=64)
    assert {"chunk = 3 blocks", "pool: 12 blocks or more", "eagle: off"} <= properties_of(chunked)


def test_a_lone_group_without_caching() -> None:
    cfg = KVCacheConfig(num_blocks=2, groups=(Mamba(4, "none", 2),), max_model_len=32, enable_caching=False,
                        max_num_batched_tokens=8, dcp_world_size=1)  # fmt: skip
    assert properties_of(cfg) == {
        "block = scheduler block", "mamba: 2 speculative blocks", "eagle: off", "pool: at most 2 usable blocks",
        "prefix caching off", "token budget below the model length",
    }  # fmt: skip
    assert missing(properties_of(cfg))[0] == "block = 1/2 scheduler block"


TAKEN: set[str] = set()


@settings(max_examples=3000, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
@given(configs(SHAPES, NEWEST))
def _draw_newest(drawn: tuple[str, KVCacheConfig | str]) -> None:
    if not isinstance(drawn[1], str):
        TAKEN.update(properties_of(drawn[1]))


@settings(max_examples=1500, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
@given(configs(SHAPES, PROFILES["vllm-0.25.1"]))
def _draw_baseline(drawn: tuple[str, KVCacheConfig | str]) -> None:
    if not isinstance(drawn[1], str):
        TAKEN.update(properties_of(drawn[1]))


@settings(max_examples=500, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
@given(configs(SHAPES, PROFILES["vllm-0.29.0"]))
def _draw_checkpoints(drawn: tuple[str, KVCacheConfig | str]) -> None:
    """vLLM 0.29.0: its block-aligned prefill checkpoints (the newest profile draws the positional form)."""
    if not isinstance(drawn[1], str):
        TAKEN.update(properties_of(drawn[1]))


def test_the_configuration_strategy_reaches_every_class() -> None:
    """Every class is drawn (so a class the machine misses is a matter of its runs, not of its ranges)."""
    _draw_newest()
    _draw_baseline()
    _draw_checkpoints()
    assert missing(TAKEN) == [], missing(TAKEN)
    assert len(NAMES) == len(set(NAMES))
