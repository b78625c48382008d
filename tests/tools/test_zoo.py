"""The upstream bug zoo (kvtools.zoo): every entry builds, and the kit kills a
few representative mutants quickly (dev profile, no timing assertions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvref.adapters import DeclaredSemantics, load_factory
from kvref.cli import main
from kvref.lockstep import Lockstep, LockstepFailure, RunStats
from kvref.ops import REQUEST_OPS
from kvref.safety import safety_replay
from kvref.safety_defects import MAMBA_FAILED_LOAD, registered
from kvref.traces import load, replay
from kvspec.config import CrossAttention, FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.profiles import VLLM_0_25_1, profile_named
from kvtools.zoo import ZOO
from kvtools.zoo.base import ENTRIES
from kvtools.zoo.cli import main as zoo_main
from kvtools.zoo.coordinator import hits_touched_per_group
from kvtools.zoo.fresh import FRESH
from kvtools.zoo.runner import run_entry
from kvtools.zoo.unseen import PROFILE_OF, UNSEEN

CONFIGS = (
    KVCacheConfig(profile=VLLM_0_25_1, num_blocks=8, groups=(FullAttention(4),), max_model_len=16),
    KVCacheConfig(
        profile=VLLM_0_25_1,
        num_blocks=16,
        groups=(FullAttention(4), SlidingWindow(2, 3)),
        max_model_len=32,
        use_eagle=True,
    ),
    KVCacheConfig(
        profile=VLLM_0_25_1, num_blocks=16, groups=(FullAttention(2), Mamba(2, "align", 1)), max_model_len=32
    ),
    KVCacheConfig(
        profile=VLLM_0_25_1,
        num_blocks=16,
        groups=(FullAttention(2), CrossAttention(2)),
        max_model_len=32,
        enable_caching=False,
    ),
)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_entry_constructs(name: str) -> None:
    """Each registry entry is a loadable --target factory with an upstream number."""
    entry = ZOO[name]
    assert entry.name == name and entry.upstream and entry.description
    factory = load_factory(f"kvtools.zoo:{name}")
    assert getattr(factory, "__name__", None) == name
    for cfg in CONFIGS:
        adapter = factory(cfg)
        assert adapter.name == name
        adapter.to_view()


@pytest.mark.parametrize("name", sorted(UNSEEN))
def test_unseen_entry_constructs(name: str) -> None:
    """Each unseen entry is a loadable --target factory with an operator, a description and a known
    profile, and builds an adapter for configurations of every kind (without the patched decision
    point it is plain kvimpl)."""
    entry = UNSEEN[name]
    assert entry.name == name and entry.upstream and entry.description
    assert profile_named(PROFILE_OF[name]).name == PROFILE_OF[name]
    factory = load_factory(f"kvtools.zoo.unseen:{name}")
    assert getattr(factory, "__name__", None) == name
    for cfg in CONFIGS:
        adapter = factory(cfg)
        assert adapter.name == name
        adapter.to_view()


def test_unseen_cli_lists_the_set_with_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m kvtools zoo --unseen --list`` prints every unseen entry with its profile (and hunts
    nothing); an unknown name or both sets at once is refused."""
    assert zoo_main(["--unseen", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(UNSEEN)
    assert all(line.endswith(f"[{PROFILE_OF[line.split()[0]]}]") for line in lines)
    assert zoo_main(["--unseen", "no_such_fault"]) == 2
    assert zoo_main(["--unseen", "--fresh", "--list"]) == 2


def test_unseen_set_is_apart_from_the_zoo_and_the_fresh_set() -> None:
    """No unseen entry reuses a zoo or fresh entry's name (each is a different fault)."""
    assert not set(UNSEEN) & (set(ZOO) | set(FRESH))


def test_registry_holds_every_entry() -> None:
    """Every entry registered by an area module is in ``ZOO``, once."""
    assert list(ZOO) == list(dict.fromkeys(ZOO)) and set(ZOO) == set(ENTRIES)


@pytest.mark.parametrize("name", ["constant_none_hash", "unhashed_freed_to_tail", "lora_missing_from_hash"])
def test_kit_kills(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kvref check fails on the mutant and leaves a shrunk trace.

    NOTE: the ci profile, not dev: a seeded run is repeatable for one set of
    loaded modules, but Hypothesis also draws literals it finds in the
    modules already imported, so inside a long pytest session the same seed
    can take a different path (a dev-profile kill of cache_salt_dropped
    passed alone and failed in the full suite). These three die within a
    few hundred steps at seed 0 on the ci profile.
    """
    monkeypatch.setenv("KVREF_FAILURE_DIR", str(tmp_path))
    argv = ["check", "--target", f"kvtools.zoo:{name}", "--against", "spec", "--profile", "ci", "--seed", "0"]
    assert main(argv) == 1
    assert list(tmp_path.glob("failure-*.jsonl"))


def test_runner_row() -> None:
    """The runner reports hunt and shrink time separately and counts both against the budget."""
    row = run_entry(ZOO["constant_none_hash"], budget=60, seed=0, profile="ci")
    assert row["killed"] and row["trace_length"] and row["steps"]
    assert row["hunt_seconds"] + row["shrink_seconds"] == pytest.approx(row["seconds"], abs=0.2)
    assert row["within_budget"] == (row["seconds"] <= 60)


def test_hits_touched_per_group_is_killable(tmp_path: Path) -> None:
    """A hand-built history that kills ``hits_touched_per_group`` (the machine's ``flood`` lines the
    situation up: tests/stateful/test_flood.py). a and y fill the pool and are freed, a first; b extends
    a and loads 3 tokens through the connector, so group 0's allocation pops group 1's still-free hit
    block unless every hit is touched first."""
    cfg = KVCacheConfig(
        profile=VLLM_0_25_1, num_blocks=17, groups=(FullAttention(2), SlidingWindow(2, 16)), max_model_len=32
    )
    mutant = load_factory("kvtools.zoo:hits_touched_per_group")
    lock = Lockstep(cfg, [load_factory("spec"), mutant], RunStats(), tmp_path)
    a = [1, 2, 3, 0, 1, 2, 3, 0]
    for rid, prompt in (("a", a), ("y", [0] * 8)):
        lock.request_op({"op": "add_request", "rid": rid, "prompt": prompt})
        lock.call({"op": "allocate_slots", "rid": rid, "num_new_tokens": 8})
    lock.call({"op": "free", "rid": "a"})
    lock.call({"op": "free", "rid": "y"})
    lock.request_op({"op": "add_request", "rid": "b", "prompt": [*a, 3, 3, 3, 3]})
    hit = lock.call({"op": "get_computed_blocks", "rid": "b"})
    op = {"op": "allocate_slots", "rid": "b", "num_new_tokens": 1, "num_new_computed_tokens": hit["num_tokens"],
          "new_computed_blocks": hit["blocks"], "num_external_computed_tokens": 3}  # fmt: skip
    with pytest.raises(LockstepFailure, match="views differ after allocate_slots"):
        lock.call(op)


DIRECTED_KILLS = (
    "touch_before_capacity_check",
    "double_free_in_call",
    "wrong_num_cached_blocks",
    "cross_attn_batch_budget",
    "unhashed_freed_to_tail",
    "eagle_drop_every_pass",
    "unscaled_hash_block_size",
    "removed_event_per_copy",
    "full_hit_keeps_last_block",
    "eagle_window_drops_last",
)
"""Zoo entries the directed traces (traces/vllm-0.25.1/directed) catch without any search."""


@pytest.mark.parametrize("name", DIRECTED_KILLS)
def test_directed_traces_kill(name: str) -> None:
    """Replaying the directed traces against the mutant fails on at least one of them."""
    paths = sorted((Path(__file__).resolve().parents[2] / "traces" / "vllm-0.25.1" / "directed").glob("*.jsonl"))
    factory = load_factory(f"kvtools.zoo:{name}")
    assert any(not replay(load(p), factory, str(p)).ok for p in paths), f"no directed trace catches {name}"


def test_the_touch_order_mutant_declared_as_vllm_0_16_0_meets_the_known_divergence(tmp_path: Path) -> None:
    """kvimpl with 0.16.0's touch order (the zoo's hits_touched_per_group),
    declared as upstream vLLM 0.16.0, against kvspec on the divergence
    trace's scenario: the lockstep counts the known divergence and stops
    comparing instead of failing; declared as following kvspec, it fails."""
    trace = load(Path(__file__).resolve().parents[2] / "traces/vllm-0.16.0/divergences/hits-touched-per-group.jsonl")

    class Declared:
        """The mutant with a declared semantics (upstream or kvspec's)."""

        def __init__(self, config: KVCacheConfig, upstream: bool) -> None:
            self.inner = hits_touched_per_group(config)
            self.semantics = DeclaredSemantics(config.profile.name, upstream)

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

    def run(upstream: bool) -> RunStats:
        stats = RunStats()
        def declared(config: KVCacheConfig) -> Any:  # a wrapper the protocol cannot type
            return Declared(config, upstream)

        lock = Lockstep(trace.config, [declared, load_factory("spec")], stats, tmp_path)
        for op in trace.steps:
            clean = {k: v for k, v in op.items() if k not in ("expect", "view")}
            if clean["op"] in REQUEST_OPS:
                lock.request_op(clean)
            else:
                lock.call(clean)
        return stats

    stats = run(True)
    assert stats.known["hits-touched-per-group"] == 1 and stats.unexplained == 0
    with pytest.raises(LockstepFailure, match="views differ after allocate_slots"):
        run(False)


def test_adopted_hit_blocks_listed_for_zeroing_are_seen() -> None:
    """The shrunk trace of the safety hunt (vLLM 0.33.0's profile, shapes with a
    Mamba group): r3 adopts r1's cached blocks as its hit; the mutant lists them
    for zeroing, the zeroing wipes KV r1's next step reads. kvimpl runs the same
    calls with no violation. The monitor zeroes a block listed again after its
    own listing was drained as of that drain (kvref.content.BlockContents.
    listed_for_zeroing), and the scheduler model drains the list every step
    where the model zeroes (as vLLM's scheduler does)."""
    trace = load(Path(__file__).with_name("zoo_traces") / "hit_blocks_listed_for_zeroing.jsonl")
    found = safety_replay(trace, load_factory("kvtools.zoo:hit_blocks_listed_for_zeroing")(trace.config))
    assert found is not None and "zeroed" in str(found[1]), found
    assert safety_replay(trace, load_factory("impl")(trace.config)) is None


def test_failed_load_zeroing_one_block_early_is_seen() -> None:
    """The shrunk trace of the safety hunt (vLLM 0.34.0's profile, full attention
    next to a Mamba group): r1's delayed load of 3 tokens fails after 2; the
    scheduler caches the 2 valid tokens and lists the blocks from token 2 on for
    zeroing again. The mutant lists from token 0, so the zeroing wipes the block
    that holds the valid prefix, and r1's next step reads it. kvspec and kvimpl
    run the same calls with no zeroed read (a start inside a block is refused);
    the Mamba group (checked under EAGLE too) then starts r1's recomputation
    from the state entry its failed load skipped, vLLM 0.34.0's registered
    ``mamba-failed-load``, which they model as the release has it."""
    trace = load(Path(__file__).with_name("zoo_traces") / "failed_load_zeroes_valid_block.jsonl")
    found = safety_replay(trace, load_factory("kvtools.zoo:failed_load_zeroes_valid_block")(trace.config))
    assert found is not None and "zeroed" in str(found[1]), found
    for target in ("spec", "impl"):
        same = safety_replay(trace, load_factory(target)(trace.config))
        assert same is not None and same[1].defect == MAMBA_FAILED_LOAD, (target, same)
        assert registered(same[1].defect, same[1].oracle, trace.config.profile.release) is not None
