"""``python -m kvtools zoo``: hunt every (or the named) zoo entry and write the reports.

Options: ``--budget`` seconds per entry (hunt plus shrink), ``--seed``,
``--profile``, ``--json`` and ``--markdown`` (the report files), ``--update``
(rerun only the named entries, keep the other rows), ``--vllm`` (the faults
of :mod:`kvtools.zoo.vllm`), ``--rewrite`` (only re-render from the JSON),
``--fresh`` (the fresh fault set of :mod:`kvtools.zoo.fresh`, never used to
tune the generator), ``--unseen`` (the unseen set of :mod:`kvtools.zoo.unseen`,
written after the generator was frozen: docs/reports/zoo-unseen.json and
bug-zoo-unseen.md, each entry under its own release,
:data:`kvtools.zoo.unseen.PROFILE_OF`), ``--semantics`` (the release the
configurations follow; default vllm-0.25.1, with ``--unseen`` each entry's),
``--list``, ``--note`` and ``--no-shrink-cap``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvref.adapters.impl import ImplAdapter
from kvspec.config import KVCacheConfig
from kvspec.profiles import profile_named
from kvtools.zoo import ZOO
from kvtools.zoo.base import ZooEntry
from kvtools.zoo.fresh import FRESH
from kvtools.zoo.report import refresh, write_markdown
from kvtools.zoo.runner import progress, run_entry
from kvtools.zoo.unseen import PROFILE_OF, UNSEEN
from kvtools.zoo.vllm import VLLM_ZOO, VllmZooEntry

DEFAULT_JSON, DEFAULT_MD = Path("docs/reports/zoo.json"), Path("docs/reports/bug-zoo.md")
DEFAULT_SEMANTICS = "vllm-0.25.1"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the zoo; 0 when the reports were written, 2 for an unknown entry."""
    args = build_parser().parse_args(argv)
    if args.fresh and args.unseen:
        print("--fresh and --unseen name two different fault sets; give one", file=sys.stderr)
        return 2
    if (args.fresh or args.unseen) and args.json == DEFAULT_JSON:
        stem = "fresh" if args.fresh else "unseen"
        args.json, args.markdown = (
            DEFAULT_JSON.with_name(f"zoo-{stem}.json"),
            DEFAULT_MD.with_name(f"bug-zoo-{stem}.md"),
        )
    registry = FRESH if args.fresh else UNSEEN if args.unseen else ZOO
    if args.list:
        for e in registry.values():
            profile = f" [{PROFILE_OF[e.name]}]" if args.unseen else ""
            print(f"{e.name:32} {e.upstream:40} {e.description}{profile}")
        return 0
    unknown = [n for n in args.names if n not in registry]
    if unknown:
        print(f"unknown zoo entries: {', '.join(unknown)}", file=sys.stderr)
        return 2
    rows = [refresh(r) for r in json.loads(args.json.read_text())] if args.rewrite else _hunt(args)
    args.json.write_text(json.dumps(rows, indent=2) + "\n")
    write_markdown(
        rows, args.markdown, args.budget, args.seed, args.profile, args.note, fresh=args.fresh, unseen=args.unseen
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command's options."""
    parser = argparse.ArgumentParser(prog="python -m kvtools zoo", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="entries to run (default: all)")
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", default="ci")
    parser.add_argument(
        "--json", type=Path, default=DEFAULT_JSON, help="(with --fresh: zoo-fresh.json, --unseen: zoo-unseen.json)"
    )
    parser.add_argument(
        "--markdown",
        type=Path,
        default=DEFAULT_MD,
        help="(with --fresh: bug-zoo-fresh.md, --unseen: bug-zoo-unseen.md)",
    )
    parser.add_argument("--list", action="store_true", help="print the registry and exit")
    parser.add_argument("--update", action="store_true", help="rerun only the named entries, keep the other rows")
    parser.add_argument("--vllm", action="store_true", help="run the kvtools.zoo.vllm faults (needs vLLM 0.25.1)")
    parser.add_argument("--fresh", action="store_true", help="hunt the fresh fault set (kvtools.zoo.fresh)")
    parser.add_argument(
        "--unseen", action="store_true", help="hunt the unseen fault set (kvtools.zoo.unseen), each under its profile"
    )
    parser.add_argument("--rewrite", action="store_true", help="only re-render the Markdown from the JSON")
    parser.add_argument(
        "--semantics",
        default=None,
        help=f"semantics profile of the drawn configurations (default {DEFAULT_SEMANTICS}; with --unseen, each "
        "entry's own, kvtools.zoo.unseen.PROFILE_OF)",
    )
    parser.add_argument("--note", action="append", default=[], help="a paragraph for the report's preamble")
    parser.add_argument(
        "--no-shrink-cap", action="store_true", help="let Hypothesis shrink for as long as it likes (up to 300 s)"
    )
    return parser


def _hunt(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run the chosen entries; with ``--update``, merge them into the stored rows (registry order)."""
    rows = []
    semantics = profile_named(args.semantics or DEFAULT_SEMANTICS)
    if args.unseen:
        return _hunt_unseen(args)
    if args.fresh:
        for name in args.names or list(FRESH):
            row = run_entry(
                FRESH[name], args.budget, args.seed, args.profile, module="kvtools.zoo.fresh",
                shrink_cap=not args.no_shrink_cap, semantics=semantics,
            )  # fmt: skip
            print(progress(row), file=sys.stderr)
            rows.append(row)
        return rows
    for name in args.names or ([] if args.vllm else list(ZOO)):
        own = profile_named(args.semantics or ZOO[name].semantics or DEFAULT_SEMANTICS)
        row = run_entry(
            ZOO[name], args.budget, args.seed, args.profile, shrink_cap=not args.no_shrink_cap, semantics=own
        )
        print(progress(row), file=sys.stderr)
        rows.append(row)
    if args.vllm:
        for v in VLLM_ZOO.values():
            row = run_entry(
                _as_zoo_entry(v), args.budget, args.seed, args.profile, module="kvtools.zoo.vllm",
                shrink_cap=not args.no_shrink_cap,
            )  # fmt: skip
            print(progress(row), file=sys.stderr)
            rows.append(row)
    if args.update and args.json.exists():
        fresh = {r["name"]: r for r in rows}
        old = {r["name"]: r for r in json.loads(args.json.read_text())}
        order = [*ZOO, *(n for n in old if n not in ZOO), *(n for n in fresh if n not in ZOO and n not in old)]
        rows = [fresh.get(n) or old[n] for n in order if n in fresh or n in old]
    return rows


def _hunt_unseen(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Hunt the chosen entries of the unseen set, each under ``--semantics`` if given, else under its own
    profile; with ``--update``, merge them into the stored rows (registry order)."""
    rows = []
    for name in args.names or list(UNSEEN):
        row = run_entry(
            UNSEEN[name], args.budget, args.seed, args.profile, module="kvtools.zoo.unseen",
            shrink_cap=not args.no_shrink_cap, semantics=profile_named(args.semantics or PROFILE_OF[name]),
        )  # fmt: skip
        print(progress(row), file=sys.stderr)
        rows.append(row)
    if args.update and args.json.exists():
        new = {r["name"]: r for r in rows}
        old = {r["name"]: r for r in json.loads(args.json.read_text())}
        rows = [new.get(n) or old[n] for n in UNSEEN if n in new or n in old]
    return rows


def _as_zoo_entry(v: VllmZooEntry) -> ZooEntry:
    """A vLLM fault as a row head for :func:`run_entry` (which loads the factory by its target name)."""
    return ZooEntry(v.name, v.method, v.description, _no_factory, "")


def _no_factory(config: KVCacheConfig) -> ImplAdapter:
    raise NotImplementedError("vLLM zoo rows are run through their own module")
