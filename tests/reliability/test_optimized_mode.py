"""Under ``python -O`` the spec still detects broken invariants (
item 1): ``require()`` raises :class:`InvariantViolation` whether or not
``assert`` statements run. The check runs in a child interpreter started
with ``-O``, so it holds however pytest itself was started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import sys
from kvspec.config import FullAttention, KVCacheConfig
from kvspec.invariants import InvariantViolation
from kvspec.kv_cache_manager import KVCacheManager

assert False, "asserts must be off"  # skipped under -O
manager = KVCacheManager(KVCacheConfig(num_blocks=6, groups=(FullAttention(2),), max_model_len=16))
manager.check_invariants()
manager.block_pool.ref_cnt[3] = 1  # a free block with a reference: corrupt
try:
    manager.check_invariants()
except InvariantViolation as exc:
    print("caught:", exc, "optimize", sys.flags.optimize)
"""


def test_invariant_checks_survive_python_O() -> None:
    """A corrupted pool is reported under -O."""
    paths = [str(ROOT / "kit"), str(ROOT / "spec"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    proc = subprocess.run(
        [sys.executable, "-O", "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("caught: ") and proc.stdout.strip().endswith("optimize 1"), proc.stdout
