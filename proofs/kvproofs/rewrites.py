"""Rewrites of ``full_attention_hit`` for the diffbehavior demo
(``proofs/diffbehavior.md``), standing in for a future ``kvimpl``.

``full_attention_hit`` is equivalent to the spec on EVERY input (also outside
its precondition), so plain ``crosshair diffbehavior`` finds no difference.
``full_attention_hit_closed_form`` replaces the alignment loop with
arithmetic; it agrees with the spec only where the spec's ``pre:`` holds, so
it is compared through the ``guarded_*`` wrappers, which map every input
outside the precondition to ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvspec.single_type_kv_cache_manager import full_attention_hit as spec_full_attention_hit


def full_attention_hit(present: Sequence[bool], drop_eagle: bool, block_size: int, alignment: int) -> int:
    """Same contract as the spec; a for loop and an inlined alignment loop.

    pre: block_size >= 1 and alignment >= 1
    post: 0 <= __return__ <= len(present)
    post: all(present[:__return__])
    """
    hit = 0
    for cached in present:
        if not cached:
            break
        hit += 1
    if drop_eagle and hit:
        hit -= 1
    if block_size != alignment:
        while hit * block_size % alignment != 0:
            hit -= 1
    return hit


def full_attention_hit_closed_form(present: Sequence[bool], drop_eagle: bool, block_size: int, alignment: int) -> int:
    """Same contract; aligns down with one modulo: aligned block counts are the
    multiples of ``alignment / gcd(alignment, block_size)``.

    pre: block_size >= 1 and alignment >= 1
    post: 0 <= __return__ <= len(present)
    post: all(present[:__return__])
    """
    hit = next((i for i, cached in enumerate(present) if not cached), len(present))
    hit = max(hit - 1, 0) if drop_eagle else hit
    if block_size == alignment:
        return hit
    unit = alignment // math.gcd(alignment, block_size)
    return hit - hit % unit


def _in_domain(block_size: int, alignment: int) -> bool:
    """The spec's ``pre:`` line of ``full_attention_hit``."""
    return block_size >= 1 and alignment >= 1


def guarded_spec_full_attention_hit(
    present: list[bool], drop_eagle: bool, block_size: int, alignment: int
) -> int | None:
    """The spec inside its precondition, ``None`` outside."""
    if not _in_domain(block_size, alignment):
        return None
    return spec_full_attention_hit(present, drop_eagle, block_size, alignment)


def guarded_closed_form_full_attention_hit(
    present: list[bool], drop_eagle: bool, block_size: int, alignment: int
) -> int | None:
    """The closed-form rewrite inside the spec's precondition, ``None`` outside."""
    if not _in_domain(block_size, alignment):
        return None
    return full_attention_hit_closed_form(present, drop_eagle, block_size, alignment)
