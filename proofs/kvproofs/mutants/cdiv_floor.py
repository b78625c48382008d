"""Mutant: cdiv rounds DOWN (plain floor division)."""

from __future__ import annotations

OWN_CONTRACT = True
HARNESSES = ("arith.cdiv_props", "contract:single_type_kv_cache_manager.cdiv")


def cdiv(a: int, b: int) -> int:
    """Mutant of the spec function (same contract).

    pre: b > 0
    post: __return__ * b >= a > (__return__ - 1) * b
    """
    # crosshair: max_iterations=40
    return a // b
