"""Run the device block-table checks on a GPU (never part of CI).

Usage: ``.venv/bin/python ci/check_cuda.py``. With ``torch.cuda.is_available()``
it runs :func:`exercise` from ``tests/unit/test_impl_block_table.py`` with
``device="cuda"`` for every shape and a few seeds; otherwise it prints
"no GPU: skipped" and exits 0.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    """Run the checks; 0 when they pass or there is no GPU."""
    try:
        import torch  # noqa: PLC0415 - torch is optional
    except ImportError:
        print("no GPU: skipped (torch is not installed)")
        return 0
    if not torch.cuda.is_available():
        print("no GPU: skipped")
        return 0
    path = ROOT / "tests" / "unit" / "test_impl_block_table.py"
    spec = importlib.util.spec_from_file_location("test_impl_block_table", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for shape in sorted(module.SHAPES):
        for seed in range(4):
            module.exercise("cuda", shape, seed)
        print(f"cuda {shape}: ok")
    print(f"all block-table checks passed on {torch.cuda.get_device_name()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
