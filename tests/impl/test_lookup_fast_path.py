"""kvimpl's one-group lookup (``find_longest_cache_hit`` with one group id)
against its general path.

A spec group of one KV-cache group reads the cache map in one loop
(:func:`kvimpl.single_type_kv_cache_manager.cached_in_group`; Mamba only as
far as its scan from the right reads, :func:`last_cached_state`). Looking
the same group up twice takes the general path (``get_cached_block`` per
hash, then the kind's rule over every lookup), whose first list must be the
same hit.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvimpl.block_pool import BlockId, BlockPool
from kvimpl.single_type_kv_cache_manager import find_longest_cache_hit
from kvspec.config import AttentionKind, ChunkedLocal, FullAttention, Mamba, SlidingWindow
from kvspec.hashing import BlockHash, make_key

BS = 16
KINDS: list[AttentionKind] = [
    FullAttention(block_size=BS),
    SlidingWindow(block_size=BS, window=40),
    SlidingWindow(block_size=BS, window=200),
    ChunkedLocal(block_size=BS, chunk=64),
    Mamba(block_size=BS, mode="all"),
]


@settings(max_examples=400, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    n_hashes=st.integers(0, 12),
    cached=st.lists(st.integers(0, 11), max_size=14),
    group=st.integers(0, 2),
    max_length=st.integers(-1, 12 * BS),
    drop_eagle=st.booleans(),
    alignment=st.sampled_from([BS, 2 * BS, 4 * BS]),
)
def test_one_group_lookup_is_the_general_rule(
    kind: AttentionKind,
    n_hashes: int,
    cached: list[int],
    group: int,
    max_length: int,
    drop_eagle: bool,
    alignment: int,
) -> None:
    pool = BlockPool(64, True, BS)
    hashes = [BlockHash(bytes([i]) * 32) for i in range(n_hashes)]
    for n, i in enumerate(cached):  # a repeated index caches a second, newer copy
        key = make_key(BlockHash(bytes([i]) * 32), group)
        pool.cached.setdefault(key, []).append(BlockId(n + 1))
    args = (hashes, max_length)
    fast = find_longest_cache_hit(kind, *args, [group], pool, drop_eagle, alignment)
    general = find_longest_cache_hit(kind, *args, [group, group], pool, drop_eagle, alignment)
    assert len(fast) == 1 and len(general) == 2
    assert fast[0] == general[0] == general[1]
