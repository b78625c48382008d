"""Run the device block-table checks on a GPU (never part of CI).

Usage: ``python -m kvtools check-cuda``. With ``torch.cuda.is_available()``
it runs :func:`kvtools.device_exercise.exercise` with
``device="cuda"`` for every shape and a few seeds; otherwise it prints
"no GPU: skipped" and exits 0.
"""

from __future__ import annotations

import sys

from kvtools.device_exercise import SHAPES, exercise


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
    for shape in sorted(SHAPES):
        for seed in range(4):
            exercise("cuda", shape, seed)
        print(f"cuda {shape}: ok")
    print(f"all block-table checks passed on {torch.cuda.get_device_name()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
