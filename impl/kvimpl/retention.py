"""The prefix-cache retention interval (vLLM 0.23.0 on): which positions a
sparse caching mask keeps reachable, and which groups it thins (see
``kvspec.retention``; the mask itself is
:func:`kvimpl.single_type_kv_cache_manager.retention_block_mask`).

The native core declines a configuration with a retention interval
(:func:`kvimpl.native.native_unsupported`); the pure-Python manager models it.
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
) -> list[int]:
    """The positions whose hit survives a sparse mask: the prompt's last
    token, or from vLLM 0.30.0 on in a model with EAGLE groups the replay
    positions of a resend and of a longer sibling (one scheduler block below
    each aligned end); from 0.26.0 on the shared-prefix ``junction`` too, and
    from 0.33.0 on in an EAGLE group also one block below it (profile switch
    ``retention_boundaries``)."""
    rule = profile.retention_boundaries
    if eagle_model and rule.startswith("replay"):
        s = scheduler_block_size
        low = max((num_prompt_tokens - 1) // s * s - s, 0)
        high = max(num_prompt_tokens // s * s - s, 0)
        out = [low] if low == high else [low, high]
    else:
        out = [num_prompt_tokens - 1]
    if junction and rule != "prompt":
        out.append(junction)
        if group_eagle and rule == "replay-eagle-junction":
            out.append(junction - block_size)
    return out


def retention_applies(kind: AttentionKind, profile: SemanticsProfile) -> bool:
    """Whether ``kind``'s group thins its caching under a retention interval
    (profile switch ``retention_kinds``: window groups from 0.23.0, Mamba
    groups too from 0.24.0)."""
    kinds = profile.retention_kinds
    return (kinds != "none" and isinstance(kind, SlidingWindow)) or (kinds == "swa+mamba" and isinstance(kind, Mamba))
