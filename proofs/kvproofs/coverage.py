"""``python -m kvproofs.coverage``: the proof-coverage report.

Reads the obligations the last ``holds`` run wrote
(:data:`kvproofs.report.RESULTS`, from ``bash ci/proofs.sh`` or ``python -m
kvproofs.run holds``) and prints, as Markdown:

* per kvspec module, the public functions, those with contracts, those whose
  every ``post:`` line was checked, and those exempt (with the reasons);
* per module, the obligations: exhausted, confirmed within a stated bound,
  not refuted, refuted;
* per release, the obligations checked under that release's profile.

``--obligations`` adds every obligation with its check and bound (the body
of ``proofs/CONTRACTS.md``); ``--out FILE`` writes the report there too. Exits
1 when a public function breaks the contract rule (:func:`kvproofs.report.gaps`),
when a contracted function has a ``post:`` line no check reached, or when an
obligation is not exhausted or confirmed within its bound.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from kvproofs.contracts import spec_functions
from kvproofs.report import RESULTS, Obligation, gaps, load, render


def unchecked(obligations: list[Obligation]) -> list[str]:
    """``post:`` lines of contracted spec functions that no obligation covers."""
    done = {(o.subjects[0], o.condition) for o in obligations if o.check.startswith("contract")}
    return [
        f"{fn.qualname}: {c.source}"
        for fn in spec_functions()
        if fn.has_contract
        for c in fn.posts
        if (fn.qualname, c.source) not in done
    ]


def obligations_table(obligations: list[Obligation]) -> str:
    """Every obligation, one row each."""
    rows = ["| status | where | function | condition | check | bound | releases |", "|---|---|---|---|---|---|---|"]
    for o in obligations:
        releases = _releases(o.releases)
        cond = o.condition.replace("|", "\\|")
        bound = o.bound.replace("|", "\\|")
        rows.append(f"| {o.status} | {o.where} | `{o.function}` | `{cond}` | {o.check} | {bound} | {releases} |")
    return "\n".join(rows) + "\n"


def _releases(releases: tuple[str, ...]) -> str:
    from kvspec.profiles import PROFILES  # noqa: PLC0415

    if not releases:
        return "-"
    every = [p.release for p in PROFILES.values()]
    return "all" if list(releases) == every or set(releases) == set(every) else " ".join(releases)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the report; the exit status says whether coverage is complete."""
    parser = argparse.ArgumentParser(prog="python -m kvproofs.coverage", description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--obligations", action="store_true", help="also list every obligation")
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    args = parser.parse_args(argv)
    if not args.results.exists():
        print(f"no results at {args.results}: run python -m kvproofs.run holds first", file=sys.stderr)
        return 1
    obligations = load(args.results)
    text = render(obligations)
    if args.obligations:
        text += "\n## Obligations\n\n" + obligations_table(obligations)
    problems = [*gaps(), *(f"unchecked: {u}" for u in unchecked(obligations))]
    problems += [
        f"{o.status}: {o.where} {o.function} {o.condition}"
        for o in obligations
        if o.status not in ("exhausted", "within bound")
    ]
    print(text)
    if args.out:
        args.out.write_text(text)
    for p in problems:
        print(f"!!! {p}")
    print(f"==> coverage: {'complete' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
