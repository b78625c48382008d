"""common_prefix_length over plain ints.

CrossHair 0.0.113 crashes (``issubclass() arg 2 must be a class``) when it
realizes a ``Sequence[Sequence[BlockId]]`` (``BlockId`` is a ``NewType``), so
the spec's own contract is restated here over ``list[int]``.
"""

from __future__ import annotations

from kvproofs.holds import unenforced
from kvspec.block_pool import BlockId
from kvspec.single_type_kv_cache_manager import common_prefix_length


def common_prefix_exact(table: list[int], tables: list[list[int]]) -> int:
    """The longest prefix of ``table`` whose every block is in every table.

    pre: len(table) <= 4 and len(tables) <= 3 and all(len(t) <= 4 for t in tables)
    post: 0 <= __return__ <= len(table)
    post: all(all(b in t for t in tables) for b in table[:__return__])
    post: __return__ == len(table) or any(table[__return__] not in t for t in tables)
    """
    # crosshair: max_iterations=100
    ids = [[BlockId(b) for b in t] for t in tables]
    return unenforced(common_prefix_length)([BlockId(b) for b in table], ids)
