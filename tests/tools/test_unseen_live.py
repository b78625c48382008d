"""Every entry of the unseen fault set (kvtools.zoo.unseen) is live.

For each entry a hand-written history of facade calls runs on kvspec's
``KVCacheManager``, on unmutated kvimpl (the ``ImplAdapter``) and on the
mutant. kvimpl must agree with kvspec on every output and every view, and
the mutant's first difference from kvspec must be exactly the one named, so
a test fails both when the fault stops showing and when the history stops
being one kvimpl gets right.

These histories prove liveness only; they are not the measurement (that is
``python -m kvtools zoo --unseen``, run with the frozen generator).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from kvref.adapters.impl import ImplAdapter
from kvspec.config import (
    MLA,
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    KVCacheConfig,
    Mamba,
    SinkFullAttention,
    SlidingWindow,
)
from kvspec.events import BlockStored
from kvspec.hashing import external_block_hash
from kvspec.kv_cache_manager import KVCacheManager
from kvspec.profiles import VLLM_0_25_1, VLLM_0_33_0
from kvspec.request import Request, RequestBlockHasher, RequestStatus
from kvspec.stats import PrefixCacheStats
from kvtools.zoo.unseen import PROFILE_OF, UNSEEN

Entry = tuple[str, Any]
"""One observation: a label (call number, operation, what) and its value."""


class Recorder:
    """Runs facade calls on one manager and records each output and the view after it.

    The view is recorded field by field; ``cached`` as the sorted block-id
    lists of the cache map (the keys are bytes nobody should read in an
    assertion; a key difference shows up in a later lookup instead).
    """

    def __init__(self, manager: Any) -> None:
        self.m = manager
        self.log: list[Entry] = []
        self.calls = 0

    def __call__(self, op: str, *args: Any, keep: Callable[[Any], Any] | None = None, **kwargs: Any) -> Any:
        """Call ``op``; record its output (``keep(output)`` if given; an exception by its class name)."""
        self.calls += 1
        label = f"{self.calls} {op}"
        try:
            out = getattr(self.m, op)(*args, **kwargs)
        except Exception as exc:  # a mutant may crash anywhere: the crash is the observation
            out = type(exc).__name__
            self.log.append((label, out))
        else:
            self.log.append((label, _plain(keep(out) if keep is not None else out)))
        view = self.m.to_view()
        for field in ("free_queue", "ref_cnt", "tables", "usage"):
            self.log.append((f"{label} {field}", getattr(view, field)))
        self.log.append((f"{label} cached", tuple(sorted(ids for _, ids in view.cached))))
        return out


def _plain(value: Any) -> Any:
    """Lists as tuples, recursively, so that kvspec's and kvimpl's outputs compare by value."""
    if isinstance(value, list | tuple):
        return tuple(_plain(v) for v in value)
    return value


def first_difference(a: list[Entry], b: list[Entry]) -> tuple[str, Any, Any] | None:
    """The first observation where ``b`` differs from ``a``: (label, a's value, b's value)."""
    for (la, va), (lb, vb) in zip(a, b, strict=True):
        assert la == lb, f"the histories diverged in shape: {la!r} vs {lb!r}"
        if va != vb:
            return la, va, vb
    return None


@dataclass(frozen=True)
class Case:
    """One entry's directed history and the difference it must show."""

    config: KVCacheConfig
    history: Callable[[Recorder, KVCacheConfig], None]
    label: str
    spec: Any
    mutant: Any


# --- request helpers -----------------------------------------------------------------------------


def new(cfg: KVCacheConfig, rid: str, prompt: list[int], **kwargs: Any) -> Request:
    """A waiting request hashed as a scheduler with ``cfg`` hashes it."""
    return RequestBlockHasher.for_config(cfg).new_request(rid, prompt, **kwargs)


def running(cfg: KVCacheConfig, req: Request, computed: int, outputs: tuple[int, ...] = ()) -> Request:
    """``req`` running with ``computed`` tokens computed and ``outputs`` sampled."""
    req = replace(req, num_computed_tokens=computed, status=RequestStatus.RUNNING)
    return RequestBlockHasher.for_config(cfg).with_output_tokens(req, outputs) if outputs else req


def admit(h: Recorder, req: Request, **kwargs: Any) -> Any:
    """Look ``req`` up and allocate its whole prompt on the hit."""
    blocks, n = h("get_computed_blocks", req)
    if n:
        kwargs.update(num_new_computed_tokens=n, new_computed_blocks=blocks)
    return h("allocate_slots", req, req.num_tokens - n, **kwargs)


def cfg_of(groups: tuple[Any, ...], num_blocks: int = 16, profile: Any = VLLM_0_25_1, **kwargs: Any) -> KVCacheConfig:
    """A configuration of ``groups`` with a 64-token model length."""
    return KVCacheConfig(profile=profile, num_blocks=num_blocks, groups=groups, max_model_len=64, **kwargs)


A = [1, 2, 3, 4, 5, 6, 7, 8]
"""A prompt of eight tokens (four blocks of two)."""


# --- the histories, one per entry ----------------------------------------------------------------


def h_fresh_allocation(h: Recorder, cfg: KVCacheConfig) -> None:
    """One request takes two blocks from a fresh pool."""
    h("allocate_slots", new(cfg, "a", A[:4]), 4)


def h_finish_cached_request(h: Recorder, cfg: KVCacheConfig) -> None:
    """A request caches its two blocks and finishes."""
    h("allocate_slots", new(cfg, "a", A[:4]), 4)
    h("free", "a")


def h_shared_prefix_while_running(h: Recorder, cfg: KVCacheConfig) -> None:
    """b hits a's two cached blocks while a still holds them."""
    h("allocate_slots", new(cfg, "a", A[:4]), 4)
    admit(h, new(cfg, "b", [*A[:4], 9]))


def h_resend_after_finish(h: Recorder, cfg: KVCacheConfig) -> None:
    """a caches eight tokens and finishes; b resends them plus one."""
    h("allocate_slots", new(cfg, "a", A), 8)
    h("free", "a")
    admit(h, new(cfg, "b", [*A, 9]))


def h_parent_of_continuing_store(h: Recorder, cfg: KVCacheConfig) -> None:
    """a caches its first block, then its second in a later step; the parent of the second store."""
    a = new(cfg, "a", A[:3])
    h("allocate_slots", a, 3)
    h("take_events", keep=lambda evs: [type(e).__name__ for e in evs])
    a = running(cfg, a, 3, (4,))
    h("allocate_slots", a, 1)
    parent = external_block_hash(a.block_hashes[0], cfg.int_block_hashes)
    h("take_events", keep=lambda evs: [e.parent_block_hash == parent for e in evs if isinstance(e, BlockStored)])


def h_reset_then_resend(h: Recorder, cfg: KVCacheConfig) -> None:
    """a caches and finishes; the cache is reset; b resends a's prompt."""
    h("allocate_slots", new(cfg, "a", A[:4]), 4)
    h("free", "a")
    h("reset_prefix_cache")
    h("take_events", keep=lambda evs: [type(e).__name__ for e in evs])
    admit(h, new(cfg, "b", [*A[:4], 9]))


def h_window_hit(h: Recorder, cfg: KVCacheConfig) -> None:
    """a caches six tokens in one allocation and finishes; b resends them plus one."""
    h("allocate_slots", new(cfg, "a", A[:6]), 6)
    h("free", "a")
    h("get_computed_blocks", new(cfg, "b", [*A[:6], 9]))


def h_chunk_boundary(h: Recorder, cfg: KVCacheConfig) -> None:
    """a allocates eight tokens; four are computed (one whole chunk of four)."""
    h("allocate_slots", new(cfg, "a", A), 8)
    h("remove_skipped_blocks", "a", 4)


def h_block_fills_up(h: Recorder, cfg: KVCacheConfig) -> None:
    """a prefills three tokens (one block and a half), then decodes one that fills the second block."""
    a = new(cfg, "a", A[:3])
    h("allocate_slots", a, 3)
    h("allocate_slots", running(cfg, a, 3, (4,)), 1)


def h_hit_then_new_ids(h: Recorder, cfg: KVCacheConfig) -> None:
    """b hits a's cached blocks; the fresh-block list after each allocation."""
    h("allocate_slots", new(cfg, "a", A[:4]), 4)
    h("take_new_block_ids")
    admit(h, new(cfg, "b", [*A[:4], 9]))
    h("take_new_block_ids")


def h_tight_hit(h: Recorder, cfg: KVCacheConfig) -> None:
    """a's two blocks are cached and free; b extends them to twelve tokens, which needs one block more than
    the five free ones."""
    h("allocate_slots", new(cfg, "a", A[:4]), 4)
    h("free", "a")
    admit(h, new(cfg, "b", [*A[:4], *range(10, 18)]))


def h_mamba_spec(h: Recorder, cfg: KVCacheConfig) -> None:
    """A request of three tokens in a full + Mamba (one speculative block) model."""
    h("allocate_slots", new(cfg, "a", A[:3]), 3)


def h_mamba_resend(h: Recorder, cfg: KVCacheConfig) -> None:
    """a caches three Mamba states (six tokens at once) and finishes; b resends them plus one."""
    h("allocate_slots", new(cfg, "a", A[:6]), 6)
    h("free", "a")
    h("get_computed_blocks", new(cfg, "b", [*A[:6], 9]))


def h_same_step_state(h: Recorder, cfg: KVCacheConfig) -> None:
    """a caches a Mamba state at eight tokens; in the same step b hits it (and must wait for the next)."""
    admit(h, new(cfg, "a", A))
    admit(h, new(cfg, "b", [*A, 1]))


def h_mamba_tight_hit(h: Recorder, cfg: KVCacheConfig) -> None:
    """a caches eight tokens and finishes; after a step boundary b resends them with the pool just large
    enough for its one fresh state block."""
    admit(h, new(cfg, "a", A))
    h("free", "a")
    h("new_step_starts")
    h("allocate_slots", new(cfg, "f", [0] * 22), 22)
    admit(h, new(cfg, "b", [*A, 1]))


def h_connector_tokens(h: Recorder, cfg: KVCacheConfig) -> None:
    """a's first eight tokens come through the connector; one new token is computed."""
    h("allocate_slots", new(cfg, "a", [*A, 9]), 1, num_external_computed_tokens=8)


def h_three_tables(h: Recorder, cfg: KVCacheConfig) -> None:
    """a and b share two blocks, c shares nothing; the common prefix of a."""
    h("allocate_slots", new(cfg, "a", A[:4]), 4)
    admit(h, new(cfg, "b", [*A[:4], 9]))
    h("allocate_slots", new(cfg, "c", [9, 9, 9]), 3)
    h("get_num_common_prefix_blocks", "a")


def h_sink_new_ids(h: Recorder, cfg: KVCacheConfig) -> None:
    """A SinkFull request's allocation, then the fresh-block list."""
    h("allocate_slots", new(cfg, "a", A[:4]), 4)
    h("take_new_block_ids")


def h_pop_window_table(h: Recorder, cfg: KVCacheConfig) -> None:
    """a's window has moved past two blocks; its blocks are popped for a deferred free."""
    h("allocate_slots", new(cfg, "a", A), 8)
    h("remove_skipped_blocks", "a", 7)
    h("pop_blocks_for_free", "a")


def h_tail_at_prompt_end(h: Recorder, cfg: KVCacheConfig) -> None:
    """A six-token prompt (on a hash boundary inside a block of four) decodes two tokens."""
    a = new(cfg, "a", A[:6])
    h("allocate_slots", a, 6)
    h("allocate_slots", running(cfg, a, 6, (7, 8)), 2)


def h_eagle_resend(h: Recorder, cfg: KVCacheConfig) -> None:
    """a caches six tokens and finishes; b resends them plus one."""
    h("allocate_slots", new(cfg, "a", A[:6]), 6)
    h("free", "a")
    h("get_computed_blocks", new(cfg, "b", [*A[:6], 9]))


def h_hybrid_six_tokens(h: Recorder, cfg: KVCacheConfig) -> None:
    """A six-token request in a full(2) + window(4) hybrid (scheduler block 4)."""
    h("allocate_slots", new(cfg, "a", A[:6]), 6)


def h_cross(h: Recorder, cfg: KVCacheConfig) -> None:
    """A three-token decoder prompt with six encoder tokens, then one decode step."""
    a = new(cfg, "a", A[:3])
    h("allocate_slots", a, 3, num_encoder_tokens=6)
    h("allocate_slots", running(cfg, a, 3, (4,)), 1)


def h_prefix_hint(h: Recorder, cfg: KVCacheConfig) -> None:
    """a caches eight tokens and finishes; b resends them plus one; the hint after b's lookup."""
    h("allocate_slots", new(cfg, "a", A), 8)
    h("free", "a")
    b = new(cfg, "b", [*A, 9])
    h("get_computed_blocks", b)
    h("get_prefix_hint", b)


def h_pop(h: Recorder, cfg: KVCacheConfig) -> None:
    """a's blocks are popped for a deferred free."""
    h("allocate_slots", new(cfg, "a", A[:4]), 4)
    h("pop_blocks_for_free", "a")


def h_reset_stats(h: Recorder, cfg: KVCacheConfig) -> None:
    """A lookup, a reset (no block is in use, so it succeeds), and the statistics."""
    h("get_computed_blocks", new(cfg, "a", A[:4]))
    h("reset_prefix_cache")
    h("make_prefix_cache_stats")


def h_skip_reading_stats(h: Recorder, cfg: KVCacheConfig) -> None:
    """A request that skips reading the prefix cache is admitted and recorded."""
    a = new(cfg, "a", A[:4], skip_reading_prefix_cache=True)
    admit(h, a)
    h("record_prefix_cache_stats", a, 0)
    h("make_prefix_cache_stats")


def h_skip_reading_lookup(h: Recorder, cfg: KVCacheConfig) -> None:
    """a caches four tokens; b resends them but asks to skip reading the prefix cache."""
    h("allocate_slots", new(cfg, "a", A[:4]), 4)
    h("get_computed_blocks", new(cfg, "b", [*A[:4], 9], skip_reading_prefix_cache=True))


def h_computed_ids(h: Recorder, cfg: KVCacheConfig) -> None:
    """a holds eight tokens; the tables cut to its first three computed tokens."""
    h("allocate_slots", new(cfg, "a", A), 8)
    h("get_block_ids_for_computed_tokens", "a", 3)


def h_estimate(h: Recorder, cfg: KVCacheConfig) -> None:
    """a's window moves past its two cached blocks; the prefix its cached blocks stand for."""
    a = new(cfg, "a", A[:5])
    h("allocate_slots", a, 5)
    h("remove_skipped_blocks", "a", 5)
    h("estimate_cached_tokens", a)


def h_watermark(h: Recorder, cfg: KVCacheConfig) -> None:
    """a and b take four of five blocks; running a needs the last one (the watermark is one block)."""
    a = new(cfg, "a", A[:4])
    h("allocate_slots", a, 4)
    h("allocate_slots", new(cfg, "b", [9, 9, 9, 9]), 4)
    h("allocate_slots", running(cfg, a, 4, (5,)), 1)


def h_delayed_cache(h: Recorder, cfg: KVCacheConfig) -> None:
    """a's allocation delays caching (a connector load); the cache_blocks after the load."""
    a = new(cfg, "a", A[:5])
    h("allocate_slots", a, 5, delay_cache_blocks=True)
    h("cache_blocks", a, 4)


FULL2 = (FullAttention(2),)

# fmt: off
CASES: dict[str, Case] = {
    "lru_takes_tail": Case(cfg_of(FULL2, 8), h_fresh_allocation, "1 allocate_slots", ((1, 2),), ((7, 6),)),
    "hashed_freed_to_head": Case(
        cfg_of(FULL2, 8), h_finish_cached_request, "2 free free_queue", (3, 4, 5, 6, 7, 2, 1), (2, 1, 3, 4, 5, 6, 7)
    ),
    "touch_skips_shared_ref": Case(
        cfg_of(FULL2, 8), h_shared_prefix_while_running, "3 allocate_slots ref_cnt",
        ((1, 2), (2, 2), (3, 1)), ((1, 1), (2, 1), (3, 1)),
    ),
    "coarse_key_first_fine_hash": Case(
        cfg_of((FullAttention(2), MLA(4))), h_resend_after_finish, "3 get_computed_blocks",
        (((1, 2, 3, 4), (5, 6)), 8), (((), ()), 0),
    ),
    "stored_event_parent_none": Case(
        cfg_of(FULL2, 8, enable_kv_cache_events=True), h_parent_of_continuing_store, "4 take_events", (True,), (False,)
    ),
    "reset_keeps_cache_map": Case(
        cfg_of(FULL2, 8), h_reset_then_resend, "3 reset_prefix_cache cached", (), ((1,), (2,))
    ),
    "reset_emits_no_clear_event": Case(
        cfg_of(FULL2, 8, enable_kv_cache_events=True), h_reset_then_resend, "4 take_events",
        ("BlockStored", "AllBlocksCleared"), ("BlockStored",),
    ),
    "window_run_counts_own_token": Case(
        cfg_of((SlidingWindow(2, 3),)), h_window_hit, "3 get_computed_blocks", (((0, 0, 3),), 6), (((0, 2, 3),), 6)
    ),
    "chunk_skip_one_late": Case(
        cfg_of((ChunkedLocal(2, 4),)), h_chunk_boundary, "2 remove_skipped_blocks free_queue",
        (*range(5, 16), 2, 1), tuple(range(5, 16)),
    ),
    "partial_block_marked_cached": Case(
        cfg_of(FULL2, 8), h_block_fills_up, "2 allocate_slots cached", ((1,), (2,)), ((1,),)
    ),
    "hits_recorded_as_new": Case(cfg_of(FULL2, 8), h_hit_then_new_ids, "5 take_new_block_ids", (3,), (1, 2, 3)),
    "free_hits_not_counted": Case(cfg_of(FULL2, 6), h_tight_hit, "4 allocate_slots", None, "PoolExhaustedError"),
    "mamba_spec_blocks_dropped": Case(
        cfg_of((FullAttention(2), Mamba(2, "none", 1)), enable_caching=False), h_mamba_spec, "1 allocate_slots",
        ((1, 2), (3, 4, 5)), ((1, 2), (3, 4)),
    ),
    "mamba_hit_skips_newest": Case(
        cfg_of((Mamba(2, "all"),)), h_mamba_resend, "3 get_computed_blocks", (((0, 0, 3),), 6), (((0, 2),), 4)
    ),
    "step_guard_reads_first_hit": Case(
        cfg_of((FullAttention(2), Mamba(2, "align", 0))), h_same_step_state, "4 allocate_slots", None,
        ((6,), (7,)),
    ),
    "mamba_nulls_counted_evictable": Case(
        cfg_of((FullAttention(2), Mamba(2, "align", 0)), 22), h_mamba_tight_hit, "7 allocate_slots", ((18,), (19,)),
        None,
    ),
    "external_tokens_not_skipped": Case(
        cfg_of((SlidingWindow(2, 2),), enable_caching=False), h_connector_tokens, "1 allocate_slots",
        ((2,),), ((5,),),
    ),
    "common_prefix_one_table_short": Case(
        cfg_of(FULL2), h_three_tables, "5 get_num_common_prefix_blocks", (0,), (2,)
    ),
    "sink_records_new_ids": Case(
        cfg_of((SinkFullAttention(2, 2),)), h_sink_new_ids, "2 take_new_block_ids", (), (2, 3)
    ),
    "pop_trims_one_null": Case(
        cfg_of((SlidingWindow(2, 2),), profile=VLLM_0_33_0), h_pop_window_table, "3 pop_blocks_for_free",
        (4,), (0, 0, 4),
    ),
    "tail_at_prompt_end": Case(
        cfg_of((FullAttention(4), SlidingWindow(2, 3)), profile=VLLM_0_33_0), h_tail_at_prompt_end,
        "2 allocate_slots cached", ((1,), (2,), (3,), (4,)), ((1,), (2,), (2,), (3,), (4,)),
    ),
    "eagle_hit_keeps_last_block": Case(
        cfg_of(FULL2, use_eagle=True), h_eagle_resend, "3 get_computed_blocks", (((1, 2),), 4), (((1, 2, 3),), 6)
    ),
    "cache_aligned_to_hash_block": Case(
        cfg_of((FullAttention(2), SlidingWindow(4, 3))), h_hybrid_six_tokens, "1 allocate_slots cached",
        ((1,), (2,), (4,)), ((1,), (2,), (3,), (4,)),
    ),
    "cross_sized_by_decoder": Case(
        cfg_of((FullAttention(2), CrossAttention(2)), enable_caching=False), h_cross, "1 allocate_slots",
        ((1, 2), (3, 4, 5)), ((1, 2), (3, 4)),
    ),
    "prefix_hint_counts_hit": Case(
        cfg_of((FullAttention(2), SlidingWindow(4, 3))), h_prefix_hint, "4 get_prefix_hint", 0, 8
    ),
    "popped_freed_at_once": Case(
        cfg_of(FULL2, 8), h_pop, "2 pop_blocks_for_free free_queue", (3, 4, 5, 6, 7), (3, 4, 5, 6, 7, 2, 1)
    ),
    "stats_reset_flag_lost": Case(
        cfg_of(FULL2, 8, log_stats=True), h_reset_stats, "3 make_prefix_cache_stats",
        PrefixCacheStats(reset=True, requests=1, queries=4), PrefixCacheStats(reset=False, requests=1, queries=4)
    ),
    "skip_reading_counted": Case(
        cfg_of(FULL2, 8, profile=VLLM_0_33_0, log_stats=True), h_skip_reading_stats, "4 make_prefix_cache_stats",
        PrefixCacheStats(), PrefixCacheStats(requests=1, queries=4),
    ),
    "skip_reading_ignored": Case(
        cfg_of(FULL2, 8), h_skip_reading_lookup, "2 get_computed_blocks", (((),), 0), (((1, 2),), 4)
    ),
    "computed_ids_round_down": Case(
        cfg_of(FULL2), h_computed_ids, "2 get_block_ids_for_computed_tokens", ((1, 2),), ((1,),)
    ),
    "cp_cut_by_scaled_block": Case(
        cfg_of(FULL2, dcp_world_size=2), h_computed_ids, "2 get_block_ids_for_computed_tokens", ((1, 2),), ((1,),)
    ),
    "estimate_max_over_groups": Case(
        cfg_of((FullAttention(2), SlidingWindow(2, 2)), profile=VLLM_0_33_0), h_estimate,
        "3 estimate_cached_tokens", 0, 4,
    ),
    "watermark_on_running": Case(
        cfg_of(FULL2, 6, watermark=0.2), h_watermark, "3 allocate_slots", ((5,),), None
    ),
    "delay_moves_cursor": Case(cfg_of(FULL2, 8), h_delayed_cache, "2 cache_blocks cached", ((1,), (2,)), ()),
}
# fmt: on
"""Per entry: its configuration, history and first difference (kvspec's value, the mutant's)."""


def _run(factory: Callable[[KVCacheConfig], Any], case: Case) -> list[Entry]:
    h = Recorder(factory(case.config))
    case.history(h, case.config)
    return h.log


def test_every_entry_has_a_case() -> None:
    """No entry of the set goes without a directed history (and no case is left over)."""
    assert sorted(CASES) == sorted(UNSEEN)


def test_the_set_is_large_enough() -> None:
    """At least 24 faults, each with a profile the hunt can use."""
    assert len(UNSEEN) >= 24
    assert set(PROFILE_OF) == set(UNSEEN)


@pytest.mark.parametrize("name", sorted(UNSEEN))
def test_entry_is_live(name: str) -> None:
    """kvimpl agrees with kvspec on the whole history; the mutant's first difference is the named one."""
    case = CASES[name]
    assert case.config.profile.name == PROFILE_OF[name], "the case runs under the profile the hunt uses"
    spec = _run(KVCacheManager, case)
    assert first_difference(spec, _run(ImplAdapter, case)) is None, "unmutated kvimpl differs from kvspec"
    assert first_difference(spec, _run(UNSEEN[name].factory, case)) == (case.label, case.spec, case.mutant)
