"""Shipped conformance test: ``kvref check`` as one pytest test.

``pytest --kvref-target=module:factory`` collects this module (see
:mod:`kvref.pytest_plugin`, which holds the check the session's options ask
for, runs it and prints its summary at the end of the session).
"""

from __future__ import annotations

import pytest

from kvref.pytest_plugin import run_check


def test_kvref_conformance(request: pytest.FixtureRequest) -> None:
    """The lockstep check of ``--kvref-target`` against ``--kvref-against``:
    fails on an unexplained divergence or a run below the floor."""
    run_check(request.config)
