"""Proof obligations and the proof-coverage report.

An *obligation* is one condition one check must establish: a ``post:`` line of
a spec function (checked by CrossHair through a wrapper of
:mod:`kvproofs.wrappers`, or evaluated over a domain by
:mod:`kvproofs.bounded.pep316`), a ``post:`` line of a harness of
``proofs/kvproofs/holds``, or a named property of a bounded check of
``proofs/kvproofs/bounded``. Each ends in one of:

* ``exhausted``: CrossHair explored every path of the unbounded contract;
* ``within bound``: every path (CrossHair) or every case (enumeration)
  inside a stated bound was explored: the wrapper's ``pre:`` bound, the
  harness's ``pre:`` lines, or the enumerated domain;
* ``not refuted``: the path budget ran out first (fails the run);
* ``refuted``: a counterexample (fails the run).

``holds`` (:mod:`kvproofs.run`) writes the obligations to
``build/proofs/obligations.json``; :func:`render` turns them and
:mod:`kvproofs.contracts` into the proof-coverage tables
(``python -m kvproofs.coverage``).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from kvproofs.contracts import CROSSHAIR, EXEMPT, REPO, SpecFunction, spec_functions
from kvspec.profiles import PROFILES

RESULTS = REPO / "build" / "proofs" / "obligations.json"
STATUSES = ("exhausted", "within bound", "not refuted", "refuted")


@dataclass(frozen=True)
class Obligation:
    """One condition and how its check ended."""

    check: str
    """``contract (CrossHair)``, ``contract (enumeration)``, ``harness`` or ``enumeration``."""
    where: str
    """``path:line`` of the condition, relative to the repository."""
    function: str
    """The function whose condition it is (a spec function, a harness, a check)."""
    condition: str
    subjects: tuple[str, ...]
    """The spec functions it is about (``kvspec.module.function``)."""
    status: str
    bound: str
    releases: tuple[str, ...]
    """Releases whose profiles the check fed in; empty: no profile switch read."""


def save(obligations: list[Obligation], path: Path = RESULTS) -> None:
    """Write ``obligations`` as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([asdict(o) for o in obligations], indent=1) + "\n")


def load(path: Path = RESULTS) -> list[Obligation]:
    """Read obligations written by :func:`save`."""
    out = []
    for raw in json.loads(path.read_text()):
        raw["subjects"] = tuple(raw["subjects"])
        raw["releases"] = tuple(raw["releases"])
        out.append(Obligation(**raw))
    return out


def owner(path: Path, line: int) -> SpecFunction | None:
    """The spec function whose docstring (or body) holds ``path:line``
    (``path`` absolute or relative to the repository)."""
    path = (REPO / path).resolve()
    candidates = [f for f in spec_functions() if f.path == path and f.line <= line]
    return max(candidates, key=lambda f: f.line) if candidates else None


def _module(qualname: str) -> str:
    return qualname.rsplit(".", 1)[0].removeprefix("kvspec.")


def gaps() -> list[str]:
    """Public functions that break the rule of :mod:`kvproofs.contracts`."""
    import importlib  # noqa: PLC0415

    from kvproofs.bounded import MODULES  # noqa: PLC0415 - imports the domains
    from kvproofs.bounded.pep316 import DOMAINS  # noqa: PLC0415

    for module in MODULES:
        importlib.import_module(f"kvproofs.bounded.{module}")
    out = []
    names = {f.qualname for f in spec_functions()}
    for fn in spec_functions():
        checked = [w for w, table in (("CrossHair", CROSSHAIR), ("an enumeration", DOMAINS)) if fn.qualname in table]
        if fn.qualname in EXEMPT:
            if fn.has_contract or checked:
                out.append(f"{fn.qualname}: listed as exempt but has a contract or a check")
        elif not fn.has_contract:
            out.append(f"{fn.qualname}: no post: line and not exempt (kvproofs.contracts.EXEMPT)")
        elif len(checked) != 1:
            out.append(f"{fn.qualname}: checked by {len(checked)} of CROSSHAIR and the enumerated domains, not one")
    for name in (*CROSSHAIR, *DOMAINS, *EXEMPT):
        if name not in names:
            out.append(f"{name}: named in kvproofs but not a public function of kvspec")
    return out


def render(obligations: list[Obligation], title: str = "Proof coverage") -> str:
    """The proof-coverage tables as Markdown."""
    fns = spec_functions()
    lines = [f"## {title}", ""]
    lines += _functions_table(fns, obligations)
    lines += ["", *_obligations_table(obligations)]
    lines += ["", *_release_table(obligations)]
    exempt = [f for f in fns if f.qualname in EXEMPT]
    if exempt:
        lines += ["", "Public functions without a contract:", ""]
        lines += [f"* `{f.short}`: {EXEMPT[f.qualname]}" for f in exempt]
    return "\n".join(lines) + "\n"


def _functions_table(fns: tuple[SpecFunction, ...], obligations: list[Obligation]) -> list[str]:
    proved: dict[str, set[str]] = {}
    for o in obligations:
        if o.check.startswith("contract"):
            proved.setdefault(o.subjects[0], set()).add(o.condition)
    rows = [
        "| module | public functions | with contracts | every post: checked | exempt |",
        "|---|---:|---:|---:|---:|",
    ]
    total = Counter[str]()
    for module in sorted({f.module for f in fns}):
        mine = [f for f in fns if f.module == module]
        with_contract = [f for f in mine if f.has_contract]
        checked = [f for f in with_contract if {c.source for c in f.posts} <= proved.get(f.qualname, set())]
        exempt = [f for f in mine if f.qualname in EXEMPT]
        counts = Counter(all=len(mine), contract=len(with_contract), checked=len(checked), exempt=len(exempt))
        total.update(counts)
        cells = " | ".join(str(counts[k]) for k in ("all", "contract", "checked", "exempt"))
        rows.append(f"| {module.removeprefix('kvspec.')} | {cells} |")
    rows.append(
        f"| **all** | **{total['all']}** | **{total['contract']}** | **{total['checked']}** | **{total['exempt']}** |"
    )
    return rows


def _status_cells(group: list[Obligation]) -> str:
    counts = Counter(o.status for o in group)
    return " | ".join(str(counts[s]) for s in STATUSES)


def _obligations_table(obligations: list[Obligation]) -> list[str]:
    header = "| module | obligations | exhausted | within bound | not refuted | refuted |"
    rows = [header, "|---|---:|---:|---:|---:|---:|"]
    by_module: dict[str, list[Obligation]] = {}
    for o in obligations:
        by_module.setdefault(_module(o.subjects[0]) if o.subjects else "(no subject)", []).append(o)
    for module in sorted(by_module):
        group = by_module[module]
        rows.append(f"| {module} | {len(group)} | {_status_cells(group)} |")
    rows.append(f"| **all** | **{len(obligations)}** | {_status_cells(obligations)} |")
    return rows


def _release_table(obligations: list[Obligation]) -> list[str]:
    header = "| release | obligations checked under its profile | exhausted | within bound | not refuted | refuted |"
    rows = [header, "|---|---:|---:|---:|---:|---:|"]
    for profile in PROFILES.values():
        group = [o for o in obligations if profile.release in o.releases]
        rows.append(f"| {profile.release} | {len(group)} | {_status_cells(group)} |")
    independent = [o for o in obligations if not o.releases]
    rows.append(f"| (reads no profile switch) | {len(independent)} | {_status_cells(independent)} |")
    return rows
