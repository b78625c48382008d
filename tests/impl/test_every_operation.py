"""Both kvimpl builds run every operation of every release they accept a
configuration of, and refuse (``UnsupportedOperationError``) exactly the
operations the release lacks, as kvspec does; and the lockstep fails, never
skips, when a kvimpl adapter refuses an operation its release has."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvimpl.kv_cache_manager import KVCacheManager as PyManager
from kvimpl.native import NativeKVCacheManager, native_unsupported
from kvspec.config import FullAttention, KVCacheConfig, Mamba
from kvspec.errors import UnsupportedOperationError
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.profiles import PROFILES
from kvspec.request import RequestBlockHasher

Call = Callable[[Any, Any], object]

OPERATIONS: dict[str, Call] = {
    "get_computed_blocks": lambda m, r: m.get_computed_blocks(r),
    "allocate_slots": lambda m, r: m.allocate_slots(r, r.num_tokens),
    "cache_blocks": lambda m, r: m.cache_blocks(r, r.num_tokens),
    "get_block_ids": lambda m, r: m.get_block_ids(r.request_id),
    "get_block_ids_for_computed_tokens": lambda m, r: m.get_block_ids_for_computed_tokens(r.request_id, 4),
    "estimate_cached_tokens": lambda m, r: m.estimate_cached_tokens(r),
    "get_prefix_hint": lambda m, r: m.get_prefix_hint(r),
    "record_prefix_cache_stats": lambda m, r: m.record_prefix_cache_stats(r, 0),
    "take_kv_cache_block_copies": lambda m, r: m.take_kv_cache_block_copies(),
    "take_new_block_ids": lambda m, r: m.take_new_block_ids(),
    "record_blocks_for_zeroing": lambda m, r: m.record_blocks_for_zeroing(r.request_id, 4),
    "new_step_starts": lambda m, r: m.new_step_starts(),
    "get_num_common_prefix_blocks": lambda m, r: m.get_num_common_prefix_blocks(r.request_id),
    "remove_skipped_blocks": lambda m, r: m.remove_skipped_blocks(r.request_id, r.num_tokens),
    "take_events": lambda m, r: m.take_events(),
    "usage": lambda m, r: m.usage,
    "make_prefix_cache_stats": lambda m, r: m.make_prefix_cache_stats(),
    "pop_blocks_for_free": lambda m, r: m.free_blocks(list(reversed(m.pop_blocks_for_free(r.request_id)))),
    "evict_blocks": lambda m, r: m.evict_blocks([1]),
    "reset_prefix_cache": lambda m, r: m.reset_prefix_cache(),
    "free": lambda m, r: m.free(r.request_id),
}
"""Every facade operation, in an order that runs each on a live request."""


def _refusals(manager: Any, config: KVCacheConfig) -> dict[str, str]:
    hasher = RequestBlockHasher(config.hash_function, config.hash_seed, config.resolved_hash_block_size())
    request = hasher.new_request("r", list(range(9)))
    refused = {}
    for name, call in OPERATIONS.items():
        if name == "pop_blocks_for_free":  # a second request to pop, the first stays for free
            other = hasher.new_request("p", list(range(20, 29)))
            manager.allocate_slots(other, other.num_tokens)
            request_for = other
        else:
            request_for = request
        try:
            call(manager, request_for)
        except UnsupportedOperationError as exc:
            refused[name] = str(exc)
    return refused


CONFIGS = {
    "full": lambda p: KVCacheConfig(num_blocks=32, groups=(FullAttention(4),), max_model_len=64, profile=p),
    "full+mamba": lambda p: KVCacheConfig(
        num_blocks=48,
        groups=(FullAttention(4), Mamba(4, "align" if p.mamba_caching_needs_align else "all")),
        max_model_len=64,
        profile=p,
    ),
}


@pytest.mark.parametrize("shape", sorted(CONFIGS))
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_operation_on_both_builds(profile: str, shape: str) -> None:
    config = CONFIGS[shape](PROFILES[profile])
    want = _refusals(SpecManager(config), config)
    assert set(want) < set(OPERATIONS), f"kvspec refuses every operation under {profile}"
    got = _refusals(PyManager(config), config)
    assert got.keys() == want.keys(), f"pure-Python build: refuses {sorted(got)}, kvspec {sorted(want)}"
    reason = native_unsupported(config)
    if reason is None:
        got = _refusals(NativeKVCacheManager(config), config)
        assert got.keys() == want.keys(), f"native core: refuses {sorted(got)}, kvspec {sorted(want)}"
    elif "not built" not in reason:
        # Under these profiles the configuration needs a feature the core declines:
        # create_manager builds the pure-Python manager, checked above.
        assert "does not model" in reason or "not in the native core" in reason, reason


def test_a_kvimpl_refusal_fails_the_lockstep(tmp_path: Path) -> None:
    """kvimpl's adapters declare ``runs_every_operation``: the lockstep fails
    (with a trace), never skips, when one refuses an operation its release has;
    a third-party adapter without the declaration is skipped as before."""
    from kvref.adapters.impl import ImplAdapter  # noqa: PLC0415
    from kvref.adapters.spec import make_spec_adapter  # noqa: PLC0415
    from kvref.lockstep import Lockstep, LockstepFailure, RunStats  # noqa: PLC0415
    from kvspec.profiles import NEWEST  # noqa: PLC0415

    class Refusing(ImplAdapter):
        def take_kv_cache_block_copies(self) -> Any:
            raise UnsupportedOperationError("take_kv_cache_block_copies: not here")

    class Quiet(Refusing):
        runs_every_operation = False

    cfg = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=64, profile=NEWEST)
    factories: list[Any] = [make_spec_adapter, Refusing]
    lock = Lockstep(cfg, factories, RunStats(), tmp_path)
    with pytest.raises(LockstepFailure, match="refused take_kv_cache_block_copies"):
        lock.call({"op": "take_kv_cache_block_copies"})
    assert lock.stats.last_failure is not None and Path(lock.stats.last_failure).exists()
    quiet_factories: list[Any] = [make_spec_adapter, Quiet]
    quiet = Lockstep(cfg, quiet_factories, RunStats(), tmp_path / "quiet")
    quiet.call({"op": "take_kv_cache_block_copies"})
    assert quiet.stats.skipped and not quiet.stats.unexplained


def test_a_kvimpl_refusal_fails_a_replay(tmp_path: Path) -> None:
    """``kvref replay`` on an adapter that declares ``runs_every_operation``:
    its refusal of an operation the trace's release has fails the trace, as
    the lockstep does (it was counted as a skip, and a replay step of CI that
    meets only skips exits 0)."""
    from kvref.adapters.impl import ImplAdapter  # noqa: PLC0415
    from kvref.traces import Trace, replay  # noqa: PLC0415
    from kvspec.profiles import NEWEST  # noqa: PLC0415

    class Refusing(ImplAdapter):
        def take_kv_cache_block_copies(self) -> Any:
            raise UnsupportedOperationError("take_kv_cache_block_copies: not here")

    cfg = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=64, profile=NEWEST)
    trace = Trace(cfg, [{"op": "take_kv_cache_block_copies", "expect": {"copies": [], "retained": []}}], {})
    factory: Any = Refusing
    result = replay(trace, factory)
    assert not result.ok and not result.skipped and "refused an operation" in result.message
