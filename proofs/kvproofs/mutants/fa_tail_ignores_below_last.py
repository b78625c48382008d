"""Mutant: the full-attention partial tail ignores 0.32.0's rule
(profile switch ``fa_tail_below_last_token``): it stays at the prompt's last
hash boundary when the prompt ends on one."""

from __future__ import annotations

OWN_CONTRACT = True
HARNESSES = ("contract:partial_tail.fa_tail_boundary", "features.partial_tail_releases")


def fa_tail_boundary(num_prompt_tokens: int, hash_block_size: int, use_eagle: bool, below_last: bool) -> int:
    """Mutant of the spec function (same contract).

    pre: num_prompt_tokens >= 0 and hash_block_size >= 1
    post: 0 <= __return__ <= num_prompt_tokens
    post: __return__ % hash_block_size == 0
    post: __return__ + hash_block_size > num_prompt_tokens - (below_last and not use_eagle)
    post: not below_last or use_eagle or __return__ < num_prompt_tokens or num_prompt_tokens == 0
    post: below_last and not use_eagle or __return__ == fa_tail_boundary(num_prompt_tokens, hash_block_size, True, True)
    """
    # crosshair: max_iterations=40
    limit = num_prompt_tokens
    return max(limit, 0) // hash_block_size * hash_block_size
