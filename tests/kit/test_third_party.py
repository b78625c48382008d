"""Third-party engines: capabilities and skips, the minimal corpus, protocol 2,
diagnostics, and the example adapters (tests/kit/examples) that use only
kvref's public API.

The examples are what a new user writes from docs/writing-an-adapter.md:
``nanokv`` (an independent ~100-line block manager: one full-attention group,
its own block ids, no events) and ``tinypool`` (a port of vLLM's block pool
alone), each with its adapter.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kvref
from kvref.adapters import load_factory, protocol_version
from kvref.capabilities import (
    Unsupported,
    declare,
    declared_unsupported,
    op_features,
    parse_features,
    probe,
    refusal,
    trace_features,
)
from kvref.check import run_lockstep
from kvref.cli import main
from kvref.diagnose import decode_key, describe, first_difference
from kvref.exits import DIVERGENCE, NOTHING_CHECKED, OK, USAGE
from kvref.lockstep import RunStats
from kvref.ops import RequestBook, execute
from kvref.settings import load_profile
from kvref.shapes import SHAPES
from kvref.stateful import MachineSetup
from kvref.traces import Trace, load, replay
from kvspec.config import FullAttention, KVCacheConfig, SlidingWindow
from kvspec.kv_cache_manager import KVCacheManager
from kvspec.profiles import NEWEST, VLLM_0_25_1
from kvspec.request import Request
from kvspec.view import KVView

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = Path(__file__).with_name("examples")
MINIMAL = sorted((ROOT / "traces" / "vllm-0.25.1" / "minimal").glob("*.jsonl"))
GOLDEN = sorted((ROOT / "traces" / "vllm-0.25.1" / "golden").glob("*.jsonl"))


@pytest.fixture
def examples(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The example folder on ``sys.path`` (as a user's working folder is)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    yield EXAMPLES
    names = ("nanokv", "nanokv_adapter", "nanoblocks", "nanoblocks_adapter", "tinypool", "tinypool_adapter")
    for name in (*names, "aph_adapter"):
        sys.modules.pop(name, None)


def _cfg(**kw: Any) -> KVCacheConfig:
    fields: dict[str, Any] = {"num_blocks": 8, "groups": (FullAttention(2),), "max_model_len": 32}
    fields.update(kw)
    return KVCacheConfig(**fields)


def _setup(factories: list[Any], profile: Any = NEWEST, **kw: Any) -> MachineSetup:
    shapes, excluded, _ = probe(factories, SHAPES, profile, kw.pop("excluded", frozenset()))
    return MachineSetup(factories, RunStats(), kw.pop("failure_dir"), shapes=shapes, profile=profile,
                        excluded=excluded, **kw)  # fmt: skip


# -- features and declared capabilities ------------------------------------------


def test_features_of_configurations_and_operations() -> None:
    cfg = _cfg(groups=(FullAttention(2), SlidingWindow(2, 4)), enable_kv_cache_events=True)
    assert {"kind:FullAttention", "kind:SlidingWindow", "hybrid", "caching", "events"} <= set(
        trace_features(cfg, [])
    )
    assert op_features({"op": "add_request", "rid": "a", "prompt": [1], "extra": {"lora": {"name": "l"}}}) == {
        "lora"
    }
    alloc = {"op": "allocate_slots", "rid": "a", "num_new_tokens": 1, "num_external_computed_tokens": 2,
             "num_lookahead_tokens": 0, "has_scheduled_reqs": False}  # fmt: skip
    assert op_features(alloc) == {"op:allocate_slots", "external", "has_scheduled_reqs"}


def test_parse_features_names_bare_operations_and_refuses_unknown_ones() -> None:
    assert parse_features("pop_blocks_for_free, events") == {"op:pop_blocks_for_free", "events"}
    with pytest.raises(ValueError, match="unknown feature 'evnts'"):
        parse_features("evnts")


def test_declare_attaches_supports_and_unsupported() -> None:
    @declare(supports=lambda c: None if len(c.groups) == 1 else "one group", unsupported={"events"})
    def make(config: KVCacheConfig) -> KVCacheManager:
        return KVCacheManager(config)

    assert refusal(make, _cfg()) is None
    assert refusal(make, _cfg(groups=(FullAttention(2), FullAttention(2)))) == "one group"
    assert declared_unsupported(make) == {"events"}


def test_probe_drops_refused_shapes_and_switches(examples: Path) -> None:
    factories = [load_factory("spec"), load_factory("nanokv_adapter:make")]
    shapes, excluded, notes = probe(factories, SHAPES, NEWEST)
    kept = [s.name for s in shapes]
    assert "full" in kept and "swa" not in kept and "full+swa" not in kept
    assert {"eagle", "events", "stats", "watermark"} <= excluded
    assert any("exactly one full-attention group" in n for n in notes)


# -- the minimal engine ----------------------------------------------------------


@pytest.mark.parametrize("profile", [VLLM_0_25_1, NEWEST], ids=lambda p: p.name)
def test_minimal_engine_passes_on_its_subset(examples: Path, tmp_path: Path, profile: Any) -> None:
    load_profile("dev")
    factories = [load_factory("spec"), load_factory("nanokv_adapter:make")]
    setup = _setup(factories, profile, failure_dir=tmp_path, excluded=declared_unsupported(factories[1]))
    assert run_lockstep(setup, seed=0, goal=600) is None
    assert setup.stats.steps >= 600
    assert set(setup.stats.configs) == {"full"}


def test_minimal_engine_refuses_a_hit_list_no_lookup_returns(examples: Path) -> None:
    """The machine found this in the example engine: one cached block offered as a hit of zero
    tokens was accepted (nothing allocated, ``[[]]``) where kvspec raises StaleHitError."""
    cfg = KVCacheConfig(num_blocks=8, groups=(FullAttention(2),), max_model_len=32, profile=NEWEST)
    outs = []
    for factory in (load_factory("spec"), load_factory("nanokv_adapter:make")):
        adapter, book = factory(cfg), RequestBook(cfg)
        book.apply({"op": "add_request", "rid": "a", "prompt": [1, 2, 3]})
        execute(adapter, book, {"op": "allocate_slots", "rid": "a", "num_new_tokens": 3})
        book.apply({"op": "add_request", "rid": "b", "prompt": [1, 2, 3]})
        op = {"op": "allocate_slots", "rid": "b", "num_new_tokens": 1, "num_new_computed_tokens": 0,
              "new_computed_blocks": [[1]]}  # fmt: skip
        outs.append(execute(adapter, book, op))
    assert outs == [{"error": "StaleHitError"}] * 2


def test_undeclared_gaps_are_skips_learned_between_batches(examples: Path, tmp_path: Path) -> None:
    """Without its ``unsupported`` declaration, the engine's Unsupported
    errors are counted as skips (never a divergence or a traceback) and left
    out from the next batch on."""
    load_profile("dev")
    factories = [load_factory("spec"), _undeclared()]
    setup = _setup(factories, NEWEST, failure_dir=tmp_path)
    assert run_lockstep(setup, seed=0, goal=1500) is None
    assert any(k.endswith("op:pop_blocks_for_free") for k in setup.stats.skipped)
    assert "op:pop_blocks_for_free" in setup.excluded
    assert setup.stats.unexplained == 0


def test_kvref_check_counts_refused_configurations(examples: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.chdir(examples)
    monkeypatch.setenv("KVREF_FAILURE_DIR", str(tmp_path))  # a divergence's trace goes there, not into the tree
    code = main(["check", "--target", "nanokv_adapter:make", "--against", "spec", "--min-steps", "300"])
    err = capsys.readouterr().err
    assert code == OK
    assert "left out: shape swa: nanokv has exactly one full-attention group" in err
    assert "Traceback" not in err


MINIMAL_LACKS = {
    "events", "stats", "eagle", "hybrid", "watermark", "lookahead", "external", "delay_cache_blocks",
    "full_sequence_must_fit", "reserved_blocks", "has_scheduled_reqs", "chunked-prefill", "caller-errors",
    "lora", "mm", "cache_salt", "prompt_embeds", "skip_reading_prefix_cache", "op:pop_blocks_for_free",
    "op:free_blocks", "op:cache_blocks", "op:evict_blocks", "op:reset_prefix_cache",
    "op:get_num_common_prefix_blocks", "op:get_prefix_hint", "op:get_block_ids_for_computed_tokens",
}  # fmt: skip
"""What the minimal corpus leaves out: it was recorded with ``kvref traces record --shape full --semantics
vllm-0.25.1 --caching on --min-allocations 6 --without`` these (traces/README.md)."""


@pytest.mark.parametrize("replayer", ["spec", "impl", "nanokv_adapter:make"])
def test_minimal_corpus_replays(examples: Path, replayer: str) -> None:
    assert len(MINIMAL) >= 10
    factory = load_factory(replayer)
    for path in MINIMAL:
        trace = load(path)
        assert trace.meta["features"] == trace_features(trace.config, trace.steps)
        result = replay(trace, factory, str(path))
        assert result.ok, f"{path.name}: {result.message}{result.skipped}"


def test_minimal_corpus_stays_inside_the_minimal_subset() -> None:
    """Caching on, one full-attention group, whole prompts, valid calls only, no admission argument."""
    for path in MINIMAL:
        trace = load(path)
        features = set(trace.features())
        assert not features & MINIMAL_LACKS, path.name
        assert trace.config.enable_caching, path.name
        assert {f for f in features if f.startswith("kind:")} == {"kind:FullAttention"}


def test_a_minimal_engine_runs_the_whole_minimal_corpus(examples: Path) -> None:
    """nanoblocks (an engine that always caches, admits whole prompts, decodes one token and trusts its caller)
    runs every trace: none is skipped. It differs from vLLM by policy, so most fail, each at a step where one of
    its declared differences shows (docs/writing-an-adapter.md)."""
    factory = load_factory("nanoblocks_adapter:make_fixed")
    results = [replay(load(path), factory, str(path)) for path in MINIMAL]
    assert not [r.path for r in results if r.skipped]
    assert any(r.ok for r in results) and all(r.ok or r.failed_step is not None for r in results)


def test_replay_skips_what_the_engine_cannot_run(examples: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(p) for p in GOLDEN[::20]] + [str(MINIMAL[0])]
    code = main(["replay", *files, "--target", "nanokv_adapter:make"])
    out = capsys.readouterr().out
    assert code == OK
    assert "FAILED" not in out and "Traceback" not in out
    assert "skipped (the adapter refuses the configuration: nanokv has exactly one full-attention group)" in out
    assert "1/1 traces as expected" in out and "skipped x" in out


def test_replay_of_only_skipped_traces_checks_nothing(examples: Path) -> None:
    swa = next(p for p in GOLDEN if p.name.startswith("swa-"))
    assert main(["replay", str(swa), "--target", "nanokv_adapter:make"]) == NOTHING_CHECKED


def _undeclared() -> Any:
    """nanokv's factory with its ``supports`` but without its ``unsupported``."""
    module = __import__("nanokv_adapter")

    def make(config: KVCacheConfig) -> Any:
        return module.NanoAdapter(config)

    make.supports = module.supports  # type: ignore[attr-defined]  # a declared attribute of the factory
    return make


def _recorded(cfg: KVCacheConfig, ops: list[Any]) -> Trace:
    """A trace of ``ops`` as kvspec runs them."""
    book, spec = RequestBook(cfg), load_factory("spec")(cfg)
    steps: list[Any] = []
    for op in ops:
        if op["op"] == "add_request":
            book.apply(op)
            steps.append(op)
        else:
            steps.append({**op, "expect": execute(spec, book, op), "view": spec.to_view().digest()})
    return Trace(cfg, steps)


def test_an_unsupported_step_is_a_skip_with_its_reason(examples: Path) -> None:
    trace = _recorded(_cfg(), [{"op": "add_request", "rid": "a", "prompt": [1, 2, 3]},
                               {"op": "allocate_slots", "rid": "a", "num_new_tokens": 3},
                               {"op": "pop_blocks_for_free", "rid": "a"}])  # fmt: skip
    result = replay(trace, _undeclared())
    assert not result.ok and result.failed_step is None
    assert result.skipped == "step 2 (pop_blocks_for_free): nanokv frees at once (no deferred free)"
    declared = replay(trace, load_factory("nanokv_adapter:make"))
    assert declared.skipped == "the trace uses op:pop_blocks_for_free, which the adapter lacks"


# -- protocol 2 --------------------------------------------------------------------


class _V2(KVCacheManager):
    """kvspec's manager, but ``free``/``pop_blocks_for_free`` take the request."""

    name = "v2"
    seen: list[object]

    def free(self, request: Any, /) -> None:
        self.seen.append(request)
        super().free(request.request_id)

    def pop_blocks_for_free(self, request: Any, /) -> tuple[int, ...]:  # type: ignore[override]  # protocol 2
        self.seen.append(request)
        return tuple(super().pop_blocks_for_free(request.request_id))


def test_protocol_version_is_declared_or_read_from_the_signature(examples: Path) -> None:
    assert protocol_version(KVCacheManager(_cfg())) == 1
    assert protocol_version(load_factory("nanokv_adapter:make")(_cfg())) == 2  # declared
    assert protocol_version(_V2(_cfg())) == 2  # signature: free(self, request)


def test_protocol_2_gets_the_request_and_agrees_with_protocol_1() -> None:
    cfg = _cfg()
    v1: Any = KVCacheManager(cfg)
    v2: Any = _V2(cfg)
    v2.seen = []
    books = RequestBook(cfg), RequestBook(cfg)
    ops: list[Any] = [{"op": "add_request", "rid": "a", "prompt": [1, 2, 3, 4, 5]},
           {"op": "allocate_slots", "rid": "a", "num_new_tokens": 5}, {"op": "pop_blocks_for_free", "rid": "a"},
           {"op": "add_request", "rid": "b", "prompt": [1, 2]},
           {"op": "allocate_slots", "rid": "b", "num_new_tokens": 2},
           {"op": "free", "rid": "b"}, {"op": "free", "rid": "nobody"}]  # fmt: skip
    for op in ops:
        if op["op"] == "add_request":
            for book in books:
                book.apply(op)
            continue
        assert execute(v1, books[0], op) == execute(v2, books[1], op)
    assert v1.to_view() == v2.to_view()
    assert [r.request_id for r in v2.seen if isinstance(r, Request)] == ["a", "b", "nobody"]


# -- diagnostics -----------------------------------------------------------------------


def _view(**kw: Any) -> KVView:
    fields: dict[str, Any] = {"free_queue": (1, 2, 3), "ref_cnt": (), "cached": (), "tables": (), "usage": 0.0}
    fields.update(kw)
    return KVView(**fields)


def test_first_difference_names_each_side() -> None:
    field, text = first_difference(_view(), _view(free_queue=(1, 3, 2)), "spec", "mine") or ("", "")
    assert field == "free_queue"
    assert "position 1: spec has 2, mine has 3" in text
    key = bytes.fromhex("ab" * 32) + (1).to_bytes(4, "big")
    text = describe(_view(cached=((key, (4,)),)), _view(), "spec", "mine")
    assert "hash abababab…abab group 1: spec has [4], mine has no entry" in text
    assert decode_key(key) == "hash abababab…abab group 1"
    assert "request 'r1': spec has [[1, 2]], mine has [[1, 3]]" in describe(
        _view(tables=(("r1", ((1, 2),)),)), _view(tables=(("r1", ((1, 3),)),)), "spec", "mine"
    )


class _WrongFreeOrder(KVCacheManager):
    """Frees a request's blocks in table order instead of last first."""

    name = "wrong-order"

    def free(self, request_id: str) -> None:
        super().free_blocks(list(super().pop_blocks_for_free(request_id)))


def test_replay_prints_the_first_differing_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _recorded(_cfg(num_blocks=12), [{"op": "add_request", "rid": "a", "prompt": [1, 2, 3, 4, 5, 6, 7]},
                                            {"op": "allocate_slots", "rid": "a", "num_new_tokens": 7},
                                            {"op": "free", "rid": "a"}])  # fmt: skip
    path = trace.write(tmp_path / "free-order.jsonl")
    module = tmp_path / "wrongorder.py"
    module.write_text("from test_third_party import _WrongFreeOrder as make\n")
    sys.path[:0] = [str(tmp_path), str(Path(__file__).parent)]
    try:
        code = main(["replay", str(path), "--target", "wrongorder:make"])
    finally:
        del sys.path[:2]
        sys.modules.pop("wrongorder", None)
    out = capsys.readouterr().out
    assert code == DIVERGENCE
    assert "FAILED at step 2: free: view digest differs; free_queue: first difference at position" in out
    assert "spec has" in out and "wrong-order has" in out


# -- the public API ---------------------------------------------------------------------


def _kvref_imports(path: Path) -> list[tuple[str, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "kvref":
            out += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(alias.name, "") for alias in node.names if alias.name.split(".")[0] == "kvref"]
    return out


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.name)
def test_examples_import_only_the_public_api(path: Path) -> None:
    """Every kvref name an example adapter uses is ``from kvref import NAME``
    with NAME in :data:`kvref.__all__`."""
    for module, name in _kvref_imports(path):
        assert module == "kvref" and name in kvref.__all__, f"{path.name}: {module}.{name} is not public"


def test_public_names_resolve() -> None:
    for name in kvref.__all__:
        assert getattr(kvref, name) is not None
    with pytest.raises(AttributeError):
        _ = kvref.not_a_name


def test_templates_import_only_the_public_api() -> None:
    templates = sorted((ROOT / "kit" / "kvref" / "templates").glob("*.py"))
    assert templates
    for path in templates:
        for module, name in _kvref_imports(path):
            assert module == "kvref" and name in kvref.__all__, f"{path.name}: {module}.{name}"


def test_bad_options_are_input_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--target", "spec", "--against", "spec", "--without", "evnts"]) == USAGE
    assert main(["check", "--target", "spec", "--against", "spec", "--shapes", "full+nope"]) == USAGE
    assert "unknown kind token" in capsys.readouterr().err


def test_unsupported_carries_its_feature() -> None:
    from kvref.adapters.vllm.errors import Unsupported as VllmUnsupported  # noqa: PLC0415

    assert Unsupported("x", "events").feature == "events"
    assert VllmUnsupported("0.16.0", "KVCacheManager.pop_blocks_for_free").feature == "op:pop_blocks_for_free"
    arg = VllmUnsupported("0.16.0", "KVCacheManager.allocate_slots(reserved_blocks=...)")
    assert arg.feature == "reserved_blocks"
    assert VllmUnsupported("0.16.0", "KVCacheGroupSpec.is_eagle_group").feature == "eagle"


def test_context_parallelism_is_opt_in_for_adapters() -> None:
    """An adapter that does not name ``context-parallelism`` in ``features``
    refuses a configuration with a world size above 1 (a skip, never a
    divergence); one that names it runs it; an unknown opt-in name is a
    ValueError at declaration."""
    from kvref.capabilities import declare, refusal  # noqa: PLC0415 - local to this test
    from kvspec.config import FullAttention, KVCacheConfig  # noqa: PLC0415 - same

    cp = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=64, dcp_world_size=2,
                       hash_block_size=8)  # fmt: skip
    plain = KVCacheConfig(num_blocks=16, groups=(FullAttention(4),), max_model_len=64)

    def old(config: KVCacheConfig) -> object:
        return config

    @declare(features={"context-parallelism"})
    def new(config: KVCacheConfig) -> object:
        return config

    reason = refusal(old, cp)
    assert reason is not None and "context-parallelism is opt-in" in reason
    assert refusal(old, plain) is None
    assert refusal(new, cp) is None
    with pytest.raises(ValueError, match="not opt-in features"):
        declare(features={"events"})
