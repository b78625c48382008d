"""Support for the named invariant predicates.

Each stateful class of the spec states its invariants as module-level
predicates named ``inv_*`` (pure functions returning bool, each with a
docstring saying what it means) and checks them all in ``check_invariants()``.
A broken invariant is a bug in the implementation under test, never a caller
error, so it raises :class:`InvariantViolation`, an ``AssertionError`` that
is raised even under ``python -O``.
"""

from __future__ import annotations


class InvariantViolation(AssertionError):
    """An internal invariant does not hold."""


def require(holds: bool, message: str) -> None:
    """Raise InvariantViolation(message) unless ``holds``."""
    if not holds:
        raise InvariantViolation(message)
