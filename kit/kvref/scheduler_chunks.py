"""The scheduler model's chunking rules (:mod:`kvref.scheduler`): how many
tokens a step schedules with a Mamba group in ``align`` mode, and where the
Mamba tail boundary and the prefix hint cut a chunk. Pure functions of the
configuration and the counts.

The ``align`` split follows ``Scheduler._mamba_block_aligned_split``
(vllm/v1/core/sched/scheduler.py) release by release (:func:`align_rule`;
blocks are those of :func:`align_block_size`):

* ``whole-blocks`` (up to vLLM 0.25.x): a chunk that ends before the last
  cache position (:func:`last_cache_position`) is cut to a whole number of
  blocks, counted from its start; one that runs past that position
  ends there; one that starts at or past it is left alone. A chunk that
  starts inside a block therefore ends inside one too (the registered safety
  defect ``mamba-align-midblock``).
* ``block-end-if-cacheable`` (0.26.0): a chunk that ends before the last cache
  position ends on the block boundary at or below its end; then it stops at
  the first of these strictly inside it: the end of the block it starts in
  (when it starts inside a block and that end is at or below the last cache
  position), the last cache position, the caller's stop (the Mamba tail).
* ``block-end`` (0.27.0 on): a chunk that ends before the prefill end (the
  prompt, or all but the last token of a request with output tokens) ends on
  the block boundary at or below its end, unless that is not past its start
  and a block is wider than the step budget; then it stops at the first of
  these strictly inside it: the end of the block it starts in (whenever it
  starts inside a block), the last cache position, the caller's stop.

In every release a chunk that starts at or past the prefill end is left alone.
Under look-ahead block hashes (vLLM 0.33.0 on) the last cache position leaves
room for the look-ahead tokens (:func:`last_cache_position`). With Mamba
prefill checkpoints (every Mamba group has ``num_prefill_checkpoint_blocks``
above 0; :func:`internal_checkpoint`) a chunk can rely on the manager keeping
a state inside it: in vLLM 0.29.0's block-aligned form any chunk that starts
on a block boundary, which then has no last cache position and is not cut to
a block boundary; from 0.30.0 on only a chunk that reaches the prefill end
and can export the prompt's checkpoint (kvspec's ``checkpoint_position`` of
the prefill end and ``checkpoint_valid``), which then has no last cache
position, no stop at the end of the block it starts in and no Mamba tail
stop. ``long_prefill_token_threshold`` is not followed; kvref does not
configure it.
"""

from __future__ import annotations

import math
from typing import Literal

from kvref.divergences import release_key
from kvspec.config import KVCacheConfig, Mamba
from kvspec.mamba_tail import mamba_tail_boundary
from kvspec.partial_hits import partial_hash_hits_enabled
from kvspec.prefill_checkpoints import POSITIONAL_FORMS, checkpoint_granularity, checkpoint_position, checkpoint_valid

AlignRule = Literal["whole-blocks", "block-end-if-cacheable", "block-end"]


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


def align_block_size(config: KVCacheConfig) -> int:
    """The block size the split aligns to, 0 without a Mamba group in ``align``
    mode. vLLM's split reads ``cache_config.block_size``, which vLLM makes the
    Mamba block size in ``align`` mode; the kit takes the Mamba ``align``
    groups' block size as the manager runs them (their least common multiple
    where they differ). Wherever vLLM can build the model this is also the
    scheduler block size; in a kvspec hybrid whose other groups have larger
    blocks (``full@2x+mamba-align``) it is the Mamba block, whose boundaries
    are where its states are cached.

    post: __return__ >= 0
    """
    sizes = [k.block_size for k in config.manager_groups() if isinstance(k, Mamba) and k.mode == "align"]
    return math.lcm(*sizes) if sizes else 0


def mamba_align(config: KVCacheConfig) -> bool:
    """Whether the scheduler splits prefill chunks for Mamba: a Mamba group in ``align`` mode."""
    return align_block_size(config) > 0


def align_rule(config: KVCacheConfig) -> AlignRule:
    """How the release's scheduler splits an ``align`` chunk (the module docstring):
    ``whole-blocks`` up to vLLM 0.25.x, ``block-end-if-cacheable`` in 0.26.x,
    ``block-end`` from 0.27.0 on."""
    release = release_key(config.profile.release)
    if release < (0, 26, 0):
        return "whole-blocks"
    return "block-end-if-cacheable" if release < (0, 27, 0) else "block-end"


def drafts_tokens(config: KVCacheConfig) -> bool:
    """Whether the scheduler of ``config`` runs an EAGLE-style drafter (draft
    tokens, their look-ahead slots): under ``use_eagle``, or under look-ahead
    block hashes, with which vLLM's scheduler (0.33.0 on) builds the manager
    without ``use_eagle``.

    post: __return__ == (config.use_eagle or config.num_hash_lookahead_tokens > 0)
    """
    return config.use_eagle or config.num_hash_lookahead_tokens > 0


def last_cache_position(config: KVCacheConfig, num_tokens: int) -> int:
    """The last block boundary (:func:`align_block_size`, else the scheduler
    block size) whose Mamba state a prefill of a request of ``num_tokens``
    tokens caches: the last boundary at or below ``num_tokens`` (from vLLM
    0.32.0 on without EAGLE: at or below ``num_tokens - 1``, as a resend
    recomputes the last token, and under look-ahead block hashes at or below
    ``num_tokens - num_hash_lookahead_tokens``, which the boundary's hash
    needs), one block lower under EAGLE (it drops the last hit block), never
    below 0. vLLM stops a chunk at the Mamba tail only above this position.

    pre: num_tokens >= 0
    post: 0 <= __return__ <= num_tokens
    post: __return__ % (align_block_size(config) or config.scheduler_block_size) == 0
    """
    bs = align_block_size(config) or config.scheduler_block_size
    below_last = release_key(config.profile.release) >= (0, 32, 0) and not config.use_eagle
    behind = max(config.num_hash_lookahead_tokens, 1) if below_last else 0
    last = max(num_tokens - behind, 0) // bs * bs
    return max(last - bs, 0) if config.use_eagle else last


def internal_checkpoint(config: KVCacheConfig, start: int, end: int = 0, prefill_end: int = 0) -> bool:
    """Whether the release's scheduler lets a prefill chunk from ``start`` to
    ``end`` rely on a Mamba prefill checkpoint
    (``Scheduler._mamba_block_aligned_split``). Every Mamba group needs
    ``num_prefill_checkpoint_blocks`` above 0. Then, vLLM 0.29.0: no EAGLE,
    and ``start`` on a block boundary (:func:`align_block_size`). From 0.30.0
    on: the chunk reaches ``prefill_end`` and can export the checkpoint
    position of the prefill end (at the hash block, from 0.32.0 on at the
    scheduler block unless hits are fine-grained; one unit lower under EAGLE)
    with the first Mamba group's ``prefill_checkpoint_alignment``.

    pre: 0 <= start and end >= 0 and prefill_end >= 0
    post: not __return__ or config.profile.prefill_checkpoints == "block-aligned" or start < end
    post: not __return__ or config.profile.prefill_checkpoints != "block-aligned" or start % align_block_size(config) == 0
    """  # noqa: E501 - a PEP 316 condition is one line
    form = config.profile.prefill_checkpoints
    mambas = [k for k in config.groups if isinstance(k, Mamba)]
    bs = align_block_size(config)
    if not (bs and mambas and all(k.num_prefill_checkpoint_blocks > 0 for k in mambas)):
        return False
    if form == "block-aligned":
        return not config.use_eagle and start % bs == 0
    if form not in POSITIONAL_FORMS or end < prefill_end:
        return False
    ahead = config.num_hash_lookahead_tokens
    position = checkpoint_position(config.profile, prefill_end, checkpoint_unit(config), config.use_eagle, ahead)
    hbs = config.resolved_hash_block_size()
    return checkpoint_valid(start, end, position, hbs, bs, mambas[0].prefill_checkpoint_alignment)


def checkpoint_unit(config: KVCacheConfig) -> int:
    """The unit the checkpoint positions of ``config`` are multiples of, as
    its scheduler, manager and worker take it: the pool's hash block, from
    vLLM 0.32.0 on the cache-hit alignment (the hash block with fine-grained
    hits, else the scheduler block; kvspec's ``checkpoint_granularity``).

    post: __return__ >= 1
    """
    hbs = config.resolved_hash_block_size()
    hit = hbs if partial_hash_hits_enabled(config) else config.scheduler_block_size
    return checkpoint_granularity(config.profile, hbs, hit)


def mamba_tail_stop(config: KVCacheConfig, num_prompt_tokens: int, num_tokens: int, start: int) -> int:
    """Where a prefill chunk from ``start`` must stop so that a Mamba tail
    entry can be registered (vLLM's ``_mamba_block_aligned_split``, with
    fine-grained hits): the prompt's Mamba tail boundary when it lies after
    the request's last cache position (0 for a chunk that relies on a prefill
    checkpoint: :func:`internal_checkpoint`) and before the prompt's end,
    else 0 (no stop).

    pre: 0 <= start and 0 < num_prompt_tokens <= num_tokens
    post: __return__ == 0 or __return__ < num_prompt_tokens
    """
    hbs = config.resolved_hash_block_size()
    tail = mamba_tail_boundary(
        num_prompt_tokens, hbs, tail_eagle(config), config.profile.mamba_tail_entries, config.num_hash_lookahead_tokens
    )
    last = 0 if internal_checkpoint(config, start) else last_cache_position(config, num_tokens)
    return tail if last < tail < num_prompt_tokens else 0


def align_split(
    config: KVCacheConfig, num_tokens: int, start: int, n: int, stop: int = 0, num_prompt_tokens: int = 0
) -> int:
    """The tokens the release's scheduler schedules when ``n`` are wanted from
    ``start`` in a model with a Mamba ``align`` group (the module docstring;
    the prefix hint aside: :func:`cap_at_junction`). 0 when it schedules
    nothing this step (the chunk cannot reach a boundary).
    ``num_prompt_tokens`` (0: all ``num_tokens``) places the prefill end.

    pre: 0 <= start < num_tokens and 1 <= n <= num_tokens - start
    pre: 0 <= num_prompt_tokens <= num_tokens
    post: 0 <= __return__ <= n
    """
    bs = align_block_size(config) or config.scheduler_block_size
    end = start + n
    prefill_end = max(num_prompt_tokens or num_tokens, num_tokens - 1)
    checkpoint = internal_checkpoint(config, start, end, prefill_end)
    last = 0 if checkpoint else last_cache_position(config, num_tokens)
    rule = align_rule(config)
    if rule == "whole-blocks":
        # vllm/v1/core/sched/scheduler.py, vLLM 0.25.1: the length is floored, not the end
        if end < last:
            end = start + n // bs * bs
        elif start < last < end:
            end = last
        return (stop if start < stop < end else end) - start
    if start >= prefill_end:
        return n
    if rule == "block-end-if-cacheable":
        if end < last:
            end = end // bs * bs
    elif end < prefill_end and not checkpoint:
        aligned = end // bs * bs
        if aligned > start or bs <= config.batched_tokens():
            end = aligned
    block_end = (start // bs + 1) * bs
    positional = checkpoint and config.profile.prefill_checkpoints != "block-aligned"
    stops = [last, 0 if positional else stop]
    if start % bs and not checkpoint and (rule == "block-end" or block_end <= last):
        stops.append(block_end)
    end = min((s for s in stops if start < s < end), default=end)
    return max(end - start, 0)


def schedule_chunk(
    config: KVCacheConfig, num_tokens: int, start: int, n: int, stop: int = 0, num_prompt_tokens: int = 0
) -> int:
    """Tokens actually scheduled when ``n`` are wanted from ``start``.

    At least one and at most the remaining tokens; a chunk that would run
    past ``stop`` (0: none; the Mamba tail) ends there. With a Mamba group in
    ``align`` mode, the chunk the release's scheduler makes
    (:func:`align_split`; ``num_prompt_tokens``, 0 for all ``num_tokens``,
    places the prefill end): a chunk that starts on a block boundary below
    the last cache position ends on a boundary (save at ``stop``, and from
    0.27.0 where a block is wider than the step budget); up to vLLM 0.25.x
    one that starts inside a block is a whole number of blocks long, so it
    ends inside one; from 0.26.0 on it stops at the end of the block it
    starts in (0.26.0: where that end is cacheable). Where the release
    schedules nothing (too few tokens wanted to reach the next stop), the
    smallest chunk it schedules when more are wanted.

    pre: 0 <= start < num_tokens and n >= 1
    pre: 0 <= num_prompt_tokens <= num_tokens
    post: 1 <= __return__ <= num_tokens - start
    """
    n = min(n, num_tokens - start)
    if not mamba_align(config):
        return stop - start if start < stop < start + n else n
    got = align_split(config, num_tokens, start, n, stop, num_prompt_tokens)
    while not got:  # the whole rest always schedules something
        n += 1
        got = align_split(config, num_tokens, start, n, stop, num_prompt_tokens)
    return got


def reserve_prefill_lookahead(config: KVCacheConfig, num_tokens: int, start: int, n: int) -> int:
    """The chunk ``n`` from ``start`` when a multi-module MTP drafter reads
    ``L = num_prefill_lookahead`` known tokens past a chunk's end (vLLM 0.28.0
    on, ``Scheduler._reserve_prefill_lookahead``): a chunk that would leave
    fewer than ``L`` tokens (but some) is cut to leave ``L``. Where the cut
    leaves nothing (no more than ``L`` tokens are left), vLLM schedules
    nothing this step; the kit keeps the chunk (it stands for a later step
    with a budget for the whole rest, and where a Mamba split forbids that
    chunk, for a request vLLM would never schedule: the chunk kept is the
    one the split allows).

    pre: 0 <= start < num_tokens and 1 <= n <= num_tokens - start
    post: 1 <= __return__ <= n
    post: __return__ == n or num_tokens - start - __return__ == config.num_prefill_lookahead
    """
    rest = num_tokens - start
    left = rest - n
    if not 0 < left < config.num_prefill_lookahead or rest <= config.num_prefill_lookahead:
        return n
    return rest - config.num_prefill_lookahead


def settle_chunk(config: KVCacheConfig, num_tokens: int, start: int, n: int, hint: int, admission: bool) -> int:
    """:func:`schedule_chunk`'s chunk ``n`` cut at the prefix hint's junction
    (:func:`cap_at_junction`), then short of an MTP drafter's look-ahead
    (:func:`reserve_prefill_lookahead`), in the order vLLM's scheduler cuts.

    pre: 0 <= start < num_tokens and 1 <= n <= num_tokens - start and hint >= 0
    post: 1 <= __return__ <= n
    """
    n = cap_at_junction(config, start, n, hint, admission)
    return reserve_prefill_lookahead(config, num_tokens, start, n) if config.num_prefill_lookahead else n


def cap_at_junction(config: KVCacheConfig, start: int, n: int, hint: int, admission: bool) -> int:
    """The chunk ``n`` from ``start`` cut at the prefix hint's junction, as
    vLLM's ``Scheduler._mamba_block_aligned_split`` does (only with a Mamba
    group in ``align`` mode; ``bs`` is :func:`align_block_size`):

    * up to vLLM 0.25.1 the hint is ``num_uncached_common_prefix_tokens`` of
      the admission's lookup: when it is at least ``bs`` and ``n`` exceeds it,
      ``n`` becomes the hint floored to ``bs`` (later chunks ignore it);
    * from 0.26.0 on (profile switch ``lookup_returns_boundary``) the hint is
      the request's ``shared_prefix_boundary`` ``J``: a chunk with
      ``start < J < start + n`` stops at ``start + (J - start) // bs * bs``
      when that is past ``start`` (any chunk: the request keeps ``J``).

    Applied to :func:`schedule_chunk`'s chunk: vLLM takes the junction's stop
    together with the others, which gives the same chunk (a block end or the
    last cache position that cut the chunk short of ``J`` is at or before the
    junction's stop), save one case: under EAGLE, from the last cache
    position on, a chunk the Mamba tail cut short of ``J`` while the
    junction's stop lies before the tail; vLLM stops at the junction's stop. The junction checkpoint of
    vLLM 0.30.0 on (the stop at ``J`` itself) is opt-in and not modelled.

    pre: start >= 0 and n >= 1 and hint >= 0
    post: 1 <= __return__ <= n
    """
    bs = align_block_size(config)
    if not hint or not bs:
        return n
    if not config.profile.lookup_returns_boundary:
        return hint // bs * bs if admission and hint >= bs and n > hint else n
    stop = start + (hint - start) // bs * bs
    return stop - start if start < hint < start + n and start < stop else n
