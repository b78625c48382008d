"""Look-ahead block hashes (vLLM 0.33.0 on) in kvimpl: its request hasher
hashes as kvspec's (incrementally too, with every extra-key source), its
pure-Python manager caches and reports the same blocks and events, its native
core declines such configurations (they run on the pure-Python manager), and
the kit draws them as vLLM's scheduler sets them: only under 0.33.0 on, for an
EAGLE-style drafter with prefix caching, with the manager's ``use_eagle`` off.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings

from kvimpl.kv_cache_manager import KVCacheManager as ImplManager
from kvimpl.native import native_unsupported
from kvimpl.request import RequestHasher
from kvref.capabilities import config_features
from kvref.machine.configuration import configs
from kvref.ops import config_from_json, config_to_json
from kvref.scheduler_chunks import drafts_tokens
from kvref.shapes import SHAPES
from kvspec.config import FullAttention, KVCacheConfig, Mamba
from kvspec.hashing import ExtraKeySource, LoRA, MultiModalFeature
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.profiles import VLLM_0_32_0, VLLM_0_34_0, SemanticsProfile
from kvspec.request import RequestBlockHasher

PROMPT = list(range(100, 118))  # 18 tokens


def _config(ahead: int, *groups: object, **kw: object) -> KVCacheConfig:
    kinds = groups or (FullAttention(4),)
    return KVCacheConfig(
        num_blocks=32, groups=kinds, max_model_len=64, profile=VLLM_0_34_0,  # type: ignore[arg-type]  # kinds
        num_hash_lookahead_tokens=ahead, enable_kv_cache_events=True, **kw,  # type: ignore[arg-type]  # options
    )  # fmt: skip


EXTRAS = (
    ExtraKeySource(),
    ExtraKeySource(mm_features=(MultiModalFeature("img", 5, 2), MultiModalFeature("v", 9, 6)), cache_salt="s"),
    ExtraKeySource(lora=LoRA("l", 1, "p"), prompt_embeds=tuple(bytes([i]) for i in range(18))),
)


@pytest.mark.parametrize("ahead", [1, 2, 3])
@pytest.mark.parametrize("extra", EXTRAS)
def test_the_request_hasher_hashes_as_kvspec(ahead: int, extra: ExtraKeySource) -> None:
    config = _config(ahead)
    spec, impl = RequestBlockHasher.for_config(config), RequestHasher.for_config(config, native=True)
    for cut in (1, 5, 9, 18):
        s = spec.new_request("r", PROMPT[:cut], extra)
        i = impl.new_request("r", PROMPT[:cut], extra)
        assert type(i).__module__ == "kvimpl.request"  # a Python request: the C one does not hash ahead
        for token in PROMPT[cut:]:
            s = spec.with_output_tokens(s, [token])
            i.append_output_token_ids([token])
            assert tuple(i.block_hashes) == s.block_hashes


@pytest.mark.parametrize("groups", [(FullAttention(4),), (FullAttention(4), Mamba(4, "align"))])
def test_the_python_manager_caches_and_reports_as_kvspec(groups: tuple[object, ...]) -> None:
    config = _config(3, *groups, num_prefill_lookahead=3)
    assert native_unsupported(config) is not None  # look-ahead hashes (or, with Mamba, its tail entries)
    assert "look-ahead" in str(native_unsupported(_config(3)))
    spec, impl = SpecManager(config), ImplManager(config)
    hasher, impl_hasher = RequestBlockHasher.for_config(config), RequestHasher.for_config(config, native=False)
    req, ireq = hasher.new_request("a", PROMPT[:12]), impl_hasher.new_request("a", PROMPT[:12])
    for m, r in ((spec, req), (impl, ireq)):
        assert m.allocate_slots(r, 12) is not None
    req = dataclasses.replace(req, num_computed_tokens=12)
    ireq.num_computed_tokens = 12
    for token in PROMPT[12:]:
        req = dataclasses.replace(hasher.with_output_tokens(req, [token]), num_computed_tokens=req.num_tokens)
        ireq.append_output_token_ids([token])
        assert spec.allocate_slots(dataclasses.replace(req, num_computed_tokens=req.num_tokens - 1), 1) is not None
        ireq.num_computed_tokens = ireq.num_tokens - 1
        assert impl.allocate_slots(ireq, 1) is not None
        ireq.num_computed_tokens = ireq.num_tokens
        assert spec.take_events() == impl.take_events()
        assert spec.to_view() == impl.to_view()
    impl.check_invariants()


def _drawn(profile: SemanticsProfile) -> list[KVCacheConfig]:
    found: list[KVCacheConfig] = []

    @settings(max_examples=400, database=None, derandomize=True)
    @given(configs(SHAPES, profile))
    def draw(drawn: tuple[str, KVCacheConfig | str]) -> None:
        if not isinstance(drawn[1], str):
            found.append(drawn[1])

    draw()
    return found


def test_the_kit_draws_them_as_vllm_s_scheduler_sets_them() -> None:
    newest = _drawn(VLLM_0_34_0)
    ahead = [c for c in newest if c.num_hash_lookahead_tokens]
    assert ahead and any(c.use_eagle for c in newest)  # both: look-ahead hashes and the trailing-block drop
    for c in ahead:
        assert c.enable_caching and not c.use_eagle and drafts_tokens(c)
        assert "lookahead_hashes" in config_features(c)
        assert config_from_json(config_to_json(c), c.profile) == c
    assert not any(c.num_hash_lookahead_tokens for c in _drawn(VLLM_0_32_0))
    assert "num_hash_lookahead_tokens" not in config_to_json(next(c for c in newest if not c.num_hash_lookahead_tokens))
