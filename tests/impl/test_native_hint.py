"""The native core's record of the prefix hint's longest lookup.

The core records, in each hybrid lookup, the hit length of its first spec
group's search (``_first_lookup_tokens``); the native manager's prefix hint
is that length minus the reconciled hit. :mod:`kvimpl.native_hint` computes
the same length in Python with kvimpl's own search over a copy of the core's
cache map; the two must agree on every lookup.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from kvimpl import native
from kvimpl.native import NativeKVCacheManager
from kvimpl.native_hint import cached_map, native_hint_for
from kvimpl.request import RequestHasher
from kvspec.config import ChunkedLocal, FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.errors import ConfigError
from kvspec.profiles import NEWEST, VLLM_0_25_1
from kvspec.request import RequestStatus

needs_build = pytest.mark.skipif(native.native_module() is None, reason="the native extension is not built here")


@needs_build
@pytest.mark.parametrize("use_eagle", [False, True], ids=["plain", "eagle"])
@pytest.mark.parametrize("profile", [VLLM_0_25_1, NEWEST], ids=lambda p: p.name)
@pytest.mark.parametrize(
    "groups",
    [
        (FullAttention(4), SlidingWindow(4, 8)),
        (SlidingWindow(4, 8), FullAttention(8)),
        (FullAttention(4), ChunkedLocal(4, 8)),
        (FullAttention(4), Mamba(4, mode="all")),
        (FullAttention(4), Mamba(4, mode="align")),
    ],
    ids=["full+swa", "swa+full@2x", "full+chunked", "full+mamba-all", "full+mamba-align"],
)
def test_first_lookup_is_kvimpls_python_search(groups: tuple[Any, ...], profile: Any, use_eagle: bool) -> None:
    """On a seeded run with evictions, every hybrid lookup's recorded first
    search equals kvimpl's Python search over the core's cache map."""
    try:
        config = KVCacheConfig(num_blocks=40, groups=groups, max_model_len=128, use_eagle=use_eagle, profile=profile)
    except ConfigError as exc:
        pytest.skip(f"not a valid configuration: {exc}")
    if native.native_unsupported(config) is not None:
        pytest.skip(f"the native core does not run this configuration: {native.native_unsupported(config)}")
    manager = NativeKVCacheManager(config)
    hint = native_hint_for(config)
    assert hint is not None
    hasher = RequestHasher.for_config(config, native=True)
    rng = random.Random(3)
    prefixes = [[rng.randrange(50) for _ in range(rng.randint(6, 30))] for _ in range(3)]
    reqs: dict[str, Any] = {}
    hits = 0
    for step in range(120):
        manager.new_step_starts()
        for rid, r in list(reqs.items()):
            if manager.allocate_slots(r, 1) is None or rng.random() < 0.2:
                manager.free(rid)
                del reqs[rid]
                continue
            r.num_computed_tokens += 1
            r.append_output_token_ids(rng.randrange(50))
        r = hasher.new_request(f"r{step}", rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randint(0, 9))])
        found, n = manager.get_computed_blocks(r)
        longest = hint.longest(r.block_hashes, r.num_tokens - 1, cached_map(manager))
        core = manager._first_lookup_tokens
        assert core == longest, f"step {step}: the core recorded {core} tokens, kvimpl's search finds {longest}"
        hits += longest > 0
        if manager.allocate_slots(r, r.num_tokens - n, n, found if any(found) else None) is not None:
            r.num_computed_tokens = r.num_tokens
            r.status = RequestStatus.RUNNING
            reqs[r.request_id] = r
    assert hits > 10, f"only {hits} lookups hit: the run does not exercise the search"
