"""Traces of vLLM's real scheduler: ``python -m kvtools scheduler-traces``.

kvref's other traces come from kvref's own scheduler model. These come from
the installed vLLM release's own ``Scheduler`` and ``AsyncScheduler``
(:mod:`kvtools.scheduler_rig`), run on the CPU with a fake model runner:
each engine step calls ``schedule()``, then answers with one sampled token
per request that finished its prompt (none for a prefill chunk), then
``update_from_output``; asynchronous scheduling keeps two steps in flight,
as vLLM's engine core does with its batch queue. Requests arrive at random
(prompts mostly from a few shared prefixes, so prefix hits happen), finish
on a stop token or at their ``max_tokens``, are now and then aborted, and
are preempted when the small pool runs out. Every call the scheduler makes
to its ``KVCacheManager`` is recorded (:mod:`kvtools.scheduler_recorder`)
as a kvref trace under the release's semantics profile; after the arrivals
stop, the run continues until every request has finished, so a trace ends
with an empty pool.

A recording is kept only if it is faithful: the trace must replay step for
step on kvref's real-vLLM adapter of the same release (a fresh manager,
driven only by what the trace says). A recording that fails is reported
with its first differing step and not written (``--rejects DIR`` keeps it),
as a defect of the recorder (exit status 1): every request field the manager
reads is carried, asynchronous scheduling's in-flight tokens included (which
vLLM 0.26.0 and later read when freeing blocks outside a sliding window or
behind a Mamba state).

    python -m kvtools scheduler-traces                  # the corpus for the installed release
    python -m kvtools scheduler-traces --check          # re-record, compare with the stored files
    python -m kvtools scheduler-traces --only full-sync --out DIR

Files go to ``traces/vllm-<release>/scheduler/<scenario>.jsonl``. The run
re-executes itself under ``PYTHONHASHSEED=0`` when another seed is set: the
scheduler iterates sets of request ids, and a fixed seed keeps a recording
reproducible byte for byte.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from kvref.adapters.vllm import installed_vllm_version, make_vllm_adapter
from kvref.capabilities import trace_features
from kvref.diagnose import describe
from kvref.ops import REQUEST_OPS
from kvref.shapes import build_kinds, shape_named
from kvref.traces import ReplayResult, Trace, load, replay
from kvspec.config import KVCacheConfig
from kvspec.errors import UnsupportedByProfileError
from kvspec.profiles import PROFILES

from .scheduler_engine import Engine, Scenario
from .scheduler_recorder import Recorder, RecordingManager
from .scheduler_rig import Inexpressible, RigSettings, build_scheduler

ROOT: Final = Path(__file__).resolve().parents[2]


def _pair(shape: str, seed: int, suffix: str = "", **kw: Any) -> tuple[Scenario, Scenario]:
    stem = f"{shape}-{suffix}" if suffix else shape
    return (
        Scenario(f"{stem}-sync", shape, False, seed, **kw),
        Scenario(f"{stem}-async", shape, True, seed + 100, **kw),
    )


SCENARIOS: Final = (
    *_pair("full", 1, num_blocks=14),
    *_pair("full+swa", 2, num_blocks=18, events=True),
    *_pair("full+mamba-align", 3, num_blocks=18, log_stats=True),
    *_pair("full+mamba-align@2x", 4, num_blocks=22),
    *_pair("full", 5, num_blocks=16, spec_tokens=3, drafter="ngram", suffix="ngram"),
    *_pair("full+swa", 6, num_blocks=20, spec_tokens=2, drafter="eagle", suffix="eagle"),
)
"""The corpus of one release: each scenario under both schedulers (the
asynchronous run with another seed). Pool sizes are chosen so that requests
get preempted; a scenario the release cannot express is skipped with the
reason (:func:`main`)."""


@dataclass
class Recording:
    """A recorded trace and what happened while recording it."""

    scenario: Scenario
    trace: Trace
    engine_steps: int
    requests: int
    preemptions: int
    recorder: Recorder


def record(scenario: Scenario) -> Recording:
    """Run ``scenario`` on the installed vLLM's scheduler and record its manager calls.

    Raises:
        RigError: The scheduler cannot be built for the scenario.
        Unrecordable: The scheduler made a call the trace format cannot express.
        RuntimeError: The run did not drain within its step limit.
    """
    release = installed_vllm_version()
    profile = PROFILES[f"vllm-{release}"]
    kinds = build_kinds(shape_named(scenario.shape), scenario.block_size, scenario.window)
    eagle = bool(scenario.spec_tokens) and scenario.drafter == "eagle"
    # What vLLM's scheduler builds its manager with for an EAGLE drafter (one token of
    # look-ahead): num_prefill_lookahead from 0.28.0 on; from 0.33.0 on, with prefix
    # caching, look-ahead block hashes instead of the trailing-block drop.
    ahead = eagle and profile.lookahead_block_hashes
    intended = KVCacheConfig(
        num_blocks=scenario.num_blocks,
        groups=kinds,
        max_model_len=scenario.max_model_len,
        use_eagle=eagle and not ahead,
        profile=profile,
        num_prefill_lookahead=1 if eagle and profile.prefill_lookahead else 0,
        num_hash_lookahead_tokens=1 if ahead else 0,
    )
    settings = RigSettings(
        asynchronous=scenario.asynchronous,
        max_num_seqs=scenario.max_num_seqs,
        token_budget=scenario.token_budget,
        log_stats=scenario.log_stats,
        events=scenario.events,
        spec_tokens=scenario.spec_tokens,
        drafter=scenario.drafter,
    )
    rig = build_scheduler(intended, settings)
    recorder = Recorder(rig.api, rig.manager)
    rig.scheduler.kv_cache_manager = RecordingManager(rig.manager, recorder)
    engine = Engine(rig, scenario, recorder)
    engine.run()
    meta = {
        "shape": scenario.shape,
        "scheduler": {
            "class": type(rig.scheduler).__name__,
            "release": release,
            "model_runner": "v2" if getattr(rig.scheduler, "use_v2_model_runner", False) else "v1",
            "scenario": scenario.name,
            "seed": scenario.seed,
            "engine_steps": engine.steps,
            "requests": engine.added,
            "preemptions": engine.preemptions(),
            **({"spec_tokens": scenario.spec_tokens, "drafter": scenario.drafter} if scenario.spec_tokens else {}),
        },
        "features": sorted(trace_features(rig.config, recorder.steps)),
    }
    if recorder.left_out:
        meta["left_out"] = dict(sorted(recorder.left_out.items()))
    trace = Trace(rig.config, recorder.steps, meta)
    return Recording(scenario, trace, engine.steps, engine.added, engine.preemptions(), recorder)


def diagnose(rec: Recording, result: ReplayResult) -> str:
    """Why a recording did not replay: the first view field that differs
    between the scheduler's manager and the replayed one.

    NOTE: every request field the manager reads is carried now
    (``num_in_flight_tokens`` too, which vLLM 0.26.0 and later read when
    freeing skipped blocks), so a recording that does not replay is a
    defect of the recorder or of kvref's adapter, never state the format
    cannot say.
    """
    index = result.failed_step
    if index is None or result.view is None or index not in rec.recorder.views:
        return ""
    return describe(rec.recorder.views[index], result.view, "the scheduler's manager", "the replay")


def check_faithful(trace: Trace) -> ReplayResult:
    """Replay ``trace`` on kvref's adapter over the installed vLLM (a fresh manager)."""
    return replay(trace, make_vllm_adapter, "<recording>")


def main(argv: Sequence[str] | None = None) -> int:
    """Record the corpus of the installed release (see the module docstring); the
    process first re-executes itself under ``PYTHONHASHSEED=0`` when another seed is set."""
    parser = argparse.ArgumentParser(prog="python -m kvtools scheduler-traces", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder (default traces/vllm-<release>/scheduler)")
    parser.add_argument("--only", nargs="*", default=[], help="scenario names (default: all)")
    parser.add_argument("--check", action="store_true", help="compare with the stored files instead of writing")
    parser.add_argument("--rejects", type=Path, help="write unfaithful recordings here")
    given = list(sys.argv[2:] if argv is None else argv)
    args = parser.parse_args(given)
    if os.environ.get("PYTHONHASHSEED") != "0":
        # This process is replaced by the same command under the fixed seed.
        env = dict(os.environ, PYTHONHASHSEED="0")
        os.execve(sys.executable, [sys.executable, "-m", "kvtools", "scheduler-traces", *given], env)
    release = installed_vllm_version()
    if release is None or f"vllm-{release}" not in PROFILES:
        print(f"scheduler-traces: needs an installed vLLM with a semantics profile (found {release})", file=sys.stderr)
        return 2
    out = args.out or ROOT / "traces" / f"vllm-{release}" / "scheduler"
    unknown = sorted(set(args.only) - {s.name for s in SCENARIOS})
    if unknown:
        print(f"scheduler-traces: unknown scenario(s) {unknown}", file=sys.stderr)
        return 2
    bad = 0
    for scenario in SCENARIOS:
        if args.only and scenario.name not in args.only:
            continue
        try:
            bad += not _one(scenario, out, args.check, args.rejects)
        except (UnsupportedByProfileError, Inexpressible) as exc:
            print(f"{scenario.name}: skipped: kvspec cannot express it under vllm-{release}: {exc}")
    return 1 if bad else 0


def _one(scenario: Scenario, out: Path, check: bool, rejects: Path | None) -> bool:
    """Record, check and write (or compare) one scenario; False for a
    recording that does not replay for a reason the recorder cannot name,
    or (``check``) one that differs from the stored file."""
    rec = record(scenario)
    trace = rec.trace
    path = out / f"{scenario.name}.jsonl"
    result = check_faithful(trace)
    calls = sum(1 for s in trace.steps if s["op"] not in REQUEST_OPS)
    summary = (
        f"{scenario.name}: {len(trace.steps)} steps, {calls} calls, {rec.requests} requests, "
        f"{rec.engine_steps} engine steps, {rec.preemptions} preemptions"
    )
    left_out = rec.recorder.left_out
    if left_out:
        summary += f", left out {dict(left_out)} (non-empty: {dict(rec.recorder.left_out_nonempty)})"
    if not result.ok:
        print(f"{summary}: NOT FAITHFUL: replay differs at step {result.failed_step}: {result.message}")
        print(f"  {diagnose(rec, result)}")
        if rejects is not None:
            trace.write(rejects / path.name)
        return False
    if check:
        same = path.exists() and path.read_text() == trace.dumps()
        print(f"{summary}: {'same as' if same else 'DIFFERS from'} {path}")
        if path.exists() and not same:
            stored = load(path)
            first = next((i for i, (a, b) in enumerate(zip(stored.steps, trace.steps, strict=False)) if a != b), None)
            print(f"  first differing step: {first} (stored {len(stored.steps)} steps)")
        return same
    trace.write(path)
    print(f"{summary}: faithful on vLLM {trace.config.profile.release}, wrote {path}")
    return True
