"""Which C functions and lines each tier of the hunt runs (gcov), on the unmutated core.

:func:`measure` builds the core with ``--coverage -O0`` (the same compiler
and flags otherwise: :mod:`kvtools.cmutants.build`) into a staging package of
its own, runs every tier on it exactly as the hunt does (same seed; the
lockstep without a time budget, so that the whole step goal runs), and
reads gcov's JSON after each. A tier that fails on the unmutated core stops
the campaign: every verdict would be void.

The runner uses it for two things. A lockstep target is run on a mutant only
when the mutant's function ran under it: the hunt is deterministic (seeded,
a fixed step goal), so a run that never enters a function behaves the same
whatever that function's code (the brief's "where the mutated function is on
their paths", measured rather than guessed). And the report marks a survivor
whose line no tier executed as *not reached*, the C counterpart of mutmut's
"no tests".
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtools.cmutants.build import Stage, compile_command, link_command


@dataclass(frozen=True)
class TierReach:
    """What one tier ran: per C file, the functions entered and the lines executed."""

    functions: dict[str, frozenset[str]]
    lines: dict[str, frozenset[int]]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready copy (sorted lists)."""
        return {
            "functions": {f: sorted(v) for f, v in sorted(self.functions.items())},
            "lines": {f: sorted(v) for f, v in sorted(self.lines.items())},
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> TierReach:
        """The inverse of :meth:`to_json`."""
        return TierReach(
            {f: frozenset(v) for f, v in data["functions"].items()},
            {f: frozenset(int(x) for x in v) for f, v in data["lines"].items()},
        )


RunTier = Callable[[Path, str], tuple[int, str]]
"""``run(stage_root, tier) -> (exit code, output)``: one tier on the package staged at ``stage_root``."""


def measure(stage: Stage, tiers: Sequence[str], run: RunTier) -> dict[str, TierReach]:
    """Run ``tiers`` on a coverage build of the unmutated core; what each executed.

    Raises:
        RuntimeError: If a tier does not pass on the unmutated core.
        subprocess.CalledProcessError: If the coverage build fails.
    """
    cov = stage.work / "coverage"
    shutil.rmtree(cov, ignore_errors=True)
    objects = cov / "objects"
    objects.mkdir(parents=True)
    cov_stage = Stage(cov, stage.sources, stage.package)
    cov_stage.prepare_package()
    objs = []
    for src in stage.c_files():
        obj = objects / (src.stem + ".o")
        cmd = [*compile_command(src, obj, stage.sources), "-O0", "--coverage"]
        subprocess.run(cmd, check=True, capture_output=True)
        objs.append(obj)
    subprocess.run([*link_command(objs, cov_stage.extension), "--coverage"], check=True, capture_output=True)
    reach: dict[str, TierReach] = {}
    for tier in tiers:
        for stale in objects.glob("*.gcda"):
            stale.unlink()
        code, output = run(cov_stage.root, tier)
        if code != 0:
            tail = "\n".join(output.splitlines()[-15:])
            raise RuntimeError(f"the tier {tier!r} fails on the unmutated core (exit {code}):\n{tail}")
        reach[tier] = _read_gcov(stage.c_files(), objects)
    return reach


def _read_gcov(sources: Sequence[Path], objects: Path) -> TierReach:
    functions: dict[str, frozenset[str]] = {}
    lines: dict[str, frozenset[int]] = {}
    for src in sources:
        if not (objects / (src.stem + ".gcda")).exists():
            functions[src.name], lines[src.name] = frozenset(), frozenset()
            continue
        proc = subprocess.run(
            ["gcov", "--json-format", "--stdout", "--object-directory", str(objects), str(src)],
            capture_output=True,
            check=True,
            cwd=objects,
        )
        data = json.loads(_maybe_gunzip(proc.stdout))
        entry = next((f for f in data["files"] if Path(f["file"]).name == src.name), None)
        if entry is None:
            functions[src.name], lines[src.name] = frozenset(), frozenset()
            continue
        functions[src.name] = frozenset(f["name"] for f in entry["functions"] if f["execution_count"] > 0)
        lines[src.name] = frozenset(ln["line_number"] for ln in entry["lines"] if ln["count"] > 0)
    return TierReach(functions, lines)


def _maybe_gunzip(raw: bytes) -> str:
    text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    # gcov --stdout prints one JSON document per source (one here).
    return text.decode().strip().splitlines()[0] if text.strip().startswith(b"{") else text.decode()
