"""The scheduler model's chunking rules (:mod:`kvref.scheduler`): how many
tokens a step schedules with a Mamba group in ``align`` mode, and where the
Mamba tail boundary and the prefix hint cut a chunk. Pure functions of the
configuration and the counts.
"""

from __future__ import annotations

from kvspec.config import KVCacheConfig, Mamba


def tail_eagle(config: KVCacheConfig) -> bool:
    """Whether EAGLE lowers the Mamba tail boundary, as the release decides
    (``mamba_tail_eagle``): never before vLLM 0.30.0; in 0.30.x when the Mamba
    group is itself an EAGLE group (its flag, or every group under
    ``use_eagle`` without flags); from 0.31.0 when the model uses EAGLE."""
    rule = config.profile.mamba_tail_eagle
    if rule == "model":
        return config.use_eagle
    if rule == "group":
        eagle = config.eagle_group_ids()
        return any(isinstance(k, Mamba) and g in eagle for g, k in enumerate(config.groups))
    return False


def schedule_chunk(config: KVCacheConfig, num_tokens: int, start: int, n: int, stop: int = 0) -> int:
    """Tokens actually scheduled when ``n`` are wanted from ``start``.

    At least one and at most the remaining tokens; with a Mamba group in
    ``align`` mode a chunk that does not finish the request ends on a
    scheduler-block boundary (the next one when ``n`` does not reach one),
    and a chunk that would run past ``stop`` (0: none) ends there.

    pre: 0 <= start < num_tokens and n >= 1
    post: 1 <= __return__ <= num_tokens - start
    """
    remaining = num_tokens - start
    bs = config.scheduler_block_size
    if n < remaining and any(isinstance(k, Mamba) and k.mode == "align" for k in config.groups):
        end = (start + n) // bs * bs
        if end <= start:
            end = min(start + remaining, (start // bs + 1) * bs)
        n = end - start
    if start < stop < start + n:
        n = stop - start
    return max(1, min(n, remaining))


def cap_at_junction(config: KVCacheConfig, start: int, n: int, hint: int, admission: bool) -> int:
    """The chunk ``n`` from ``start`` cut at the prefix hint's junction, as
    vLLM's ``Scheduler._mamba_block_aligned_split`` does (only with a Mamba
    group in ``align`` mode; ``bs`` is the scheduler block size):

    * up to vLLM 0.25.1 the hint is ``num_uncached_common_prefix_tokens`` of
      the admission's lookup: when it is at least ``bs`` and ``n`` exceeds it,
      ``n`` becomes the hint floored to ``bs`` (later chunks ignore it);
    * from 0.26.0 on (profile switch ``lookup_returns_boundary``) the hint is
      the request's ``shared_prefix_boundary`` ``J``: a chunk with
      ``start < J < start + n`` stops at ``start + (J - start) // bs * bs``
      when that is past ``start`` (any chunk: the request keeps ``J``).

    pre: start >= 0 and n >= 1 and hint >= 0
    post: 1 <= __return__ <= n
    """
    if not hint or not any(isinstance(k, Mamba) and k.mode == "align" for k in config.groups):
        return n
    bs = config.scheduler_block_size
    if not config.profile.lookup_returns_boundary:
        return hint // bs * bs if admission and hint >= bs and n > hint else n
    stop = start + (hint - start) // bs * bs
    return stop - start if start < hint < start + n and start < stop else n
