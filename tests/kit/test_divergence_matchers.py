"""Each registered divergence's matcher recognises what vLLM really returned
(outputs copied from runs of vLLM 0.25.1 on the divergence traces and on a
shrunk lockstep failure), and nothing else: a well-formed difference, or the
same difference under a release where the divergence is fixed, stays
unexplained."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvref.divergences import explain, load_registry
from kvref.traces import load
from kvspec.config import MLA, ChunkedLocal, FullAttention, KVCacheConfig, Mamba, MambaMode, SlidingWindow
from kvspec.profiles import VLLM_0_25_1, VLLM_0_26_0, VLLM_0_28_0, VLLM_0_33_0, VLLM_0_34_0, profile_named

ROOT = Path(__file__).resolve().parents[2]
LOOKUP = {"op": "get_computed_blocks", "rid": "b"}

EAGLE_MAMBA_ALIGN_SWA = KVCacheConfig(
    profile=VLLM_0_25_1,
    num_blocks=16,
    groups=(FullAttention(4), Mamba(4, "align"), SlidingWindow(2, 1)),
    max_model_len=32,
    use_eagle=True,
)


def _trace_step(div_id: str) -> tuple[KVCacheConfig, dict[str, Any], Any]:
    trace = load(ROOT / load_registry()[div_id].trace)
    step = trace.steps[trace.meta["divergence_step"]]
    return trace.config, step, step["expect"]


@pytest.mark.parametrize(
    ("div_id", "vllm_out"),
    [
        ("eagle-mamba-hit", {"blocks": [[1, 2, 3], [0, 0, 0, 9]], "num_tokens": 16}),
        ("swa-eagle-fallback", {"blocks": [[], []], "num_tokens": 0}),
        ("second-full-group", {"blocks": [[1, 2, 3], [6, 7, 8, 9], [0, 0, 13]], "num_tokens": 12}),
        ("common-prefix-pending", [2]),
        ("mamba-align-external-estimate", {"crash": "ValueError"}),
        ("mamba-cow-owner", [[], [5], [6]]),
        ("connector-lookup-bound-crash", {"crash": "IndexError"}),
        ("lookahead-lookup-crash", {"crash": "IndexError"}),
        ("report-mode-cp-crash", {"crash": "AssertionError"}),
        ("report-mode-partial-hit-crash", {"crash": "IndexError"}),
        ("mamba-align-recompute-crash", {"crash": "AssertionError"}),
    ],
)
def test_matcher_explains_vllms_output_on_its_trace(div_id: str, vllm_out: Any) -> None:
    cfg, op, spec_out = _trace_step(div_id)
    pending = div_id == "common-prefix-pending"
    assert explain(cfg, op, vllm_out, spec_out, pending) == div_id


def test_bound_crash_in_a_plain_lookup_only_without_a_full_attention_group() -> None:
    """vLLM 0.33.0's plain lookup with a bound past the hashed tokens crashes where the Mamba or
    sliding-window (or chunked-local) finder sees the bound first (a Mamba-only, window-only or
    chunk-only model: shrunk lockstep failures); with a full-attention group it never does, so a
    crash there stays unexplained."""
    op = {"op": "get_computed_blocks", "rid": "r1", "max_cache_hit_length": 4}
    spec_out = {"blocks": [[]], "num_tokens": 0}
    crash = {"crash": "IndexError"}
    mamba_only = KVCacheConfig(num_blocks=16, groups=(Mamba(2, "align"),), max_model_len=32, profile=VLLM_0_33_0)
    assert explain(mamba_only, op, crash, spec_out, False) == "connector-lookup-bound-crash"
    assert explain(mamba_only, {"op": "get_computed_blocks", "rid": "r1"}, crash, spec_out, False) is None
    window_only = KVCacheConfig(num_blocks=16, groups=(SlidingWindow(2, 1),), max_model_len=32, profile=VLLM_0_33_0)
    assert explain(window_only, op, crash, spec_out, False) == "connector-lookup-bound-crash"
    chunked_only = KVCacheConfig(
        num_blocks=16, groups=(ChunkedLocal(2, 6),), max_model_len=32, profile=VLLM_0_33_0
    )  # a 7-token prompt looked up with the bound 8: a shrunk lockstep failure of seed 3 (asynchronous)
    assert explain(chunked_only, {**op, "max_cache_hit_length": 8}, crash, spec_out, False) == (
        "connector-lookup-bound-crash"
    )
    full_only = KVCacheConfig(num_blocks=16, groups=(FullAttention(2),), max_model_len=32, profile=VLLM_0_33_0)
    assert explain(full_only, op, crash, spec_out, False) is None
    hybrid = KVCacheConfig(
        num_blocks=16, groups=(FullAttention(2), Mamba(2, "align")), max_model_len=32, profile=VLLM_0_33_0
    )
    assert explain(hybrid, op, crash, {"blocks": [[], []], "num_tokens": 0}, False) is None
    assert explain(mamba_only, op, crash, spec_out, False, release="0.34.0") is None


def test_swa_eagle_window_lost_only_for_nulls_inside_the_window_and_only_in_0_19_1() -> None:
    """vLLM 0.19.1's output on its trace (a shrunk lockstep failure): the same
    length, the window's block null. Not explained from 0.20.0 on, nor for a
    null before the window, a different length, or a difference in another group."""
    cfg, op, spec_out = _trace_step("swa-eagle-window-lost")
    assert cfg.profile.release == "0.19.1"
    assert spec_out == {"blocks": [[1], [0, 6]], "num_tokens": 4}
    assert explain(cfg, op, {"blocks": [[1], [0, 0]], "num_tokens": 4}, spec_out, False) == "swa-eagle-window-lost"
    assert explain(cfg, op, {"blocks": [[1], [0, 0]], "num_tokens": 4}, spec_out, False, release="0.20.0") is None
    assert explain(cfg, op, {"blocks": [[2], [0, 0]], "num_tokens": 4}, spec_out, False) is None
    assert explain(cfg, op, {"blocks": [[1], [0, 7]], "num_tokens": 4}, spec_out, False) is None
    wide = {"blocks": [[1, 2], [5, 6, 7, 8]], "num_tokens": 8}
    assert explain(cfg, op, {"blocks": [[1, 2], [0, 6, 7, 8]], "num_tokens": 8}, wide, False) is None
    assert explain(cfg, op, {"blocks": [[1, 2], [5, 6, 0, 8]], "num_tokens": 8}, wide, False) is None


def test_eagle_mamba_hit_with_lists_longer_than_a_shrunk_hit() -> None:
    """The second form: the hit shrank to 0, a later look-ahead pass left longer lists."""
    vllm_out = {"blocks": [[], [2], [0, 0]], "num_tokens": 0}
    spec_out = {"blocks": [[], [], []], "num_tokens": 0}
    assert explain(EAGLE_MAMBA_ALIGN_SWA, LOOKUP, vllm_out, spec_out, False) == "eagle-mamba-hit"


def test_eagle_mamba_hit_longer_and_ending_on_a_mamba_state() -> None:
    """The third form: a longer hit whose lists agree, ending on the state block the
    EAGLE Mamba group found with its look-ahead (FullAttention(2) + SlidingWindow(2,
    window 1) + Mamba(2, align), the window and Mamba groups flagged)."""
    cfg = KVCacheConfig(
        num_blocks=16, max_model_len=32, use_eagle=True, eagle_groups=(1, 2), profile=VLLM_0_25_1,
        groups=(FullAttention(2), SlidingWindow(2, 1), Mamba(2, "align")),
    )  # fmt: skip
    spec_out = {"blocks": [[], [], []], "num_tokens": 0}
    assert explain(cfg, LOOKUP, {"blocks": [[1], [2], [3]], "num_tokens": 2}, spec_out, False) == "eagle-mamba-hit"
    assert explain(cfg, LOOKUP, {"blocks": [[1], [2], [0]], "num_tokens": 2}, spec_out, False) is None


def test_a_well_formed_difference_is_not_explained() -> None:
    vllm_out = {"blocks": [[1], [0], [0, 7]], "num_tokens": 4}
    spec_out = {"blocks": [[], [], []], "num_tokens": 0}
    assert explain(EAGLE_MAMBA_ALIGN_SWA, LOOKUP, vllm_out, spec_out, False) is None


def test_a_fixed_divergence_is_not_explained_on_later_releases() -> None:
    cfg, op, spec_out = _trace_step("eagle-mamba-hit")
    vllm_out = {"blocks": [[1, 2, 3], [0, 0, 0, 9]], "num_tokens": 16}
    later = replace(cfg, profile=VLLM_0_26_0)
    assert explain(later, op, vllm_out, spec_out, False) is None


def test_the_vllm_sides_release_picks_the_entries_not_the_profile_kvspec_runs() -> None:
    # kvref drift runs kvspec under 0.25.1 against a later vLLM: a defect that release
    # fixed must not explain a difference there, and the vLLM release decides.
    cfg, op, spec_out = _trace_step("eagle-mamba-hit")
    vllm_out = {"blocks": [[1, 2, 3], [0, 0, 0, 9]], "num_tokens": 16}
    assert cfg.profile.release == "0.25.1"
    assert explain(cfg, op, vllm_out, spec_out, False, release="0.33.0") is None
    assert explain(cfg, op, vllm_out, spec_out, False, release="0.25.1") == "eagle-mamba-hit"
    assert explain(replace(cfg, profile=VLLM_0_26_0), op, vllm_out, spec_out, False, release="0.25.1") == (
        "eagle-mamba-hit"
    )


def test_mamba_cow_owner_only_where_it_was_not_fixed_and_only_the_copy() -> None:
    """The owner's copy returned first in the Mamba group is explained under
    0.26.0, not under 0.28.0 (which fixed it), and not when another group
    differs too or the extra block is not first."""
    cfg, op, spec_out = _trace_step("mamba-cow-owner")
    assert spec_out == [[], [], [6]]
    assert explain(cfg, op, [[], [5], [6]], spec_out, False) == "mamba-cow-owner"
    assert explain(cfg, op, [[], [5], [6]], spec_out, False, release="0.28.0") is None
    assert explain(cfg, op, [[7], [5], [6]], spec_out, False) is None
    assert explain(cfg, op, [[], [6, 5], [6]], spec_out, False) is None
    assert explain(cfg, op, [[], [], [5]], spec_out, False) is None


def _state_before(path: Path, step: int) -> tuple[KVCacheConfig, dict[str, Any], Any]:
    """The trace's config, its step ``step`` and kvspec's view right before it."""
    from kvref.adapters.spec import make_spec_adapter  # noqa: PLC0415 - only these tests need it
    from kvref.ops import REQUEST_OPS, RequestBook, execute  # noqa: PLC0415

    trace = load(path)
    adapter: Any = make_spec_adapter(trace.config)  # kvspec's ids are BlockId, the protocol says int
    book = RequestBook(trace.config)
    for op in trace.steps[:step]:
        clean = {k: v for k, v in op.items() if k not in ("expect", "view")}
        if clean["op"] in REQUEST_OPS:
            book.apply(clean)
        else:
            execute(adapter, book, clean)
    return trace.config, trace.steps[step], adapter.to_view()


HITS_TOUCHED = ROOT / "traces/vllm-0.16.0/divergences/hits-touched-per-group.jsonl"


def test_state_trigger_holds_on_its_trace_and_only_where_the_orders_differ() -> None:
    """hits-touched-per-group shows in the state, not the output (both return
    no new blocks): its trigger holds at the divergence step of its trace,
    from the state before it, under 0.16.0 only; without connector tokens,
    or with a free block ahead of the sliding-window hit, the two touch
    orders give the same blocks and nothing is explained."""
    from kvref.divergences import explain_state  # noqa: PLC0415

    cfg, op, before = _state_before(HITS_TOUCHED, load(HITS_TOUCHED).meta["divergence_step"])
    assert before.free_queue == (2, 1, 4, 3, 5, 6)
    assert explain_state(cfg, op, before, 0) == "hits-touched-per-group"
    assert explain_state(cfg, op, before, 0, "0.25.1") is None  # fixed there
    assert explain_state(cfg, {**op, "num_external_computed_tokens": 0}, before, 0) is None
    roomier = replace(before, free_queue=(7, *before.free_queue))  # FA's connector block is 7, not SWA's hit
    assert explain_state(cfg, op, roomier, 0) is None
    assert explain_state(cfg, {**op, "op": "get_computed_blocks"}, before, 0) is None


def test_swa_eagle_fallback_explains_the_probe_of_0_34_0() -> None:
    """vLLM 0.34.0's ``get_num_cached_tokens`` runs the same finder: a shorter count in a
    configuration with an EAGLE window group whose block size is not the alignment is explained,
    a longer one or one in a configuration without such a group is not."""
    cfg = KVCacheConfig(
        num_blocks=16, groups=(FullAttention(4), SlidingWindow(2, 6)), max_model_len=32,
        use_eagle=True, eagle_groups=(1,), profile=VLLM_0_34_0,
    )  # fmt: skip
    probe = {"op": "get_num_cached_tokens", "rid": "r1"}
    assert explain(cfg, probe, 0, 4, False) == "swa-eagle-fallback"
    assert explain(cfg, probe, 4, 0, False) is None
    assert explain(cfg, probe, True, 4, False) is None
    plain = replace(cfg, groups=(FullAttention(4), SlidingWindow(4, 6)))
    assert explain(plain, probe, 0, 4, False) is None


def test_second_full_group_in_a_connectors_lookup() -> None:
    """vLLM 0.28.0's connector lookup keeps MLA's longer list as its plain lookup does (a shrunk
    lockstep failure: FullAttention + MLA + SlidingWindow under EAGLE); a full-attention list
    within the hit is no such case."""
    cfg = KVCacheConfig(
        num_blocks=16, groups=(FullAttention(2), MLA(2), SlidingWindow(2, 1)), max_model_len=32, use_eagle=True,
        profile=VLLM_0_28_0,
    )  # fmt: skip
    op = {"op": "get_computed_blocks_for_connector", "rid": "r1"}
    spec_out = {"blocks": [[1], [6], [11]], "num_tokens": 2, "hit_diverged": False}
    vllm_out = {"blocks": [[1], [6, 7, 8, 9], [11]], "num_tokens": 2, "hit_diverged": False}
    assert explain(cfg, op, vllm_out, spec_out, False) == "second-full-group"
    assert explain(cfg, op, spec_out | {"blocks": [[1], [6], []]}, spec_out, False) is None


def test_lookahead_crash_only_from_two_tokens_and_without_a_full_attention_group() -> None:
    """Look-ahead hashes of one token keep the hashes level with the lookup limit; a
    full-attention-type group cuts a plain lookup's length first, not a connector's in a
    hybrid with a Mamba group; 0.34.0's get_num_cached_tokens runs the same finders (all
    checked on real vLLM 0.33.0 and 0.34.0)."""
    crash = {"crash": "IndexError"}
    spec_out = {"blocks": [[]], "num_tokens": 0}
    lookup = {"op": "get_computed_blocks", "rid": "r"}

    def config(ahead: int, *groups: Any) -> KVCacheConfig:
        return KVCacheConfig(
            num_blocks=16, groups=groups, max_model_len=32, profile=VLLM_0_34_0, num_hash_lookahead_tokens=ahead,
            num_prefill_lookahead=ahead,
        )  # fmt: skip

    for kind in (SlidingWindow(2, 1), ChunkedLocal(2, 4), Mamba(2, "align")):
        assert explain(config(2, kind), lookup, crash, spec_out, False) == "lookahead-lookup-crash"
        assert explain(config(1, kind), lookup, crash, spec_out, False) is None
    window = config(2, SlidingWindow(2, 1))
    assert explain(window, {"op": "get_num_cached_tokens", "rid": "r"}, crash, 0, False) == "lookahead-lookup-crash"
    hybrid = config(2, FullAttention(2), SlidingWindow(2, 1))
    assert explain(hybrid, lookup, crash, {"blocks": [[], []], "num_tokens": 0}, False) is None
    connector = {"op": "get_computed_blocks_for_connector", "rid": "r"}
    answered = {"blocks": [[], []], "num_tokens": 0, "hit_diverged": False}
    assert explain(hybrid, connector, crash, answered, False) is None  # a hybrid's window group answers
    assert explain(window, lookup, crash, None, False) == "lookahead-lookup-crash"  # the safety level: no kvspec side
    mamba_hybrid = config(2, FullAttention(2), Mamba(2, "align"))
    assert explain(mamba_hybrid, connector, crash, answered, False) == "lookahead-lookup-crash"
    assert explain(mamba_hybrid, lookup, crash, {"blocks": [[], []], "num_tokens": 0}, False) is None


def test_report_mode_crash_needs_context_parallelism_events_and_a_hit() -> None:
    """The announcement of a report-mode "full" hit asserts only under context parallelism
    (the group's configured block then is a fraction of the hash block; measured on real
    0.34.0); without it, without events, without a hit or before 0.26.0 an AssertionError
    stays unexplained."""
    crash = {"crash": "AssertionError"}
    hit = {"blocks": [[1, 2]], "num_tokens": 16}

    def config(profile: Any = VLLM_0_34_0, dcp: int = 2, events: bool = True) -> KVCacheConfig:
        return KVCacheConfig(
            num_blocks=16, groups=(FullAttention(4),), max_model_len=32, profile=profile, dcp_world_size=dcp,
            enable_kv_cache_events=events,
        )  # fmt: skip

    assert explain(config(), LOOKUP, crash, hit, False) == "report-mode-cp-crash"
    assert explain(config(), {"op": "get_computed_blocks_for_connector", "rid": "b"}, crash, hit, False) == (
        "report-mode-cp-crash"
    )
    assert explain(config(), LOOKUP, crash, None, False) == "report-mode-cp-crash"  # the safety level
    assert explain(config(dcp=1), LOOKUP, crash, hit, False) is None
    assert explain(config(events=False), LOOKUP, crash, hit, False) is None
    assert explain(config(), LOOKUP, crash, {"blocks": [[]], "num_tokens": 0}, False) is None
    assert explain(config(), LOOKUP, {"crash": "IndexError"}, hit, False) is None
    assert explain(config(VLLM_0_25_1), LOOKUP, crash, hit, False) is None


def test_report_mode_partial_hit_crash_needs_a_hit_inside_a_block() -> None:
    """The announcement of a report-mode "full" hit reads past the request's hashes only under
    fine-grained hits, for a hit that ends inside a group's block (real 0.27.1 and 0.29.0):
    a hit on a block boundary, events off or plain hashing leave an IndexError unexplained."""
    crash = {"crash": "IndexError"}
    inside = {"blocks": [[1, 2], [0, 4]], "num_tokens": 6}

    def config(hash_block: int | None = 2, events: bool = True) -> KVCacheConfig:
        return KVCacheConfig(
            num_blocks=32, groups=(FullAttention(4), Mamba(4, "align")), max_model_len=32, profile=VLLM_0_26_0,
            hash_block_size=hash_block, enable_kv_cache_events=events,
        )  # fmt: skip

    assert explain(config(), LOOKUP, crash, inside, False) == "report-mode-partial-hit-crash"
    assert explain(config(), LOOKUP, crash, None, False) == "report-mode-partial-hit-crash"  # the safety level
    assert explain(config(), LOOKUP, crash, {"blocks": [[1, 2], [0, 4]], "num_tokens": 8}, False) is None
    assert explain(config(events=False), LOOKUP, crash, inside, False) is None
    assert explain(config(hash_block=None), LOOKUP, crash, inside, False) is None
    assert explain(config(), LOOKUP, {"crash": "AssertionError"}, inside, False) is None



def test_mamba_recompute_crash_only_where_kvspec_adds_no_entry_and_before_0_23_0() -> None:
    """An ``align`` allocation that vLLM 0.16.0-0.22.x asserts on: the table already covers the
    tokens, so kvspec gives the Mamba group nothing (real 0.16.0, seed 2 of the ci profile at the
    safety level). A new entry on kvspec's side, connector tokens, another exception or 0.23.0,
    which dropped the assertion, leave it unexplained."""
    crash = {"crash": "AssertionError"}
    step = {"op": "allocate_slots", "rid": "a", "num_new_tokens": 2}

    def config(release: str = "vllm-0.20.0", mode: MambaMode = "align") -> KVCacheConfig:
        return KVCacheConfig(
            num_blocks=16, groups=(FullAttention(2), Mamba(2, mode)), max_model_len=32, profile=profile_named(release)
        )  # fmt: skip

    assert explain(config(), step, crash, [[5], []], False) == "mamba-align-recompute-crash"
    assert explain(config(), step, crash, None, False) == "mamba-align-recompute-crash"  # the safety level
    assert explain(config(), step, crash, [[5], [6]], False) is None
    assert explain(config(), {**step, "num_external_computed_tokens": 2}, crash, [[5], []], False) is None
    assert explain(config(), step, {"crash": "ValueError"}, [[5], []], False) is None
    assert explain(config(mode="all"), step, crash, [[5], []], False) is None
    assert explain(config("vllm-0.23.0"), step, crash, [[5], []], False) is None
