"""Harnesses whose PEP 316 contracts CrossHair must not refute.

Harnesses call the function under test through :func:`unenforced`: while it
analyses a function, CrossHair enforces the contracts of every function it
calls, and silently drops each path on which a callee's ``post:`` fails
("surfaced more locally"). Without the bypass, a harness could never refute a
property that the callee's own contract also gets wrong, and a mutant that
breaks its own contract would escape every harness.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from crosshair.condition_parser import NoEnforce

F = TypeVar("F", bound=Callable[..., Any])

_no_enforce: Callable[[Callable[..., Any]], Any] = NoEnforce


def unenforced(fn: F) -> F:
    """``fn`` called without CrossHair enforcing its contract (a plain call
    outside CrossHair)."""
    return cast(F, _no_enforce(fn))
