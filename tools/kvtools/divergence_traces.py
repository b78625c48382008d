"""Build the minimal known-divergence traces of ``kvref/divergences.toml``.

For every registry entry this script writes ``traces/divergences/<id>.jsonl``
(the entry's ``trace`` path): a short, hand-written operation list whose
``expect`` outputs and ``view`` digests are filled in by running the
executable specification (``kvref.ops`` on the spec adapter). The header
carries ``known_divergence: <id>`` and ``divergence_step``: the 0-based index
into the steps list where real vLLM 0.25.1's output first differs, or ``-1``
for a divergence at construction (sinkfull-ctor, which the vLLM adapter works
around; that trace must then pass with ``construction_workaround ==
"sinkfull-ctor"``).

After writing, every trace is replayed: against the spec it must pass; against
vLLM (when installed) it must fail exactly at ``divergence_step``. Run from the
repository root::

    .venv/bin/python ci/make_divergence_traces.py          # write + check
    .venv/bin/python ci/make_divergence_traces.py --check  # check the files only

The scenarios are documented in ``docs/divergences.md``; the output is
deterministic (running the script twice gives byte-identical files).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvref.adapters import AdapterFactory, KVCacheAdapter, load_factory
from kvref.divergences import load_registry
from kvref.ops import REQUEST_OPS, RequestBook, execute
from kvref.traces import Trace, load, replay
from kvspec.config import MLA, FullAttention, KVCacheConfig, Mamba, SinkFullAttention, SlidingWindow
from kvspec.profiles import VLLM_0_25_1

Json = Any
ROOT = Path(__file__).resolve().parents[2]
CONSTRUCTION = -1
"""``divergence_step`` of a divergence that happens when the manager is built."""


@dataclass(frozen=True)
class Scenario:
    """A configuration, the operations (without outputs) and the divergence step."""

    config: KVCacheConfig
    ops: list[Json]
    step: int


def _add(rid: str, prompt: list[int]) -> Json:
    return {"op": "add_request", "rid": rid, "prompt": prompt}


def _alloc(rid: str, n: int, **kw: Json) -> Json:
    return {"op": "allocate_slots", "rid": rid, "num_new_tokens": n, **kw}


P17 = list(range(100, 117))
"""A 17-token prompt: four full blocks of 4 (16 tokens) plus one token."""
B20 = [*P17[:16], 1, 2, 3, 4]
"""Shares the 16 block-aligned tokens of ``P17`` and continues differently."""


def scenarios() -> dict[str, Scenario]:
    """Every divergence's minimal scenario, by registry id."""
    return {
        # Construction: vLLM raises TypeError; the adapter's shim builds it.
        # The trace shows the spec's rule: sink blocks 1..2 are never free or
        # handed out, usage > 0 without requests, reset always fails.
        "sinkfull-ctor": Scenario(
            KVCacheConfig(profile=VLLM_0_25_1, num_blocks=8, groups=(SinkFullAttention(4, 8),), max_model_len=32),
            [
                {"op": "usage"},
                {"op": "reset_prefix_cache"},
                _add("a", list(range(1, 11))),
                _alloc("a", 10),
                {"op": "free", "rid": "a"},
                _add("b", list(range(20, 40))),
                _alloc("b", 20),
                _add("c", [7, 7, 7, 7]),
                _alloc("c", 4),
                {"op": "free", "rid": "b"},
                {"op": "usage"},
                {"op": "reset_prefix_cache"},
            ],
            CONSTRUCTION,
        ),
        # FA(4) + Mamba(4, all), EAGLE on every group: the lookup of b finds
        # 16 FA tokens and drops the EAGLE block (12); Mamba looks 4 tokens
        # further (16) and does not drop. vLLM returns 16 tokens with 3 FA blocks.
        "eagle-mamba-hit": Scenario(
            KVCacheConfig(
                profile=VLLM_0_25_1,
                num_blocks=16,
                groups=(FullAttention(4), Mamba(4, "all")),
                max_model_len=64,
                use_eagle=True,
            ),
            [_add("a", P17), _alloc("a", 17), _add("b", B20), {"op": "get_computed_blocks", "rid": "b"}],
            3,
        ),
        # FA(8) + SWA(4, window 13), EAGLE: FA finds 16 tokens and drops to 8;
        # SWA looks at blocks 0-2 (cached) up to 12 tokens. vLLM's fallback
        # re-aligns (8), pops the EAGLE block (4), re-aligns again (0).
        "swa-eagle-fallback": Scenario(
            KVCacheConfig(
                profile=VLLM_0_25_1,
                num_blocks=16,
                groups=(FullAttention(8), SlidingWindow(4, 13)),
                max_model_len=64,
                use_eagle=True,
            ),
            [_add("a", P17), _alloc("a", 17), _add("b", B20), {"op": "get_computed_blocks", "rid": "b"}],
            3,
        ),
        # FA(4) + MLA(4) + SWA(4, window 4): evicting the SWA group's 4th block
        # (id 14) makes SWA stop at 12 tokens; FA and MLA found 16. vLLM trims
        # only the first full-type group (FA) and returns 4 MLA blocks.
        "second-full-group": Scenario(
            KVCacheConfig(
                profile=VLLM_0_25_1,
                num_blocks=20,
                groups=(FullAttention(4), MLA(4), SlidingWindow(4, 4)),
                max_model_len=64,
            ),
            [
                _add("a", P17),
                _alloc("a", 17),
                {"op": "evict_blocks", "block_ids": [14]},
                _add("b", B20),
                {"op": "get_computed_blocks", "rid": "b"},
            ],
            4,
        ),
        # Appendix A.7: a = [1,2,3], b = [1,2,4] (hit on 1,2), unrelated
        # c = [5,6,7]; b is popped but not freed. Blocks 1 and 2 have ref_cnt 2
        # (a + b's pending references) = the number of tables (a, c), so vLLM
        # reports 2 although c holds neither.
        "common-prefix-pending": Scenario(
            KVCacheConfig(profile=VLLM_0_25_1, num_blocks=16, groups=(FullAttention(4),), max_model_len=64),
            [
                _add("a", list(range(1, 11))),
                _alloc("a", 10),
                _add("b", [*range(1, 10), 99]),
                _alloc("b", 2, num_new_computed_tokens=8, new_computed_blocks=[[1, 2]]),
                _add("c", list(range(200, 210))),
                _alloc("c", 10),
                {"op": "pop_blocks_for_free", "rid": "b"},
                {"op": "get_num_common_prefix_blocks", "rid": "a"},
            ],
            7,
        ),
        # Mamba(4, align, 1 speculative block), 3 blocks (2 free). A new
        # 8-token request with 1 external token needs 3 blocks (1 for the
        # external token, then state + speculative block); vLLM's estimate
        # forgets the external block (2), admits it, and get_new_blocks fails
        # half-way with the external block already taken. kvspec returns None.
        "mamba-align-external-estimate": Scenario(
            KVCacheConfig(profile=VLLM_0_25_1, num_blocks=3, groups=(Mamba(4, "align", 1),), max_model_len=32),
            [_add("a", list(range(8))), _alloc("a", 7, num_external_computed_tokens=1)],
            1,
        ),
    }


def record(div_id: str, sc: Scenario) -> Trace:
    """Run the scenario on the spec; every facade step gets its output and digest."""
    adapter = load_factory("spec")(sc.config)
    book = RequestBook(sc.config)
    steps: list[Json] = []
    for op in sc.ops:
        if op["op"] in REQUEST_OPS:
            book.apply(op)
            steps.append(dict(op))
            continue
        steps.append({**op, "expect": execute(adapter, book, op), "view": adapter.to_view().digest()})
    return Trace(sc.config, steps, {"known_divergence": div_id, "divergence_step": sc.step})


def _capturing(factory: AdapterFactory, made: list[KVCacheAdapter]) -> AdapterFactory:
    def build(config: KVCacheConfig) -> KVCacheAdapter:
        adapter = factory(config)
        made.append(adapter)
        return adapter

    return build


def vllm_output_at(trace: Trace, step: int) -> Json:
    """What real vLLM returns at ``step`` (the steps before it agree); an
    exception that is not a caller error is shown as ``crash: ...``."""
    adapter = load_factory("vllm")(trace.config)
    book = RequestBook(trace.config)
    for op in trace.steps[:step]:
        clean = {k: v for k, v in op.items() if k not in ("expect", "view")}
        if clean["op"] in REQUEST_OPS:
            book.apply(clean)
        else:
            execute(adapter, book, clean)
    try:
        return execute(adapter, book, {k: v for k, v in trace.steps[step].items() if k not in ("expect", "view")})
    except Exception as exc:  # vLLM raising mid-way is itself the divergence
        return f"crash: {type(exc).__name__}: {exc}"


def check(path: Path, with_vllm: bool) -> list[str]:
    """Problems with one divergence trace (empty when it behaves as documented)."""
    trace = load(path)
    step = trace.meta["divergence_step"]
    problems: list[str] = []
    spec = replay(trace, load_factory("spec"), str(path))
    if not spec.ok:
        problems.append(f"spec fails at step {spec.failed_step}: {spec.message}")
    if not with_vllm:
        return problems
    made: list[KVCacheAdapter] = []
    got = replay(trace, _capturing(load_factory("vllm"), made), str(path))
    if step == CONSTRUCTION:
        workaround = getattr(made[0], "construction_workaround", None)
        if not got.ok or workaround != trace.meta["known_divergence"]:
            problems.append(f"vllm: ok={got.ok} ({got.message}), construction_workaround={workaround!r}")
        else:
            print(f"  vllm: constructed only through the adapter shim ({workaround}); all steps agree")
    elif got.ok or got.failed_step != step:
        problems.append(f"vllm: expected to fail at step {step}, got ok={got.ok} failed_step={got.failed_step}")
    else:
        op = trace.steps[step]
        print(f"  step {step} {op['op']}: spec {op['expect']} | vllm {vllm_output_at(trace, step)}")
    return problems


def main(argv: list[str] | None = None) -> int:
    """Write (unless ``--check``) and verify every divergence trace."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="only verify the existing files")
    args = parser.parse_args(argv)
    from kvref.adapters.vllm_adapter import vllm_available  # noqa: PLC0415 - imports vLLM lazily

    with_vllm = vllm_available()
    registry = load_registry()
    table = scenarios()
    if set(table) != set(registry):
        print(f"scenarios {sorted(table)} do not match the registry {sorted(registry)}", file=sys.stderr)
        return 1
    failed = 0
    for div_id, entry in registry.items():
        path = ROOT / entry.trace
        if not args.check:
            record(div_id, table[div_id]).write(path)
        n = len(load(path).steps)
        print(f"{entry.trace}: {n} steps, divergence_step {table[div_id].step}")
        problems = check(path, with_vllm)
        for p in problems:
            print(f"  PROBLEM: {p}", file=sys.stderr)
        failed += bool(problems)
    if not with_vllm:
        print("vLLM 0.25.1 is not installed: only the spec replay was checked")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
