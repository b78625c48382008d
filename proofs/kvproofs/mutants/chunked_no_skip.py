"""Mutant: chunked_local_hit looks up from block 0 instead of skipping the
blocks before the current chunk."""

from __future__ import annotations

from collections.abc import Sequence

OWN_CONTRACT = True
HARNESSES = ("bounded:search.chunked_local_search", "contract:single_type_kv_cache_manager.chunked_local_hit")


def chunked_local_hit(present: Sequence[bool], max_length: int, chunk: int, block_size: int) -> tuple[int, int]:
    """Mutant of the spec function (same contract).

    pre: chunk >= 1 and block_size >= 1 and len(present) == max(0, max_length) // block_size
    post: __return__[0] <= __return__[1] <= len(present)
    post: __return__[0] * block_size == (max_length // chunk * chunk if max_length > 0 else 0) // block_size * block_size
    post: all(present[__return__[0] : __return__[1]])
    post: __return__[1] == len(present) or not present[__return__[1]]
    """  # noqa: E501 - a PEP 316 condition is one line
    # crosshair: max_iterations=40
    n = 0
    while n < len(present) and present[n]:
        n += 1
    return 0, n
