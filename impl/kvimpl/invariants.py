"""Internal invariant failures of kvimpl.

A broken invariant is a bug in kvimpl, never a caller error: it raises
:class:`kvspec.invariants.InvariantViolation` (the one class for spec and
impl alike, an ``AssertionError`` that is raised even under ``python -O``).
``require`` is kvimpl's own copy of the spec's one-line helper.
"""

from __future__ import annotations

from kvspec.invariants import InvariantViolation


def require(holds: bool, message: str) -> None:
    """Raise InvariantViolation(message) unless ``holds``."""
    if not holds:
        raise InvariantViolation(message)
