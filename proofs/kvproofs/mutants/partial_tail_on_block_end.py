"""Mutant: partial_tail_index also registers a tail that ends a block (it
skips only a boundary of 0 or one not reached yet), so a full block gets a
second key for its own full length."""

from __future__ import annotations

OWN_CONTRACT = True
HARNESSES = ("contract:partial_tail.partial_tail_index", "features.partial_tail_releases")


def partial_tail_index(boundary: int, num_tokens: int, block_size: int) -> int | None:
    """Mutant of the spec function (same contract).

    pre: boundary >= 0 and block_size >= 1
    post: __return__ is None or __return__ * block_size < boundary < (__return__ + 1) * block_size
    post: __return__ is None or boundary <= num_tokens
    post: __return__ is not None or boundary == 0 or boundary > num_tokens or boundary % block_size == 0
    """
    # crosshair: max_iterations=40
    if boundary == 0 or boundary > num_tokens:
        return None
    return boundary // block_size
