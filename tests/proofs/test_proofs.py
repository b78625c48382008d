"""The CrossHair proofs and bounded checks of ``proofs/`` as pytest tests.

Skipped unless ``KVREF_PROOFS=1``: they take minutes of CPU, and
``ci/proofs.sh`` (called by ``ci/test.sh``) runs exactly these tests with the
variable set, so the default ``pytest`` run does not pay for them twice.
Run them alone with ``KVREF_PROOFS=1 pytest -s tests/proofs/test_proofs.py``
(``-s`` shows the result tables as they come).
"""

from __future__ import annotations

import os

import pytest

from kvproofs import run

pytestmark = pytest.mark.skipif(
    os.environ.get("KVREF_PROOFS") != "1",
    reason="CrossHair proofs take minutes; ci/proofs.sh runs them (set KVREF_PROOFS=1 to run them here)",
)

JOBS = int(os.environ.get("KVREF_PROOFS_JOBS", str(min(os.cpu_count() or 1, 4))))
"""Parallel CrossHair processes (``KVREF_PROOFS_JOBS``; default: CPU count, at most 4)."""


def test_holds_are_silent() -> None:
    """proofs/holds and proofs/bounded: nothing refuted, CrossHair never crashes."""
    assert run.holds(JOBS, run.HOLDS_TIMEOUT), "an obligation was refuted or not exhausted (see the table above)"


def test_mutants_match_golden_output() -> None:
    """Every proofs/mutants module is refuted exactly as proofs/mutants/expected.txt says."""
    assert run.mutants(JOBS, run.MUTANT_TIMEOUT, write=False), "mutant results differ from expected.txt"


def test_diffbehavior_pairs() -> None:
    """Every spec/kvimpl (and demo) pair ends with the expected diffbehavior status."""
    assert run.diff(JOBS, run.DIFF_TIMEOUT), "a diffbehavior pair ended unexpectedly"
