"""vLLM 0.34.0's scheduler-visible changes in kvspec, each against 0.33.0.

The six changes (``docs/vllm-versions.md``): ``get_num_common_prefix_blocks``
is gone; ``get_num_cached_tokens`` is new; whether a request reads the prefix
cache is fixed when it is made; a prompt-logprob request reads at most up to
its first scored row; an explicit ``max_cache_hit_length`` can only lower the
limit; token ids are 32-bit. Each was checked against real vLLM 0.34.0
(``traces/vllm-0.34.0/directed/``).
"""

from __future__ import annotations

import dataclasses

import pytest

from kvspec.config import FullAttention, KVCacheConfig
from kvspec.errors import InvalidRequestError, InvalidTokenCountError, UnsupportedOperationError
from kvspec.kv_cache_manager import KVCacheManager
from kvspec.profiles import VLLM_0_32_0, VLLM_0_33_0, VLLM_0_34_0, SemanticsProfile
from kvspec.request import Request, RequestBlockHasher

PROMPT = list(range(100, 117))  # 17 tokens: 4 full blocks of 4


def cached(profile: SemanticsProfile) -> tuple[KVCacheManager, RequestBlockHasher]:
    """A manager whose cache holds PROMPT's 4 full blocks (request "a" ran and was freed)."""
    config = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=64, profile=profile)
    kv = KVCacheManager(config)
    hasher = RequestBlockHasher.for_config(config)
    req = hasher.new_request("a", PROMPT)
    assert kv.allocate_slots(req, len(PROMPT)) is not None
    kv.cache_blocks(dataclasses.replace(req, num_computed_tokens=len(PROMPT)), len(PROMPT))
    kv.free("a")
    return kv, hasher


def test_the_profile_is_0_33_0_with_six_changes() -> None:
    changed = {
        f.name for f in dataclasses.fields(VLLM_0_34_0) if getattr(VLLM_0_34_0, f.name) != getattr(VLLM_0_33_0, f.name)
    }
    assert changed == {
        "name", "release", "common_prefix", "num_cached_tokens_op", "hit_limit_at_construction",
        "prompt_logprobs_hit_cap", "hit_length_bound", "token_ids_int32",
    }  # fmt: skip


def test_common_prefix_blocks_are_gone() -> None:
    kv, hasher = cached(VLLM_0_34_0)
    kv.allocate_slots(hasher.new_request("b", [1, 2, 3]), 3)
    with pytest.raises(UnsupportedOperationError):
        kv.get_num_common_prefix_blocks("b")
    old, old_hasher = cached(VLLM_0_33_0)
    old.allocate_slots(old_hasher.new_request("b", [1, 2, 3]), 3)
    assert old.get_num_common_prefix_blocks("b") == (0,)


def test_num_cached_tokens_reads_without_change() -> None:
    kv, hasher = cached(VLLM_0_34_0)
    req = hasher.new_request("b", [*PROMPT, 7])
    before = kv.to_view()
    assert kv.get_num_cached_tokens(req) == 16
    assert kv.to_view() == before
    assert kv.get_computed_blocks(req)[1] == 16
    old, old_hasher = cached(VLLM_0_33_0)
    with pytest.raises(UnsupportedOperationError):
        old.get_num_cached_tokens(old_hasher.new_request("b", PROMPT))


def test_num_cached_tokens_ignores_a_prompt_logprob_limit_but_not_a_zero_one() -> None:
    kv, hasher = cached(VLLM_0_34_0)
    capped = hasher.new_request("b", [*PROMPT, 7], skip_reading_prefix_cache=False, prompt_logprobs=True,
                                prompt_logprob_start=5)  # fmt: skip
    assert capped.prefix_cache_hit_limit == 5
    assert kv.get_num_cached_tokens(capped) == 16
    assert kv.get_computed_blocks(capped)[1] == 4
    assert kv.get_num_cached_tokens(hasher.new_request("c", PROMPT, skip_reading_prefix_cache=True)) == 0


def test_skip_is_read_at_construction_from_0_34_0() -> None:
    for profile, hit in ((VLLM_0_33_0, 0), (VLLM_0_34_0, 16)):
        kv, hasher = cached(profile)
        late = dataclasses.replace(hasher.new_request("b", [*PROMPT, 7]), skip_reading_prefix_cache=True)
        assert kv.get_computed_blocks(late)[1] == hit, profile.name
        made = hasher.new_request("c", [*PROMPT, 7], skip_reading_prefix_cache=True)
        assert kv.get_computed_blocks(made)[1] == 0


@pytest.mark.parametrize(("start", "hit_033", "hit_034"), [(None, 16, 0), (5, 16, 4), (9, 16, 8), (40, 16, 16)])
def test_prompt_logprob_requests_read_up_to_their_first_scored_row(
    start: int | None, hit_033: int, hit_034: int
) -> None:
    for profile, hit in ((VLLM_0_33_0, hit_033), (VLLM_0_34_0, hit_034)):
        kv, hasher = cached(profile)
        req = hasher.new_request("b", [*PROMPT, 7], skip_reading_prefix_cache=False, prompt_logprobs=True,
                                 prompt_logprob_start=start)  # fmt: skip
        assert kv.get_computed_blocks(req)[1] == hit, profile.name
        unset = hasher.new_request("c", [*PROMPT, 7], prompt_logprobs=True, prompt_logprob_start=start)
        assert unset.skip_reading_prefix_cache  # unset: prompt logprobs skip reads
        assert kv.get_computed_blocks(unset)[1] == 0


def test_prompt_logprob_start_needs_prompt_logprobs() -> None:
    hasher = RequestBlockHasher.for_config(
        KVCacheConfig(num_blocks=8, groups=(FullAttention(4),), max_model_len=64, profile=VLLM_0_34_0)
    )
    with pytest.raises(InvalidRequestError):
        hasher.new_request("a", PROMPT, prompt_logprob_start=2)
    with pytest.raises(InvalidRequestError):
        hasher.new_request("a", PROMPT, prompt_logprobs=True, prompt_logprob_start=-1)


def test_an_explicit_hit_length_bound() -> None:
    old, old_hasher = cached(VLLM_0_32_0)
    with pytest.raises(UnsupportedOperationError):
        old.get_computed_blocks(old_hasher.new_request("b", PROMPT), max_cache_hit_length=8)
    for profile, whole in ((VLLM_0_33_0, 16), (VLLM_0_34_0, 12)):
        kv, hasher = cached(profile)
        req = hasher.new_request("b", PROMPT[:16])  # 16 tokens, all cached
        assert kv.get_computed_blocks(req, max_cache_hit_length=9)[1] == 8
        # 0.33.0 takes a bound above num_tokens - 1 as given: the whole prompt hits.
        assert kv.get_computed_blocks(req, max_cache_hit_length=16)[1] == whole, profile.name
        assert kv.get_computed_blocks(req)[1] == 12
        with pytest.raises(InvalidTokenCountError):
            kv.get_computed_blocks(req, max_cache_hit_length=-1)


def test_token_ids_are_32_bit_from_0_34_0() -> None:
    for profile, refused in ((VLLM_0_33_0, False), (VLLM_0_34_0, True)):
        config = KVCacheConfig(num_blocks=8, groups=(FullAttention(4),), max_model_len=64, profile=profile)
        hasher = RequestBlockHasher.for_config(config)
        req = hasher.new_request("a", [1, (1 << 31) - 1])
        for prompt, appended in (([1, 1 << 31], None), ([1], [1 << 31])):

            def make(h: RequestBlockHasher = hasher, p: list[int] = prompt, a: list[int] | None = appended) -> Request:
                made = h.new_request("b", p)
                return made if a is None else h.with_output_tokens(made, a)

            if refused:
                with pytest.raises(InvalidRequestError, match="32-bit"):
                    make()
            else:
                assert isinstance(make(), Request)
        assert req.all_token_ids[-1] == (1 << 31) - 1
