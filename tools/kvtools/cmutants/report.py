"""The C mutants report: triage, score with its sampling error, ``docs/reports/cmutants.md``.

Survivors are triaged in ``tools/kvtools/cmutants_triage.toml`` by mutant
id: ``[equivalent]`` (no caller of kvimpl can observe the change; left out
of the score) and ``[gap]`` (observable; the reason names the situation the
hunt does not produce; counted as a survivor). The score is killed /
(killed + surviving non-equivalent), timeouts counted as killed, invalid
mutants (that do not compile) left out.

NOTE: the score of a sample is an estimate. Each file is a stratum: its
hunted mutants are taken as a simple random sample of its mutants (the
runner's draw is one, a whole file is a census). The overall score is the
stratified ratio estimate (each file weighted by its number of mutants), with
a 95 % interval from its linearised variance (finite-population corrected:
a file hunted in full adds no sampling error); where that variance is 0 (no
surviving gap in the sample) a normal interval says nothing, so the interval
is Wilson's on the pooled counts instead. Per file, the interval is Wilson's.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtools.cmutants.generate import OPERATORS, Mutant
from kvtools.mutants.report import Triage, load_triage

TRIAGE = Path(__file__).resolve().parents[1] / "cmutants_triage.toml"
KILLED = ("killed", "timeout")
STATUSES = ("killed", "timeout", "survived", "invalid", "error")
Z95 = 1.959964



def classify(record: dict[str, Any], mutant_id: str, triage: Triage) -> str:
    """One of killed, timeout, equivalent, gap, untriaged (a survivor), invalid, error."""
    status = str(record["status"])
    if status != "survived":
        return status
    if mutant_id in triage.equivalent:
        return "equivalent"
    if mutant_id in triage.gaps:
        return "gap"
    return "untriaged"


@dataclass(frozen=True)
class Score:
    """killed / (killed + surviving non-equivalent), estimated with a 95 % interval."""

    killed: int
    counted: int
    estimate: float | None
    low: float | None
    high: float | None

    def text(self) -> str:
        """``k/n = p % (95 % interval lo-hi %)``."""
        if self.estimate is None or self.low is None or self.high is None:
            return "-"
        return (
            f"{self.killed}/{self.counted} = {100 * self.estimate:.1f}% "
            f"(95% interval {100 * self.low:.1f}-{100 * self.high:.1f}%)"
        )


def wilson(k: int, n: int) -> tuple[float, float]:
    """Wilson's 95 % score interval for ``k`` successes in ``n`` trials (n > 0)."""
    p = k / n
    denom = 1 + Z95**2 / n
    centre = (p + Z95**2 / (2 * n)) / denom
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def stratified_score(strata: Sequence[tuple[int, Sequence[str]]]) -> Score:
    """The score over files given as (mutants in the file, classes of its hunted mutants).

    See the module's NOTE for the estimator and its interval.
    """
    ys: list[float] = []
    xs: list[float] = []
    used = [(big_n, [c for c in cls if c != "error"]) for big_n, cls in strata]
    used = [(big_n, cls) for big_n, cls in used if cls]
    for big_n, cls in used:
        w = big_n / len(cls)
        ys.append(w * sum(c in KILLED for c in cls))
        xs.append(w * sum(c in (*KILLED, "gap", "untriaged") for c in cls))
    killed = sum(sum(c in KILLED for c in cls) for _, cls in used)
    counted = sum(sum(c in (*KILLED, "gap", "untriaged") for c in cls) for _, cls in used)
    if counted == 0 or sum(xs) == 0:
        return Score(killed, counted, None, None, None)
    r = sum(ys) / sum(xs)
    var = 0.0
    for big_n, cls in used:
        n = len(cls)
        if n < 2 or n >= big_n:
            continue
        d = [(c in KILLED) - r * (c in (*KILLED, "gap", "untriaged")) for c in cls]
        var += big_n**2 * (1 - n / big_n) * statistics.variance(d) / n
    var /= sum(xs) ** 2
    if var <= 0:
        low, high = wilson(killed, counted)
        return Score(killed, counted, r, low, high)
    half = Z95 * math.sqrt(var)
    return Score(killed, counted, r, max(0.0, r - half), min(1.0, r + half))


def file_score(big_n: int, classes: Sequence[str]) -> Score:
    """A file's score: exact when every mutant was hunted, else with Wilson's interval."""
    killed = sum(c in KILLED for c in classes)
    counted = sum(c in (*KILLED, "gap", "untriaged") for c in classes)
    if counted == 0:
        return Score(0, 0, None, None, None)
    p = killed / counted
    if len([c for c in classes if c != "error"]) >= big_n:
        return Score(killed, counted, p, p, p)
    low, high = wilson(killed, counted)
    return Score(killed, counted, p, low, high)


def write_report(data: dict[str, Any], all_mutants: dict[str, list[Mutant]], triage_path: Path, out: Path) -> None:
    """Write ``out`` (docs/reports/cmutants.md) from the results ``data``; also set ``data['summary']``."""
    triage = load_triage(triage_path)
    results: dict[str, dict[str, Any]] = data["results"]
    classes = {k: classify(r, k, triage) for k, r in results.items()}
    files = [f for f in all_mutants if any(r["file"] == f for r in results.values())]
    per_file = {f: [classes[k] for k, r in results.items() if r["file"] == f] for f in files}
    overall = stratified_score([(len(all_mutants[f]), per_file[f]) for f in files])
    total = sum(len(ms) for ms in all_mutants.values())
    counts = Counter(classes.values())
    stale = sorted(k for k in (*triage.equivalent, *triage.gaps) if k in classes and classes[k] in (*KILLED, "invalid"))
    unknown = sorted(
        k for k in (*triage.equivalent, *triage.gaps) if not any(k == m.id for ms in all_mutants.values() for m in ms)
    )
    data["summary"] = {
        "mutants": total,
        "hunted": len(results),
        "classes": dict(sorted(counts.items())),
        "score": overall.text(),
        "score_estimate": overall.estimate,
        "score_interval": [overall.low, overall.high],
        "per_file": {f: file_score(len(all_mutants[f]), per_file[f]).text() for f in files},
    }
    lines = _header(data, all_mutants, results, overall, counts, total)
    lines += _file_table(all_mutants, per_file, files, overall)
    lines += _kills(results, classes)
    lines += _operator_table(results, classes)
    lines += _cost(data, results)
    if triage.notes.strip():
        lines += ["", "## Notes", "", *triage.notes.strip().splitlines()]
    if stale or unknown:
        lines += ["", "## Stale triage entries", ""]
        lines += [f"- `{k}`: now {classes[k]} (drop it from the triage file)" for k in stale]
        lines += [f"- `{k}`: names no mutant of the current sources" for k in unknown]
    lines += _survivors(results, classes, triage)
    lines += _every(results, classes)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")


def _header(
    data: dict[str, Any],
    all_mutants: dict[str, list[Mutant]],
    results: dict[str, dict[str, Any]],
    overall: Score,
    counts: Counter[str],
    total: int,
) -> list[str]:
    campaigns = data.get("campaigns", [])
    commands = sorted({c["command"] for c in campaigns if c.get("command")})
    full = [f for f, ms in all_mutants.items() if ms and all(m.id in results for m in ms)]
    sampled = [f for f in all_mutants if f not in full and any(r["file"] == f for r in results.values())]
    lines = [
        "# Mutants of kvimpl's native core (C)",
        "",
        "Operator-level mutants of `impl/kvimpl/_native/*.c` (`tools/kvtools/cmutants/generate.py`: relational",
        "operators, `&&`/`||`, `+ 1`/`- 1`, increments, the literals 0 and 1, `return 0`/`return -1`, negated `if`",
        "conditions, deleted statements that assign or call; in function bodies only, never in comments, literals",
        "or preprocessor lines), each compiled with the build's own compiler and flags into a staging copy of",
        "kvimpl and hunted in child processes: first the unit tests that drive the native core (`pytest",
        "tests/impl/test_native.py tests/impl/test_every_operation.py tests/impl/test_validation.py ... -x`, the",
        "14 files of `FAST_TESTS` in `tools/kvtools/cmutants/runner.py`), then, for a survivor, the memcheck tier",
        "(the same tests on the mutant built with `-fsanitize=address,undefined`, the sanitizer runtime preloaded:",
        "an AddressSanitizer or UBSan report kills; `tools/kvtools/cmutants/memcheck.py`), then the lockstep",
        "`kvref check --target T",
        "--against spec --profile ci --seed 0 --budget 60` for T in `impl-native`, `impl-array`,",
        "`impl-batch-native`; each tier only where the mutant's function runs under it (measured with gcov on the",
        "unmutated core).",
        "A crash of the child (a signal) or a run past its hang guard (a *timeout*) counts as a kill; a mutant",
        "that does not compile is *invalid* and not counted. Survivors are triaged in",
        "`tools/kvtools/cmutants_triage.toml`: *equivalent* (left out of the score, with the reason) or *gap*",
        "(observable; with the situation the hunt does not produce). Regenerate with `python -m kvtools cmutants`",
        "(or `ci/cmutants.sh`); the results are in `docs/reports/cmutants.json`.",
        "",
        "## Summary",
        "",
        f"- mutants of the current sources: **{total}**; hunted: **{len(results)}**"
        + (f" ({100 * len(results) / total:.1f}%)" if total else ""),
    ]
    if sampled:
        lines.append(
            "- **a sample**: "
            + (f"every mutant of {', '.join(f'`{f}`' for f in full)}; " if full else "")
            + "a stratified random sample of "
            + ", ".join(
                f"`{f}` ({sum(r['file'] == f for r in results.values())} of {len(all_mutants[f])})" for f in sampled
            )
            + ". The draw is `--sample N --seed S` (each file's share in proportion to its mutants, a prefix of a"
            " seeded permutation of the file's mutants); see the commands below."
        )
    else:
        lines.append("- every mutant of every hunted file was hunted (no sampling error)")
    lines += [
        f"- killed: **{counts['killed']}**, timeouts (counted as killed): {counts['timeout']}; survived: "
        f"{counts['equivalent'] + counts['gap'] + counts['untriaged']} (equivalent {counts['equivalent']}, "
        f"known gaps {counts['gap']}, untriaged {counts['untriaged']}); invalid (do not compile): "
        f"{counts['invalid']}; runner errors: {counts['error']}",
        f"- **score: {overall.text()}** (killed / (killed + surviving non-equivalent); the estimate weights each"
        " file by its number of mutants, see the notes of `tools/kvtools/cmutants/report.py`)",
        "- commands: " + ("; ".join(f"`{c.strip()}`" for c in commands) if commands else "-"),
    ]
    return lines


def _file_table(
    all_mutants: dict[str, list[Mutant]], per_file: dict[str, list[str]], files: list[str], overall: Score
) -> list[str]:
    lines = [
        "",
        "| file | mutants | hunted | killed | timeout | equivalent | gap | untriaged | invalid | score |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    kinds = ("killed", "timeout", "equivalent", "gap", "untriaged", "invalid")
    for f in files:
        c = Counter(per_file[f])
        score = file_score(len(all_mutants[f]), per_file[f])
        cells = [str(len(all_mutants[f])), str(len(per_file[f])), *(str(c[k]) for k in kinds), score.text()]
        lines.append(f"| `{f}` | " + " | ".join(cells) + " |")
    not_hunted = [f for f in all_mutants if f not in files]
    for f in not_hunted:
        lines.append(f"| `{f}` | {len(all_mutants[f])} | 0 | | | | | | | - |")
    c = Counter(x for f in files for x in per_file[f])
    cells = [str(sum(len(ms) for ms in all_mutants.values())), str(sum(len(v) for v in per_file.values()))]
    lines.append("| **all** | " + " | ".join([*cells, *(str(c[k]) for k in kinds), f"**{overall.text()}**"]) + " |")
    return lines


def _kills(results: dict[str, dict[str, Any]], classes: dict[str, str]) -> list[str]:
    by_tier = Counter(str(r.get("killed_by")) for k, r in results.items() if classes[k] in KILLED)
    how = Counter(_how_kind(str(r["how"])) for k, r in results.items() if classes[k] in KILLED)
    return [
        "",
        "Kills by tier: "
        + ", ".join(f"{t} {n}" for t, n in sorted(by_tier.items()))
        + "; by kind: "
        + ", ".join(f"{h} {n}" for h, n in sorted(how.items()))
        + ".",
    ]


def _how_kind(how: str) -> str:
    if "crash (" in how:
        return "crash " + how.split("crash (", 1)[1].split(")", 1)[0]
    for key, name in (
        ("AddressSanitizer", "memory error (ASan)"),
        ("UBSan:", "undefined behaviour (UBSan)"),
        ("sanitizer exit", "sanitizer report"),
        ("hang guard", "timeout"),
        ("does not import", "import"),
        ("divergence", "divergence"),
        ("adapter hang", "op watchdog"),
        ("nothing checked", "nothing checked"),
    ):
        if key in how:
            return name
    return "test failure"


def _operator_table(results: dict[str, dict[str, Any]], classes: dict[str, str]) -> list[str]:
    lines = [
        "",
        "## By operator",
        "",
        "| operator | hunted | killed | timeout | equivalent | gap | untriaged | invalid |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for op in OPERATORS:
        mine = [classes[k] for k, r in results.items() if r["operator"] == op]
        if not mine:
            continue
        c = Counter(mine)
        cells = [
            str(len(mine)),
            *(str(c[k]) for k in ("killed", "timeout", "equivalent", "gap", "untriaged", "invalid")),
        ]
        lines.append(f"| `{op}` | " + " | ".join(cells) + " |")
    return lines


def _cost(data: dict[str, Any], results: dict[str, dict[str, Any]]) -> list[str]:
    rows = list(results.values())
    valid = [r for r in rows if r["status"] != "invalid"]

    def med(values: Sequence[float]) -> str:
        return f"{statistics.median(values):.1f} s" if values else "-"

    fast_kill = [r["tiers"]["fast"]["seconds"] for r in valid if r.get("killed_by") == "fast" and "fast" in r["tiers"]]
    fast_pass = [
        r["tiers"]["fast"]["seconds"] for r in valid if r["tiers"].get("fast", {}).get("verdict") == "survived"
    ]
    lock = [t["seconds"] for r in valid for name, t in r["tiers"].items() if name not in ("fast", "memcheck")]
    mem = [t for r in valid for name, t in r["tiers"].items() if name == "memcheck"]
    mem_kill = [t["seconds"] for t in mem if t["verdict"] != "survived"]
    mem_pass = [t["seconds"] for t in mem if t["verdict"] == "survived"]
    mem_build = [t["build_seconds"] for t in mem if "build_seconds" in t]
    totals = [r["build_seconds"] + sum(t["seconds"] for t in r["tiers"].values()) for r in rows]
    reach = data.get("reach") or {}
    reach_rows = reach.get("tiers_reach", {})
    lines = [
        "",
        "## Cost",
        "",
        "Wall-clock seconds on the machine that ran the campaign (2 CPU cores shared with other jobs; one",
        "mutant at a time):",
        "",
        f"- build (compile the mutated file, relink): median {med([r['build_seconds'] for r in rows])}",
        f"- fast tier: median {med(fast_kill)} when it kills, {med(fast_pass)} when the mutant passes it",
        f"- memcheck tier (the sanitized object, then the fast tier's tests under ASan and UBSan): median"
        f" {med(mem_kill)} when it kills, {med(mem_pass)} when the mutant passes it ({len(mem)} runs; of which"
        f" the sanitized build: median {med(mem_build)})"
        + (
            f"; {statistics.median(mem_pass) / statistics.median(fast_pass):.1f} times the fast tier's pass"
            if mem_pass and fast_pass
            else ""
        ),
        f"- lockstep run: median {med(lock)} ({len(lock)} runs)",
        f"- per mutant, everything: median {med(totals)}, mean "
        + (f"{statistics.mean(totals):.1f} s" if totals else "-")
        + f", total {sum(totals) / 3600:.1f} h for {len(rows)} mutants",
    ]
    if reach_rows:
        lines.append(
            f"- reach (gcov, once per source version, {reach.get('seconds', '?')} s): C functions entered per tier: "
            + ", ".join(f"{t} {sum(len(v) for v in r['functions'].values())}" for t, r in reach_rows.items())
        )
    return lines


def _survivors(results: dict[str, dict[str, Any]], classes: dict[str, str], triage: Triage) -> list[str]:
    left = [(k, r) for k, r in results.items() if classes[k] in ("equivalent", "gap", "untriaged")]
    lines = [
        "",
        "## Survivors",
        "",
        "Reached by: the tiers whose run executed the mutated line on the unmutated core (gcov); none: no tier",
        "runs it.",
        "",
        "| mutant | function | change | reached by | triage | reason |",
        "|---|---|---|---|---|---|",
    ]
    for k, r in left:
        reason = triage.equivalent.get(k) or triage.gaps.get(k) or ""
        reached = ", ".join(r.get("reached", [])) or "none"
        cls = classes[k] if classes[k] != "untriaged" else "**untriaged**"
        lines.append(f"| `{k}` | `{r['function']}` | {_code(r['change'])} | {reached} | {cls} | {_cell(reason)} |")
    return lines


def _every(results: dict[str, dict[str, Any]], classes: dict[str, str]) -> list[str]:
    lines = ["", "## Every hunted mutant", "", "| mutant | change | result | how | seconds |", "|---|---|---|---|---:|"]
    for k, r in results.items():
        secs = r["build_seconds"] + sum(t["seconds"] for t in r["tiers"].values())
        lines.append(f"| `{k}` | {_code(r['change'])} | {classes[k]} | {_cell(str(r['how']))} | {secs:.0f} |")
    return lines


def _cell(text: str) -> str:
    """Table-cell text: pipes escaped, at most 240 characters."""
    short = text if len(text) <= 240 else text[:237] + "..."
    return short.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    """A change as table-cell code."""
    short = text if len(text) <= 120 else text[:117] + "..."
    return "`" + short.replace("`", "'").replace("|", "\\|") + "`"
