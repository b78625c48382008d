"""The ``kvref`` command: one module per subcommand.

``check`` (lockstep state machines), ``drift`` (how the installed vLLM
differs from a semantics profile), ``replay`` (stored traces), ``soak``
(a long scripted run), ``bench`` (timing against real vLLM) and ``traces
record`` (new traces from lockstep runs).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvref.cli import bench, check, drift, replay, soak, traces


def build_parser() -> argparse.ArgumentParser:
    """The ``kvref`` argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="kvref", description="Conformance kit for paged KV-cache managers.")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (check, drift, replay, soak, bench, traces):
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvref`` console script."""
    args = build_parser().parse_args(argv)
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
