"""Internal invariant failures of kvimpl (duplicated from the spec on purpose).

A broken invariant is a bug in kvimpl, never a caller error: it raises
:class:`InvariantViolation`, an ``AssertionError`` that is raised even under
``python -O``.
"""

from __future__ import annotations


class InvariantViolation(AssertionError):
    """An internal invariant of kvimpl does not hold."""


def require(holds: bool, message: str) -> None:
    """Raise InvariantViolation(message) unless ``holds``."""
    if not holds:
        raise InvariantViolation(message)
