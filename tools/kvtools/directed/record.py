"""The directed-trace recorder: ``python -m kvtools directed [--check] [--out DIR]``.

Records every scenario of every theme on kvspec and writes
``traces/vllm-0.25.1/directed/<name>.jsonl``, deleting files that are no scenario's; with
``--check`` it only compares the committed files with a fresh recording.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from kvspec.profiles import profile_named
from kvtools.directed import allocation, arguments, boundary, hits, retention
from kvtools.directed.script import Scenario

ROOT = Path(__file__).resolve().parents[3]
DIRECTED_DIR = ROOT / "traces" / "vllm-0.25.1" / "directed"
THEMES = (allocation, arguments, hits, boundary, retention)
"""The scenario modules (the trace files sort by scenario name, whatever the theme)."""


def record_releases(argv: Sequence[str] | None, build: Callable[[str], list[Scenario]], command: str) -> int:
    """Record ``build(release)``'s scenarios for each release named in ``argv``
    (default: the command line) into ``traces/<release>/directed/``; the
    scripts of one situation under the releases that have it (``command`` is
    how the usage line names the script)."""
    names = list(sys.argv[1:] if argv is None else argv)
    if not names:
        print(f"usage: python -m {command} vllm-<release> [...]", file=sys.stderr)
        return 2
    for name in names:
        release = profile_named(name).name
        for sc in build(release):
            out = DIRECTED_DIR.parent.parent / release / "directed" / f"{sc.name}.jsonl"
            out.parent.mkdir(parents=True, exist_ok=True)
            sc.record().write(out)
            print(out)
    return 0


def scenarios() -> list[Scenario]:
    """Every directed scenario, in file-name order."""
    return sorted((sc for theme in THEMES for sc in theme.scenarios()), key=lambda sc: sc.name)


def write_all(out_dir: Path, check: bool) -> int:
    """Record every scenario; write it (or, with ``check``, compare it). Returns the exit code."""
    stale = []
    names = set()
    for sc in scenarios():
        names.add(f"{sc.name}.jsonl")
        text = sc.record().dumps()
        path = out_dir / f"{sc.name}.jsonl"
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        elif not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    extra = sorted(p.name for p in out_dir.glob("*.jsonl") if p.name not in names)
    if check and (stale or extra):
        print(f"kvtools directed: out of date: {stale}; not a scenario: {extra}", file=sys.stderr)
        return 1
    for name in extra if not check else ():
        (out_dir / name).unlink()
    print(f"kvtools directed: {len(names)} scenarios {'match' if check else 'written to'} {out_dir}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Record (or, with ``--check``, compare) the directed traces; 1 when a file is out of date."""
    parser = argparse.ArgumentParser(prog="python -m kvtools directed", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DIRECTED_DIR, help="output folder (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="only compare the committed files with a fresh recording")
    args = parser.parse_args(argv)
    return write_all(args.out, args.check)
