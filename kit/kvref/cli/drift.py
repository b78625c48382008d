"""``kvref drift``: what changed in a new vLLM release, class by class.

The tool for the day a vLLM release comes out: run the lockstep of a
semantics profile (``--semantics``, e.g. the previous release's) against the
installed vLLM and keep going. Each unexplained divergence is shrunk, its
trace saved under ``--out``, its class (operation and the aspect that
differs) registered as known for the rest of the run, and the hunt goes on;
the command ends with a table of the distinct behaviour classes, each with
its shortest trace and the operation where it shows. A class is a lead, not
a verdict: read its trace, then model the change as a profile switch or
register it as a divergence.

When kvspec has a profile for the installed release, each class is also
replayed under the working profile with that release's switches set, one or
two at a time (:mod:`kvref.drift`): the switches that reproduce the trace
are named in the table, and the hunt goes on with them set, so that a second
change showing on the same operation is still found.
"""

from __future__ import annotations

import argparse
from typing import Any

from kvref.cli.check import add_lockstep_arguments, run_check


def add_parser(sub: Any) -> None:
    """Register ``drift`` on the subcommand parser ``sub``."""
    drift = sub.add_parser("drift", help="list how the installed vLLM differs from a semantics profile")
    add_lockstep_arguments(drift)
    drift.add_argument(
        "--no-attribute",
        action="store_true",
        help="do not replay each class under the installed release's profile switches "
        "(every class is then registered by its operation and aspect only)",
    )
    # The ci profile's 20,000 steps by default: the day a release comes out, a
    # dev-sized run (2,000 steps) stops after the first class or two.
    drift.set_defaults(run=run, against="vllm", target="spec", profile="ci")


def run(args: argparse.Namespace) -> int:
    """Keep-going lockstep of ``--semantics`` against ``--against`` (default: vllm)."""
    return run_check(args, keep_going=True, allow_mismatch=True, attribute=not args.no_attribute)
