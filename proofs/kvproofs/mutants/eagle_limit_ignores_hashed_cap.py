"""Mutant: the hybrid search's EAGLE look-ahead is always capped by
``num_tokens - 1`` (profile switch ``eagle_margin_hashed_cap``: from 0.32.0 on
by the hashed tokens, so the look-ahead can reach a block that ends at the
last token)."""

from __future__ import annotations

OWN_CONTRACT = True
HARNESSES = ("contract:kv_cache_coordinator.eagle_search_limit", "bounded:releases.hybrid_switch_relations")


def eagle_search_limit(cur: int, margin: int, max_len: int, hashed: int, hashed_cap: bool) -> int:
    """Mutant of the spec function (same contract).

    pre: cur >= 0 and margin >= 1 and max_len >= 0 and hashed >= 0
    post: __return__ >= 0
    post: __return__ == min(cur + margin, hashed if hashed_cap else max_len)
    post: __return__ >= eagle_search_limit(cur, margin, max_len, hashed, False) or hashed < max_len
    """
    # crosshair: max_iterations=40
    return min(cur + margin, max_len)
