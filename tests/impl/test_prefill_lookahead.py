"""Multi-module MTP inputs (vLLM 0.28.0 on): ``num_prefill_lookahead`` makes
caching lag the last ``num_prefill_lookahead - 1`` computed tokens (a drafter
may prefill them again), ``SlidingWindow.extra_retained_tokens`` keeps that
many more tokens below a window. kvspec, kvimpl's pure-Python manager and its
native core cache and skip the same blocks; configurations vLLM refuses are
refused; the scheduler model never ends a chunk inside the drafter's look-ahead,
as the installed vLLM's scheduler does."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings

from kvimpl.kv_cache_manager import KVCacheManager as ImplManager
from kvimpl.native import NativeKVCacheManager, native_unsupported
from kvref.adapters.vllm import installed_vllm_version
from kvref.capabilities import config_features
from kvref.machine.configuration import configs
from kvref.ops import config_from_json, config_to_json
from kvref.scheduler_chunks import reserve_prefill_lookahead
from kvref.shapes import MTP_SHAPES
from kvspec.config import FullAttention, KVCacheConfig, SlidingWindow, num_reprefillable_tokens, uses_prefill_lookahead
from kvspec.errors import ConfigError, UnsupportedByProfileError
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.profiles import NEWEST, PROFILES, VLLM_0_27_1, VLLM_0_28_0, SemanticsProfile, profile_named
from kvspec.request import Request, RequestBlockHasher

Factory = Callable[[KVCacheConfig], Any]
MANAGERS: dict[str, Factory] = {"spec": SpecManager, "impl": ImplManager, "native": NativeKVCacheManager}


def _manager(name: str, config: KVCacheConfig) -> Any:
    if name == "native" and native_unsupported(config):
        pytest.skip(f"native core: {native_unsupported(config)}")
    return MANAGERS[name](config)


def _request(config: KVCacheConfig, rid: str, tokens: int) -> Request:
    hasher = RequestBlockHasher(config.hash_function, config.hash_seed, config.resolved_hash_block_size())
    return hasher.new_request(rid, list(range(100, 100 + tokens)))


def _hit_after_prefill(name: str, config: KVCacheConfig, prompt: int) -> int:
    """Prefill a ``prompt``-token request in one chunk, then look up the same
    prompt and one more token: the tokens the cache serves."""
    m = _manager(name, config)
    assert m.allocate_slots(_request(config, "a", prompt), prompt) is not None
    _, hit = m.get_computed_blocks(_request(config, "b", prompt + 1))
    m.check_invariants()
    return int(hit)


@pytest.mark.parametrize("name", sorted(MANAGERS))
@pytest.mark.parametrize(("lookahead", "expected"), [(0, 12), (1, 12), (2, 8), (3, 8), (4, 8)])
def test_caching_lags_the_reprefillable_tokens(name: str, lookahead: int, expected: int) -> None:
    """12 computed tokens, blocks of 4: a look-ahead of L keeps the last L - 1
    tokens out of the cache, so the third block is cached only for L <= 1."""
    config = KVCacheConfig(
        num_blocks=24, groups=(FullAttention(4),), max_model_len=64, num_prefill_lookahead=lookahead, profile=NEWEST
    )
    assert _hit_after_prefill(name, config, 12) == expected


@pytest.mark.parametrize("name", sorted(MANAGERS))
@pytest.mark.parametrize(("lookahead", "expected"), [(0, 12), (2, 8), (3, 8)])
def test_a_hybrids_eagle_groups_cache_from_the_final_tokens(name: str, lookahead: int, expected: int) -> None:
    """Full attention and a window under EAGLE: the EAGLE groups cache one
    block past the aligned final tokens, and the lookup drops a block."""
    config = KVCacheConfig(
        num_blocks=48, groups=(FullAttention(4), SlidingWindow(4, 4, extra_retained_tokens=max(0, lookahead - 1))),
        max_model_len=64, use_eagle=True, num_prefill_lookahead=lookahead, profile=NEWEST,
    )  # fmt: skip
    # 16 tokens: EAGLE groups cache up to min(final, aligned final + 4), final = 16 - (L - 1): 16, 15
    # and 14 tokens; a lookup of 17 finds 4, 3 and 3 full blocks and drops the last one
    assert _hit_after_prefill(name, config, 16) == expected


@pytest.mark.parametrize("name", sorted(MANAGERS))
@pytest.mark.parametrize(("extra", "nulls"), [(0, 4), (1, 4), (2, 3), (5, 3), (6, 2)])
def test_a_window_keeps_its_extra_tokens(name: str, extra: int, nulls: int) -> None:
    """20 computed tokens, a window of 4 in blocks of 4: ``20 - 4 + 1 - extra``
    tokens are skipped, so ``floor(that / 4)`` leading entries become null."""
    config = KVCacheConfig(
        num_blocks=24, groups=(SlidingWindow(4, 4, extra_retained_tokens=extra),), max_model_len=64,
        enable_caching=False, profile=NEWEST,
    )  # fmt: skip
    m = _manager(name, config)
    assert m.allocate_slots(_request(config, "a", 21), 20) is not None
    m.remove_skipped_blocks("a", 20)
    table = list(m.get_block_ids("a")[0])
    assert table[:nulls] == [0] * nulls and all(table[nulls:])
    m.check_invariants()


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"num_prefill_lookahead": 2, "profile": VLLM_0_27_1}, UnsupportedByProfileError, "no multi-module MTP"),
        (
            {"groups": (SlidingWindow(4, 4, extra_retained_tokens=1),), "profile": VLLM_0_27_1},
            UnsupportedByProfileError,
            "no multi-module MTP",
        ),
        ({"num_prefill_lookahead": -1}, ConfigError, "non-negative int"),
        ({"num_prefill_lookahead": True}, ConfigError, "non-negative int"),
        ({"groups": (SlidingWindow(4, 4, extra_retained_tokens=-2),)}, ConfigError, "extra_retained_tokens"),
        ({"use_eagle": True, "num_prefill_lookahead": 5}, ConfigError, "exceeds the scheduler block size 4"),
        # a flagged group counts without use_eagle too (vLLM checks its flag set, not the groups that drop)
        ({"eagle_groups": (0,), "num_prefill_lookahead": 5}, ConfigError, "exceeds the scheduler block size 4"),
    ],
)
def test_refused_configurations(fields: dict[str, Any], error: type[Exception], message: str) -> None:
    base: dict[str, Any] = {"num_blocks": 16, "groups": (FullAttention(4),), "max_model_len": 32}
    with pytest.raises(error, match=message):
        KVCacheConfig(**{**base, **fields})


def test_what_stays_legal() -> None:
    """A look-ahead up to the scheduler block under EAGLE, any look-ahead without
    EAGLE or without caching; 0.28.0 is the first release with the inputs."""
    for fields in (
        {"use_eagle": True, "num_prefill_lookahead": 4},
        {"num_prefill_lookahead": 9},
        {"use_eagle": True, "num_prefill_lookahead": 9, "enable_caching": False},
    ):
        cfg = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=32, **fields)  # type: ignore[arg-type]  # mixed field types
        assert num_reprefillable_tokens(cfg) == cfg.num_prefill_lookahead - 1
    first = KVCacheConfig(
        num_blocks=16, groups=(FullAttention(4),), max_model_len=32, num_prefill_lookahead=2, profile=VLLM_0_28_0
    )
    assert num_reprefillable_tokens(first) == 1


def test_the_trace_format_keeps_old_configs_byte_equal() -> None:
    plain = KVCacheConfig(num_blocks=16, groups=(FullAttention(4), SlidingWindow(4, 3)), max_model_len=32)
    data = config_to_json(plain)
    assert "num_prefill_lookahead" not in data and "extra_retained_tokens" not in data["groups"][1]
    mtp = KVCacheConfig(
        num_blocks=16, groups=(FullAttention(4), SlidingWindow(4, 3, 2)), max_model_len=32, num_prefill_lookahead=3
    )
    data = config_to_json(mtp)
    assert data["num_prefill_lookahead"] == 3 and data["groups"][1]["extra_retained_tokens"] == 2
    assert config_from_json(data, NEWEST) == mtp


@pytest.mark.parametrize(("lookahead", "total", "start"), list(itertools.product((1, 2, 3), (2, 5, 9), range(0, 8))))
def test_a_chunk_leaves_the_look_ahead_or_nothing(lookahead: int, total: int, start: int) -> None:
    """Unchanged where it finishes the prefill or leaves the look-ahead, or
    where no more than the look-ahead is left; else cut to leave it."""
    if start >= total:
        return
    cfg = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=32, num_prefill_lookahead=lookahead)
    for n in range(1, total - start + 1):
        got = reserve_prefill_lookahead(cfg, total, start, n)
        left = total - start - got
        assert 1 <= got <= n, (n, got)
        if total - start - n == 0 or total - start - n >= lookahead or total - start <= lookahead:
            assert got == n
        else:
            assert left == lookahead


VLLM = installed_vllm_version()


def _profile_of_installed() -> SemanticsProfile | None:
    name = f"vllm-{VLLM}"
    return profile_named(name) if VLLM is not None and name in PROFILES else None


@pytest.mark.skipif(_profile_of_installed() is None, reason="needs an installed vLLM kvref models")
def test_the_reserve_matches_the_installed_vllm() -> None:
    """The installed release's ``Scheduler._reserve_prefill_lookahead`` on a
    stand-in scheduler cuts what :func:`reserve_prefill_lookahead` cuts; where
    it schedules nothing, the kit keeps the chunk."""
    from vllm.v1.core.sched.scheduler import Scheduler  # noqa: PLC0415 - optional dependency

    reserve = getattr(Scheduler, "_reserve_prefill_lookahead", None)
    if reserve is None:
        pytest.skip("this vLLM has no _reserve_prefill_lookahead (before 0.28.0)")
    profile = _profile_of_installed()
    assert profile is not None
    checked = 0
    for lookahead in (1, 2, 3, 5):
        fake = SimpleNamespace(num_prefill_lookahead=lookahead)
        cfg = KVCacheConfig(
            num_blocks=16, groups=(FullAttention(4),), max_model_len=32, num_prefill_lookahead=lookahead,
            profile=profile,
        )  # fmt: skip
        for total in range(1, 14):
            for start in range(total):
                for n in range(1, total - start + 1):
                    theirs = reserve(fake, SimpleNamespace(num_tokens=total), start, n)
                    ours = reserve_prefill_lookahead(cfg, total, start, n)
                    assert ours == (theirs or n), (lookahead, total, start, n, theirs)
                    checked += 1
    assert checked > 1000


@settings(max_examples=40, database=None)
@given(
    configs(shapes=MTP_SHAPES, profile=NEWEST), configs(shapes=MTP_SHAPES, profile=NEWEST, excluded=frozenset({"mtp"}))
)
def test_the_mtp_shapes_draw_the_inputs_unless_excluded(
    drawn: tuple[str, KVCacheConfig | str], without: tuple[str, KVCacheConfig | str]
) -> None:
    """An MTP shape's configuration has its look-ahead and every window keeps
    ``N - 1`` tokens; an engine that lacks the feature ``mtp`` gets the kinds
    without them."""
    name, cfg = drawn
    if isinstance(cfg, KVCacheConfig):
        lookahead = int(name.rsplit("@mtp", 1)[1])
        assert cfg.num_prefill_lookahead == lookahead
        assert all(k.extra_retained_tokens == lookahead - 1 for k in cfg.groups if isinstance(k, SlidingWindow))
        assert "mtp" in config_features(cfg)
    _, cfg = without
    if isinstance(cfg, KVCacheConfig):
        assert not uses_prefill_lookahead(cfg) and "mtp" not in config_features(cfg)
