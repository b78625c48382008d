"""The machine's broken inputs are broken: every configuration ``invalid_other``
tries is refused under every profile it is tried with, and every caller error
the machine sends is refused by kvspec and kvimpl alike with the same typed
error, leaving the state as it was."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kvref.adapters.impl import make_impl_adapter
from kvref.adapters.spec import make_spec_adapter
from kvref.ops import RequestBook, execute
from kvref.stateful import BAD_CONFIGS, bad_config
from kvspec.config import AttentionKind, CircularBuffer, FullAttention, KVCacheConfig, SlidingWindow
from kvspec.errors import ConfigError
from kvspec.profiles import NEWEST, PROFILES

BASES = {
    "full": (FullAttention(4),),
    "full+swa": (FullAttention(4), SlidingWindow(4, 8)),
    "ring1": (CircularBuffer(1),),  # a first group of one-token blocks (the lone ring shape at block size 2)
}


@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.parametrize("base", sorted(BASES))
def test_every_bad_config_is_refused(profile: str, base: str) -> None:
    """Each applicable :data:`BAD_CONFIGS` entry raises ConfigError (an
    UnsupportedByProfileError is one too), so the rule can never pass a
    configuration that is in fact valid."""
    if base == "ring1" and not PROFILES[profile].circular_buffer_kind:
        pytest.skip(f"{profile} has no ring kind")
    cfg = KVCacheConfig(num_blocks=32, groups=BASES[base], max_model_len=64, profile=PROFILES[profile])
    tried = 0
    for kind in BAD_CONFIGS:
        bad = bad_config(cfg, kind)
        if bad is None:
            continue
        tried += 1
        with pytest.raises(ConfigError):
            replace(cfg, **bad)
    assert tried >= len(BAD_CONFIGS) - len(RELEASE_SPECIFIC)  # only the release-specific breaks may not apply


RELEASE_SPECIFIC = (
    "equal_groups", "cp_hybrid", "fine_hits_blocked", "cp_ring", "cp_cached_mamba", "old_release_watermark",
    "old_release_budget",
)  # fmt: skip


@pytest.mark.parametrize("kind", RELEASE_SPECIFIC)
def test_every_release_specific_bad_config_applies_somewhere(kind: str) -> None:
    cfgs = [KVCacheConfig(num_blocks=32, groups=BASES["full"], max_model_len=64, profile=p) for p in PROFILES.values()]
    assert any(bad_config(cfg, kind) is not None for cfg in cfgs)


def _both(cfg: KVCacheConfig) -> tuple[list[Any], RequestBook]:
    return [make_spec_adapter(cfg), make_impl_adapter(cfg)], RequestBook(cfg)


def _same_refusal(cfg: KVCacheConfig, setup: list[dict[str, object]], op: dict[str, object], error: str) -> None:
    adapters, book = _both(cfg)
    for step in setup:
        if step["op"] == "add_request":
            book.apply(step)
        else:
            outs = [execute(a, book, step) for a in adapters]
            assert outs[0] == outs[1], step
    before = [a.to_view() for a in adapters]
    outs = [execute(a, book, op) for a in adapters]
    assert outs == [{"error": error}] * 2, outs
    assert [a.to_view() for a in adapters] == before  # nothing changed


ADD: dict[str, object] = {"op": "add_request", "rid": "r", "prompt": [1, 2, 3, 1, 2, 3, 1, 2, 3]}


@pytest.mark.parametrize(
    ("name", "groups", "caching", "hits", "error"),
    [
        ("out of pool", (FullAttention(4),), True, [[32]], "InvalidBlockIdError"),
        ("caching off", (FullAttention(4),), False, [[1]], "StaleHitError"),
        ("null in a full-attention hit", (FullAttention(4),), True, [[0]], "StaleHitError"),
        ("one block too many", (FullAttention(4),), True, [[1]], "StaleHitError"),
        ("a ring group's hit", (FullAttention(4), CircularBuffer(8)), True, [[], [1]], "StaleHitError"),
    ],
)
def test_bad_hits_are_refused_alike(
    name: str, groups: tuple[AttentionKind, ...], caching: bool, hits: list[list[int]], error: str
) -> None:
    """The hit lists ``_bad_hit`` sends on a first allocation (no lookup returns
    them: the prompt was never cached, so every hit list must be empty)."""
    cfg = KVCacheConfig(num_blocks=32, groups=groups, max_model_len=64, enable_caching=caching, profile=NEWEST)
    op = {"op": "allocate_slots", "rid": "r", "num_new_tokens": 1, "num_new_computed_tokens": 0,
          "new_computed_blocks": hits}  # fmt: skip
    _same_refusal(cfg, [ADD], op, error)


@pytest.mark.parametrize(
    ("op", "error"),
    [
        ({"op": "record_prefix_cache_stats", "rid": "r", "num_hits": -1}, "InvalidTokenCountError"),
        ({"op": "remove_skipped_blocks", "rid": "r", "total_computed_tokens": -1}, "InvalidTokenCountError"),
        ({"op": "cache_blocks", "rid": "r", "num_computed_tokens": -1}, "InvalidTokenCountError"),
        ({"op": "free_blocks", "block_ids": [32]}, "InvalidBlockIdError"),
        ({"op": "cache_blocks", "rid": "r", "num_computed_tokens": 8}, "CacheBeyondAllocationError"),
    ],
)
def test_bad_counts_are_refused_alike(op: dict[str, object], error: str) -> None:
    """The calls ``_bad_count`` sends, on a request that holds no block yet."""
    cfg = KVCacheConfig(num_blocks=32, groups=(FullAttention(4),), max_model_len=64, profile=NEWEST)
    _same_refusal(cfg, [ADD], op, error)


def test_every_bad_checkpoint_config_is_refused() -> None:
    """The broken prefill checkpoints, tried in runs that draw checkpoints (vLLM 0.29.0),
    each raise ConfigError, naming the broken field or release."""
    from kvref.machine.invalid_inputs import CHECKPOINT_BAD_CONFIGS  # noqa: PLC0415 - not re-exported

    cfg = KVCacheConfig(num_blocks=32, groups=BASES["full"], max_model_len=64, profile=PROFILES["vllm-0.29.0"])
    for kind in CHECKPOINT_BAD_CONFIGS:
        bad = bad_config(cfg, kind)
        assert bad is not None, kind
        with pytest.raises(ConfigError, match=r"prefill_checkpoint|prefill checkpoints"):
            replace(cfg, **bad)
