"""The safety level: the content and in-flight oracles (kvref.safety, docs/safety.md).

The oracles must pass kvspec and kvimpl, and fail an engine that serves KV
computed after another prefix (upstream nano-vllm's block manager, unmodified;
kvspec behind a weak hash) or fills a block that another step or load uses,
with a message that says which request reads which block.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvref.adapters import load_factory
from kvref.capabilities import declared_unsupported, probe
from kvref.check import run_lockstep
from kvref.cli import main
from kvref.content import ZERO, BlockContents
from kvref.hypothesis_compat import set_shrink_time_limit, shrink_time_limit
from kvref.lockstep import Lockstep, LockstepFailure, RunStats
from kvref.ops import REQUEST_OPS
from kvref.safety import SafetyMonitor, SafetyViolation, safety_monitor, safety_replay
from kvref.settings import load_profile
from kvref.shapes import SHAPES
from kvref.stateful import MachineSetup
from kvref.traces import Trace, load
from kvspec.config import FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.profiles import NEWEST, VLLM_0_25_1, SemanticsProfile

EXAMPLES = Path(__file__).with_name("examples")
HAS_NANO = importlib.util.find_spec("nanovllmnpu") is not None


@pytest.fixture
def examples(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The example folder on ``sys.path`` (as a user's working folder is)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    yield EXAMPLES
    for name in ("nanovllm_adapter", "weakhash_adapter"):
        sys.modules.pop(name, None)


def _solo(target: str, cfg: KVCacheConfig, tmp_path: Path) -> Lockstep:
    stats = RunStats()
    lock = Lockstep(cfg, [load_factory(target)], stats, tmp_path)
    lock.monitor = safety_monitor(cfg, lock.book, stats.safety)
    return lock


def _admit(lock: Lockstep, rid: str, prompt: list[int], **extra: Any) -> Any:
    """Add ``rid`` and admit it whole after its lookup (the allocation's output)."""
    lock.request_op({"op": "add_request", "rid": rid, "prompt": prompt})
    found = lock.call({"op": "get_computed_blocks", "rid": rid})
    hit = found["num_tokens"]
    op: dict[str, Any] = {"op": "allocate_slots", "rid": rid, "num_new_computed_tokens": hit, **extra}
    op.setdefault("num_new_tokens", len(prompt) - hit - op.get("num_external_computed_tokens", 0))
    if any(found["blocks"]):
        op["new_computed_blocks"] = found["blocks"]
    out = lock.call(op)
    if out is not None and not op.get("delay_cache_blocks"):
        lock.request_op({"op": "set_request", "rid": rid, "num_computed_tokens": len(prompt), "status": "RUNNING"})
    return out


def _setup(factories: list[Any], tmp_path: Path, profile: SemanticsProfile = NEWEST) -> MachineSetup:
    excluded = frozenset().union(*(declared_unsupported(f) for f in factories))
    shapes, excluded, _ = probe(factories, SHAPES, profile, excluded)
    return MachineSetup(factories, RunStats(), tmp_path, shapes=shapes, profile=profile, excluded=excluded,
                        safety=True)  # fmt: skip


# -- the content oracle -----------------------------------------------------------------


@pytest.mark.skipif(not HAS_NANO, reason="nano-vllm-npu is not installed (ci/setup.sh installs it)")
def test_nano_vllm_serves_a_block_reused_under_another_prefix(examples: Path, tmp_path: Path) -> None:
    """The eight calls of the wrong-prefix defect of nano-vllm's block manager:
    cache and free [1,1,0,0]; admit and free [2,2,0,0], which reuses the block
    of [0,0] and keys it anew while the old key stays; look up [1,1,0,0,9]."""
    lock = _solo("nanovllm_adapter:make", KVCacheConfig(num_blocks=4, groups=(FullAttention(2),), max_model_len=16),
                 tmp_path)  # fmt: skip
    _admit(lock, "a", [1, 1, 0, 0])
    lock.call({"op": "free", "rid": "a"})
    _admit(lock, "b", [2, 2, 0, 0])
    lock.call({"op": "free", "rid": "b"})
    lock.request_op({"op": "add_request", "rid": "c", "prompt": [1, 1, 0, 0, 9]})
    with pytest.raises(LockstepFailure) as failed:
        lock.call({"op": "get_computed_blocks", "rid": "c"})
    message = str(failed.value)
    assert "safety (content): request c hit block 2 (group 0) for position 2" in message
    assert "the KV of another prefix (written for request b at position 2)" in message
    assert lock.stats.last_failure_key == "get_computed_blocks/safety/content"


@pytest.mark.skipif(not HAS_NANO, reason="nano-vllm-npu is not installed (ci/setup.sh installs it)")
def test_the_safety_level_finds_the_nano_vllm_defect_with_no_fault_planted(examples: Path, tmp_path: Path) -> None:
    """The whole hunt, as ``kvref check --level safety`` runs it (docs/safety.md
    has the steps it takes at seeds 0-4 of the ci profile)."""
    load_profile("dev")
    setup = _setup([load_factory("nanovllm_adapter:make")], tmp_path)
    saved = shrink_time_limit()
    set_shrink_time_limit(10)  # finding it is the point here; shrinking a long history takes minutes
    try:
        failure = run_lockstep(setup, seed=0, goal=40_000)
    finally:
        set_shrink_time_limit(saved)
    assert failure is not None and "safety (content)" in failure, failure
    assert setup.stats.first_failure_steps is not None and setup.stats.first_failure_steps < 40_000


def test_a_weak_hash_collides_and_the_oracle_not_the_hash_sees_it(examples: Path, tmp_path: Path) -> None:
    load_profile("dev")
    setup = _setup([load_factory("weakhash_adapter:make")], tmp_path)
    failure = run_lockstep(setup, seed=0, goal=5_000)
    assert failure is not None and "safety (content)" in failure and "another prefix" in failure, failure


@pytest.mark.parametrize("engine", ["spec", "impl"])
def test_kvspec_and_kvimpl_pass_the_safety_level(engine: str, tmp_path: Path) -> None:
    load_profile("dev")
    setup = _setup([load_factory(engine)], tmp_path)
    assert run_lockstep(setup, seed=1, goal=1_500) is None
    assert setup.stats.safety["slots compared"] > 0 and setup.stats.safety["hits checked"] > 0


def test_a_step_that_reads_a_block_never_written_fails(tmp_path: Path) -> None:
    """A hit adopted while nothing ever wrote it: the monitor's contents start
    empty, so a fresh block served as a hit is read before it is written."""
    cfg = KVCacheConfig(num_blocks=8, groups=(FullAttention(2),), max_model_len=16)
    lock = _solo("spec", cfg, tmp_path)
    _admit(lock, "a", [1, 2, 3, 4, 5])
    assert lock.monitor is not None
    lock.monitor.contents = type(lock.monitor.contents)(cfg)  # forget what a's step wrote
    lock.request_op({"op": "add_request", "rid": "b", "prompt": [1, 2, 3, 4, 6]})
    with pytest.raises(LockstepFailure, match=r"request b hit block 1 \(group 0\) for position 0, .*never written"):
        lock.call({"op": "get_computed_blocks", "rid": "b"})


def test_a_sliding_window_step_reads_only_its_window(tmp_path: Path) -> None:
    """Out-of-window blocks may be freed and reused: the oracle reads the window only."""
    cfg = KVCacheConfig(num_blocks=8, groups=(SlidingWindow(2, window=2),), max_model_len=32)
    lock = _solo("spec", cfg, tmp_path)
    _admit(lock, "a", [1, 2, 3, 4, 5, 6, 7])
    for n, token in enumerate((8, 9, 10), start=7):
        lock.request_op({"op": "append_tokens", "rid": "a", "tokens": [token]})
        assert lock.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 1}) is not None
        lock.request_op({"op": "set_request", "rid": "a", "num_computed_tokens": n + 1})
    _admit(lock, "b", [3, 3, 3, 3, 3, 3])
    assert lock.stats.safety["steps run"] == 5 and lock.stats.unexplained == 0


def test_a_declared_difference_never_silences_the_safety_check(examples: Path, tmp_path: Path) -> None:
    from kvref.divergences import Divergence  # noqa: PLC0415

    lock = _solo("weakhash_adapter:make", KVCacheConfig(num_blocks=8, groups=(FullAttention(2),), max_model_len=16),
                 tmp_path)  # fmt: skip
    lock.declared[0].append(Divergence("any", "anything goes", "*", "", "", True, aspect="*"))
    _admit(lock, "a", [1, 2, 3, 4, 5])  # weak keys: one bit, the parity of the running token sum
    lock.request_op({"op": "add_request", "rid": "b", "prompt": [2, 1, 4, 3, 5]})  # the same bits
    with pytest.raises(LockstepFailure, match="safety"):
        lock.call({"op": "get_computed_blocks", "rid": "b"})


# -- the in-flight oracle -------------------------------------------------------------


def _mamba_load(profile: SemanticsProfile, tmp_path: Path) -> tuple[Lockstep, SafetyMonitor]:
    """A hybrid whose fresh blocks are zeroed (a Mamba group), and a delayed load in flight."""
    cfg = KVCacheConfig(num_blocks=16, groups=(FullAttention(2), Mamba(2)), max_model_len=32, profile=profile,
                        enable_caching=False)  # fmt: skip
    lock = _solo("spec", cfg, tmp_path)
    assert _admit(lock, "a", [1, 2, 3, 4, 5, 6], num_new_tokens=0, num_external_computed_tokens=4,
                  delay_cache_blocks=True) is not None  # fmt: skip
    assert lock.monitor is not None
    return lock, lock.monitor


def test_zeroing_a_block_a_load_fills_fails_before_vllm_0_26(tmp_path: Path) -> None:
    """vLLM 0.25.1's scheduler zeroes every fresh block, the destinations of a
    delayed connector load too (vLLM#47373); from 0.26.0 on it leaves them out."""
    lock, monitor = _mamba_load(VLLM_0_25_1, tmp_path)
    assert not monitor.skip_load_zeroing
    lock.call({"op": "take_new_block_ids"})  # vLLM 0.25.1's own defect: named, and the run halts there
    assert lock.stats.known == {"safety defect load-zeroing": 1} and lock.halted
    assert lock.stats.unexplained == 0
    with pytest.raises(SafetyViolation, match=r"take_new_block_ids lists block \d+ for zeroing while the connector "
                                              r"load of request a"):  # fmt: skip
        _mamba_load(VLLM_0_25_1, tmp_path / "alone")[1]._zero([1, 2])  # what the oracle says, unregistered


def test_a_newer_scheduler_leaves_the_load_out_of_the_zeroing(tmp_path: Path) -> None:
    lock, monitor = _mamba_load(NEWEST, tmp_path)
    assert monitor.skip_load_zeroing
    lock.call({"op": "take_new_block_ids"})
    lock.call({"op": "cache_blocks", "rid": "a", "num_computed_tokens": 4})
    assert not monitor.loads and lock.stats.unexplained == 0


def test_a_block_handed_out_while_a_load_fills_it_fails(tmp_path: Path) -> None:
    """The loading request is freed before its load ends and the scheduler
    frees at once (what vLLM#32255 fixed in the scheduler): the monitor takes
    the free as the load's end, so a load still in flight is only seen where
    a manager hands its destination to another request while it waits."""
    cfg = KVCacheConfig(num_blocks=16, groups=(FullAttention(2),), max_model_len=32)
    lock = _solo("spec", cfg, tmp_path)
    _admit(lock, "a", [1, 2, 3, 4, 5, 6], num_new_tokens=0, num_external_computed_tokens=4, delay_cache_blocks=True)
    assert lock.monitor is not None
    load = lock.monitor.loads["a"]
    block = next(iter(load.blocks))
    lock.monitor.loads["a"].blocks[block] = 0
    lock.request_op({"op": "add_request", "rid": "b", "prompt": [7, 7, 7]})
    lock.monitor.loads["a"].blocks = {b: 0 for b in range(1, 16)}  # as if the manager gave b a loading block
    with pytest.raises(LockstepFailure, match=r"safety \(inflight\): block \d+ is still being filled by the connector "
                                              r"load of request a"):  # fmt: skip
        _admit(lock, "b", [7, 7, 7])


def test_the_cli_runs_the_safety_level_alone(examples: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.chdir(examples)
    monkeypatch.setenv("KVREF_FAILURE_DIR", str(tmp_path))
    code = main(["check", "--safety", "--target", "weakhash_adapter:make", "--min-steps", "3000"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 1
    assert "the safety level runs the target alone" in err
    assert "safety (content)" in err
    assert main(["check", "--level", "safety", "--target", "spec", "--against", "spec"]) == 2


def test_the_all_level_keeps_the_profile_of_its_conformance_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--level all`` runs the safety check under the profile the conformance check
    chose (against real vLLM: the installed release's), not the target's own choice."""
    import kvref.cli.check as cli_check  # noqa: PLC0415 - the module whose execute is replaced

    seen: list[tuple[str, str | None, str | None]] = []

    def fake(request: Any, chosen_profile: list[str] | None = None, **_: Any) -> int:
        seen.append((request.level, request.against, request.semantics))
        if chosen_profile is not None:
            chosen_profile.append("vllm-0.29.0")
        return 0

    monkeypatch.setattr(cli_check, "execute", fake)
    assert main(["check", "--level", "all", "--target", "spec", "--against", "impl"]) == 0
    assert seen == [("conformance", "impl", None), ("safety", None, "vllm-0.29.0")]
    seen.clear()
    assert main(["check", "--level", "all", "--target", "spec", "--against", "impl", "--semantics", "vllm-0.25.1"]) == 0
    assert seen == [("conformance", "impl", "vllm-0.25.1"), ("safety", None, "vllm-0.25.1")]


def test_a_copy_on_write_hit_is_read_after_its_copy() -> None:
    """vLLM 0.29.0 on: a fine-grained hit on part of a block gives the request a
    fresh block that the scheduler's copy (``take_kv_cache_block_copies``, at the
    end of its pass) fills before the step runs. Without the pipeline the
    monitor ran the step at the allocation, before the copy, and reported a
    read of a block never written (kvspec under 0.29.0, shapes with a Mamba
    group, seed 1); it now runs it once the copies are handed off."""
    trace = load(Path(__file__).with_name("safety_traces") / "cow-hit-before-copy.jsonl")
    assert trace.steps[-1]["op"] == "take_kv_cache_block_copies"
    for engine in ("spec", "impl"):
        assert safety_replay(trace, load_factory(engine)(trace.config)) is None, engine
    before_copy = Trace(trace.config, trace.steps[:-1], trace.meta)
    assert safety_replay(before_copy, load_factory("spec")(trace.config)) is None  # the step waits


def test_a_running_requests_own_tail_copy_runs_before_its_step() -> None:
    """vLLM 0.29.0: a running request's step past its own Mamba tail entry (a state
    inside a block) moves the entry to a fresh block the copy fills, while the
    step writes on in the source block. Without the pipeline the monitor ran
    the step at its allocation (no prefix hit, so it did not wait for copies)
    and copied afterwards, so the moved entry seemed to hold the state one
    token later and a later hit on it a state of another prefix (kvimpl under
    0.29.0 with a retention interval of 0, seed 0); the step now waits for the
    copies under any configuration with fine-grained hits."""
    trace = load(Path(__file__).with_name("safety_traces") / "own-tail-copy-before-step.jsonl")
    assert trace.config.prefix_cache_retention_interval == 0
    for engine in ("spec", "impl"):
        assert safety_replay(trace, load_factory(engine)(trace.config)) is None, engine


def test_a_block_listed_again_after_its_listing_was_drained_is_zeroed_now() -> None:
    """A block listed when it is handed out is zeroed before the writes that
    follow; listed again after that listing was drained (an adopted hit), the
    zeroing wipes what was written before the drain."""
    contents = BlockContents(KVCacheConfig(num_blocks=8, groups=(FullAttention(2),), max_model_len=16))
    contents.handed_out(3)
    contents.write(3, 0, 0, 11)
    contents.listed_for_zeroing([3])
    contents.zero(3)
    assert contents.value(3, 0, 0) == 11
    contents.listed_for_zeroing([3])
    contents.zero(3)
    assert contents.value(3, 0, 0) == ZERO


def test_a_copy_on_write_hit_runs_its_copies_before_its_load() -> None:
    """The same hit with a connector token past it (a synchronous load into the
    copy's destination): on the device the copies run first, then the load,
    then the step. The monitor landed the load at the allocation and let the
    later copy overwrite it (kvimpl under 0.29.0, every shape, seed 3: a false
    "never written" at the loaded position)."""
    trace = load(Path(__file__).with_name("safety_traces") / "cow-copy-then-load.jsonl")
    assert trace.steps[-1]["op"] == "take_kv_cache_block_copies" and trace.steps[-2]["num_external_computed_tokens"]
    for engine in ("spec", "impl"):
        assert safety_replay(trace, load_factory(engine)(trace.config)) is None, engine


def test_a_connector_load_fills_the_groups_a_lookup_left_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connector's lookup in a Mamba hybrid (vLLM 0.27.0 on) hits 4 tokens in
    full attention only; the Mamba and sliding-window groups lag at 0, and the
    connector loads one more token. The load fills every group from its own
    hit (vLLM's NIXL connector loads each block that holds no cached hit), so
    the step reads the window's earlier positions as loaded. A monitor that
    started every group's load at the reported hit saw them never written
    (kvspec at the safety level under 0.29.0, seed 0, once the family ran there)."""
    trace = load(Path(__file__).with_name("safety_traces") / "connector-load-fills-lagging-groups.jsonl")
    lookups = [s["expect"] for s in trace.steps if s["op"] == "get_computed_blocks_for_connector"]
    assert lookups[-1]["hit_diverged"] and lookups[-1]["blocks"] == [[1], [], []]
    for engine in ("spec", "impl"):
        assert safety_replay(trace, load_factory(engine)(trace.config)) is None, engine
    monkeypatch.setattr(SafetyMonitor, "_lagging_starts", lambda self, hits, local: ())
    found = safety_replay(trace, load_factory("spec")(trace.config))
    assert found is not None and "never written" in str(found[1]), found


def test_an_allocation_may_retain_a_block_it_freed_for_a_pending_copy(tmp_path: Path) -> None:
    """Under vLLM 0.26.0's profile one allocation releases a request's
    sliding-window blocks outside the window and takes one of them (cached)
    as the destination of a Mamba copy-on-write: the block leaves its cache
    entry and sits in no table and no free queue, retained for the copy.
    The lockstep's hash-lifetime rule (kvspec.invariants.inv_hash_lifetime)
    flagged it (kvspec at the safety level, seed 0)."""
    trace = load(Path(__file__).with_name("safety_traces") / "copy-destination-freed-by-the-same-call.jsonl")
    lock = Lockstep(trace.config, [load_factory("spec")], RunStats(), tmp_path)
    for step in trace.steps:
        op = {k: v for k, v in step.items() if k not in ("expect", "view")}
        if op["op"] in REQUEST_OPS:
            lock.request_op(op)
        else:
            assert lock.call(op) == step["expect"]
    assert lock.stats.unexplained == 0
