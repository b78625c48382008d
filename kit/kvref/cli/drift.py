"""``kvref drift``: what changed in a new vLLM release, class by class.

The tool for the day a vLLM release comes out. It first compares the
installed release's *surface* (its manager, block-pool and request API,
KV-cache spec classes and event fields, :mod:`kvref.surface`) with the
surface recorded for the working profile's release: each new, removed or
changed entry is a class of its own, printed with the profile switch that
models it (:data:`kvref.drift.SURFACE_SWITCHES`). Then it runs the lockstep
of a semantics profile (``--semantics``, e.g. the previous release's) against
the installed vLLM and keeps going. Each unexplained divergence is shrunk,
its trace saved under ``--out``, its class (operation and the aspect that
differs) registered as known for the rest of the run, and the hunt goes on;
the command ends with a table of the distinct behaviour classes, each with
its shortest trace, the operation where it shows and what would explain it:
the profile switches that reproduce its trace, or the surface entry of its
operation. A class is a lead, not a verdict: read its trace, then model the
change as a profile switch or register it as a divergence.

When kvspec has a profile for the installed release, each class is also
replayed under the working profile with that release's switches set, one or
two at a time (:mod:`kvref.drift`): the switches that reproduce the trace
are named in the table, and the hunt goes on with them set, so that a second
change showing on the same operation is still found. A release newer than
every profile runs under the newest (one line says so); its surface is
compared with the newest profile's.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvref.cli.check import add_lockstep_arguments, execute, request_from
from kvref.drift import explain_surface
from kvref.exits import InputError
from kvref.surface import SurfaceChange, compare, declared_surface, read_surface, write_surface
from kvspec.profiles import NEWEST, PROFILES, SemanticsProfile, profile_for_release, profile_named


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
    drift.add_argument("--surface-only", action="store_true", help="compare the surfaces only (no lockstep run)")
    drift.add_argument(
        "--record-surface",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the installed release's surface to FILE (JSON, the format of kvref/surfaces/) and stop",
    )
    # The ci profile's 20,000 steps by default: the day a release comes out, a
    # dev-sized run (2,000 steps) stops after the first class or two.
    drift.set_defaults(run=run, against="vllm", target="spec", profile="ci", keep_going=True)


def run(args: argparse.Namespace) -> int:
    """The surface comparison, then a keep-going lockstep of ``--semantics``
    against ``--against`` (default: vllm)."""
    console = Console(stderr=True)
    release = _installed_release()
    if args.record_surface is not None:
        if release is None:
            raise InputError("--record-surface: vLLM is not installed")
        write_surface(read_surface(), release, args.record_surface)
        console.print(f"surface of vLLM {release} written to {args.record_surface}")
        return 0
    changes = surface_drift(args.semantics, release, console) if args.against == "vllm" else []
    if args.surface_only:
        return 1 if changes else 0
    request = request_from(args, keep_going=True, allow_mismatch=True)
    code = execute(request, attribute=not args.no_attribute, surface=changes)
    return 1 if code == 0 and changes else code


def surface_drift(semantics: str | None, release: str | None, console: Console) -> list[SurfaceChange]:
    """Compare the installed release's surface with the working profile's
    recorded one; print the table and return the changes (none when either
    is missing, with a line saying why)."""
    if release is None:
        console.print("surface: vLLM is not installed, not compared")
        return []
    try:
        working = profile_named(semantics) if semantics else profile_for_release(release)
    except KeyError as exc:
        raise InputError(f"--semantics: {exc.args[0]}") from None
    declared = declared_surface(working.release)
    if declared is None:
        console.print(f"surface: none recorded for {working.name} (kvref/surfaces/), not compared")
        return []
    try:
        installed = read_surface()
    except (FileNotFoundError, SyntaxError) as exc:
        console.print(f"surface: cannot read vLLM {release}'s sources ({exc}), not compared")
        return []
    reference = PROFILES.get(f"vllm-{release}")
    changes = compare(declared, installed)
    _report_surface(changes, working, reference, release)
    return changes


def _report_surface(
    changes: list[SurfaceChange], working: SemanticsProfile, reference: SemanticsProfile | None, release: str
) -> None:
    title = f"{len(changes)} surface change(s): vLLM {release} against the surface of {working.name}"
    if reference is None:
        title += f" (no profile for {release}; the newest is {NEWEST.name})"
    table = Table(title=title)
    for col in ("change", "entry", "detail", "explained by (switch, release)"):
        table.add_column(col)
    for c in changes:
        detail = (c.after if c.kind == "new" else c.before if c.kind == "removed" else c.detail()) or ""
        table.add_row(c.kind, c.entry, escape(detail), explain_surface(c, working, reference))
    Console(width=max(Console().width, 160)).print(table)


def _installed_release() -> str | None:
    from kvref.adapters.vllm import installed_vllm_version  # noqa: PLC0415 - imports no vLLM, only metadata

    return installed_vllm_version()
