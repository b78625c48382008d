"""Mutant: the Mamba tail boundary is not lowered under EAGLE (profile
switch ``mamba_tail_eagle``: the unit EAGLE recomputes stays keyed)."""

from __future__ import annotations

OWN_CONTRACT = True
HARNESSES = ("contract:mamba_tail.mamba_tail_boundary", "features.mamba_tail_releases")


def mamba_tail_boundary(
    num_prompt_tokens: int, hash_block_size: int, drop_eagle: bool, below_last: bool, lookahead: int = 0
) -> int:
    """Mutant of the spec function (same contract).

    pre: num_prompt_tokens >= 0 and hash_block_size >= 1 and lookahead >= 0
    post: 0 <= __return__ <= num_prompt_tokens
    post: __return__ % hash_block_size == 0
    post: drop_eagle or below_last or __return__ + hash_block_size > num_prompt_tokens
    post: drop_eagle or not below_last or __return__ <= max(num_prompt_tokens - max(lookahead, 1), 0)
    post: drop_eagle or not below_last or lookahead > 1 or __return__ + hash_block_size >= num_prompt_tokens > __return__ or __return__ == 0
    post: not drop_eagle or __return__ == max(mamba_tail_boundary(num_prompt_tokens, hash_block_size, False, False) - hash_block_size, 0)
    """  # noqa: E501 - a PEP 316 condition is one line
    # crosshair: max_iterations=40
    limit = num_prompt_tokens - max(lookahead, 1) if below_last and not drop_eagle else num_prompt_tokens
    boundary = max(limit, 0) // hash_block_size * hash_block_size
    return boundary
