"""The ``kvref`` command: one module per subcommand.

``check`` (lockstep state machines), ``fuzz`` (the same machines under
HypoFuzz, coverage-guided, for as long as it is left running), ``campaign``
(``fuzz`` workers over several vLLM release venvs sharing a Redis example
database), ``drift``
(how the installed vLLM differs from a semantics profile), ``replay`` (stored traces), ``soak``
(a long scripted run), ``bench`` (timing against real vLLM), ``traces
record`` (new traces from lockstep runs), ``corpus`` (the shipped traces)
and ``install-vllm`` (a vLLM release's KV-cache core on CPU).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import metadata

from kvref.cli import bench, campaign, check, corpus, drift, fuzz, install_vllm, replay, soak, traces
from kvref.exits import HANG, INTERRUPTED, USAGE, AdapterHang, InputError, interruptible


def build_parser() -> argparse.ArgumentParser:
    """The ``kvref`` argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="kvref",
        description="Conformance kit for paged KV-cache managers.",
        epilog="exit codes: 0 agree, 1 divergence, 2 usage or input error, 3 nothing checked, "
        "4 adapter hang, 130 interrupted (docs/index.md)",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (check, drift, fuzz, campaign, replay, soak, bench, traces, corpus, install_vllm):
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvref`` console script (exit codes: :mod:`kvref.exits`)."""
    args = build_parser().parse_args(argv)
    try:
        with interruptible():
            result: int = args.run(args)
    except InputError as exc:
        print(f"kvref {args.command}: {exc}", file=sys.stderr)
        return USAGE
    except AdapterHang as exc:
        print(f"kvref {args.command}: {exc}", file=sys.stderr)
        return HANG
    except KeyboardInterrupt:
        print(f"kvref {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    return result


def _version() -> str:
    from kvspec.profiles import NEWEST, PROFILES  # noqa: PLC0415

    try:
        own = metadata.version("kvref")
    except metadata.PackageNotFoundError:
        own = "unknown"
    return f"kvref {own}; semantics profiles {', '.join(PROFILES)} (default {NEWEST.name})"


if __name__ == "__main__":
    sys.exit(main())
