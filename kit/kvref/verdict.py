"""What a check compared, and how it ends: one summary for ``kvref check`` and the pytest plugin.

A run that compared next to nothing is no pass. :func:`judge` gives the exit
code (:mod:`kvref.exits`): an unexplained divergence is 1; no step at all, or
a run below the *floor*, is 3; else 0. The floor (:data:`FLOOR_STEPS`,
:data:`FLOOR_SKIPPED`): at least half the step goal compared, and no more
than half the machine runs stopped by a skip (an adapter that raised
``Unsupported``: such a run compares only its first steps). :func:`summary`
says how much was checked, per configuration shape: runs, steps, runs a skip
stopped and why, configurations refused; what was left out; the known
differences met and the comparisons they restarted; and a warning for every
``Unsupported`` that named no feature (what it disabled).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from kvref import config_coverage
from kvref.exits import DIVERGENCE, NOTHING_CHECKED, OK
from kvref.lockstep import DivergenceClass, RunStats
from kvref.shapes import SHAPES

FLOOR_STEPS = 0.5
"""A run must compare at least this fraction of its step goal."""
FLOOR_SKIPPED = 0.5
"""A run fails the floor when more than this fraction of its machine runs were stopped by a skip."""


@dataclass(frozen=True)
class Verdict:
    """How a check ends.

    Attributes:
        code: The exit code (:mod:`kvref.exits`).
        line: One line saying why.
    """

    code: int
    line: str


def judge(stats: RunStats, goal: int, failure: str | None, classes: list[DivergenceClass]) -> Verdict:
    """The verdict of a run with ``stats`` that aimed at ``goal`` steps."""
    found = [c for c in classes if not c.explained_by]
    if failure is not None or found:
        what = f"{len(found)} divergence class(es)" if found else "an unexplained divergence"
        return Verdict(DIVERGENCE, f"FAILED: {what} ({stats.steps:,} steps compared)")
    if stats.steps == 0:
        return Verdict(NOTHING_CHECKED, "NOTHING CHECKED: no lockstep step ran (every configuration was refused)")
    below = below_floor(stats, goal)
    if below:
        return Verdict(NOTHING_CHECKED, f"BELOW THE FLOOR: {below}; nothing failed, but this is no pass")
    return Verdict(OK, f"agree: {stats.steps:,} steps compared in {stats.runs:,} runs, every one explained or equal")


def below_floor(stats: RunStats, goal: int) -> str:
    """Why the run compared too little ("" when it met the floor)."""
    if stats.steps < FLOOR_STEPS * goal:
        return f"{stats.steps:,} of the {goal:,} steps asked were compared (the floor is {FLOOR_STEPS:.0%})"
    stopped = sum(stats.skipped_runs.values())
    if stats.runs and stopped > FLOOR_SKIPPED * stats.runs:
        return (
            f"{stopped:,} of {stats.runs:,} runs were stopped by a skip (the floor is {FLOOR_SKIPPED:.0%}): "
            "each compared only its first steps (see the skips and warnings above)"
        )
    return ""


def summary(stats: RunStats, title: str, excluded: frozenset[str] = frozenset()) -> list[str]:
    """The summary lines of a run (``excluded``: the features left out at its end)."""
    elapsed = max(time.monotonic() - stats.started, 1e-9)
    lines = [title, f"  steps run: {stats.steps:,} in {stats.runs:,} machine runs, {elapsed:.0f} s "
             f"({stats.steps / elapsed:.0f} steps per second)"]  # fmt: skip
    if stats.first_failure_steps is not None:
        lines.append(f"  steps to the first failure (before shrinking): {stats.first_failure_steps:,}")
    lines += _per_shape(stats)
    covered = sorted(stats.configs)
    if covered and covered != ["pool"]:
        missing = config_coverage.missing(stats.config_properties)
        taken = len(config_coverage.NAMES) - len(missing)
        lines.append(f"  configuration classes taken: {taken}/{len(config_coverage.NAMES)}"
                     + (f"; not: {', '.join(missing)}" if missing else ""))  # fmt: skip
    absent = Counter({k: n for k, n in stats.invalid_calls.items() if k.endswith(":UnsupportedOperationError")})
    invalid = stats.invalid_calls - absent
    rebuilt = stats.event_log_rebuilds
    lines.append(
        f"  invariant checks: {stats.invariant_checks:,}; event-log checks: {stats.event_log_checks:,}"
        + (f" ({rebuilt:,} rebuilt after an undecided announcement)" if rebuilt else "")
        + f"; prefix hints read: {stats.prefix_hint_reads:,} ({stats.prefix_hints:,} not 0)"
    )
    if stats.announcing_lookups:
        lines.append(f"  lookups that hit for report-mode full requests: {stats.announcing_lookups:,}")
    kinds = ", ".join(sorted(invalid)) or "none"
    lines.append(f"  invalid calls rejected: {sum(invalid.values()):,} ({len(invalid)} kinds: {kinds})")
    if absent:
        names = ", ".join(sorted(k.split(":")[0] for k in absent))
        lines.append(f"  operations the release lacks, refused as it does: {sum(absent.values()):,} ({names})")
    lines.append(f"  invalid configs rejected: {stats.invalid_configs:,}")
    if stats.block_copies:
        lines.append(f"  copy-on-write copies compared: {stats.block_copies:,}")
    if stats.safety:
        done = ", ".join(f"{k} {v:,}" for k, v in sorted(stats.safety.items()) if k != "groups not checked")
        lines.append(f"  safety oracles (content, in flight): {done}")
    if stats.pipeline:
        lines.append("  asynchronous pipeline: " + ", ".join(f"{k} {v:,}" for k, v in sorted(stats.pipeline.items())))
    if stats.hit_limits:
        lines.append("  hit limits drawn: " + ", ".join(f"{k} {v:,}" for k, v in sorted(stats.hit_limits.items())))
    if stats.connector:
        lines.append("  connector lookups: " + ", ".join(f"{k} {v:,}" for k, v in sorted(stats.connector.items())))
    retention = {name: stats.config_properties[name] for name in config_coverage.RETENTION_CLASSES}
    if any(retention.values()):
        lines.append("  runs with a retention interval: " + ", ".join(f"{k} {v:,}" for k, v in retention.items()))
    checkpoints = stats.config_properties[config_coverage.CHECKPOINT_CLASS]
    if checkpoints:
        lines.append(f"  runs with Mamba prefill checkpoints: {checkpoints:,}")
    if stats.fallback_steps:
        lines.append(f"  steps on a fallback build: {sum(stats.fallback_steps.values()):,} of {stats.steps:,}")
        lines += [f"    x{n} {key}" for key, n in stats.fallback_steps.most_common()]
    if excluded:
        lines.append(f"  features left out: {', '.join(sorted(excluded))}")
    if stats.left_out:
        lines.append("  operations left out (excluded features): " + _counts(stats.left_out))
    if stats.skipped:
        lines.append("  runs stopped by a skip (an adapter could not run an operation):")
        lines += [f"    x{n} {key}: {stats.skip_reasons.get(key, '')}" for key, n in stats.skipped.most_common()]
    lines += [f"  WARNING: {w}" for w in warnings(stats, excluded)]
    if stats.known:
        lines.append("  divergences known (explained): " + _counts(stats.known))
    met = [(k, n) for k, n in sorted(stats.class_found_at.items()) if k.startswith("safety defect ")]
    if met:  # registered vLLM safety defects (kvref.safety_defects): where each was first met
        lines.append("  safety defects met (steps to the first): " + ", ".join(f"{k[14:]} {n:,}" for k, n in met))
    if stats.restarts:
        lines.append("  comparisons restarted after a declared difference or a known class: " + _counts(stats.restarts))
    if stats.keep_going:
        lines.append(f"  divergence classes not modelled: {len(stats.classes)}")
        if stats.accepted:
            switches = "; ".join(c.explained_by for c in stats.accepted)
            lines.append(f"  divergence classes explained by switches: {len(stats.accepted)} ({switches})")
    else:
        lines.append(f"  divergences unexplained: {stats.unexplained}")
    return lines


def warnings(stats: RunStats, excluded: frozenset[str]) -> list[str]:
    """One line per ``Unsupported`` that named no feature: what it disabled."""
    out = []
    for key, op in sorted(stats.unnamed_skips.items()):
        adapter, _, feature = key.partition(": ")
        runs = stats.skipped[key]
        if feature in excluded:
            effect = f"{feature} was left out from the next batch on ({runs} run(s) stopped before that)"
        else:
            effect = (f"{op} cannot be left out, so each of the {runs} run(s) that reached such a call stopped "
                      "there")  # fmt: skip
        out.append(
            f"{adapter} raised a skip error from {op} that names no feature: {effect}; raise "
            f"kvref.Unsupported(message, feature) naming what the call needs (e.g. chunked-prefill), or "
            "declare it on the factory (docs/writing-an-adapter.md section 3)"
        )
    if stats.asynchronous and not stats.pipeline:
        out.append(
            "--async-scheduling: no run kept a step in flight (the pipeline needs pop_blocks_for_free and "
            "free_blocks under a release with the deferred free, vLLM 0.24.0 on, and free before it; an adapter "
            "left one out): these steps ran synchronously"
        )
    return out


def classes_table(classes: list[DivergenceClass]) -> list[str]:
    """The distinct divergence classes of a keep-going run, one line each with its trace."""
    lines = [f"{len(classes)} distinct divergence class(es):"]
    for c in classes:
        shapes = ", ".join(sorted(c.shapes))
        first = c.message if len(c.message) <= 100 else c.message[:97] + "..."
        explained = f"; explained by {c.explained_by}" if c.explained_by else ""
        lines.append(f"  {c.key}: {first} [{shapes}]")
        lines.append(f"    first after {c.steps_to_find:,} steps, seen {c.occurrences}x; shortest trace "
                     f"({c.trace_ops} operations): {c.trace or '-'}{explained}")  # fmt: skip
    return lines


def _per_shape(stats: RunStats) -> list[str]:
    """Runs, steps, runs stopped by a skip and configurations refused, per shape."""
    refused: Counter[str] = Counter()
    for reason, n in stats.refused_reasons.items():
        refused[reason.split(": ", 1)[0]] += n
    shapes = sorted(set(stats.configs) | set(refused), key=lambda s: (-stats.shape_steps[s], s))
    total = "" if sorted(stats.configs) == ["pool"] else f" ({len(stats.configs)} of {len(SHAPES)} shapes ran)"
    lines = [
        f"  per configuration shape{total}:",
        f"    {'shape':<32}{'runs':>8}{'steps':>10}{'skipped':>9}{'refused':>9}",
    ]
    for shape in shapes:
        lines.append(f"    {shape:<32}{stats.configs[shape]:>8,}{stats.shape_steps[shape]:>10,}"
                     f"{stats.skipped_runs[shape]:>9,}{refused[shape]:>9,}")  # fmt: skip
    for reason, count in sorted(stats.refused_reasons.items(), key=lambda kv: -kv[1])[:5]:
        lines.append(f"    refused x{count}: {reason}")
    return lines


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} x{v:,}" for k, v in sorted(counter.items()))
