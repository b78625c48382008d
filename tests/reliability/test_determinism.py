"""Determinism: replaying a trace twice gives byte-identical
outputs, views and event streams, in one process and across processes with
different ``PYTHONHASHSEED`` values.

kvspec derives its hashes from the config's ``hash_seed``, never from Python's
``hash()``, so ``PYTHONHASHSEED`` must not matter; the vLLM adapter installs
its NONE_HASH from the same seed. Targets: the ``target`` fixture
(``KVREF_TARGETS``, see ``tests/conftest.py``).
``test_detects_hash_seed_dependence`` shows that the check fails on an
adapter whose output follows ``hash()`` of strings.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from kvref.adapters import load_factory
from kvref.adapters.spec import SpecAdapter
from kvref.traces import load, transcript
from kvspec.block_pool import BlockId
from kvspec.config import KVCacheConfig

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = [
    ROOT / "traces" / "vllm-0.25.1" / "golden" / f"{shape}-0001.jsonl"
    for shape in (
        "full",
        "full+mamba-align",
        "full+mamba-all",
        "full@2x+mamba-align@2x+swa",
        "full@2x+swa",
        "mla",
        "sink",
        "full+cross",
    )
]
HASH_SEEDS = ("0", "12345")
SUBPROCESS_SCRIPT = """
import sys
from pathlib import Path
from kvref.adapters import load_factory
from kvref.traces import load, transcript
factory = load_factory(sys.argv[1])
sys.stdout.write("".join(transcript(load(Path(p)), factory) for p in sys.argv[2:]))
"""


def transcripts_in_process(target: str) -> str:
    """All golden transcripts of ``target``, concatenated."""
    factory = load_factory(target)
    return "".join(transcript(load(p), factory) for p in GOLDEN)


def transcripts_in_subprocess(target: str, hash_seed: str, extra_path: str = "") -> str:
    """The same, computed by a fresh interpreter with ``PYTHONHASHSEED=hash_seed``."""
    paths = [str(ROOT / "kit"), str(ROOT / "spec"), str(ROOT / "impl"), extra_path, os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    proc = subprocess.run(
        [sys.executable, "-c", SUBPROCESS_SCRIPT, target, *map(str, GOLDEN)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def digest(text: str) -> str:
    """Short SHA-256 for assertion messages."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def test_golden_selection_exists() -> None:
    """The chosen traces are present and some of them carry events."""
    assert all(p.exists() for p in GOLDEN)
    assert sum(load(p).config.enable_kv_cache_events for p in GOLDEN) >= 4


def test_replay_is_deterministic(target: str) -> None:
    """Twice in-process and once per PYTHONHASHSEED: byte-identical text."""
    first = transcripts_in_process(target)
    assert '"op":"take_events"' in first and '"type":"BlockStored"' in first
    assert transcripts_in_process(target) == first, "two in-process replays differ"
    for seed in HASH_SEEDS:
        other = transcripts_in_subprocess(target, seed)
        assert other == first, f"PYTHONHASHSEED={seed}: {digest(other)} != in-process {digest(first)}"


class HashOrderedNewIds(SpecAdapter):
    """Reports new block ids in ``hash(str(id))`` order, which follows
    PYTHONHASHSEED (a set of strings iterated somewhere in a port)."""

    name = "hash_ordered"

    def take_new_block_ids(self) -> list[BlockId]:
        """The spec's ids, in string-hash order."""
        return sorted(super().take_new_block_ids(), key=lambda b: hash(str(b)))


def hash_ordered(config: KVCacheConfig) -> HashOrderedNewIds:
    """Factory (``test_determinism:hash_ordered``) for the subprocess check."""
    return HashOrderedNewIds(config)


def test_detects_hash_seed_dependence() -> None:
    """The comparison fails for an adapter that depends on PYTHONHASHSEED."""
    here = str(Path(__file__).parent)
    runs = {transcripts_in_subprocess("test_determinism:hash_ordered", seed, here) for seed in HASH_SEEDS}
    assert len(runs) == 2
