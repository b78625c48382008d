"""Look-ahead block hashes in kvspec (vLLM 0.33.0 on, ``num_hash_lookahead_tokens``).

Each hash also covers the ``L`` tokens after its block, so it exists only once
they do; the manager caches only up to the hashed tokens; the Mamba tail sits
at or below ``num_prompt_tokens - L``; stored events name the look-ahead tokens
and carry the keys of the block's whole window. The directed traces
``traces/vllm-0.33.0/directed/lookahead-hashes-*.jsonl`` (and 0.34.0's) were
replayed by real vLLM 0.33.0 and 0.34.0.
"""

from __future__ import annotations

import dataclasses

import pytest

from kvspec.config import FullAttention, KVCacheConfig
from kvspec.errors import ConfigError, UnsupportedByProfileError
from kvspec.events import BlockStored
from kvspec.hashing import (
    ExtraKeySource,
    LoRA,
    MultiModalFeature,
    get_hash_fn_by_name,
    hash_block_tokens,
    lookahead_extra_keys,
    lookahead_window_keys,
    none_hash,
)
from kvspec.kv_cache_manager import KVCacheManager
from kvspec.mamba_tail import mamba_tail_boundary
from kvspec.profiles import VLLM_0_32_0, VLLM_0_33_0, VLLM_0_34_0
from kvspec.request import RequestBlockHasher

PROMPT = list(range(100, 116))  # 16 tokens: 4 full blocks of 4


def _config(ahead: int, **kw: object) -> KVCacheConfig:
    fields: dict[str, object] = {
        "num_blocks": 16, "groups": (FullAttention(4),), "max_model_len": 64, "profile": VLLM_0_34_0,
        "num_hash_lookahead_tokens": ahead, "enable_kv_cache_events": True,
    }  # fmt: skip
    fields.update(kw)
    return KVCacheConfig(**fields)  # type: ignore[arg-type]  # a test builds the config from a dict of fields


@pytest.mark.parametrize("ahead", [0, 1, 2, 3])
def test_a_block_is_hashed_once_its_look_ahead_exists(ahead: int) -> None:
    hasher = RequestBlockHasher.for_config(_config(ahead))
    for n in range(1, 20):
        req = hasher.new_request("r", list(range(n)))
        assert len(req.block_hashes) == max(n - ahead, 0) // 4


def test_appending_tokens_hashes_as_hashing_at_once() -> None:
    hasher = RequestBlockHasher.for_config(_config(2))
    extra = ExtraKeySource(lora=LoRA("l", 1, "p"), mm_features=(MultiModalFeature("img", 5, 2),), cache_salt="s")
    whole = hasher.new_request("r", PROMPT, extra)
    grown = hasher.new_request("r", PROMPT[:5], extra)
    for token in PROMPT[5:]:
        grown = hasher.with_output_tokens(grown, [token])
    assert grown.block_hashes == whole.block_hashes and len(whole.block_hashes) == 3


def test_the_hash_keys_the_look_ahead_tokens_after_the_window_keys() -> None:
    fn = get_hash_fn_by_name("sha256_cbor")
    hasher = RequestBlockHasher.for_config(_config(1))
    req = hasher.new_request("r", PROMPT[:5])
    assert req.block_hashes == (hash_block_tokens(fn, none_hash(fn, "0"), PROMPT[:4], (None, PROMPT[4])),)
    other = hasher.new_request("r", [*PROMPT[:4], 7])
    assert other.block_hashes != req.block_hashes  # the same block, another next token


def test_a_multimodal_item_in_the_look_ahead_keys_the_block_and_stays_open() -> None:
    src = ExtraKeySource(mm_features=(MultiModalFeature("img", 5, 2),))
    keys, cursor = lookahead_window_keys(src, 0, 4, 2, 0)
    assert keys == (("img", 5),) and cursor == 0  # block 1 still holds the item: the cursor stays on it
    assert lookahead_window_keys(src, 0, 4, 1, 0)[0] is None  # the window [0, 5) ends where the item starts
    keys2, _ = lookahead_extra_keys(src, PROMPT, 4, 8, 2, cursor, tagged=True)
    assert keys2 == ((("mm", "img", 1),), 108, 109)


def test_caching_waits_for_the_hashes_then_catches_up() -> None:
    config = _config(1)
    kv, hasher = KVCacheManager(config), RequestBlockHasher.for_config(config)
    req = hasher.new_request("a", PROMPT)
    assert kv.allocate_slots(req, 16) is not None
    kv.cache_blocks(dataclasses.replace(req, num_computed_tokens=16), 16)
    stored = [e for e in kv.take_events() if isinstance(e, BlockStored)]
    assert [len(e.block_hashes) for e in stored] == [3]
    assert stored[0].lookahead_token_ids == ((104,), (108,), (112,))
    req = dataclasses.replace(hasher.with_output_tokens(req, [7]), num_computed_tokens=16)
    assert kv.allocate_slots(req, 1) is not None
    stored = [e for e in kv.take_events() if isinstance(e, BlockStored)]
    assert stored[0].lookahead_token_ids == ((7,),) and stored[0].token_ids == tuple(PROMPT[12:])
    assert kv.get_computed_blocks(hasher.new_request("b", [*PROMPT, 8, 9]))[1] == 12
    assert kv.get_computed_blocks(hasher.new_request("c", [*PROMPT, 7, 9]))[1] == 16


def test_without_look_ahead_events_carry_none() -> None:
    config = _config(0)
    kv, hasher = KVCacheManager(config), RequestBlockHasher.for_config(config)
    req = hasher.new_request("a", PROMPT)
    kv.allocate_slots(req, 16)
    kv.cache_blocks(dataclasses.replace(req, num_computed_tokens=16), 16)
    assert all(e.lookahead_token_ids is None for e in kv.take_events() if isinstance(e, BlockStored))


def test_the_mamba_tail_leaves_room_for_the_look_ahead() -> None:
    assert mamba_tail_boundary(18, 4, False, True) == 16
    assert mamba_tail_boundary(18, 4, False, True, lookahead=1) == 16
    assert mamba_tail_boundary(18, 4, False, True, lookahead=3) == 12
    assert mamba_tail_boundary(2, 4, False, True, lookahead=3) == 0
    assert mamba_tail_boundary(18, 4, True, True, lookahead=3) == 12  # EAGLE's drop: one unit below 16


def test_releases_before_0_33_0_refuse_look_ahead_hashes() -> None:
    with pytest.raises(UnsupportedByProfileError, match="look-ahead block hashes"):
        _config(1, profile=VLLM_0_32_0)
    assert _config(1, profile=VLLM_0_33_0).num_hash_lookahead_tokens == 1
    for bad in (-1, True, 1.5):
        with pytest.raises(ConfigError, match="num_hash_lookahead_tokens"):
            _config(bad)  # type: ignore[arg-type]  # the wrong types are the point
