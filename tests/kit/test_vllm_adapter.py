"""The vLLM adapter drives the real vLLM KVCacheManager correctly.

Skipped as a whole when no vLLM release the adapter drives is installed. The
exact-behaviour tests pin vLLM 0.25.1 (the release kvspec models) and run only
on it; :class:`TestEraSmoke` runs on every release, one test per API era.
"""

from __future__ import annotations

import importlib
import os
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest

import kvref.adapters.vllm as va
from kvref.adapters import DeclaredSemantics, KVCacheAdapter
from kvref.adapters.vllm import (
    ERAS,
    MODELLED_VLLM_VERSION,
    Unsupported,
    VllmAdapter,
    VllmApi,
    era_for,
    installed_vllm_version,
    loaded_api,
    make_vllm_adapter,
    vllm_available,
)
from kvref.adapters.vllm.errors import CannotRead
from kvspec.config import (
    MLA,
    AttentionKind,
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    KVCacheConfig,
    Mamba,
    SinkFullAttention,
    SlidingWindow,
)
from kvspec.errors import (
    CacheBeyondAllocationError,
    ConfigError,
    DoubleFreeError,
    ExceedsMaxModelLenError,
    GroupCountError,
    InvalidBlockIdError,
    InvalidRequestError,
    InvalidTokenCountError,
    KVCacheError,
    StaleHitError,
    UnexpectedPrefixHitError,
    UnknownRequestError,
)
from kvspec.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvspec.hashing import ExtraKeySource, LoRA, MultiModalFeature, make_key
from kvspec.profiles import VLLM_0_25_1
from kvspec.request import Request, RequestBlockHasher, RequestStatus
from kvspec.stats import PrefixCacheStats

if not vllm_available():
    pytest.skip(
        "no supported vLLM is installed (install 0.25.1 with `bash ci/setup.sh --with-vllm`)",
        allow_module_level=True,
    )

ROOT = Path(__file__).resolve().parents[2]
RELEASE = va.loaded_api().version


TestFunction = TypeVar("TestFunction", bound=Callable[..., None])


def any_release(test: TestFunction) -> TestFunction:
    """Mark a test that holds on every release the adapter drives."""
    setattr(test, "any_release", True)  # noqa: B010 - read back by release_gate
    return test


@pytest.fixture(autouse=True)
def release_gate(request: pytest.FixtureRequest) -> None:
    """Exact-behaviour tests pin the modelled release; ``@any_release`` ones run everywhere."""
    if RELEASE != MODELLED_VLLM_VERSION and not getattr(request.function, "any_release", False):
        pytest.skip(f"pins vLLM {MODELLED_VLLM_VERSION}; vLLM {RELEASE} is installed")


# ----------------------------------------------------------------- helpers


def config(groups: tuple[AttentionKind, ...], **kw: Any) -> KVCacheConfig:
    kw.setdefault("num_blocks", 16)
    kw.setdefault("max_model_len", 128)
    kw.setdefault("profile", VLLM_0_25_1)
    return KVCacheConfig(groups=groups, **kw)


def hasher(cfg: KVCacheConfig) -> RequestBlockHasher:
    return RequestBlockHasher.for_config(cfg)


def manager_classes(adapter: VllmAdapter) -> list[str]:
    return [type(m).__name__ for m in adapter.manager.coordinator.single_type_managers]


def computed(req: Request, n: int) -> Request:
    """``req`` after ``n`` tokens were computed and it runs."""
    return replace(req, num_computed_tokens=n, status=RequestStatus.RUNNING)


# ----------------------------------------------------------------- availability


@any_release
@pytest.mark.parametrize("module", ["kvref.adapters.vllm"])
def test_importing_the_adapter_does_not_import_vllm(module: str) -> None:
    code = (
        f"import sys, {module} as m\n"
        "assert 'vllm' not in sys.modules and 'torch' not in sys.modules\n"
        "assert issubclass(m.VllmUnavailable, RuntimeError)\n"
        "assert m.installed_vllm_version() is not None\n"
        "assert 'vllm' not in sys.modules and 'torch' not in sys.modules\n"
    )
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'spec'}{os.pathsep}{ROOT / 'kit'}")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("version", ["0.34.0", "0.35.2", "1.0.0"])
def test_a_release_newer_than_every_era_is_driven_by_the_newest(version: str) -> None:
    assert era_for(version) is ERAS[-1]


@any_release
@pytest.mark.parametrize("version", ["0.15.2", "unknown"])
def test_undriven_version_is_unavailable(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    vllm = importlib.import_module("vllm")
    monkeypatch.setattr(va, "_LOADED", None)
    monkeypatch.setattr(vllm, "__version__", version)
    assert not vllm_available()
    with pytest.raises(va.VllmUnavailable, match=r"bash ci/setup\.sh --with-vllm"):
        make_vllm_adapter(config((FullAttention(4),)))


@any_release
def test_failed_import_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(va, "_LOADED", None)
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(va.VllmUnavailable, match=r"no supported vLLM is installed"):
        make_vllm_adapter(config((FullAttention(4),)))


def test_semantics_name_the_installed_release() -> None:
    adapter = make_vllm_adapter(config((FullAttention(4),)))
    assert adapter.semantics == DeclaredSemantics(profile="vllm-0.25.1", upstream=True)
    assert adapter.semantics.known == ()
    assert installed_vllm_version() == "0.25.1"
    assert adapter.api.version == "0.25.1"
    assert type(adapter.api) is VllmApi


@any_release
def test_every_release_maps_to_one_era() -> None:
    assert era_for("0.25.1") is VllmApi
    assert era_for("0.25.1.dev3+g1234") is VllmApi
    eras = [e.era for e in ERAS]
    assert len(set(eras)) == len(eras)
    assert [e.since for e in ERAS] == sorted(e.since for e in ERAS)
    for era in ERAS:
        assert all(era_for(v) is era for v in era.verified), era.era


def test_public_driving_methods() -> None:
    cfg = config((FullAttention(4),))
    adapter = make_vllm_adapter(cfg)
    adapter.apply_globals()
    vreq = adapter.new_vllm_request(hasher(cfg).new_request("x", list(range(9))))
    assert vreq.request_id == "x"
    assert len(vreq.block_hashes) == 2
    assert adapter.vllm_status("RUNNING") is importlib.import_module("vllm.v1.request").RequestStatus.RUNNING
    out = adapter.manager.get_computed_blocks(vreq)
    assert out[1] == 0
    assert adapter.to_view().tables == ()  # the request is not mirrored


def test_record_prefix_cache_stats_is_unsupported_here() -> None:
    cfg = config((FullAttention(4),), log_stats=True)
    adapter = make_vllm_adapter(cfg)
    with pytest.raises(Unsupported, match=r"vLLM 0\.25\.1 has no KVCacheManager\.record_prefix_cache_stats"):
        adapter.record_prefix_cache_stats(hasher(cfg).new_request("a", [1] * 8), 0)


# ----------------------------------------------------------------- construction

SINGLE_KINDS: list[tuple[AttentionKind, str, bool]] = [
    (FullAttention(4), "FullAttentionManager", True),
    (MLA(8), "FullAttentionManager", True),
    (SlidingWindow(4, 8), "SlidingWindowManager", True),
    (ChunkedLocal(4, 8), "ChunkedLocalAttentionManager", True),
    (Mamba(4, "all"), "MambaManager", True),
    (Mamba(4, "align", 1), "MambaManager", True),
    (Mamba(4, "none"), "MambaManager", True),
    (CrossAttention(4), "CrossAttentionManager", False),
]


@pytest.mark.parametrize(("kind", "manager", "caching"), SINGLE_KINDS)
def test_construct_every_kind_alone(kind: AttentionKind, manager: str, caching: bool) -> None:
    adapter = make_vllm_adapter(config((kind,), enable_caching=caching))
    assert isinstance(adapter, KVCacheAdapter)
    assert adapter.name == "vllm"
    assert adapter.construction_workaround is None
    assert manager_classes(adapter) == [manager]
    view = adapter.to_view()
    assert view.free_queue == tuple(range(1, 16))
    assert (view.ref_cnt, view.cached, view.tables) == ((), (), ())
    assert view.usage == 0.0


HYBRIDS: list[tuple[tuple[AttentionKind, ...], list[str], bool]] = [
    (
        (FullAttention(4), SlidingWindow(4, 8)),
        ["FullAttentionManager", "SlidingWindowManager"],
        True,
    ),
    ((FullAttention(4), Mamba(4, "align")), ["FullAttentionManager", "MambaManager"], True),
    (
        (FullAttention(4), ChunkedLocal(4, 8)),
        ["FullAttentionManager", "ChunkedLocalAttentionManager"],
        True,
    ),
    ((MLA(4), SlidingWindow(4, 8)), ["FullAttentionManager", "SlidingWindowManager"], True),
    (
        (FullAttention(16), SlidingWindow(4, 8)),
        ["FullAttentionManager", "SlidingWindowManager"],
        True,
    ),
    (
        (FullAttention(4), CrossAttention(4)),
        ["FullAttentionManager", "CrossAttentionManager"],
        False,
    ),
]


@pytest.mark.parametrize(("groups", "managers", "caching"), HYBRIDS)
def test_construct_hybrids(groups: tuple[AttentionKind, ...], managers: list[str], caching: bool) -> None:
    adapter = make_vllm_adapter(config(groups, enable_caching=caching))
    assert manager_classes(adapter) == managers
    assert adapter.construction_workaround is None
    assert adapter.to_view().free_queue == tuple(range(1, 16))


def test_equal_kinds_map_to_equal_specs() -> None:
    adapter = make_vllm_adapter(
        config((FullAttention(4), SlidingWindow(4, 8), FullAttention(4), MLA(4), SlidingWindow(4, 16)))
    )
    specs = [g.kv_cache_spec for g in adapter.manager.kv_cache_config.kv_cache_groups]
    assert specs[0] == specs[2]
    assert specs[0] != specs[3]
    assert specs[1] != specs[4]
    spec_kinds = [k for k, _ in adapter.manager.kv_cache_event_metadata]
    assert spec_kinds[:4] == ["full_attention", "sliding_window", "full_attention", "mla_attention"]


def test_mamba_spec_fields() -> None:
    adapter = make_vllm_adapter(config((Mamba(4, "align", 2),)))
    spec = adapter.manager.kv_cache_config.kv_cache_groups[0].kv_cache_spec
    assert (spec.mamba_cache_mode, spec.num_speculative_blocks) == ("align", 2)


def test_eagle_groups_are_flagged() -> None:
    cfg = config((FullAttention(4), SlidingWindow(4, 8)), use_eagle=True, eagle_groups=(1,))
    adapter = make_vllm_adapter(cfg)
    flags = [g.is_eagle_group for g in adapter.manager.kv_cache_config.kv_cache_groups]
    assert flags == [False, True]


def test_sinkfull_construction_shim() -> None:
    stm = importlib.import_module("vllm.v1.core.single_type_kv_cache_manager")
    original = stm.SinkFullAttentionManager.__dict__["__init__"]
    cfg = config((SinkFullAttention(4, 8),), num_blocks=10)
    adapter = make_vllm_adapter(cfg)
    assert adapter.construction_workaround == "sinkfull-ctor"
    assert stm.SinkFullAttentionManager.__dict__["__init__"] is original  # patch restored
    manager = adapter.manager.coordinator.single_type_managers[0]
    assert type(manager).__name__ == "SinkFullAttentionManager"
    assert manager.scheduler_block_size == 4
    assert [b.block_id for b in manager.sink_blocks] == [1, 2]
    view = adapter.to_view()
    assert view.free_queue == (3, 4, 5, 6, 7, 8, 9)  # sink blocks 1..2 are gone
    assert view.ref_cnt == ()
    assert view.usage == pytest.approx(2 / 9)

    # Everything afterwards is plain vLLM: allocate, free, reset fails (sink).
    req = hasher(cfg).new_request("a", list(range(9)))
    assert adapter.allocate_slots(req, 9) == ((3, 4, 5),)
    adapter.free("a")
    assert adapter.to_view().free_queue == (5, 6, 7, 8, 9, 4, 3)
    assert adapter.reset_prefix_cache() is False


def test_sinkfull_in_a_hybrid() -> None:
    adapter = make_vllm_adapter(config((FullAttention(4), SinkFullAttention(4, 4)), num_blocks=10))
    assert adapter.construction_workaround == "sinkfull-ctor"
    assert adapter.to_view().free_queue == tuple(range(2, 10))


# ----------------------------------------------------------------- small scenarios


def test_free_order_and_hit() -> None:
    cfg = config((FullAttention(4),), num_blocks=8)
    adapter = make_vllm_adapter(cfg)
    h = hasher(cfg)
    a = h.new_request("a", list(range(14)))
    assert adapter.get_computed_blocks(a) == (((),), 0)
    assert adapter.allocate_slots(a, 14) == ((1, 2, 3, 4),)
    view = adapter.to_view()
    assert view.tables == (("a", ((1, 2, 3, 4),)),)
    assert sorted(ids for _, ids in view.cached) == [(1,), (2,), (3,)]
    adapter.free("a")
    assert adapter.to_view().free_queue == (4, 5, 6, 7, 3, 2, 1)

    b = h.new_request("b", list(range(14)))
    hits, n = adapter.get_computed_blocks(b)
    assert (hits, n) == (((1, 2, 3),), 12)
    assert adapter.allocate_slots(b, 2, n, hits) == ((4,),)
    assert adapter.get_block_ids("b") == ((1, 2, 3, 4),)


def test_cached_keys_are_digest_plus_group_id() -> None:
    cfg = config((FullAttention(4), SlidingWindow(4, 8)))
    adapter = make_vllm_adapter(cfg)
    req = hasher(cfg).new_request("a", list(range(10)))
    assert adapter.allocate_slots(req, 10) is not None
    view = adapter.to_view()
    assert view.cached
    assert all(len(key) == 36 for key, _ in view.cached)
    expected = {make_key(req.block_hashes[i], 0) for i in range(2)}
    assert expected <= {key for key, _ in view.cached}
    assert [key for key, _ in view.cached] == sorted(key for key, _ in view.cached)


def test_full_sequence_gate() -> None:
    prompt = list(range(100))
    fa_cfg = config((FullAttention(4),), num_blocks=8, max_num_batched_tokens=8)
    fa = make_vllm_adapter(fa_cfg)
    req = hasher(fa_cfg).new_request("a", prompt)
    assert fa.allocate_slots(req, 8, full_sequence_must_fit=True) is None

    swa_cfg = config((SlidingWindow(4, 8),), num_blocks=8, max_num_batched_tokens=8)
    swa = make_vllm_adapter(swa_cfg)
    req = hasher(swa_cfg).new_request("a", prompt)
    assert swa.allocate_slots(req, 8, full_sequence_must_fit=True) == ((1, 2),)


def test_watermark_and_reserved_blocks() -> None:
    cfg = config((FullAttention(4),), num_blocks=10, watermark=0.3)
    h = hasher(cfg)
    assert make_vllm_adapter(cfg).allocate_slots(h.new_request("a", [1] * 24), 24) is not None
    long_req = h.new_request("b", [1] * 28)
    assert make_vllm_adapter(cfg).allocate_slots(long_req, 28) is None
    assert make_vllm_adapter(cfg).allocate_slots(long_req, 28, has_scheduled_reqs=False) is not None
    running = replace(long_req, status=RequestStatus.RUNNING)
    assert make_vllm_adapter(cfg).allocate_slots(running, 28) is not None

    plain = config((FullAttention(4),), num_blocks=10)
    assert make_vllm_adapter(plain).allocate_slots(long_req, 28, reserved_blocks=3) is None
    assert make_vllm_adapter(plain).allocate_slots(long_req, 28, reserved_blocks=2) is not None


def test_mamba_same_step_hit_is_deferred() -> None:
    cfg = config((Mamba(4, "all"),))
    adapter = make_vllm_adapter(cfg)
    h = hasher(cfg)
    assert adapter.allocate_slots(h.new_request("a", list(range(10))), 10) == ((1, 2, 3),)
    b = h.new_request("b", list(range(10)))
    hits, n = adapter.get_computed_blocks(b)
    assert (hits, n) == (((0, 2),), 8)
    assert adapter.allocate_slots(b, 2, n, hits) is None
    adapter.new_step_starts()
    assert adapter.allocate_slots(b, 2, n, hits) == ((4,),)
    assert adapter.get_block_ids("b") == ((0, 2, 4),)
    assert dict(adapter.to_view().ref_cnt)[2] == 2


def test_common_prefix() -> None:
    cfg = config((FullAttention(4),))
    adapter = make_vllm_adapter(cfg)
    h = hasher(cfg)
    adapter.allocate_slots(h.new_request("a", list(range(10))), 10)
    b = h.new_request("b", [*range(9), 99])
    hits, n = adapter.get_computed_blocks(b)
    assert adapter.allocate_slots(b, 10 - n, n, hits) == ((4,),)
    assert adapter.get_block_ids("b") == ((1, 2, 4),)
    assert adapter.get_num_common_prefix_blocks("a") == (2,)
    adapter.allocate_slots(h.new_request("c", [50] * 10), 10)
    assert adapter.get_num_common_prefix_blocks("a") == (0,)


# ----------------------------------------------------------------- request mirroring


def test_hashes_match_kvspec_with_extra_keys_and_outputs() -> None:
    embeds = tuple(struct.pack("<4e", i, i + 0.5, 1.0, 2.0) for i in range(13))
    extras = [
        ExtraKeySource(),
        ExtraKeySource(lora=LoRA("adapter", 3)),
        ExtraKeySource(cache_salt="salt"),
        ExtraKeySource(mm_features=(MultiModalFeature("img", 2, 5), MultiModalFeature("v", 9, 3))),
        ExtraKeySource(prompt_embeds=embeds),
    ]
    for fn in ("sha256_cbor", "sha256", "xxhash", "xxhash_cbor"):
        cfg = config((FullAttention(4),), num_blocks=64, hash_function=fn, hash_seed="7")
        adapter = make_vllm_adapter(cfg)
        h = hasher(cfg)
        for j, extra in enumerate(extras):
            prompt = [0] * 13 if extra.prompt_embeds else [100 * j + t for t in range(13)]
            req = h.new_request(f"r{j}", prompt, extra)
            req = h.with_output_tokens(req, [5])
            assert adapter.allocate_slots(req, 14) is not None
            req = computed(h.with_output_tokens(req, [6, 7, 8, 9, 10]), 14)
            assert adapter.allocate_slots(req, 5) is not None
            keys = {key for key, _ in adapter.to_view().cached}
            assert {make_key(x, 0) for x in req.block_hashes} <= keys, (fn, j)


def test_adapters_with_different_seeds_coexist() -> None:
    cfgs = [config((FullAttention(4),), hash_seed=s) for s in ("0", "1")]
    adapters = [make_vllm_adapter(c) for c in cfgs]
    for step in range(3):
        for cfg, adapter in zip(cfgs, adapters, strict=True):
            req = hasher(cfg).new_request(f"r{step}", [step] * 9)
            assert adapter.allocate_slots(req, 9) is not None
            keys = {key for key, _ in adapter.to_view().cached}
            assert {make_key(x, 0) for x in req.block_hashes} <= keys
    keys0 = {k for k, _ in adapters[0].to_view().cached}
    keys1 = {k for k, _ in adapters[1].to_view().cached}
    assert not keys0 & keys1


def test_allocate_passes_the_exact_hit_object() -> None:
    cfg = config((FullAttention(4),))
    adapter = make_vllm_adapter(cfg)
    h = hasher(cfg)
    adapter.allocate_slots(h.new_request("a", list(range(10))), 10)
    b = h.new_request("b", list(range(10)))
    hits, n = adapter.get_computed_blocks(b)
    returned = adapter._last_hits["b"][1]
    seen: list[Any] = []
    real = adapter.manager.allocate_slots

    def spy(*args: Any, **kw: Any) -> Any:
        seen.append(kw["new_computed_blocks"])
        return real(*args, **kw)

    adapter.manager.allocate_slots = spy
    assert adapter.allocate_slots(b, 10 - n, n, hits) == ((4,),)
    assert seen[0] is returned
    adapter.allocate_slots(h.new_request("c", [7] * 5), 5, 0, ((),))
    assert seen[1] is None


def test_outputs_are_snapshots() -> None:
    cfg = config((FullAttention(4),))
    adapter = make_vllm_adapter(cfg)
    h = hasher(cfg)
    req = h.new_request("a", list(range(4)))
    first = adapter.allocate_slots(req, 4)
    before = adapter.get_block_ids("a")
    req = computed(h.with_output_tokens(req, [1, 2, 3, 4]), 4)
    adapter.allocate_slots(req, 4)
    assert first == before == ((1,),)
    assert adapter.get_block_ids("a") == ((1, 2),)
    assert adapter.get_block_ids("unknown") == ((),)


def test_deferred_free() -> None:
    cfg = config((FullAttention(4),), num_blocks=8)
    adapter = make_vllm_adapter(cfg)
    adapter.allocate_slots(hasher(cfg).new_request("a", list(range(14))), 14)
    popped = adapter.pop_blocks_for_free("a")
    assert popped == (1, 2, 3, 4)
    assert adapter.to_view().tables == ()
    assert adapter.reset_prefix_cache() is False
    adapter.free_blocks(tuple(reversed(popped)))
    assert adapter.to_view().free_queue == (4, 5, 6, 7, 3, 2, 1)
    with pytest.raises(DoubleFreeError):
        adapter.free_blocks([1])
    assert adapter.pop_blocks_for_free("a") == ()
    adapter.free("never-seen")


def test_events_stats_and_reset() -> None:
    cfg = config(
        (FullAttention(4), SlidingWindow(4, 8)),
        num_blocks=32,
        enable_kv_cache_events=True,
        log_stats=True,
    )
    adapter = make_vllm_adapter(cfg)
    h = hasher(cfg)
    req = h.new_request("a", list(range(10)), ExtraKeySource(lora=LoRA("x", 2)))
    assert adapter.get_computed_blocks(req) == (((), ()), 0)
    adapter.allocate_slots(req, 10)
    events = adapter.take_events()
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert [(e.group_idx, e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window) for e in stored] == [
        (0, "full_attention", None),
        (1, "sliding_window", 8),
    ]
    first = stored[0]
    assert isinstance(first.token_ids, tuple)
    assert first.token_ids == tuple(range(8))
    assert isinstance(first.block_hashes, tuple)
    assert all(isinstance(x, int) for x in first.block_hashes)
    assert (first.lora_id, first.lora_name, first.medium) == (2, "x", "GPU")
    assert first.extra_keys == (("x",), ("x",))
    assert adapter.take_events() == []

    adapter.evict_blocks([2, 1, 2])
    events = adapter.take_events()
    removed = [e for e in events if isinstance(e, BlockRemoved)]
    assert len(removed) == len(events)
    assert [(e.block_hashes, e.group_idx) for e in removed] == [
        ((first.block_hashes[0],), 0),
        ((first.block_hashes[1],), 0),
    ]

    stats = adapter.make_prefix_cache_stats()
    assert stats == PrefixCacheStats(requests=1, queries=10, hits=0)
    adapter.free("a")
    assert adapter.reset_prefix_cache() is True
    assert adapter.take_events() == [AllBlocksCleared()]
    assert adapter.make_prefix_cache_stats() == PrefixCacheStats(reset=True)
    assert adapter.to_view().cached == ()


def test_bytes_event_hashes() -> None:
    cfg = config((FullAttention(4),), enable_kv_cache_events=True, int_block_hashes=False)
    adapter = make_vllm_adapter(cfg)
    req = hasher(cfg).new_request("a", list(range(8)))
    adapter.allocate_slots(req, 8)
    (event,) = adapter.take_events()
    assert isinstance(event, BlockStored)
    assert event.block_hashes == req.block_hashes


def test_take_new_block_ids_and_usage() -> None:
    cfg = config((FullAttention(4), Mamba(4, "all")), num_blocks=11)
    adapter = make_vllm_adapter(cfg)
    adapter.allocate_slots(hasher(cfg).new_request("a", list(range(8))), 8)
    assert adapter.take_new_block_ids() == [1, 2]
    assert adapter.take_new_block_ids() == []
    assert adapter.usage == pytest.approx(0.4)


def test_caching_disabled_cache_blocks_is_lenient() -> None:
    cfg = config((FullAttention(4), CrossAttention(4)), enable_caching=False)
    adapter = make_vllm_adapter(cfg)
    req = hasher(cfg).new_request("a", list(range(8)))
    assert adapter.allocate_slots(req, 8, num_encoder_tokens=6) == ((1, 2), (3, 4))
    adapter.cache_blocks(req, 10_000)
    assert adapter.to_view().cached == ()
    assert adapter.get_num_common_prefix_blocks("a") == (0, 0)


# ----------------------------------------------------------------- caller errors


@dataclass
class Scene:
    adapter: VllmAdapter
    h: RequestBlockHasher
    a: Request  # allocated: 10 tokens, table [1, 2, 3], blocks 1 and 2 hashed
    b: Request  # same 10 tokens, never allocated


def scene() -> Scene:
    cfg = config((FullAttention(4),), num_blocks=8, max_model_len=32)
    adapter = make_vllm_adapter(cfg)
    h = hasher(cfg)
    a = h.new_request("a", list(range(10)))
    assert adapter.allocate_slots(a, 10) == ((1, 2, 3),)
    return Scene(adapter, h, computed(a, 10), h.new_request("b", list(range(10))))


def _cache_beyond_table(s: Scene) -> None:
    longer = s.h.with_output_tokens(s.a, list(range(10)))
    s.adapter.cache_blocks(longer, 16)


Action = Callable[[Scene], object]

ERRORS: list[tuple[str, Action, type[KVCacheError]]] = [
    ("negative N", lambda s: s.adapter.allocate_slots(s.b, -1), InvalidTokenCountError),
    ("negative H", lambda s: s.adapter.allocate_slots(s.b, 4, -4), InvalidTokenCountError),
    (
        "negative K",
        lambda s: s.adapter.allocate_slots(s.b, 4, num_lookahead_tokens=-1),
        InvalidTokenCountError,
    ),
    (
        "negative E",
        lambda s: s.adapter.allocate_slots(s.b, 4, num_external_computed_tokens=-1),
        InvalidTokenCountError,
    ),
    (
        "negative enc",
        lambda s: s.adapter.allocate_slots(s.b, 4, num_encoder_tokens=-1),
        InvalidTokenCountError,
    ),
    (
        "negative reserved",
        lambda s: s.adapter.allocate_slots(s.b, 4, reserved_blocks=-1),
        InvalidTokenCountError,
    ),
    (
        "negative computed",
        lambda s: s.adapter.allocate_slots(replace(s.b, num_computed_tokens=-4), 4),
        InvalidTokenCountError,
    ),
    ("N == E == 0", lambda s: s.adapter.allocate_slots(s.b, 0), InvalidTokenCountError),
    (
        "negative N before group count",
        lambda s: s.adapter.allocate_slots(s.b, -1, 0, ((), ())),
        InvalidTokenCountError,
    ),
    ("group count", lambda s: s.adapter.allocate_slots(s.b, 4, 0, ((), ())), GroupCountError),
    (
        "group count before max len",
        lambda s: s.adapter.allocate_slots(s.b, 99, 0, ((), ())),
        GroupCountError,
    ),
    ("max model len", lambda s: s.adapter.allocate_slots(s.b, 33), ExceedsMaxModelLenError),
    (
        "max model len of running request",
        lambda s: s.adapter.allocate_slots(s.a, 23),
        ExceedsMaxModelLenError,
    ),
    (
        "hits for a running request",
        lambda s: s.adapter.allocate_slots(s.a, 1, 4, ((1,),)),
        UnexpectedPrefixHitError,
    ),
    (
        "hit id out of range",
        lambda s: s.adapter.allocate_slots(s.b, 2, 8, ((1, 99),)),
        InvalidBlockIdError,
    ),
    (
        "negative hit id",
        lambda s: s.adapter.allocate_slots(s.b, 2, 8, ((-1, 2),)),
        InvalidBlockIdError,
    ),
    ("hit at wrong index", lambda s: s.adapter.allocate_slots(s.b, 2, 8, ((2, 1),)), StaleHitError),
    ("unhashed hit", lambda s: s.adapter.allocate_slots(s.b, 2, 8, ((1, 3),)), StaleHitError),
    (
        "hit beyond the request's hashes",
        lambda s: s.adapter.allocate_slots(s.h.new_request("c", list(range(5))), 1, 4, ((1, 2),)),
        StaleHitError,
    ),
    ("free id out of range", lambda s: s.adapter.free_blocks([8]), InvalidBlockIdError),
    ("free of a held block", lambda s: s.adapter.free_blocks([0, 1]), DoubleFreeError),
    ("evict id out of range", lambda s: s.adapter.evict_blocks([1, 99]), InvalidBlockIdError),
    (
        "negative skipped total",
        lambda s: s.adapter.remove_skipped_blocks("a", -1),
        InvalidTokenCountError,
    ),
    (
        "common prefix of unknown request",
        lambda s: s.adapter.get_num_common_prefix_blocks("zzz"),
        UnknownRequestError,
    ),
    ("cache negative", lambda s: s.adapter.cache_blocks(s.a, -1), InvalidTokenCountError),
    (
        "cache beyond the tokens",
        lambda s: s.adapter.cache_blocks(s.a, 11),
        CacheBeyondAllocationError,
    ),
    ("cache beyond the table", _cache_beyond_table, CacheBeyondAllocationError),
    (
        "cache for an unallocated request",
        lambda s: s.adapter.cache_blocks(s.b, 8),
        CacheBeyondAllocationError,
    ),
]


@pytest.mark.parametrize(("action", "error"), [(a, e) for _, a, e in ERRORS], ids=[n for n, _, _ in ERRORS])
def test_caller_errors_leave_state_unchanged(action: Action, error: type[KVCacheError]) -> None:
    s = scene()
    before = s.adapter.to_view()
    with pytest.raises(error):
        action(s)
    assert s.adapter.to_view() == before
    managers = s.adapter.manager.coordinator.single_type_managers
    assert "zzz" not in managers[0].req_to_blocks


def test_stale_hit_leaves_state_unchanged() -> None:
    s = scene()
    hits, n = s.adapter.get_computed_blocks(s.b)
    s.adapter.evict_blocks([2])
    before = s.adapter.to_view()
    with pytest.raises(StaleHitError):
        s.adapter.allocate_slots(s.b, 10 - n, n, hits)
    assert s.adapter.to_view() == before


def test_popped_blocks_can_be_freed_once() -> None:
    s = scene()
    popped = s.adapter.pop_blocks_for_free("a")
    before = s.adapter.to_view()
    with pytest.raises(DoubleFreeError):
        s.adapter.free_blocks([1, 1])
    assert s.adapter.to_view() == before
    s.adapter.free_blocks([0, *reversed(popped)])
    assert s.adapter.to_view().free_queue == (3, 4, 5, 6, 7, 2, 1)
    with pytest.raises(DoubleFreeError):
        s.adapter.free_blocks([3])


def test_evict_blocks_in_ascending_order() -> None:
    s = scene()
    s.adapter.evict_blocks({2, 1})
    view = s.adapter.to_view()
    assert view.cached == ()
    assert view.ref_cnt == ((1, 1), (2, 1), (3, 1))


def test_lora_ids_below_one_are_rejected_when_the_request_is_built() -> None:
    """vLLM's LoRARequest rejects ids < 1; kvspec rejects them in the LoRA value."""
    with pytest.raises(InvalidRequestError, match="adapter_id must be >= 1"):
        LoRA("x", 0)


def test_duplicate_blocks_under_one_key_keep_insertion_order() -> None:
    cfg = config((FullAttention(4),))
    adapter = make_vllm_adapter(cfg)
    h = hasher(cfg)
    assert adapter.allocate_slots(h.new_request("a", list(range(8))), 8) == ((1, 2),)
    assert adapter.allocate_slots(h.new_request("b", list(range(8))), 8) == ((3, 4),)
    assert sorted(ids for _, ids in adapter.to_view().cached) == [(1, 3), (2, 4)]
    adapter.evict_blocks([1])
    assert sorted(ids for _, ids in adapter.to_view().cached) == [(2, 4), (3,)]


def test_preempted_lookups_are_counted_separately() -> None:
    cfg = config((FullAttention(4),), log_stats=True)
    adapter = make_vllm_adapter(cfg)
    h = hasher(cfg)
    adapter.allocate_slots(h.new_request("a", list(range(9))), 9)
    again = replace(h.new_request("b", list(range(9))), num_preemptions=1)
    assert adapter.get_computed_blocks(again) == (((1, 2),), 8)
    assert adapter.make_prefix_cache_stats() == PrefixCacheStats(
        preempted_requests=1, preempted_queries=9, preempted_hits=8
    )
    assert adapter.get_computed_blocks(replace(again, skip_reading_prefix_cache=True)) == (
        ((),),
        0,
    )


# ----------------------------------------------------------------- one smoke test per API era


def _era_param(era: type[VllmApi]) -> Any:
    """``era``, skipped unless the installed release belongs to it."""
    here = era_for(RELEASE) is era
    reason = f"era {era.era} ({', '.join(era.verified)}); vLLM {RELEASE} is installed"
    return pytest.param(era, id=f"era-{era.era}", marks=pytest.mark.skipif(not here, reason=reason))


ERA_PARAMS = [_era_param(e) for e in ERAS]


def _expect_unsupported(method: str, call: Callable[[], object]) -> None:
    with pytest.raises(Unsupported, match=rf"^vLLM {RELEASE} has no KVCacheManager\.{method}") as info:
        call()
    assert (info.value.release, info.value.method) == (RELEASE, f"KVCacheManager.{method}")


class TestEraSmoke:
    """The adapter constructs, drives and views the installed release through its era.

    Release-independent facts only (what every release shares); exact
    behaviour differences between releases are the spec profiles' business.
    """

    @any_release
    @pytest.mark.parametrize("era", ERA_PARAMS)
    def test_the_installed_release_has_this_era(self, era: type[VllmApi]) -> None:
        adapter = make_vllm_adapter(config((FullAttention(4),)))
        assert type(adapter.api) is era
        assert adapter.semantics == DeclaredSemantics(profile=f"vllm-{RELEASE}", upstream=True)
        assert installed_vllm_version() == RELEASE

    @any_release
    @pytest.mark.parametrize("era", ERA_PARAMS)
    def test_every_kind_constructs(self, era: type[VllmApi]) -> None:
        kinds: list[tuple[AttentionKind, ...]] = [(k,) for k, _, _ in SINGLE_KINDS] + [g for g, _, _ in HYBRIDS]
        for groups in kinds:
            caching = not any(isinstance(k, CrossAttention) for k in groups)
            cfg = config(groups, enable_caching=caching)
            mamba_modes = {k.mode for k in groups if isinstance(k, Mamba)}
            if era.since >= (0, 33, 0) and mamba_modes - {"align"}:
                with pytest.raises(ConfigError, match="only in mode 'align'"):
                    make_vllm_adapter(cfg)
                continue
            adapter = make_vllm_adapter(cfg)
            assert adapter.construction_workaround is None
            view = adapter.to_view()
            assert view.free_queue == tuple(range(1, 16)), groups
            assert (view.ref_cnt, view.cached, view.tables, view.usage) == ((), (), (), 0.0)

    @any_release
    @pytest.mark.parametrize("era", ERA_PARAMS)
    def test_sinkfull_constructs(self, era: type[VllmApi]) -> None:
        adapter = make_vllm_adapter(config((SinkFullAttention(4, 8),), num_blocks=10))
        expected = None if era.sinkfull_ctor_defect is None else "sinkfull-ctor"
        assert adapter.construction_workaround == expected
        sink = (1, 2) if era.sinkfull_reserves_sink_blocks else ()
        assert adapter.to_view().free_queue == tuple(b for b in range(1, 10) if b not in sink)
        req = hasher(adapter.config).new_request("a", list(range(9)))
        table = adapter.allocate_slots(req, 9)
        assert table is not None
        assert len(table[0]) == 3
        assert not set(table[0]) & set(sink)

    @any_release
    @pytest.mark.parametrize("era", ERA_PARAMS)
    def test_facade_round_trip(self, era: type[VllmApi]) -> None:
        cfg = config(
            (FullAttention(4), SlidingWindow(4, 8)), num_blocks=32, enable_kv_cache_events=True, log_stats=True
        )
        adapter = make_vllm_adapter(cfg)
        h = hasher(cfg)
        a = h.new_request("a", list(range(10)))
        assert adapter.get_computed_blocks(a) == (((), ()), 0)
        new = adapter.allocate_slots(a, 10)
        assert new is not None
        assert [len(g) for g in new] == [3, 3]
        assert adapter.get_block_ids("a") == new
        assert adapter.to_view().tables == (("a", new),)
        stored = [e for e in adapter.take_events() if isinstance(e, BlockStored)]
        assert stored
        assert all(len(e.token_ids) == 8 for e in stored)
        assert len(adapter.to_view().cached) >= 2
        adapter.make_prefix_cache_stats()  # drained: the release may have counted "a"'s lookup

        b = h.new_request("b", list(range(10)))
        hits, n = adapter.get_computed_blocks(b)
        assert n == 8
        assert hits[0] == new[0][:2]
        if era.caller_records_stats:
            assert adapter.make_prefix_cache_stats() == PrefixCacheStats()
            adapter.record_prefix_cache_stats(b, n)
        else:
            _expect_unsupported("record_prefix_cache_stats", lambda: adapter.record_prefix_cache_stats(b, n))
        assert adapter.make_prefix_cache_stats() == PrefixCacheStats(requests=1, queries=10, hits=8)
        got = adapter.allocate_slots(b, 2, n, hits)
        assert got is not None
        ref_cnt = dict(adapter.to_view().ref_cnt)
        assert all(ref_cnt[i] == 2 for i in hits[0])
        if "get_num_common_prefix_blocks" in era.missing_methods:
            _expect_unsupported("get_num_common_prefix_blocks", lambda: adapter.get_num_common_prefix_blocks("a"))
        else:
            assert len(adapter.get_num_common_prefix_blocks("a")) == 2
        if era.has_num_cached_tokens:
            assert adapter.get_num_cached_tokens(h.new_request("c", list(range(10)))) == 8
        else:
            _expect_unsupported("get_num_cached_tokens", lambda: adapter.get_num_cached_tokens(b))
        adapter.remove_skipped_blocks("a", 10)
        assert 0 < adapter.usage < 1

        if "pop_blocks_for_free" in era.missing_methods:
            _expect_unsupported("pop_blocks_for_free", lambda: adapter.pop_blocks_for_free("b"))
            adapter.free("b")
        else:
            popped = adapter.pop_blocks_for_free("b")
            assert set(popped) - {0}
            adapter.free_blocks(tuple(reversed(popped)))
        for method in ("take_new_block_ids", "new_step_starts"):
            call = getattr(adapter, method)
            if method in era.missing_methods:
                _expect_unsupported(method, call)
            else:
                call()
        adapter.evict_blocks(hits[0])
        removed = [e for e in adapter.take_events() if isinstance(e, BlockRemoved)]
        assert len(removed) == 2
        assert adapter.reset_prefix_cache() is False  # "a" still holds blocks
        adapter.free("a")
        assert adapter.reset_prefix_cache() is True
        assert adapter.take_events()[-1:] == [AllBlocksCleared()]
        view = adapter.to_view()
        assert (view.ref_cnt, view.cached, view.tables, view.usage) == ((), (), (), 0.0)
        assert sorted(view.free_queue) == list(range(1, 32))

    @any_release
    @pytest.mark.parametrize("era", ERA_PARAMS)
    def test_missing_parameters_are_unsupported(self, era: type[VllmApi]) -> None:
        cfg = config((FullAttention(4),))
        adapter = make_vllm_adapter(cfg)
        req = hasher(cfg).new_request("a", list(range(8)))
        before = adapter.to_view()
        allocations: dict[str, Callable[[], object]] = {
            "full_sequence_must_fit": lambda: adapter.allocate_slots(req, 8, full_sequence_must_fit=True),
            "reserved_blocks": lambda: adapter.allocate_slots(req, 8, reserved_blocks=1),
            "has_scheduled_reqs": lambda: adapter.allocate_slots(req, 8, has_scheduled_reqs=False),
        }
        for name, call in allocations.items():
            if name in era.allocate_args:
                continue
            with pytest.raises(Unsupported, match=rf"^vLLM {RELEASE} has no KVCacheManager\.allocate_slots\({name}"):
                call()
            assert adapter.to_view() == before
        configs = {
            "watermark": replace(cfg, watermark=0.1),
            "max_num_batched_tokens": replace(cfg, max_num_batched_tokens=16),
        }
        for name, changed in configs.items():
            if era.manager_args[name] is None:
                with pytest.raises(Unsupported, match=rf"^vLLM {RELEASE} has no KVCacheManager\({name}"):
                    make_vllm_adapter(changed)
            else:
                make_vllm_adapter(changed)
        assert adapter.allocate_slots(req, 8) is not None


def test_secondary_keys_keep_insertion_order() -> None:
    """vLLM's per-block set of secondary keys iterates in an order that changes
    with PYTHONHASHSEED; the adapter's replacement keeps insertion order for
    what the pool does with it (add, pop and walk, membership, clear), and
    leaves a pool without the map (before vLLM 0.26.0) or a used map alone."""
    from kvref.adapters.vllm.adapter import pin_secondary_key_order  # noqa: PLC0415

    class Pool:
        cached_block_hashes_by_block: dict[int, set[bytes]]

    pool = Pool()
    pool.cached_block_hashes_by_block = {}
    pin_secondary_key_order(pool)
    keys = pool.cached_block_hashes_by_block
    order = [bytes([b]) * 8 for b in (9, 1, 5, 3, 7)]
    for key in order:
        keys.setdefault(4, set()).add(key)
    keys.setdefault(4, set()).add(order[0])  # already there: stays first
    assert 4 in keys and list(keys[4]) == order
    walked: list[bytes] = []
    walked.extend(keys.pop(4, ()))
    assert walked == order and 4 not in keys
    keys.setdefault(2, set()).add(order[1])
    keys.clear()
    assert not keys

    old = Pool()
    pin_secondary_key_order(old)
    assert not hasattr(old, "cached_block_hashes_by_block")
    used = Pool()
    used.cached_block_hashes_by_block = {1: {b"k"}}
    pin_secondary_key_order(used)
    assert type(used.cached_block_hashes_by_block) is dict


@any_release
def test_an_internal_a_release_reorganised_is_one_line_not_a_crash() -> None:
    """The prefix-cache map is read in both known layouts; any other, or a
    manager without an internal the views read, is :class:`CannotRead`."""
    api = loaded_api()
    block = api.ku.KVCacheBlock(3)
    old = SimpleNamespace(cached_block_hash_to_block=SimpleNamespace(_cache={b"k": block, b"d": {3: block}}))
    assert list(api.cached_entries(old)) == [(b"k", (3,)), (b"d", (3,))]
    new = SimpleNamespace(
        cached_block_hash_to_block=SimpleNamespace(_cache={b"k": 3, b"d": 5}, _dup_ids={b"d": {5: None, 2: None}})
    )
    assert list(api.cached_entries(new)) == [(b"k", (3,)), (b"d", (5, 2))]
    strange = SimpleNamespace(cached_block_hash_to_block=SimpleNamespace(_cache={b"k": "3"}))
    with pytest.raises(CannotRead, match=r"^cannot read the prefix-cache map .*\(an entry is a str\)"):
        list(api.cached_entries(strange))
    with pytest.raises(CannotRead, match=r"^cannot read KVCacheManager.block_pool on vLLM"):
        api.check_readable(SimpleNamespace())
    adapter = make_vllm_adapter(config((FullAttention(4),)))
    api.check_readable(adapter.manager)  # the real manager reads


@any_release
def test_a_method_a_newer_release_dropped_is_unsupported_not_a_crash() -> None:
    adapter = make_vllm_adapter(config((FullAttention(4),)))
    with pytest.raises(Unsupported, match=r"has no KVCacheManager\.take_events: the release has no such method"):
        adapter.api.method(SimpleNamespace(), "take_events")
    assert adapter.api.method(adapter.manager, "take_events")() == []
