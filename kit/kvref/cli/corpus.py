"""``kvref corpus``: where the shipped traces are and what they hold."""

from __future__ import annotations

import argparse
from typing import Any

from kvref import corpus
from kvref.exits import OK


def add_parser(sub: Any) -> None:
    """Register ``corpus`` on the subcommand parser ``sub``."""
    cmd = sub.add_parser(
        "corpus",
        help="list the shipped trace folders (or, with --paths, the files of some)",
        description="Without arguments: the corpus folder and each sub-folder with its trace count. "
        "With --paths SELECTOR: one trace path per line (a folder such as vllm-0.25.1/golden, or a "
        "whole profile such as vllm-0.33.0). `kvref replay --corpus SELECTOR` replays them directly.",
    )
    cmd.add_argument("--paths", metavar="SELECTOR", action="append", default=[])
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Print the listing (exit codes: :mod:`kvref.exits`)."""
    if args.paths:
        for selector in args.paths:
            for path in corpus.files(selector):
                print(path)
        return OK
    print(corpus.root())
    for folder in corpus.folders():
        print(f"  {folder}: {len(corpus.files(folder))} traces")
    return OK
