"""The zoo's report: the kill table as ``docs/reports/bug-zoo.md`` (and its rows in ``zoo.json``).

The rows are those of :func:`kvtools.zoo.runner.run_entry`; the Markdown is
re-rendered from them, so ``python -m kvtools zoo --rewrite`` can refresh the
registry's texts without hunting again.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvtools.zoo import ZOO
from kvtools.zoo.runner import HUNT_STEPS
from kvtools.zoo.vllm import VLLM_ZOO

PREAMBLE = """\
Faults that really happened in vLLM's KV-cache code, re-planted one at a time into kvimpl
(`tools/kvtools/zoo/`) and hunted with
`kvref check --target kvtools.zoo:<name> --against spec --profile {profile} --seed {seed} --budget {budget:g}
--min-steps {hunt}` (the runner calls the same loop in-process; the step goal is out of reach, so the
time budget ends a hunt). Regenerate with `ci/mutation.sh` (or `python -m kvtools zoo`).

*Hunt* is the time from the start to the first unexplained divergence, *shrink* the time Hypothesis then
spent minimising the failing history (the trace has *trace ops* operations), *steps* the lockstep steps
run before the first divergence (for a survivor: all steps run). **Killed within {budget:g} s counts hunt
plus shrink.** Shrinking may use only what is left of the budget when the fault is found (the runner
lowers Hypothesis' `MAX_SHRINKING_SECONDS` for that run; `--no-shrink-cap` turns this off): "yes (shrink
cut)" marks a kill whose shrinking was stopped there, so its trace is longer than a full shrink would
leave. Steps are the machine-independent measure: the same seed finds a fault at the same step on
any machine, while seconds depend on the CPU and its load."""


FRESH_PREAMBLE = """\
Faults planted into kvimpl one at a time (`tools/kvtools/zoo/fresh.py`) after the generator work was
done, and never used to tune it: mutation operators at kvimpl's decision points and at the arguments
vLLM's scheduler passes. Each was hunted like a zoo entry, with
`kvref check --target kvtools.zoo.fresh:<name> --against spec --profile {profile} --seed {seed} --budget {budget:g}
--min-steps {hunt}` (in-process). Regenerate with `python -m kvtools zoo --fresh`. Columns as in bug-zoo.md;
steps are the machine-independent measure."""

UNSEEN_PREAMBLE = """\
Faults planted into kvimpl one at a time (`tools/kvtools/zoo/unseen.py`), written apart from the generator work
by someone who never ran the machine on them, and hunted only once the generator was frozen: faults from
vLLM's history (the upstream number is given) and mutation operators at kvimpl's decision points, most inside
the coordinator, the managers and the block pool.
Each was hunted like a zoo entry, with
`kvref check --target kvtools.zoo.unseen:<name> --against spec --profile {profile} --seed {seed} --budget {budget:g}
--min-steps {hunt}` (in-process), under the release the fault lives in (`PROFILE_OF` in the module, vLLM 0.25.1
unless named; `--semantics` overrides it). Regenerate with `python -m kvtools zoo --unseen`. Columns as in
bug-zoo.md, the upstream column naming the mutation operator; steps are the machine-independent measure."""


def write_markdown(
    rows: Sequence[dict[str, Any]],
    path: Path,
    budget: float,
    seed: int,
    profile: str,
    notes: Sequence[str] = (),
    fresh: bool = False,
    unseen: bool = False,
) -> None:
    """The kill table as Markdown; ``notes`` are extra paragraphs for the preamble
    (``fresh``, ``unseen``: that fault set's title and preamble).

    The rows of :data:`kvtools.zoo.vllm.VLLM_ZOO` (faults planted into real
    vLLM) get a table of their own.
    """
    real = [r for r in rows if r["name"] in VLLM_ZOO]
    rows = [r for r in rows if r not in real]
    killed = [r for r in rows if r["killed"]]
    fast = [r for r in killed if r.get("within_budget", r["seconds"] <= budget)]
    unreachable = [r for r in rows if ZOO.get(r["name"]) is not None and ZOO[r["name"]].unreachable]
    title, text = ("# The fresh fault set", FRESH_PREAMBLE) if fresh else ("# The upstream bug zoo", PREAMBLE)
    if unseen:
        title, text = "# The unseen fault set", UNSEEN_PREAMBLE
    lines = [title, "", text.format(profile=profile, seed=seed, budget=budget, hunt=HUNT_STEPS)]
    lines += ["", *notes] if notes else []
    lines += [
        "",
        f"**{len(killed)} of {len(rows)} killed; {len(fast)} of {len(rows)} within {budget:g} s (hunt + shrink)"
        + (
            f"; {len(killed)} of the {len(rows) - len(unreachable)} entries reachable through the public API.** "
            f"{len(unreachable)} entr{'y is' if len(unreachable) == 1 else 'ies are'} classified "
            "equivalent/unreachable (argued in its row). "
            if unreachable
            else ".** "
        )
        + '"unconfirmed" marks an upstream number that could not be matched to the described fault.',
        "",
        "| mutant | upstream | fault | killed | hunt s | shrink s | steps | trace ops | caught by / why it survives |",
        "|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(_row(r, budget))
    if real:
        lines += [
            "",
            "## Real vLLM 0.25.1, re-broken",
            "",
            "`tools/kvtools/zoo/vllm.py` patches ONE method of the installed vLLM's `BlockPool` or `KVCacheManager`",
            "instance inside an adapter factory; the same check (`--target kvtools.zoo.vllm:<name> --against spec`)",
            "must catch it.",
            "",
            "| mutant | patched method | fault | killed | hunt s | shrink s | steps | trace ops | first divergence |",
            "|---|---|---|---|---:|---:|---:|---:|---|",
        ]
        for r in real:
            status = _status(r, budget)
            lines.append(
                f"| `{r['name']}` | {r['upstream']} | {r['description']} | {status} | {r.get('hunt_seconds', '')} "
                f"| {_cell(r.get('shrink_seconds'))} | {_cell(r.get('steps'))} | {_cell(r['trace_length'])} "
                f"| {_summary(r['failure'])} |"
            )
    survivors = [r for r in rows if not r["killed"]]
    if survivors:
        lines += ["", "## Survivors", ""]
        lines += [f"- `{r['name']}`: {r['catch']}." for r in survivors]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def refresh(row: dict[str, Any]) -> dict[str, Any]:
    """A stored row with the registry's current target, upstream, description and catch text
    (rows of entries no longer in a registry are kept as they are)."""
    if row["name"] in ZOO:
        e = ZOO[row["name"]]
        return {
            **row,
            "target": f"kvtools.zoo:{e.name}",
            "upstream": e.upstream,
            "description": e.description,
            "catch": e.catch,
        }
    if row["name"] in VLLM_ZOO:
        v = VLLM_ZOO[row["name"]]
        return {**row, "target": f"kvtools.zoo.vllm:{v.name}", "upstream": v.method, "description": v.description}
    return row


# --- cells -----------------------------------------------------------------------------------------


def _summary(failure: str) -> str:
    """The first divergence, shortened for a table cell."""
    text = " ".join(failure.split()).replace("|", "/").replace("`", "'")
    if text.startswith("views differ") and ": " in text:
        head, rest = text.split(": ", 1)
        return f"{head}: {rest.split(':')[0]}"
    return text if len(text) <= 110 else text[:107] + "..."


def _cell(value: object) -> str:
    return "" if value is None else str(value)


def _status(r: dict[str, Any], budget: float) -> str:
    if not r["killed"]:
        return "**survived**" if r["exit_code"] == 0 else f"error ({r['exit_code']})"
    if r.get("within_budget", r["seconds"] <= budget):
        return "yes (shrink cut)" if r.get("shrink_capped") else "yes"
    return f"yes, in {r['seconds']} s (over {budget:g} s)"


def _row(r: dict[str, Any], budget: float) -> str:
    how = _summary(r["failure"]) if r["killed"] and r["failure"] else r["catch"]
    desc = r["description"].replace("|", "\\|")
    cells = [
        f"`{r['name']}`", r["upstream"], desc, _status(r, budget), _cell(r.get("hunt_seconds", r["seconds"])),
        _cell(r.get("shrink_seconds")), _cell(r.get("steps")), _cell(r["trace_length"]), how,
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |"
