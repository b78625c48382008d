"""Bounded exhaustive checks of the spec's real classes.

CrossHair 0.0.113 cannot run kvspec's classes symbolically: it parses the
prose ``inv:`` lines of their docstrings as class invariants (NameError), and
under symbolic sizes it loses list aliasing (``table += new`` on a list held
in a dict rebinds instead of extending) and can answer ``a[:n] == b[:n]``
wrongly. Properties that need a real ``BlockPool``, manager, coordinator or
facade are therefore checked here by plain enumeration: every input of a
small domain is run through the real code, so within its bounds each check
is exhaustive (a bounded proof) and deterministic.

A check is a function decorated with :func:`check`; it returns the number of
cases it ran and calls :func:`expect` for each property. ``python -m
kvproofs.bounded`` runs them (see :mod:`kvproofs.bounded.__main__`).
"""

from __future__ import annotations

from collections.abc import Callable

CHECKS: dict[str, Callable[[], int]] = {}
"""``module.function`` → check, filled by :func:`check` on import."""

MODULES = (
    "alloc",
    "pool",
    "admission",
    "hybrid",
    "search",
    "releases",
    "contracts_config",
    "contracts_lookup",
    "contracts_state",
    "contracts_values",
)
"""Check modules of ``proofs/bounded``."""


FAILED: dict[str, str] = {}
"""Refuted conditions of the running check → the first failing case (repr)."""

SEEN: dict[str, int] = {}
"""Conditions of the running check → the cases that evaluated them."""


def check(fn: Callable[[], int]) -> Callable[[], int]:
    """Register ``fn`` as a bounded check."""
    CHECKS[f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"] = fn
    return fn


def expect(ok: bool, condition: str, case: object) -> None:
    """Record ``condition`` as refuted (with its first failing case) unless
    ``ok``; the check goes on, so every refuted condition is reported."""
    SEEN[condition] = SEEN.get(condition, 0) + 1
    if not ok and condition not in FAILED:
        FAILED[condition] = repr(case)


def run_check(fn: Callable[[], int]) -> tuple[int, dict[str, int], dict[str, str]]:
    """Run one check: its number of cases, the cases of each condition and
    its refuted conditions."""
    FAILED.clear()
    SEEN.clear()
    n = fn()
    return n, dict(SEEN), dict(FAILED)
