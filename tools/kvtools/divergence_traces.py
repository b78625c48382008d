"""The minimal known-divergence traces of ``kit/kvref/divergences.toml``.

For every registry entry, ``python -m kvtools divergence-traces`` records a
short, hand-written scenario (:class:`kvtools.directed.script.Scenario`, the
one scenario class of the hand-written corpora) on the executable
specification, once per profile of :data:`RELEASES` whose release shows it
(:func:`profiles_for`), and writes it to ``traces/vllm-<release>/divergences/<id>.jsonl``.
The header carries ``known_divergence:
<id>`` and ``divergence_step``: the 0-based index into the steps list where
real vLLM of that release first differs, or ``-1`` for a divergence at
construction (sinkfull-ctor, which the vLLM adapter works around; that trace
must then pass with ``construction_workaround == "sinkfull-ctor"``).

After writing, every trace is replayed: against the spec it must pass; against
vLLM (when installed) it must fail exactly at ``divergence_step``. With
``--check`` nothing is written: a file that differs from a fresh recording is
reported out of date, and the replays run on the committed files.

The scenarios are documented in ``docs/divergences.md``; the output is
deterministic (running the recorder twice gives byte-identical files).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvref.adapters import AdapterFactory, KVCacheAdapter, load_factory
from kvref.divergences import Divergence, load_registry
from kvref.traces import StepCrashed, Trace, load, replay, run_steps
from kvspec.config import MLA, FullAttention, KVCacheConfig, Mamba, SinkFullAttention, SlidingWindow
from kvspec.errors import ConfigError, UnsupportedByProfileError
from kvspec.profiles import NEWEST, PROFILES, VLLM_0_16_0, VLLM_0_25_1, SemanticsProfile, profile_named
from kvtools.directed.script import Scenario, playing

Json = Any
ROOT = Path(__file__).resolve().parents[2]
CONSTRUCTION = -1
"""``divergence_step`` of a divergence that happens when the manager is built."""


RELEASES = (
    VLLM_0_25_1,
    NEWEST,
    VLLM_0_16_0,
    *(profile_named(f"vllm-{r}") for r in ("0.17.0", "0.17.1", "0.19.0", "0.19.1", "0.20.0", "0.21.0", "0.22.0",
                                           "0.23.0", "0.24.0", "0.25.0")),
)  # fmt: skip
"""The profiles that get a divergence corpus: the baseline, the newest and the
oldest release, and each release between 0.16.0 and 0.25.1 with an observable
change (an entry that applies to none of them is recorded under the release
that introduced it, see :func:`profiles_for`). An entry whose scenario the
profile refuses is listed as not recorded, with the reason."""


def profiles_for(entry: Divergence) -> list[SemanticsProfile]:
    """The profiles a registry entry's trace is recorded under: those of
    :data:`RELEASES` it applies to whose profile builds its scenario, else the
    release that introduced it (an entry of releases whose configuration the
    newer profiles refuse, as fine-grained hits from 0.30.0 on)."""
    hits = [p for p in RELEASES if entry.applies_to(p.release) and not isinstance(scenarios(p)[entry.id], str)]
    return hits or [profile_for_release(entry.introduced)]


def profile_for_release(release: str) -> SemanticsProfile:
    """The semantics profile of vLLM ``release``."""
    return next(p for p in PROFILES.values() if p.release == release)


def main(argv: list[str] | None = None) -> int:
    """Write (unless ``--check``) and verify every divergence trace; 1 on any problem."""
    parser = argparse.ArgumentParser(prog="python -m kvtools divergence-traces", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare and verify the committed files")
    args = parser.parse_args(argv)
    from kvref.adapters.vllm import installed_vllm_version, vllm_available  # noqa: PLC0415 - imports vLLM lazily

    installed = installed_vllm_version() if vllm_available() else None
    registry = load_registry()
    failed = 0
    extra = [p for e in registry.values() for p in profiles_for(e) if p not in RELEASES]
    for profile in (*RELEASES, *dict.fromkeys(extra)):
        table = scenarios(profile)
        if set(table) != set(registry):
            print(f"scenarios {sorted(table)} do not match the registry {sorted(registry)}", file=sys.stderr)
            return 1
        for div_id, entry in registry.items():
            if profile not in RELEASES and profile not in profiles_for(entry):
                continue
            rel_path = entry.trace_for(profile.release)
            path = ROOT / rel_path
            sc = table[div_id]
            if not entry.applies_to(profile.release) or isinstance(sc, str):
                why = sc if entry.applies_to(profile.release) else f"vLLM {profile.release} does not show it"
                print(f"{rel_path}: not recorded ({why})")
                if path.exists():
                    print(f"  PROBLEM: {rel_path} exists but should not", file=sys.stderr)
                    failed += 1
                continue
            trace = record(sc)
            problems = []
            if not args.check:
                trace.write(path)
            elif not path.exists() or path.read_text() != trace.dumps():
                problems.append("out of date: differs from a fresh recording")
            print(f"{rel_path}: {len(trace.steps)} steps, divergence_step {trace.meta['divergence_step']}")
            with_vllm = installed == profile.release
            problems += check(path, with_vllm) if path.exists() else [f"{rel_path} is missing"]
            for p in problems:
                print(f"  PROBLEM: {p}", file=sys.stderr)
            failed += bool(problems)
        if installed != profile.release:
            print(f"vLLM {profile.release} is not installed: only the spec replay of its traces was checked")
    return 1 if failed else 0


def record(sc: Scenario) -> Trace:
    """The scenario's trace: its steps, recorded on the spec, under a header naming its divergence."""
    assert sc.divergence is not None, f"{sc.name} names no divergence"
    div_id, step = sc.divergence
    return Trace(sc.config, list(sc.run().steps), {"known_divergence": div_id, "divergence_step": step})


def _add(rid: str, prompt: list[int]) -> Json:
    return {"op": "add_request", "rid": rid, "prompt": prompt}


def _alloc(rid: str, n: int, **kw: Json) -> Json:
    return {"op": "allocate_slots", "rid": rid, "num_new_tokens": n, **kw}


P17 = list(range(100, 117))
"""A 17-token prompt: four full blocks of 4 (16 tokens) plus one token."""
B20 = [*P17[:16], 1, 2, 3, 4]
"""Shares the 16 block-aligned tokens of ``P17`` and continues differently."""
P25 = list(range(100, 125))
"""A 25-token prompt: three full blocks of 8 (24 tokens) plus one token."""
B28 = [*P25[:24], 1, 2, 3, 4]
"""Shares the 24 block-aligned tokens of ``P25`` and continues differently."""


def _divergence(
    div_id: str, why: str, config: Callable[[], KVCacheConfig], ops: list[Json], step: int
) -> tuple[str, Scenario | str]:
    try:
        return div_id, Scenario(div_id, why, config(), playing(ops), (div_id, step))
    except (UnsupportedByProfileError, ConfigError) as refused:
        return div_id, f"the profile refuses its configuration: {refused}"


def scenarios(profile: SemanticsProfile = VLLM_0_25_1) -> dict[str, Scenario | str]:
    """Every divergence's minimal scenario under ``profile``, by registry id (or
    the reason it cannot be built under that profile)."""
    p = profile
    # NOTE: Mamba align groups with caching have tail entries from 0.32.0 on
    # (kvspec.mamba_tail), which kvimpl's native core does not model (its
    # pure-Python manager does); the estimate defect shows with caching off
    # too, so the traces of those releases turn caching off and every
    # implementation that follows the profile, a native core included, can
    # replay them.
    mamba_caching = not p.mamba_tail_entries
    sink_why = (
        "sink blocks 1..2 are never free or handed out, usage > 0 without requests, reset always fails"
        if p.sink_blocks_reserved
        else "no sink blocks are reserved: the group behaves as full attention"
    )
    return dict(
        [
            _divergence(
                "sinkfull-ctor",
                "construction: vLLM raises TypeError; the adapter's shim builds it. The trace shows the spec's rule: "
                + sink_why,
                lambda: KVCacheConfig(profile=p, num_blocks=8, groups=(SinkFullAttention(4, 8),), max_model_len=32),
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
            _divergence(
                "eagle-mamba-hit",
                "FA(4) + Mamba(4, all), EAGLE on every group: the lookup of b finds 16 FA tokens and drops the "
                "EAGLE block (12); Mamba looks 4 tokens further (16) and does not drop. vLLM returns 16 tokens "
                "with 3 FA blocks",
                lambda: KVCacheConfig(
                    profile=p,
                    num_blocks=16,
                    groups=(FullAttention(4), Mamba(4, "all")),
                    max_model_len=64,
                    use_eagle=True,
                ),
                [_add("a", P17), _alloc("a", 17), _add("b", B20), {"op": "get_computed_blocks", "rid": "b"}],
                3,
            ),
            _divergence(
                "swa-eagle-fallback",
                "FA(8) + SWA(4, window 13), EAGLE: FA finds 16 tokens and drops to 8; SWA looks at blocks 0-2 (cached) "
                "up to 12 tokens. vLLM's fallback re-aligns (8), pops the EAGLE block (4), re-aligns again (0)",
                lambda: KVCacheConfig(
                    profile=p,
                    num_blocks=16,
                    groups=(FullAttention(8), SlidingWindow(4, 13)),
                    max_model_len=64,
                    use_eagle=True,
                ),
                [_add("a", P17), _alloc("a", 17), _add("b", B20), {"op": "get_computed_blocks", "rid": "b"}],
                3,
            )
            if p.hybrid_eagle_lookahead
            else _divergence(
                "swa-eagle-fallback",
                "FA(8) + SWA(4, window 13), EAGLE, without the look-ahead search (0.19.1): FA finds 24 tokens and "
                "drops to 16; SWA's block 3 (id 8) is evicted, so its fallback run is blocks 0-1 (block 2 ends "
                "unaligned before the drop). vLLM pops the EAGLE block (4) and re-aligns (0); kvspec drops block 2 "
                "from the run 0-2 and keeps 8",
                lambda: KVCacheConfig(
                    profile=p,
                    num_blocks=16,
                    groups=(FullAttention(8), SlidingWindow(4, 13)),
                    max_model_len=64,
                    use_eagle=True,
                ),
                [
                    _add("a", P25),
                    _alloc("a", 25),
                    {"op": "evict_blocks", "block_ids": [8]},
                    _add("b", B28),
                    {"op": "get_computed_blocks", "rid": "b"},
                ],
                4,
            ),
            _divergence(
                "swa-eagle-window-lost",
                "FA(4) + SWA(2, window 2), EAGLE, without the look-ahead search (0.19.1): FA finds 12 tokens and drops "
                "to 8; SWA's run 2-3 ends aligned before the drop, vLLM pops block 3 and re-aligns to 4 tokens with "
                "block 1 null; kvspec takes the run 1-2 (aligned after the drop) and keeps block 1 (id 6)",
                lambda: KVCacheConfig(
                    profile=p,
                    num_blocks=16,
                    groups=(FullAttention(4), SlidingWindow(2, 2)),
                    max_model_len=32,
                    use_eagle=True,
                ),
                [_add("a", [0] * 13), _alloc("a", 13), _add("b", [0] * 13), {"op": "get_computed_blocks", "rid": "b"}],
                3,
            ),
            _divergence(
                "second-full-group",
                "FA(4) + MLA(4) + SWA(4, window 4): evicting the SWA group's 4th block (id 14) makes SWA stop at 12 "
                "tokens; FA and MLA found 16. vLLM trims only the first full-type group (FA) and returns 4 MLA blocks",
                lambda: KVCacheConfig(
                    profile=p,
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
            _divergence(
                "common-prefix-pending",
                "a = [1,2,3], b = [1,2,4] (hit on 1,2), unrelated c = [5,6,7]; b is popped but not freed. "
                "Blocks 1 and 2 have ref_cnt 2 (a + b's pending references) = the number of tables (a, c), so "
                "vLLM reports 2 although c holds neither",
                lambda: KVCacheConfig(profile=p, num_blocks=16, groups=(FullAttention(4),), max_model_len=64),
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
            _divergence(
                "mamba-align-external-estimate",
                "Mamba(4, align, 1 speculative block), 3 blocks (2 free). A new 8-token request with 1 external "
                "token needs 3 blocks (1 for the external token, then state + speculative block); vLLM's estimate "
                "forgets the external block (2), admits it, and get_new_blocks fails half-way with the external "
                "block already taken. kvspec returns None",
                lambda: KVCacheConfig(
                    profile=p,
                    num_blocks=3,
                    groups=(Mamba(4, "align", 1),),
                    max_model_len=32,
                    enable_caching=mamba_caching,
                ),
                [_add("a", list(range(8))), _alloc("a", 7, num_external_computed_tokens=1)],
                1,
            ),
            _divergence(
                "mamba-align-recompute-crash",
                "Mamba(2, align) alone: a 10-token request is admitted with 9 tokens from a delayed connector load "
                "(five table entries), the load fails after 6 (cache_blocks at 6, the valid prefix), and the "
                "scheduler's recovery computes 2 tokens from there: 8 tokens need four entries, fewer than the "
                "table has. vLLM asserts that a request's table only grows: AssertionError. kvspec allocates "
                "nothing (the table already covers the tokens)",
                lambda: KVCacheConfig(profile=p, num_blocks=16, groups=(Mamba(2, "align"),), max_model_len=32),
                [
                    _add("a", list(range(10))),
                    _alloc("a", 0, num_external_computed_tokens=9, delay_cache_blocks=True),
                    {"op": "cache_blocks", "rid": "a", "num_computed_tokens": 6},
                    {"op": "set_request", "rid": "a", "num_computed_tokens": 6, "status": "WAITING"},
                    _alloc("a", 2),
                ],
                4,
            ),
            _divergence(
                "hits-touched-per-group",
                "FA(4) + SWA(4, window 8), 7 blocks: a caches blocks 1-2 (FA) and 3-4 (SWA), c takes 5-6, both "
                "are freed (free queue 2 1 4 3 5 6). b hits 8 tokens (FA 1 2, SWA 3 4; SWA's block 3 is skipped) and "
                "loads 3 tokens from a connector. vLLM 0.16.0 touches FA's hits, gives FA's connector block the "
                "queue's head, block 4, still free and SWA's hit, then SWA touches block 4 too: one block in both "
                "tables (ref_cnt 2). kvspec touches both groups' hits first (FA gets block 3, SWA block 5)",
                lambda: KVCacheConfig(
                    profile=p, num_blocks=7, groups=(FullAttention(4), SlidingWindow(4, 8)), max_model_len=32
                ),
                [
                    _add("a", list(range(8))),
                    _alloc("a", 8),
                    _add("c", [100, 101, 102]),
                    _alloc("c", 3),
                    {"op": "free", "rid": "a"},
                    {"op": "free", "rid": "c"},
                    _add("b", [*range(8), 50, 51, 52, 53]),
                    {"op": "get_computed_blocks", "rid": "b"},
                    _alloc(
                        "b", 1, num_new_computed_tokens=8, new_computed_blocks=[[1, 2], [3, 4]],
                        num_external_computed_tokens=3,
                    ),
                ],
                8,
            ),
            _divergence(
                "mamba-cow-owner",
                "FA(8) + Mamba(8, align) + SWA(4, window 1), hash block 4: a 20-token prompt, 17 tokens loaded by "
                "the connector, 3 computed. Its Mamba state block (index 2) gets a tail entry at 20 tokens, inside "
                "the block. At the next step vLLM 0.26.0 and 0.27.x, which did not mark the request as allocated "
                "(its first allocation needed no Mamba block), copy the block into a fresh one and put the copy "
                "into the running table (returned first); kvspec keeps the table and moves the entry to the copy",
                lambda: KVCacheConfig(
                    profile=p,
                    num_blocks=16,
                    groups=(FullAttention(8), Mamba(8, "align"), SlidingWindow(4, 1)),
                    max_model_len=32,
                ),
                [
                    _add("r", [0] * 20),
                    {"op": "get_computed_blocks", "rid": "r"},
                    _alloc("r", 3, num_external_computed_tokens=17),
                    {"op": "take_kv_cache_block_copies"},
                    {"op": "set_request", "rid": "r", "num_computed_tokens": 20, "status": "RUNNING"},
                    {"op": "append_tokens", "rid": "r", "tokens": [0]},
                    _alloc("r", 1),
                ],
                6,
            ),
            _divergence(
                "connector-lookup-bound-crash",
                "FA(2) + Mamba(2, align): a 3-token request (one full block hashed) looked up by a KV connector "
                "with max_cache_hit_length 4, past its hashed tokens. vLLM 0.33.0 hands the bound to each group's "
                "own lookup, and the Mamba finder reads the hash of block 1, which the request does not have: "
                "IndexError. kvspec answers the lookup (no hit: nothing is cached)",
                lambda: KVCacheConfig(
                    profile=p, num_blocks=16, groups=(FullAttention(2), Mamba(2, "align")), max_model_len=32
                ),
                [
                    _add("r", [0, 0, 0]),
                    {"op": "get_computed_blocks_for_connector", "rid": "r", "max_cache_hit_length": 4},
                ],
                1,
            ),
            _divergence(
                "lookahead-lookup-crash",
                "SWA(2, window 1) alone, look-ahead hashes of 2 tokens (multi-module MTP of 2): a 3-token request "
                "has no block hash yet (its first block needs tokens 2 and 3 after it), and its lookup limit is 2 "
                "tokens. vLLM's sliding-window finder reads the hash of block 0, which the request does not have: "
                "IndexError. kvspec answers the lookup (no hit)",
                lambda: KVCacheConfig(
                    profile=p, num_blocks=16, groups=(SlidingWindow(2, 1),), max_model_len=32,
                    num_hash_lookahead_tokens=2, num_prefill_lookahead=2,
                ),
                [_add("r", [0, 0, 0]), {"op": "get_computed_blocks", "rid": "r"}],
                1,
            ),
            _divergence(
                "report-mode-cp-crash",
                "FA(4) under DCP 2 (manager blocks of 8, hash blocks of 8), events on: a 20-token request is "
                "cached and freed; a second one in report mode \"full\" with the same prompt hits 16 tokens. "
                "vLLM announces the hit at the group's configured block of 4, not a multiple of the hash block: "
                "AssertionError. kvspec answers the lookup and announces nothing",
                lambda: KVCacheConfig(
                    profile=p, num_blocks=16, groups=(FullAttention(4),), max_model_len=32, dcp_world_size=2,
                    enable_kv_cache_events=True,
                ),
                [
                    _add("a", list(range(20))),
                    _alloc("a", 20),
                    {"op": "free", "rid": "a"},
                    {"op": "take_events"},
                    {**_add("b", list(range(20))), "kv_cache_report_mode": "full"},
                    {"op": "get_computed_blocks", "rid": "b"},
                ],
                5,
            ),
            _divergence(
                "report-mode-partial-hit-crash",
                "FA(4) + Mamba(4, align), hash blocks of 2 (fine-grained hits), events on: a 7-token request "
                "computes 6 tokens, then 1 (its Mamba state at 6 is kept, full attention keys the 2 tokens of "
                "block 1 as a partial tail), and is freed; a second one with the same prompt in report mode "
                "\"full\" hits 6 tokens, two blocks in each group. vLLM announces both blocks, but the request's "
                "hashes at block size 4 name only block 0: IndexError. kvspec answers the lookup and announces "
                "the one block the hashes name",
                lambda: KVCacheConfig(
                    profile=p, num_blocks=32, groups=(FullAttention(4), Mamba(4, "align")), max_model_len=32,
                    hash_block_size=2, enable_kv_cache_events=True,
                ),
                [
                    _add("a", list(range(7))),
                    _alloc("a", 6),
                    {"op": "set_request", "rid": "a", "num_computed_tokens": 6, "status": "RUNNING"},
                    _alloc("a", 1),
                    {"op": "free", "rid": "a"},
                    {"op": "take_events"},
                    {**_add("b", list(range(7))), "kv_cache_report_mode": "full"},
                    {"op": "get_computed_blocks", "rid": "b"},
                ],
                7,
            ),
            _divergence(
                "checkpoint-past-hashes-crash",
                "Mamba(2, align) alone with a prefill checkpoint block (alignment 1): a 4-token prompt is "
                "computed, one output token appended, and a step of 4 tokens scheduled (the token and three "
                "drafts), which ends at 8. Its checkpoint lies at 6, in slot 2, past the request's 5 tokens "
                "(2 hashed blocks). vLLM re-keys the checkpoint block at 6 inside allocate_slots and asks "
                "the pool for the hash of block 3: AssertionError. kvspec allocates the same blocks and "
                "leaves the checkpoint block unkeyed",
                lambda: KVCacheConfig(
                    profile=p, num_blocks=16, max_model_len=32,
                    groups=(Mamba(2, "align", num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1),),
                ),
                [
                    _add("r", [0, 0, 0, 0]),
                    _alloc("r", 4),
                    {"op": "set_request", "rid": "r", "num_computed_tokens": 4, "status": "RUNNING"},
                    {"op": "append_tokens", "rid": "r", "tokens": [0]},
                    _alloc("r", 4),
                ],
                4,
            ),
        ]
    )


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


def vllm_output_at(trace: Trace, step: int) -> Json:
    """What real vLLM returns at ``step`` (the steps before it agree); an
    exception that is not a caller error is shown as ``crash: ...``."""
    head = Trace(trace.config, trace.steps[: step + 1], trace.meta)
    out: Json = None
    try:
        for index, _, got in run_steps(head, load_factory("vllm")(trace.config)):
            if index == step:
                out = got
    except StepCrashed as crash:
        if crash.index != step:
            raise
        return f"crash: {type(crash.cause).__name__}: {crash.cause}"  # vLLM raising mid-way is the divergence
    return out


def _capturing(factory: AdapterFactory, made: list[KVCacheAdapter]) -> AdapterFactory:
    """``factory``, keeping what it builds in ``made``; its declarations (the
    opt-in features it runs, what it lacks) carry over."""

    @functools.wraps(factory)
    def build(config: KVCacheConfig) -> KVCacheAdapter:
        adapter = factory(config)
        made.append(adapter)
        return adapter

    return build


if __name__ == "__main__":
    sys.exit(main())
