"""The prefix-cache retention interval: sparse caching in sliding-window and
Mamba groups (vLLM 0.23.0 on).

A sliding-window hit needs the ``need`` blocks before its end, a Mamba hit
the one state block at its end; every other block of such a group is cached
only for hits that will never end there. The retention interval
(``KVCacheConfig.prefix_cache_retention_interval``; upstream the
environment variable ``VLLM_PREFIX_CACHE_RETENTION_INTERVAL`` up to 0.28.0,
the ``KVCacheConfig`` field of that name from 0.29.0 on) thins them out:

* ``None`` (the default): as before, a window group caches the blocks a hit
  ending on each alignment boundary reads, a Mamba group every block;
* ``0``: only the blocks a hit ending on a *reachable boundary* reads;
* ``R > 0`` (a multiple of the scheduler block): the blocks a hit ending on
  each multiple of ``R`` reads, plus those of the reachable boundaries.

The reachable boundaries are the token positions a later request can resume
at (:func:`reachable_boundaries`): up to 0.25.1 the prompt's last token; from
0.26.0 on also the request's shared-prefix boundary (the junction of its
latest lookup); from 0.30.0 on, under EAGLE, the two positions a resend or a
longer sibling of the prompt resumes at; from 0.33.0 on an EAGLE group also
keeps the hit that ends one block below the junction. Full-attention,
chunked-local and the other kinds cache every block whatever the interval.
Up to 0.23.0 a Mamba group ignores it too (profile switch ``retention_kinds``).

The mask itself is
:func:`kvspec.single_type_kv_cache_manager.retention_block_mask` (upstream:
``reachable_block_mask`` of ``SlidingWindowManager`` and ``MambaManager``,
``vllm/v1/core/single_type_kv_cache_manager.py``); the boundaries follow
``replay_boundaries`` (``vllm/v1/core/kv_cache_coordinator.py``, 0.30.0 on)
and ``SingleTypeKVCacheManager.cache_blocks``.
"""

from __future__ import annotations

from kvspec.config import AttentionKind, Mamba, SlidingWindow
from kvspec.profiles import SemanticsProfile


def reachable_boundaries(
    profile: SemanticsProfile,
    num_prompt_tokens: int,
    scheduler_block_size: int,
    eagle_model: bool,
    junction: int,
    group_eagle: bool,
    block_size: int,
) -> tuple[int, ...]:
    """Token positions whose hit a sparse caching mask keeps reachable
    (profile switch ``retention_boundaries``): ``eagle_model`` says whether
    the model has EAGLE groups, ``junction`` is the request's shared-prefix
    boundary (0 without one), ``group_eagle`` whether this group drops the
    EAGLE block, ``block_size`` its block size.

    pre: num_prompt_tokens >= 1 and scheduler_block_size >= 1 and block_size >= 1 and junction >= 0
    post: len(__return__) >= 1
    post: junction == 0 or profile.retention_boundaries == "prompt" or junction in __return__
    post: profile.retention_boundaries != "prompt" or __return__ == (num_prompt_tokens - 1,)
    """
    rule = profile.retention_boundaries
    if rule in ("replay", "replay-eagle-junction") and eagle_model:
        s = scheduler_block_size
        resend = (num_prompt_tokens - 1) // s * s
        extension = num_prompt_tokens // s * s
        found = sorted({max(resend - s, 0), max(extension - s, 0)})
    else:
        found = [num_prompt_tokens - 1]
    if rule != "prompt" and junction:
        found.append(junction)
        if rule == "replay-eagle-junction" and group_eagle:
            found.append(junction - block_size)
    return tuple(found)


def retention_applies(kind: AttentionKind, profile: SemanticsProfile) -> bool:
    """Whether a group of ``kind`` thins its caching under a retention
    interval (profile switch ``retention_kinds``).

    post: not __return__ or isinstance(kind, SlidingWindow | Mamba)
    """
    if isinstance(kind, SlidingWindow):
        return profile.retention_kinds != "none"
    if isinstance(kind, Mamba):
        return profile.retention_kinds == "swa+mamba"
    return False
