"""Run the device block-table checks on a GPU (never part of CI).

Usage: ``python -m kvtools check-cuda``. With ``torch.cuda.is_available()``
it runs :func:`kvtools.device_exercise.exercise` with
``device="cuda"`` for every shape and a few seeds, on the Python build and
(when built) the native core, whose tables the core writes into pinned host
memory and copies once per step; otherwise it prints
"no GPU: skipped" and exits 0.
"""

from __future__ import annotations

import sys

from kvimpl.native import native_module
from kvtools.device_exercise import SHAPES, exercise, native_runs


def main(argv: list[str] | None = None) -> int:
    """Run the checks; 0 when they pass or there is no GPU."""
    try:
        import torch  # noqa: PLC0415 - torch is optional
    except ImportError:
        print("no GPU: skipped (torch is not installed)")
        return 0
    if not torch.cuda.is_available():
        print("no GPU: skipped")
        return 0
    builds = [False] + ([True] if native_module() is not None else [])
    for native in builds:
        name = "native" if native else "python"
        for shape in sorted(SHAPES):
            if native and not native_runs(shape):
                print(f"cuda {shape} ({name}): skipped (the native core runs it on Python)")
                continue
            for seed in range(4):
                exercise("cuda", shape, seed, native=native)
            print(f"cuda {shape} ({name}): ok")
    print(f"all block-table checks passed on {torch.cuda.get_device_name()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
