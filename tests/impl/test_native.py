"""kvimpl's native core: selection and fallback, requests, the array API, lockstep.

The native manager must agree with kvspec and with the pure-Python manager
wherever it runs, and must refuse (so that kvimpl falls back to Python) every
configuration it does not implement: cross attention, more than 64 groups, a
profile switch it does not follow, a missing build. KV-cache events are the
core's own: the same events as the Python manager's, in the same order.
"""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
import textwrap
from array import array
from typing import Any

import pytest

from kvimpl import PROFILE_SWITCHES, native
from kvimpl.kv_cache_manager import KVCacheManager as PythonManager
from kvimpl.native import NativeKVCacheManager, create_manager, native_unsupported
from kvimpl.request import Request as MutableRequest
from kvimpl.request import RequestHasher
from kvref.adapters import load_factory
from kvref.adapters.impl import ImplAdapter, NativeImplAdapter
from kvref.cli import main
from kvspec.config import CrossAttention, FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.errors import (
    InvalidTokenCountError,
    KVCacheError,
    StaleHitError,
    UnknownRequestError,
    UnsupportedByProfileError,
    UnsupportedOperationError,
)
from kvspec.hashing import ExtraKeySource, LoRA
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.profiles import NEWEST, PROFILES, VLLM_0_25_1, VLLM_0_33_0, SemanticsProfile
from kvspec.request import RequestBlockHasher, RequestStatus

BUILT = native.native_module() is not None
needs_build = pytest.mark.skipif(not BUILT, reason="the native extension is not built here")
CONFIG = KVCacheConfig(num_blocks=64, groups=(FullAttention(4), SlidingWindow(4, 8)), max_model_len=128)


def built(target: str, config: KVCacheConfig) -> object:
    """The adapter ``--target target`` builds for ``config``."""
    return load_factory(target)(config)


@needs_build
def test_selection_follows_kvref_native(monkeypatch: pytest.MonkeyPatch) -> None:
    """Native by default; KVREF_NATIVE=0 or native=False selects the Python manager."""
    monkeypatch.delenv("KVREF_NATIVE", raising=False)  # the default, also when the suite runs with KVREF_NATIVE=0
    assert isinstance(create_manager(CONFIG), NativeKVCacheManager)
    assert type(create_manager(CONFIG, native=False)) is PythonManager
    monkeypatch.setenv("KVREF_NATIVE", "0")
    assert type(create_manager(CONFIG)) is PythonManager
    assert isinstance(create_manager(CONFIG, native=True), NativeKVCacheManager)


@needs_build
@pytest.mark.parametrize(
    ("config", "why"),
    [
        (
            KVCacheConfig(
                num_blocks=64, groups=(FullAttention(4), CrossAttention(4)), max_model_len=128, enable_caching=False
            ),
            "Cross",
        ),
        (KVCacheConfig(num_blocks=4096, groups=(FullAttention(4),) * 65, max_model_len=128), "65 groups"),
    ],
)
def test_unimplemented_configurations_fall_back(config: KVCacheConfig, why: str) -> None:
    """What the core does not implement runs on the Python manager, and impl-native refuses it."""
    reason = native_unsupported(config)
    assert reason is not None
    assert why in reason
    assert type(create_manager(config)) is PythonManager
    assert type(built("impl", config)) is ImplAdapter
    with pytest.raises(UnsupportedByProfileError, match="native core"):
        built("impl-native", config)
    with pytest.raises(UnsupportedByProfileError, match=why):  # the constructor's own, typed refusal
        NativeKVCacheManager(config)


@needs_build
def test_a_switch_the_core_does_not_follow_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile setting a switch away from its default that the core does not
    know runs on Python (here: the core is made to forget one it knows)."""
    assert native.NATIVE_SWITCHES <= PROFILE_SWITCHES
    profile, switch = next(
        (p, f.name)
        for p in PROFILES.values()
        if all(g.name in native.NATIVE_SWITCHES for g in _set_switches(p))
        for f in dataclasses.fields(p)
        if f.name in native.NATIVE_SWITCHES and getattr(p, f.name) != f.default
    )
    config = dataclasses.replace(CONFIG, profile=profile)
    assert native_unsupported(config) is None
    monkeypatch.setattr(native, "NATIVE_SWITCHES", native.NATIVE_SWITCHES - {switch})
    reason = native_unsupported(config)
    assert reason is not None
    assert switch in reason
    assert type(create_manager(config)) is PythonManager
    assert type(built("impl", config)) is ImplAdapter


def _set_switches(p: SemanticsProfile) -> list[dataclasses.Field[object]]:
    """The switches profile ``p`` sets away from their defaults (0.16.0's are not all native)."""
    return [f for f in dataclasses.fields(p) if f.name not in ("name", "release") and getattr(p, f.name) != f.default]


def test_a_missing_build_falls_back_with_one_notice(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the extension, asking for the native core gives the Python manager and one line on stderr."""
    monkeypatch.delenv("KVREF_NATIVE", raising=False)  # the default selection, also under KVREF_NATIVE=0
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_import_error", "No module named 'kvimpl._kvnative'")
    monkeypatch.setattr(native, "_noticed", False)
    assert type(create_manager(CONFIG, native=True)) is PythonManager
    assert type(create_manager(CONFIG, native=True)) is PythonManager
    assert type(create_manager(CONFIG)) is PythonManager
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "pure-Python" in err
    assert type(built("impl", CONFIG)) is ImplAdapter
    with pytest.raises(UnsupportedByProfileError, match="not built"):
        built("impl-native", CONFIG)


@needs_build
def test_impl_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    """``impl`` is the native core where it applies, ``impl-python`` never."""
    monkeypatch.delenv("KVREF_NATIVE", raising=False)  # the default selection, also under KVREF_NATIVE=0
    assert type(built("impl", CONFIG)) is NativeImplAdapter
    assert type(built("impl-native", CONFIG)) is NativeImplAdapter
    assert type(built("impl-python", CONFIG)) is ImplAdapter


@pytest.mark.parametrize("build", [False, pytest.param(True, marks=needs_build)])
@pytest.mark.parametrize("hash_function", ["sha256_cbor", "sha256"])
def test_mutable_requests_hash_like_the_spec(build: bool, hash_function: str) -> None:
    """Advanced in place one token at a time, a kvimpl request has kvspec's block hashes
    (under vLLM 0.33.0, the newest release whose requests the C request can hold:
    from 0.34.0 on the hasher makes Python ones, ``tests/impl/test_release_0_34.py``)."""
    config = dataclasses.replace(CONFIG, hash_function=hash_function, profile=VLLM_0_33_0)
    spec_hasher = RequestBlockHasher.for_config(config)
    hasher = RequestHasher.for_config(config, native=build)
    rng = random.Random(1)
    prompt = [rng.randrange(50000) for _ in range(23)]
    want = spec_hasher.new_request("r", prompt)
    got = hasher.new_request("r", prompt)
    assert (type(got) is MutableRequest) is not build
    for _ in range(30):
        token = rng.randrange(50000)
        want = spec_hasher.with_output_tokens(want, [token])
        got.append_output_token_ids(token)
        assert got.block_hashes == want.block_hashes
        assert got.all_token_ids == want.all_token_ids
        assert got.num_tokens == want.num_tokens


def _drive(manager: Any, hasher: Any, steps: int, seed: int) -> list[Any]:
    """A seeded decode-and-admit run through the object API; every result in order."""
    rng = random.Random(seed)
    reqs: dict[str, Any] = {}
    out: list[Any] = []
    for step in range(steps):
        manager.new_step_starts()
        for rid, r in list(reqs.items()):
            got = manager.allocate_slots(r, 1)
            out.append(got)
            if got is None or rng.random() < 0.1:
                manager.free(rid)
                del reqs[rid]
                continue
            r.num_computed_tokens += 1
            r.append_output_token_ids(rng.randrange(100))
        rid = f"r{step}"
        r = hasher.new_request(rid, [rng.randrange(100) for _ in range(rng.randint(1, 20))])
        hits, n = manager.get_computed_blocks(r)
        got = manager.allocate_slots(r, r.num_tokens - n, n, hits if any(hits) else None)
        out.append((n, got))
        if got is not None:
            r.num_computed_tokens = r.num_tokens
            r.status = RequestStatus.RUNNING
            r.append_output_token_ids(rng.randrange(100))
            reqs[rid] = r
    out.append(manager.to_view())
    return out


@needs_build
@pytest.mark.parametrize(
    "groups", [(FullAttention(4),), (FullAttention(4), SlidingWindow(4, 8)), (FullAttention(4), Mamba(4))]
)
def test_native_and_python_agree_on_mutable_requests(groups: tuple[Any, ...]) -> None:
    """The same scheduler run on both builds, each with its own requests: same results and view."""
    config = KVCacheConfig(num_blocks=48, groups=groups, max_model_len=128, profile=VLLM_0_25_1)
    py = _drive(PythonManager(config), RequestHasher.for_config(config, native=False), 60, 3)
    nat = _drive(NativeKVCacheManager(config), RequestHasher.for_config(config, native=True), 60, 3)
    assert py == nat


def _drive_events(manager: Any, hasher: Any, steps: int, seed: int) -> list[Any]:
    """A seeded run on a small pool (evictions), with LoRA requests, explicit
    evictions and prefix-cache resets; the events of every step in order."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(50) for _ in range(12)] for _ in range(3)]
    loras = [ExtraKeySource(), ExtraKeySource(lora=LoRA("a", 1, "/a"))]
    reqs: dict[str, Any] = {}
    out: list[Any] = []
    for step in range(steps):
        manager.new_step_starts()
        for rid, r in list(reqs.items()):
            got = manager.allocate_slots(r, 1)
            if got is None or rng.random() < 0.15:
                manager.free(rid)
                del reqs[rid]
                continue
            r.num_computed_tokens += 1
            r.append_output_token_ids(rng.randrange(50))
        prompt = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randint(0, 9))]
        r = hasher.new_request(f"r{step}", prompt, rng.choice(loras))
        hits, n = manager.get_computed_blocks(r)
        got = manager.allocate_slots(r, r.num_tokens - n, n, hits if any(hits) else None)
        if got is not None:
            r.num_computed_tokens = r.num_tokens
            r.status = RequestStatus.RUNNING
            r.append_output_token_ids(rng.randrange(50))
            reqs[f"r{step}"] = r
        if rng.random() < 0.1:
            manager.evict_blocks(rng.sample(range(1, 40), 5))
        if rng.random() < 0.05:
            for rid in list(reqs):
                manager.free(rid)
            reqs.clear()
            out.append(manager.reset_prefix_cache())
        manager.check_invariants()
        out.append(manager.take_events())
    out.append(manager.to_view())
    return out


@needs_build
@pytest.mark.parametrize("request_build", [True, False], ids=["c-requests", "python-requests"])
@pytest.mark.parametrize(
    ("groups", "profile"),
    [
        ((FullAttention(4),), NEWEST),
        ((FullAttention(4), SlidingWindow(4, 8)), NEWEST),
        ((FullAttention(4), SlidingWindow(4, 8)), VLLM_0_25_1),
        ((FullAttention(4), Mamba(4, mode="all")), VLLM_0_25_1),
    ],
)
def test_native_events_are_the_python_managers(groups: tuple[Any, ...], profile: Any, request_build: bool) -> None:
    """With events on, the native core runs (no fallback) and emits the Python
    manager's events: same order, hashes, parents, tokens, extra keys, kinds."""
    config = KVCacheConfig(
        num_blocks=40, groups=groups, max_model_len=128, enable_kv_cache_events=True, profile=profile
    )
    assert native_unsupported(config) is None
    py = _drive_events(PythonManager(config), RequestHasher.for_config(config, native=False), 80, 7)
    nat = _drive_events(NativeKVCacheManager(config), RequestHasher.for_config(config, native=request_build), 80, 7)
    assert sum(len(x) for x in py if isinstance(x, list)) > 50
    assert py == nat


@needs_build
def test_native_events_off_records_nothing() -> None:
    """Without enable_kv_cache_events the core keeps no records."""
    m = NativeKVCacheManager(CONFIG)
    r = m.new_request("a", list(range(20)))
    assert m.allocate_slots(r, 20) is not None
    assert m._pending_raw_events() == []
    assert m.take_events() == []


@needs_build
def test_array_api_matches_the_object_api() -> None:
    """allocate_slots_array and advance_array give the blocks allocate_slots gives, request for request
    (under vLLM 0.33.0: the array API takes C requests, which from 0.34.0 on the hasher does not make)."""
    config = KVCacheConfig(
        num_blocks=256, groups=(FullAttention(4), SlidingWindow(4, 8)), max_model_len=256, profile=VLLM_0_33_0
    )
    a, b = NativeKVCacheManager(config), NativeKVCacheManager(config)
    ha, hb = RequestHasher.for_config(config, native=True), RequestHasher.for_config(config, native=True)
    rng = random.Random(5)
    rids = [f"r{i}" for i in range(6)]
    ra, rb = {}, {}
    for rid in rids:
        prompt = [rng.randrange(100) for _ in range(rng.randint(3, 30))]
        ra[rid], rb[rid] = ha.new_request(rid, prompt), hb.new_request(rid, prompt)
        for m, r in ((a, ra[rid]), (b, rb[rid])):
            assert m.allocate_slots(r, r.num_tokens) is not None
            r.num_computed_tokens = r.num_tokens
            r.status = RequestStatus.RUNNING
    handles = array("i", [b.handle(rid) for rid in rids])
    for _ in range(20):
        tokens = [rng.randrange(100) for _ in rids]
        want = []
        for rid, t in zip(rids, tokens, strict=True):
            ra[rid].append_output_token_ids(t)
            want.append(a.allocate_slots(ra[rid], 1))
            ra[rid].num_computed_tokens += 1
        b.advance_array(handles, array("i", [0] * len(rids)), array("i", tokens))
        counts, ids, first_unfitted = b.allocate_slots_array(handles, array("i", [1] * len(rids)))
        assert first_unfitted == -1
        got, pos = [], 0
        for i in range(len(rids)):
            row = []
            for k in counts[i * 2 : i * 2 + 2]:
                row.append(tuple(ids[pos : pos + k]))
                pos += k
            got.append(tuple(row))
        b.advance_array(handles, array("i", [1] * len(rids)), array("i", [-1] * len(rids)))
        assert got == want
        assert [rb[r].block_hashes for r in rids] == [ra[r].block_hashes for r in rids]
    assert a.to_view() == b.to_view()


@needs_build
@pytest.mark.parametrize("profile", [VLLM_0_25_1.name, NEWEST.name])
def test_lockstep_native_against_spec(profile: str) -> None:
    """A short seeded ``kvref check`` of the native core against the spec."""
    assert main(["check", "--target", "impl-native", "--against", "spec", "--seed", "3", "--min-steps", "400",
                 "--semantics", profile]) == 0  # fmt: skip


def test_spec_manager_is_untouched() -> None:
    """kvspec takes only its own immutable values (the kit translates; kvimpl's requests are kvimpl's)."""
    config = CONFIG
    r = RequestHasher.for_config(config, native=False).new_request("r", [1, 2, 3])
    with pytest.raises(Exception, match="Request"):
        SpecManager(config).allocate_slots(r, 3)


@pytest.mark.parametrize("name", ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"])
def test_kvimpl_hash_functions_are_vllms(name: str) -> None:
    """kvimpl's copy of the hash-function lookup gives kvspec's digests (which the hash vectors pin)."""
    from kvimpl.hash_functions import hash_function  # noqa: PLC0415
    from kvspec.hashing import get_hash_fn_by_name  # noqa: PLC0415

    if name.startswith("xxhash"):
        pytest.importorskip("xxhash")
    for obj in ("seed", (b"\x00" * 32, (1, 2, 3), None), (b"p", tuple(range(16)), ("lora", 1))):
        assert hash_function(name)(obj) == get_hash_fn_by_name(name)(obj)


def test_an_unknown_hash_function_is_refused() -> None:
    """The same error class as kvspec's lookup."""
    from kvimpl.hash_functions import hash_function  # noqa: PLC0415
    from kvspec.errors import UnknownHashFunctionError  # noqa: PLC0415

    with pytest.raises(UnknownHashFunctionError):
        hash_function("md5")


@needs_build
@pytest.mark.parametrize(
    ("switch", "value", "call"),
    [
        ("computed_block_ids_op", False, lambda m, r: m.get_block_ids_for_computed_tokens(r.request_id, 0)),
        ("estimate_cached_tokens_op", False, lambda m, r: m.estimate_cached_tokens(r)),
        ("prefix_hint_op", False, lambda m, r: m.get_prefix_hint(r)),
        ("stats_at_lookup", True, lambda m, r: m.record_prefix_cache_stats(r, 0)),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_the_native_core_refuses_an_operation_its_profile_lacks(switch: str, value: bool, call: Any) -> None:
    """As kvspec does. Every kvspec profile that lacks the first three (vLLM 0.16.0) also sets a
    switch the core does not follow, so only a hand-made profile runs them on the native core."""
    changes: dict[str, Any] = {switch: value}
    profile = dataclasses.replace(NEWEST, name=f"{NEWEST.name}-without-{switch}", **changes)
    config = dataclasses.replace(CONFIG, profile=profile)
    assert native_unsupported(config) is None
    for manager in (NativeKVCacheManager(config), SpecManager(config)):
        request = RequestBlockHasher.for_config(config).new_request("r", [1, 2, 3, 4, 5])
        assert manager.allocate_slots(request, 5) is not None
        before = manager.to_view()
        with pytest.raises(UnsupportedOperationError):
            call(manager, request)
        assert manager.to_view() == before


REFUSED_BATCHES = """
from kvimpl.native import NativeKVCacheManager
from kvspec.config import FullAttention, KVCacheConfig
from kvspec.errors import KVCacheError
from kvspec.request import RequestBlockHasher

config = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=64)
request = RequestBlockHasher.for_config(config).new_request("a", list(range(9)))
manager = NativeKVCacheManager(config)
for _ in range(200):
    for args in (([request], [0]), ([request], [True]), ([request], [1.5]), ([request], [9], [-1])):
        try:
            manager.allocate_slots_batch(*args)
        except KVCacheError:
            pass
        else:
            raise SystemExit(f"accepted {args}")
manager.check_invariants()
print("ok")
"""


@needs_build
def test_refused_batches_leave_the_heap_intact() -> None:
    """Regression: the native ``allocate_slots_batch`` freed an uninitialised
    hit buffer when an item's counts were refused before its hits were read
    (``validate_allocation`` returned before setting it): "double free or
    corruption" within a few refused batches. Run in a child process with
    CPython's debug allocator, which catches a bad free."""
    env = dict(os.environ, PYTHONMALLOC="debug")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(REFUSED_BATCHES)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


@needs_build
def test_refused_batches_raise_what_kvspec_raises_per_request() -> None:
    """A refused item's error class is kvspec's for the same per-request call, and nothing changes."""
    config = CONFIG
    hasher = RequestBlockHasher.for_config(config)
    manager, spec = NativeKVCacheManager(config), SpecManager(config)
    a = hasher.new_request("a", [1, 2, 3, 4, 5])
    assert manager.allocate_slots(a, 5) == spec.allocate_slots(a, 5)
    before = manager.to_view()
    unnamed = dataclasses.replace(a, request_id=3)  # type: ignore[arg-type]  # an int id on purpose
    for bad, n in ((a, 0), (a, 1.5), ("not a request", 1), (unnamed, 1)):
        with pytest.raises(KVCacheError) as want:
            spec.allocate_slots(bad, n)  # type: ignore[arg-type]  # malformed on purpose
        with pytest.raises(type(want.value)):
            manager.allocate_slots_batch([bad, a], [n, 1])
        assert manager.to_view() == before


@needs_build
@pytest.mark.parametrize("profile", [VLLM_0_25_1, PROFILES["vllm-0.26.0"]], ids=lambda p: p.name)
@pytest.mark.parametrize("kind", [SlidingWindow(4, 4), Mamba(4, "all", 1)], ids=lambda k: type(k).__name__)
@pytest.mark.parametrize("request_kind", ["spec", "python", "native"])
def test_skipped_blocks_follow_the_in_flight_tokens(profile: SemanticsProfile, kind: Any, request_kind: str) -> None:
    """From vLLM 0.26.0 on (``skip_on_processed_tokens``) a step frees the
    blocks attention no longer reads below the computed tokens less the
    request's in-flight tokens; the native core does as kvspec, on each kind
    of request, on the ordinary path, in a batch and on a quiet step; a
    negative count is refused."""
    config = KVCacheConfig(
        num_blocks=32, groups=(FullAttention(4), kind), max_model_len=64, enable_caching=False, profile=profile
    )
    seen = []
    for make in (SpecManager, PythonManager, lambda c: create_manager(c, native=True)):
        mgr = make(config)
        spec = request_kind == "spec" or make is SpecManager  # kvspec takes its own values only
        if spec:
            req: Any = RequestBlockHasher.for_config(config).new_request("a", [1] * 13)
        else:
            req = RequestHasher.for_config(config, native=request_kind == "native").new_request("a", [1] * 13)
        assert mgr.allocate_slots(req, 12) is not None
        steps = []
        for computed, in_flight in ((12, 8), (13, 8), (14, 2), (14, 2)):
            if spec:
                req = dataclasses.replace(req, num_computed_tokens=computed, num_in_flight_tokens=in_flight)
            else:
                req.num_computed_tokens, req.num_in_flight_tokens = computed, in_flight
            batch = mgr.allocate_slots_batch if hasattr(mgr, "allocate_slots_batch") and computed == 13 else None
            out = batch([req], [1])[0] if batch is not None else mgr.allocate_slots(req, 1)
            steps.append((out, mgr.get_block_ids("a")))
        if spec:
            bad: Any = dataclasses.replace(req, num_in_flight_tokens=-1)
        else:
            req.num_in_flight_tokens = -1
            bad = req
        with pytest.raises(KVCacheError, match="num_in_flight_tokens"):
            mgr.allocate_slots(bad, 1)
        mgr.check_invariants()
        seen.append((steps, mgr.to_view()))
    assert seen[1] == seen[0], f"kvimpl (Python) differs from kvspec under {profile.name}"
    assert seen[2] == seen[0], f"kvimpl (native) differs from kvspec under {profile.name}"
    freed = sum(b == 0 for b in seen[0][0][0][1][1])
    assert freed == (0 if profile.skip_on_processed_tokens else 2), seen[0]  # below 4 or 12 computed tokens


@needs_build
@pytest.mark.parametrize("release", ["0.29.0", "0.30.0"])
def test_mamba_align_removal_follows_the_retired_mark(release: str) -> None:
    """From vLLM 0.30.0 on (``mamba_align_retired_mark``) a Mamba align removal
    steps over null gaps from the request's retired mark: a hit state left
    behind while the request's tokens were in flight is freed; the native core
    does as kvspec."""
    profile = PROFILES[f"vllm-{release}"]
    groups = (FullAttention(4), Mamba(4, "align", 0))
    config = KVCacheConfig(num_blocks=32, groups=groups, max_model_len=64, profile=profile)
    seen = []
    for make in (SpecManager, lambda c: create_manager(c, native=True)):
        mgr = make(config)
        h = RequestBlockHasher.for_config(config)
        a = h.new_request("a", [1] * 8)
        mgr.allocate_slots(a, 4)
        mgr.allocate_slots(dataclasses.replace(a, num_computed_tokens=4), 4)
        mgr.free("a")
        mgr.new_step_starts()
        b = h.new_request("b", [1] * 4 + [3] * 12)
        hits, n = mgr.get_computed_blocks(b)
        mgr.allocate_slots(b, 8, n, hits)
        mgr.allocate_slots(dataclasses.replace(b, num_computed_tokens=12, num_in_flight_tokens=8), 2)
        mgr.remove_skipped_blocks("b", 12)
        mgr.remove_skipped_blocks("b", 13)
        mgr.check_invariants()
        seen.append(mgr.to_view())
    assert isinstance(create_manager(config, native=True), NativeKVCacheManager)
    assert seen[1] == seen[0]
    hit_state_freed = dict(seen[0].tables)["b"][1][0] == 0
    assert hit_state_freed == (release == "0.30.0"), seen[0]


# -- bad inputs of the native API: the typed error, and nothing changed ------------------------


def _observed(manager: Any) -> object:
    """Everything a caller can read back: the view, and the events and new-block ids recorded since."""
    return manager.to_view(), manager.take_events(), manager.take_new_block_ids()


def _running(config: KVCacheConfig, prompts: dict[str, list[int]]) -> tuple[Any, dict[str, Any]]:
    """A native manager (events on) whose requests ``prompts`` are running with their prompts computed."""
    config = dataclasses.replace(config, enable_kv_cache_events=True)
    manager = NativeKVCacheManager(config)
    hasher = RequestHasher.for_config(config, native=True)
    requests = {}
    for rid, prompt in prompts.items():
        r = requests[rid] = hasher.new_request(rid, prompt)
        assert manager.allocate_slots(r, r.num_tokens) is not None
        r.num_computed_tokens = r.num_tokens
        r.status = RequestStatus.RUNNING
    return manager, requests


@needs_build
def test_bad_array_calls_raise_the_typed_error_and_change_nothing() -> None:
    """allocate_slots_array checks every position before it allocates anything: a bad count
    at the second position leaves the first request's step undone."""
    config = KVCacheConfig(num_blocks=32, groups=(FullAttention(4),), max_model_len=16)
    manager, _ = _running(config, {"a": [1, 2, 3, 4], "b": [5, 6, 7]})
    handles = array("i", [manager.handle("a"), manager.handle("b")])
    _observed(manager)  # drains the admissions' events and new-block ids
    before = _observed(manager)
    bad: list[tuple[type[Exception], tuple[Any, ...]]] = [
        (InvalidTokenCountError, (handles, array("i", [1]))),  # fewer counts than handles
        (InvalidTokenCountError, (handles, array("i", [1, 1, 1]))),  # more counts than handles
        (InvalidTokenCountError, (handles, array("i", [1, 0]))),  # a count that is not positive
        (InvalidTokenCountError, (handles, array("i", [1, -3]))),
        (InvalidTokenCountError, (handles, array("i", [1, 14]))),  # 3 computed + 14 > max_model_len 16
        (InvalidTokenCountError, (handles, array("i", [1, 1]), -1)),  # a negative lookahead
        (UnknownRequestError, (array("i", [handles[0], 99]), array("i", [1, 1]))),
    ]
    for error, args in bad:
        with pytest.raises(error):
            manager.allocate_slots_array(*args)
        assert _observed(manager) == before, args
    manager.check_invariants()
    counts, ids, first_unfitted = manager.allocate_slots_array(handles, array("i", [1, 13]))  # the limits themselves
    assert first_unfitted == -1
    assert list(counts) == [1, 3] and len(ids) == 4


@needs_build
def test_keyword_calls_are_the_positional_calls() -> None:
    """The native methods that take keywords (cache_blocks, remove_skipped_blocks) bind them
    by name as kvspec's methods do, and refuse an unknown keyword or a repeated argument."""
    config = KVCacheConfig(num_blocks=64, groups=(FullAttention(4), SlidingWindow(4, 4)), max_model_len=64)
    prompts = {"a": list(range(1, 14)), "b": list(range(20, 30))}
    by_position, reqs_p = _running(dataclasses.replace(config, enable_caching=True), prompts)
    by_keyword, reqs_k = _running(dataclasses.replace(config, enable_caching=True), prompts)
    by_position.cache_blocks(reqs_p["a"], 8)
    by_keyword.cache_blocks(request=reqs_k["a"], num_computed_tokens=8)
    by_keyword.cache_blocks(reqs_k["b"], num_computed_tokens=8)
    by_position.cache_blocks(reqs_p["b"], 8)
    by_position.remove_skipped_blocks("a", 12)
    by_keyword.remove_skipped_blocks(request_id="a", total_computed_tokens=12)
    by_position.remove_skipped_blocks("b", 9, 10)
    by_keyword.remove_skipped_blocks("b", num_prompt_tokens=10, total_computed_tokens=9)
    assert _observed(by_keyword) == _observed(by_position)
    assert by_keyword.get_block_ids("a") == by_position.get_block_ids("a")
    assert 0 in by_keyword.get_block_ids("a")[1]  # the window's skipped blocks were removed
    spec = SpecManager(config)
    every = ("request", "num_computed_tokens", "request_id", "total_computed_tokens", "num_prompt_tokens", "x")
    for method, own, args in (
        ("cache_blocks", {"request", "num_computed_tokens"}, (reqs_k["a"], 8)),
        ("remove_skipped_blocks", {"request_id", "total_computed_tokens", "num_prompt_tokens"}, ("a", 12)),
    ):
        for name in every:
            if name in own:
                continue
            with pytest.raises(TypeError, match="unexpected keyword"):
                getattr(by_keyword, method)(*args, **{name: 1})
            with pytest.raises(TypeError):
                getattr(spec, method)(*args, **{name: 1})
        with pytest.raises(TypeError, match="multiple values"):
            getattr(by_keyword, method)(*args, **{sorted(own)[0] if method == "cache_blocks" else "request_id": 1})
    assert _observed(by_keyword) == _observed(by_position)


@needs_build
def test_evict_blocks_takes_each_id_once_whatever_came_before() -> None:
    """evict_blocks sorts and deduplicates its ids in the core's scratch vector (each id
    compared with the one before it); a later call's last id must be evicted even when an
    earlier call left the same id just past it."""
    config = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=64, enable_kv_cache_events=True)
    native, spec = NativeKVCacheManager(config), SpecManager(config)
    hasher = RequestBlockHasher.for_config(config)
    a = hasher.new_request("a", list(range(1, 10)))
    for m in (native, spec):
        m.evict_blocks([2, 2, 2])  # nothing cached yet: no change, but 2 stays in the scratch vector
        assert m.allocate_slots(a, 9) is not None
        m.cache_blocks(a, 9)
    assert native.get_block_ids("a") == spec.get_block_ids("a") == ((1, 2, 3),)
    for ids in ([1, 2], [3, 3]):  # [1, 2] sits on the earlier [2, 2, 2]: the entry past its last id is 2
        for m in (native, spec):
            m.evict_blocks(ids)
        assert native.to_view() == spec.to_view(), ids
        assert native.take_events() == spec.take_events(), ids
    _, n = native.get_computed_blocks(hasher.new_request("b", list(range(1, 10))))
    assert n == 0  # blocks 1 and 2 were evicted: no hit


@needs_build
def test_a_hit_the_cache_never_returned_is_stale() -> None:
    """allocate_slots refuses a hit that names the null block in a full-attention group
    (group 0 too) or a block cached under another key (other tokens, another group), with
    kvspec's StaleHitError, and changes nothing."""
    config = KVCacheConfig(num_blocks=32, groups=(FullAttention(4), FullAttention(4)), max_model_len=64)
    native, spec = NativeKVCacheManager(config), SpecManager(config)
    hasher = RequestBlockHasher.for_config(config)
    a = hasher.new_request("a", list(range(1, 10)))
    for m in (native, spec):
        assert m.allocate_slots(a, 9) is not None
        m.free("a")
    b = hasher.new_request("b", list(range(1, 10)))
    hit, n = spec.get_computed_blocks(b)
    assert (tuple(map(tuple, hit)), n) == (tuple(map(tuple, native.get_computed_blocks(b)[0])), 8)
    (g0, g1) = (tuple(hit[0]), tuple(hit[1]))
    other = hasher.new_request("c", [9] * 9)  # other tokens: none of a's blocks is its
    bad_hits = [
        (b, ((0, g0[1]), g1)),  # the null block in group 0
        (b, (g0, (g1[0], 0))),  # ... in group 1
        (b, (g1, g0)),  # the groups swapped: the right tokens, another group's blocks
        (b, ((g0[1], g0[0]), g1)),  # the right group, the blocks of other positions
        (other, (g0, g1)),  # another request's tokens
    ]
    for m in (native, spec):
        before = m.to_view()
        for req, blocks in bad_hits:
            with pytest.raises(StaleHitError):
                m.allocate_slots(req, 1, 8, blocks)
            assert m.to_view() == before, (req.request_id, blocks)
        not_sequences: list[Any] = [(g0, 5), (5, g1)]  # a group that is not a sequence: kvspec's own TypeError
        for malformed in not_sequences:
            with pytest.raises(TypeError):
                m.allocate_slots(b, 1, 8, malformed)
            assert m.to_view() == before, malformed
    assert native.allocate_slots(b, 1, 8, (g0, g1)) == spec.allocate_slots(b, 1, 8, (g0, g1))


class _NoTruth:
    """An argument whose truth value cannot be taken (its ``__bool__`` raises)."""

    def __bool__(self) -> bool:
        raise ValueError("no truth value")


@needs_build
@pytest.mark.parametrize("flag", ["delay_cache_blocks", "full_sequence_must_fit", "has_scheduled_reqs"])
def test_a_flag_without_a_truth_value_changes_nothing(flag: str) -> None:
    """allocate_slots takes the truth of its flags before it allocates: the flag's own error
    comes out and nothing changes, for a new request and for a step of one holding blocks
    (kvspec allocates first for delay_cache_blocks)."""
    config = KVCacheConfig(num_blocks=32, groups=(FullAttention(4),), max_model_len=64, enable_kv_cache_events=True)
    manager = NativeKVCacheManager(config)
    a = RequestBlockHasher.for_config(config).new_request("a", list(range(1, 10)))
    for n in (9, 4):
        _observed(manager)  # drains the events and new-block ids of the step before
        before = _observed(manager)
        with pytest.raises(ValueError, match="no truth value"):
            manager.allocate_slots(a, n, **{flag: _NoTruth()})
        assert _observed(manager) == before, n
        assert manager.allocate_slots(a, n, **{flag: False}) is not None
        a = dataclasses.replace(a, num_computed_tokens=a.num_computed_tokens + n)


@needs_build
def test_the_watermark_holds_back_waiting_and_preempted_requests() -> None:
    """The admission watermark applies to a waiting and to a preempted request, not to a running
    one, as in kvspec: 9 blocks fit the 10 free ones, but not with the watermark's 2 kept back."""
    config = KVCacheConfig(num_blocks=11, groups=(FullAttention(4),), max_model_len=64, watermark=0.2)
    hasher = RequestBlockHasher.for_config(config)
    for status in (RequestStatus.WAITING, RequestStatus.PREEMPTED, RequestStatus.RUNNING):
        a = dataclasses.replace(hasher.new_request("a", list(range(1, 37))), status=status)
        native, spec = NativeKVCacheManager(config), SpecManager(config)
        got, want = native.allocate_slots(a, 36), spec.allocate_slots(a, 36)
        assert got == want, status
        assert (got is None) == (status is not RequestStatus.RUNNING), status
        assert native.to_view() == spec.to_view(), status


@needs_build
def test_the_core_holds_one_reference_to_each_held_request() -> None:
    """cache_blocks keeps the request it is given as the slot's request, with a reference of its
    own, and drops the one it held (a borrowed reference would be freed under the core)."""
    config = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=64)
    manager = NativeKVCacheManager(config)
    a = RequestBlockHasher.for_config(config).new_request("a", list(range(1, 10)))
    assert manager.allocate_slots(a, 9) is not None
    b = dataclasses.replace(a, num_computed_tokens=9)  # the same request, a new object
    held_a, held_b = sys.getrefcount(a), sys.getrefcount(b)
    manager.cache_blocks(b, 8)
    assert (sys.getrefcount(a), sys.getrefcount(b)) == (held_a - 1, held_b + 1)


@needs_build
def test_first_unfitted_is_the_first_position_that_did_not_fit() -> None:
    """allocate_slots_array reports the first request that did not fit, also when a later one
    does not fit either (a full pool: every step needs a new block)."""
    config = KVCacheConfig(num_blocks=4, groups=(FullAttention(4),), max_model_len=16)
    manager, _ = _running(config, {"a": [1, 2, 3, 4], "b": [5, 6, 7, 8], "c": [9, 10, 11, 12]})
    handles = array("i", [manager.handle("a"), manager.handle("b")])
    counts, ids, first_unfitted = manager.allocate_slots_array(handles, array("i", [1, 1]))
    assert (list(counts), list(ids), first_unfitted) == ([-1, -1], [], 0)


@needs_build
@pytest.mark.parametrize("hbs, seed", [(0, b"s" * 32), (-1, b"s" * 32), (4, b""), (4, b"s" * 33)])
def test_a_c_request_refuses_a_bad_block_size_or_seed(hbs: int, seed: bytes) -> None:
    """kvimpl's C request refuses a hash block size below 1 and a seed digest outside 1-32 bytes
    (kvimpl's hasher never makes one; a direct construction can)."""
    mod = native.native_module()
    assert mod is not None
    with pytest.raises(ValueError, match="hash_block_size must be >= 1"):
        mod.Request("r", [1, 2, 3], hbs, seed, None, False, None, False)


@needs_build
def test_host_rows_of_gives_each_handles_row() -> None:
    """``host_rows_of`` (the array API's rows for a step's slot mapping) gives the host-table row of each
    handle, in the handles' order, and refuses a handle without a row and a buffer that is not int32."""
    from kvimpl.device_tables import CPU_COPY  # noqa: PLC0415 - needs torch, as the device tables do

    pytest.importorskip("torch")
    config = KVCacheConfig(num_blocks=64, groups=(FullAttention(4),), max_model_len=64, profile=VLLM_0_33_0)
    mgr = NativeKVCacheManager(config, CPU_COPY)
    hasher = RequestHasher.for_config(config, native=True)
    for i in range(3):
        req = hasher.new_request(f"r{i}", [i + 1] * 5)
        assert mgr.allocate_slots(req, 5) is not None
    mgr.free("r0")
    rows = mgr.device_tables.rows
    handles = array("i", [mgr.handle("r2"), mgr.handle("r1")])
    assert list(mgr.host_rows_of(handles)) == [rows["r2"], rows["r1"]] != [rows["r1"], rows["r2"]]
    with pytest.raises(UnknownRequestError):
        mgr.host_rows_of(array("i", [handles[0], 99]))
    with pytest.raises(TypeError):
        mgr.host_rows_of(array("q", [handles[0]]))
