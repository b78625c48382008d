"""Keep-going with declared differences, the block-pool layer, and
:class:`kvref.VllmLineage` (a vLLM fork with a renamed package)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import json
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from kvref import DeclaredSemantics, Divergence, VllmLineage
from kvref.adapters import load_factory
from kvref.adapters.vllm import vllm_available
from kvref.check import run_keep_going, run_lockstep
from kvref.cli import main
from kvref.divergences import load_known_file
from kvref.exits import DIVERGENCE, OK, USAGE, InputError
from kvref.layers.pool import POOL, execute_pool, load_pool_factory
from kvref.layers.pool_machine import make_pool_machine
from kvref.lockstep import Lockstep, LockstepFailure, RunStats
from kvref.settings import load_profile
from kvref.shapes import shape_named
from kvref.stateful import MachineSetup
from kvref.traces import load, replay
from kvspec.block_pool import BlockId
from kvspec.config import FullAttention, KVCacheConfig
from kvspec.kv_cache_manager import KVCacheManager
from kvspec.profiles import VLLM_0_25_1

EXAMPLES = Path(__file__).with_name("examples")
needs_vllm = pytest.mark.skipif(not vllm_available(), reason="real vLLM is not installed")


class _ReversedPop(KVCacheManager):
    """A planted difference: ``pop_blocks_for_free`` returns the blocks reversed."""

    name = "reversed-pop"

    def pop_blocks_for_free(self, request_id: str) -> tuple[int, ...]:  # type: ignore[override]  # a tuple of ints
        return tuple(reversed(super().pop_blocks_for_free(request_id)))


class _ReversedPopDeclared(_ReversedPop):
    """The same, declaring the difference with its own matcher."""

    semantics = DeclaredSemantics(
        "vllm-0.33.0", upstream=False,
        known=(Divergence("reversed-pop", "pop returns reversed", "pop_blocks_for_free", "", "", False,
                          matcher=lambda cfg, op, own, other, pending: own == other[::-1]),),
    )  # fmt: skip


def _setup(target: Any, tmp_path: Path, **kw: Any) -> MachineSetup:
    load_profile("dev")
    return MachineSetup([load_factory("spec"), target], RunStats(), tmp_path / "failures",
                        shapes=(shape_named("full"),), **kw)  # fmt: skip


# -- keep going and declared differences ------------------------------------------------


def test_keep_going_lists_each_class_once_with_its_shortest_trace(tmp_path: Path) -> None:
    setup = _setup(_ReversedPop, tmp_path)
    classes = run_keep_going(setup, seed=0, goal=1500, out_dir=tmp_path / "classes")
    keys = [c.key for c in classes]
    assert "pop_blocks_for_free/output" in keys
    assert len(keys) == len(set(keys))
    for c in classes:
        assert c.trace is not None and c.trace.exists() and c.trace_ops > 0 and c.steps_to_find > 0
        assert load(c.trace).meta["features"]


def test_keep_going_counts_a_known_construction_crash_instead_of_listing_it_again(tmp_path: Path) -> None:
    def crashes_with_blocks_above_20(config: KVCacheConfig) -> Any:
        if config.num_blocks > 20:
            raise RuntimeError("cannot build this one")
        return load_factory("spec")(config)

    setup = _setup(crashes_with_blocks_above_20, tmp_path)
    classes = run_keep_going(setup, seed=0, goal=1500, out_dir=tmp_path / "classes")
    assert [c.key for c in classes] == ["construct/crash"]
    assert setup.stats.refused_configs["known class"] > 0
    assert classes[0].occurrences == 1 + setup.stats.refused_configs["known class"]
    assert setup.stats.steps >= 1500  # the other configurations were still checked


class _LookupCrashes(KVCacheManager):
    """A planted crash: every prefix lookup raises."""

    name = "lookup-crashes"

    def get_computed_blocks(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("planted lookup crash")


def test_keep_going_goes_on_after_a_reference_that_crashed(tmp_path: Path) -> None:
    # When the side listed first (whose output the scheduler model reads) crashes in a class
    # already listed, the run restarts; the model must not read the crash marker as a lookup
    # result (kvref drift against a real release died there with a KeyError).
    load_profile("dev")
    crashing: Any = _LookupCrashes  # a manager class stands in for its adapter factory
    setup = MachineSetup([crashing, load_factory("spec")], RunStats(), tmp_path / "failures",
                         shapes=(shape_named("full"),))  # fmt: skip
    classes = run_keep_going(setup, seed=1, goal=600, out_dir=tmp_path / "classes")  # seed 1 meets it again
    assert [c.key for c in classes] == ["get_computed_blocks/crash"]
    assert classes[0].occurrences > 1  # met again, and each time the run went on
    assert setup.stats.steps >= 600


class _HaltingPopThenWrongIds(_ReversedPop):
    """Declares its reversed pop as a *halting* difference; every later
    ``take_new_block_ids`` answer is wrong."""

    semantics = DeclaredSemantics(
        "vllm-0.33.0", upstream=False,
        known=(Divergence("reversed-pop", "pop returns reversed", "pop_blocks_for_free", "", "", True,
                          matcher=lambda cfg, op, own, other, pending: own == other[::-1]),),
    )  # fmt: skip

    def take_new_block_ids(self) -> list[BlockId]:
        return [BlockId(999)]


def test_a_halting_known_divergence_ends_the_comparison_within_the_rule(tmp_path: Path) -> None:
    # The scheduler model reads the prefix hint right after a lookup: when that lookup
    # meets a halting known divergence, the calls that follow compare nothing.
    cfg = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=64)
    halting: Any = _HaltingPopThenWrongIds  # a manager class stands in for its adapter factory
    lock = Lockstep(cfg, [load_factory("spec"), halting], RunStats(), tmp_path)
    lock.request_op({"op": "add_request", "rid": "a", "prompt": list(range(9))})
    allocate = {"op": "allocate_slots", "rid": "a", "num_new_tokens": 9, "num_new_computed_tokens": 0,
                "num_lookahead_tokens": 0, "num_external_computed_tokens": 0, "num_encoder_tokens": 0,
                "delay_cache_blocks": False, "full_sequence_must_fit": False, "has_scheduled_reqs": False,
                "reserved_blocks": 0}  # fmt: skip
    lock.call(allocate)
    with pytest.raises(LockstepFailure, match=r"returned \[999\]"):
        Lockstep(cfg, [load_factory("spec"), halting], RunStats(), tmp_path).call(
            {"op": "take_new_block_ids"}
        )  # the planted difference is caught while the run compares
    assert lock.call({"op": "pop_blocks_for_free", "rid": "a"}) == [1, 2, 3]  # the reference's answer
    assert lock.halted and lock.stats.known["reversed-pop"] == 1
    steps = lock.stats.steps
    assert lock.call({"op": "take_new_block_ids"}) == []  # neutral output, not compared
    assert lock.stats.steps == steps


def test_a_declared_matcher_explains_the_difference(tmp_path: Path) -> None:
    setup = _setup(_ReversedPopDeclared, tmp_path)
    assert run_lockstep(setup, seed=0, goal=1500) is None
    assert setup.stats.known["reversed-pop"] > 0


def test_a_known_file_names_the_class(tmp_path: Path) -> None:
    known = tmp_path / "known.toml"
    known.write_text('[[divergence]]\nid = "reversed-pop"\ntitle = "pop returns its blocks reversed"\n'
                     'operation = "pop_blocks_for_free"\naspect = "output"\n')  # fmt: skip
    entries = load_known_file(known)
    setup = _setup(_ReversedPop, tmp_path, known=tuple(entries))
    assert run_keep_going(setup, seed=0, goal=1500, out_dir=tmp_path / "classes") == []
    assert setup.stats.known["reversed-pop"] > 0


@pytest.mark.parametrize(
    ("text", "message"),
    [("x = 1", "no [[divergence]] entries"), ('[[divergence]]\nid = "a"', "missing title, operation"),
     ('[[divergence]]\nid = "a"\ntitle = "t"\noperation = "free"', "needs a matcher"),
     ('[[divergence]]\nid = "a"\ntitle = "t"\noperation = "free"\nmatcher = "nope_mod:f"', "cannot import")],
)  # fmt: skip
def test_bad_known_files_are_input_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "known.toml"
    path.write_text(text)
    with pytest.raises(InputError, match=re.escape(message)):
        load_known_file(path)


def test_kvref_check_keep_going_prints_the_classes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = tmp_path / "planted.py"
    module.write_text("from test_layers_and_lineage import _ReversedPop as make\n")
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.chdir(tmp_path)
    code = main(["check", "--target", "planted:make", "--against", "spec", "--keep-going", "--shapes", "full",
                 "--min-steps", "1000", "--out", str(tmp_path / "classes")])  # fmt: skip
    out = capsys.readouterr().out
    assert code == DIVERGENCE
    assert "pop_blocks_for_free/output" in out and "distinct divergence class" in out
    sys.modules.pop("planted", None)


# -- the pool layer ---------------------------------------------------------------------


def _pool_setup(targets: Sequence[str], tmp_path: Path) -> MachineSetup:
    load_profile("dev")
    factories = [load_pool_factory(t) for t in targets]
    return MachineSetup(factories, RunStats(), tmp_path, profile=VLLM_0_25_1)  # type: ignore[arg-type]  # pool factories


@pytest.mark.parametrize("pool_target", ["impl", pytest.param("vllm", marks=needs_vllm)])
def test_pool_layer_agrees_with_kvspec(tmp_path: Path, pool_target: str) -> None:
    setup = _pool_setup(["spec", pool_target], tmp_path)
    assert run_lockstep(setup, seed=0, goal=800, machine=make_pool_machine(setup)) is None
    assert setup.stats.steps >= 800 and setup.stats.invariant_checks > 0
    assert any(k.startswith("free_blocks:DoubleFreeError") for k in setup.stats.invalid_calls)


@pytest.fixture
def examples(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    yield EXAMPLES
    for name in ("tinypool", "tinypool_adapter"):
        sys.modules.pop(name, None)


def test_a_block_pool_port_is_checked_by_the_pool_layer(examples: Path, tmp_path: Path) -> None:
    setup = _pool_setup(["spec", "tinypool_adapter:make"], tmp_path)
    setup.excluded = frozenset({"events"})
    assert run_lockstep(setup, seed=0, goal=800, machine=make_pool_machine(setup)) is None
    assert setup.stats.steps >= 800


class _LifoPool:
    """kvspec's pool, but freed hashed blocks go to the *head* (a planted bug)."""

    def __new__(cls, config: KVCacheConfig) -> Any:
        adapter = load_pool_factory("spec")(config)
        pool: Any = getattr(adapter, "pool")  # noqa: B009 - the spec adapter's pool
        original = pool.free_blocks

        def free_blocks(ordered: Any) -> None:
            before = set(pool.free_queue)
            original(ordered)
            new = [b for b in pool.free_queue if b not in before]
            pool.free_queue = new + [b for b in pool.free_queue if b in before]

        pool.free_blocks = free_blocks
        adapter.name = "lifo"
        return adapter


def test_a_pool_divergence_writes_a_pool_trace_that_replays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    setup = _pool_setup(["spec"], tmp_path)
    setup.factories.append(_LifoPool)
    failure = run_lockstep(setup, seed=0, goal=2000, machine=make_pool_machine(setup))
    assert failure is not None and setup.stats.last_failure is not None
    trace = load(setup.stats.last_failure)
    assert trace.layer == "pool"
    schema = json.loads((Path(__file__).resolve().parents[2] / "traces" / "schema" / "trace.schema.json").read_text())
    lines = [json.loads(line) for line in setup.stats.last_failure.read_text().splitlines()]
    assert all(Draft202012Validator(schema).is_valid(line) for line in lines), "a pool trace the schema refuses"
    assert replay(trace, load_pool_factory("spec"), execute_op=execute_pool).ok  # type: ignore[arg-type]  # pool
    module = tmp_path / "lifo.py"
    module.write_text("from test_layers_and_lineage import _LifoPool as make\n")
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["replay", str(setup.stats.last_failure), "--target", "lifo:make"]) == DIVERGENCE
    out = capsys.readouterr().out
    assert "FAILED at step" in out
    sys.modules.pop("lifo", None)


def test_pool_check_from_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVREF_FAILURE_DIR", str(tmp_path))
    args = ["check", "--layer", "pool", "--target", "impl", "--against", "spec", "--min-steps", "300",
            "--semantics", "vllm-0.25.1"]  # fmt: skip
    assert main(args) == OK
    assert main(["check", "--layer", "pool", "--target", "nope_mod:make", "--against", "spec"]) == USAGE


def test_pool_lockstep_compares_views(tmp_path: Path) -> None:
    cfg = KVCacheConfig(num_blocks=6, groups=(FullAttention(2),), max_model_len=16, profile=VLLM_0_25_1)
    spec = load_pool_factory("spec")
    lock = Lockstep(cfg, [spec, _LifoPool], RunStats(), tmp_path, "pool", layer=POOL)  # type: ignore[list-item]  # pools
    lock.request_op({"op": "add_request", "rid": "a", "prompt": [1, 2, 3, 4]})
    lock.call({"op": "get_new_blocks", "num_blocks": 2})
    lock.call({"op": "cache_full_blocks", "rid": "a", "block_ids": [1, 2], "num_cached_blocks": 0,
               "num_full_blocks": 2, "block_size": 2, "group_id": 0})  # fmt: skip
    with pytest.raises(LockstepFailure, match=r"free_queue: first difference at position 0: spec has 3, lifo has"):
        lock.call({"op": "free_blocks", "block_ids": [2, 1]})


# -- VllmLineage ----------------------------------------------------------------------------


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes ``vllmfork.*`` the already importable ``vllm.*`` (a renamed package)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name == "vllmfork" or name.startswith("vllmfork."):
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module("vllm" + spec.name.removeprefix("vllmfork"))

    def exec_module(self, module: ModuleType) -> None:
        pass


@needs_vllm
def test_a_renamed_fork_is_checked_through_its_lineage(tmp_path: Path) -> None:
    finder = _Alias()
    sys.meta_path.insert(0, finder)
    try:
        fork = VllmLineage(package="vllmfork", env_prefix="VLLM_", upstream="0.25.1", name="fork")
        api = fork.api()
        assert api.modules["kcm"] == "vllmfork.v1.core.kv_cache_manager"
        assert api.env.int_block_hashes == "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"
        adapter = fork.make(KVCacheConfig(num_blocks=8, groups=(FullAttention(4),), max_model_len=32,
                                          profile=VLLM_0_25_1))  # fmt: skip
        assert adapter.name == "fork" and adapter.semantics.profile == "vllm-0.25.1" and adapter.semantics.upstream
        setup = MachineSetup([load_factory("spec"), fork.make], RunStats(), tmp_path, profile=VLLM_0_25_1,
                             shapes=(shape_named("full"), shape_named("full+swa")))  # fmt: skip
        load_profile("dev")
        assert run_lockstep(setup, seed=0, goal=600) is None
        against_upstream = MachineSetup([VllmLineage(upstream="0.25.1").make, fork.make], RunStats(), tmp_path,
                                        profile=VLLM_0_25_1, shapes=(shape_named("full"),))  # fmt: skip
        assert run_lockstep(against_upstream, seed=0, goal=400) is None
    finally:
        sys.meta_path.remove(finder)
        for name in [m for m in sys.modules if m.startswith("vllmfork")]:
            del sys.modules[name]


def test_lineage_renames_variables_and_modules() -> None:
    from kvref.adapters.vllm.lineage import _rename, _repackage  # noqa: PLC0415 - internals under test

    assert _rename("VLLM_LOGGING_LEVEL", "APHRODITE_") == "APHRODITE_LOGGING_LEVEL"
    assert _rename("PYTHONHASHSEED", "APHRODITE_") == "PYTHONHASHSEED"
    assert _repackage("vllm.v1.core.block_pool", "aphrodite") == "aphrodite.v1.core.block_pool"
    assert _repackage("torch", "aphrodite") == "torch"
    with pytest.raises(Exception, match="name the vLLM release"):
        VllmLineage(package="nothing_here").api()


def test_lineage_declarations_ride_on_its_factories() -> None:
    """``features`` (the opt-in context parallelism), ``unsupported`` and ``supports`` of a lineage are on
    ``make`` and ``make_pool``; ``declare`` takes a lineage's factory (a bound method once refused it); the era
    names and the era base class are public."""
    import kvref  # noqa: PLC0415 - the public names under test
    from kvref import declare  # noqa: PLC0415
    from kvref.capabilities import refusal  # noqa: PLC0415

    def one_group(config: KVCacheConfig) -> str | None:
        return None if len(config.groups) == 1 else "one group"

    fork = VllmLineage(package="vllmfork", upstream="0.25.1", features={"context-parallelism"},
                       unsupported={"events"}, supports=one_group)  # fmt: skip
    cp = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=64, dcp_world_size=2,
                       hash_block_size=8)  # fmt: skip
    for factory in (fork.make, fork.make_pool):
        assert getattr(factory, "features") == {"context-parallelism"}  # noqa: B009 - a declared attribute
        assert getattr(factory, "unsupported") == {"events"}  # noqa: B009
        assert refusal(factory, cp) is None
    assert refusal(VllmLineage(upstream="0.25.1").make, cp) is not None  # opt-in: refused without it
    declared = declare(unsupported={"stats"})(VllmLineage(upstream="0.25.1").build)
    assert getattr(declared, "unsupported") == {"stats"}  # noqa: B009
    assert "0.29" in kvref.ERA_NAMES and "kvref" not in kvref.ERA_NAMES
    assert issubclass(VllmLineage(upstream="0.29.0").base_era(), kvref.VllmApi)
    assert all(name in kvref.__all__ for name in ("ERA_NAMES", "VllmApi", "VllmLineage"))
    with pytest.raises(ValueError, match="not opt-in features"):
        VllmLineage(upstream="0.25.1", features={"events"})


@pytest.fixture
def renamed_fork(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """The renamed-fork example importable from the working folder (tests/kit/examples/renamed_fork.py)."""
    monkeypatch.chdir(EXAMPLES)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setenv("KVREF_FAILURE_DIR", str(tmp_path / "failures"))
    yield EXAMPLES
    for name in [m for m in sys.modules if m.startswith(("vllmfork", "renamed_fork"))]:
        del sys.modules[name]


@needs_vllm
def test_the_guides_fork_recipe_catches_a_planted_hit_cap(renamed_fork: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """vLLM 0.25.1 renamed as a fork, with its prefix hit capped at every token instead of all but the last:
    ``kvref check --target renamed_fork:make_planted --against spec`` at its default settings finds it (seed 0:
    after 3,796 steps, 5 s into the run, at a lookup; since the retention interval joined the draws, at the
    prefix hint that reads the same capped hit; the dev goal of 2,000 steps it once had passed it)."""
    code = main(["check", "--target", "renamed_fork:make_planted", "--against", "spec"])
    err = capsys.readouterr().err
    assert code == DIVERGENCE, err[-1500:]
    assert "unexplained divergence: fork-planted returned" in err


@needs_vllm
def test_a_renamed_fork_that_opts_in_runs_context_parallelism(renamed_fork: Path, tmp_path: Path) -> None:
    fork = VllmLineage(package="vllmfork", upstream="0.25.1", name="fork", features={"context-parallelism"})
    importlib.import_module("renamed_fork")  # its import hook serves vllmfork
    load_profile("dev")
    setup = MachineSetup([load_factory("spec"), fork.make], RunStats(), tmp_path, profile=VLLM_0_25_1,
                         shapes=(shape_named("full@dcp2"),))  # fmt: skip
    assert run_lockstep(setup, seed=0, goal=400) is None
    assert setup.stats.configs["full@dcp2"] > 0 and not setup.stats.refused_configs
