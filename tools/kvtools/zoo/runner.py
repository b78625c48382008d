"""The zoo's runner: hunt one entry with the kit's lockstep, as ``kvref check`` does.

:func:`run_entry` calls :func:`kvref.check.run_lockstep`, the loop behind
``kvref check``, in-process with the spec as the reference and the entry as
the target, times the hunt and the shrink apart, and caps the shrink at what
is left of the budget; it returns the entry's row of the kill table
(:mod:`kvtools.zoo.report` renders the rows).
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from kvref.adapters import load_factory
from kvref.check import run_lockstep
from kvref.hypothesis_compat import set_shrink_time_limit, shrink_time_limit
from kvref.isolation import isolated
from kvref.lockstep import RunStats
from kvref.settings import load_profile
from kvref.stateful import MachineSetup
from kvspec.profiles import VLLM_0_25_1, SemanticsProfile
from kvtools.zoo.base import ZooEntry
from kvtools.zoo.production import CRASHES

HUNT_STEPS = 1_000_000_000
"""The zoo hunts until its time budget runs out (``--min-steps`` far beyond reach), not
only for the profile's step goal (20,000 steps, about 12 s, on ``ci``)."""


def run_entry(
    entry: ZooEntry,
    budget: float,
    seed: int,
    profile: str,
    module: str = "kvtools.zoo",
    shrink_cap: bool = True,
    semantics: SemanticsProfile = VLLM_0_25_1,
) -> dict[str, Any]:
    """Hunt one mutant as ``kvref check --target <module>:<name> --against spec
    --profile <profile> --seed <seed> --budget <budget> --min-steps HUNT_STEPS``
    does; return its row of the kill table.

    Hunt time runs from the start to the first unexplained divergence, shrink
    time from there to the end of the run (Hypothesis shrinks the failing
    history before it reports). ``within_budget`` is True only when hunt plus
    shrink took at most ``budget`` seconds.

    With ``shrink_cap`` Hypothesis may shrink only for what is left of the
    budget when the fault is found (its ``MAX_SHRINKING_SECONDS``, 300 by
    default, is lowered for this run), so a late kill reports a longer trace
    instead of overrunning the budget; ``shrink_capped`` says so in the row.

    ``semantics`` is the release the drawn configurations follow (default
    vLLM 0.25.1, the zoo's; a fault in an operation that exists only in a
    later release, such as ``record_prefix_cache_stats`` from 0.27.0, needs
    that release's profile to be reachable at all).
    """
    with tempfile.TemporaryDirectory() as tmp:
        target = load_factory(f"{module}:{entry.name}")
        if entry.name in CRASHES:  # it kills the process it runs in: hunt it in a child process
            target = isolated(target)
        alone = entry.level == "safety"  # hunted alone, under the safety oracles: no reference
        factories = [target] if alone else [load_factory("spec"), target]
        load_profile(profile)
        setup = MachineSetup(factories, RunStats(), Path(tmp), profile=semantics, safety=alone)
        start = time.monotonic()
        setup.stats.started = start
        saved, cap = shrink_time_limit(), [shrink_time_limit()]

        def lower_cap() -> None:
            cap[0] = max(1, int(budget - (time.monotonic() - start)))
            set_shrink_time_limit(cap[0])

        setup.stats.on_first_failure = lower_cap if shrink_cap else None
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                killed = run_lockstep(setup, seed, HUNT_STEPS, budget) is not None
        finally:
            set_shrink_time_limit(saved)
        seconds = time.monotonic() - start
        stats = setup.stats
        traces = sorted(Path(tmp).glob("failure-*.jsonl"))
        lines = traces[0].read_text().splitlines() if traces else []
    first = lines[0] if lines else ""
    failure = str(json.loads(first).get("failure", "")) if first.startswith("{") else ""
    hunt = (stats.first_failure_at - start) if killed and stats.first_failure_at is not None else seconds
    return {
        "name": entry.name,
        "target": f"{module}:{entry.name}",
        "upstream": entry.upstream,
        "description": entry.description,
        "killed": killed,
        "exit_code": 1 if killed else 0,
        "seconds": round(seconds, 1),
        "hunt_seconds": round(hunt, 1),
        "shrink_seconds": round(seconds - hunt, 1) if killed else None,
        "within_budget": killed and seconds <= budget,
        "shrink_capped": killed and shrink_cap and seconds - hunt >= cap[0],
        "trace_length": len(lines) - 1 if lines else None,
        "steps": stats.first_failure_steps if killed else stats.steps,
        "steps_total": stats.steps,
        "prefix_hits": stats.prefix_hits,
        "failure": failure,
        "catch": entry.catch,
        "semantics": semantics.name,
        "level": entry.level,
    }


def progress(row: dict[str, Any]) -> str:
    """One line about a finished hunt, for the terminal."""
    if not row["killed"]:
        return f"zoo: {row['name']}: SURVIVED {row['steps']} steps in {row['seconds']}s"
    return (
        f"zoo: {row['name']}: killed at step {row['steps']} (hunt {row['hunt_seconds']}s, shrink "
        f"{row['shrink_seconds']}s, trace {row['trace_length']} ops)"
    )
