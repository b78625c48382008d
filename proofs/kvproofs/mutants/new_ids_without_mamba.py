"""Mutant: 0.26.0's rule for fresh block ids (profile switch
``new_block_ids`` ``"full-mla-with-mamba"``) is taken for 0.25.1's: full
attention and MLA record their fresh blocks in models without a Mamba group
too."""

from __future__ import annotations

from kvspec.config import MLA, AttentionKind, CircularBuffer, FullAttention, Mamba
from kvspec.profiles import SemanticsProfile

OWN_CONTRACT = True
HARNESSES = ("contract:single_type_kv_cache_manager.records_new_block_ids",)


def records_new_block_ids(kind: AttentionKind, profile: SemanticsProfile, has_mamba: bool) -> bool:
    """Mutant of the spec function (same contract).

    post: not (__return__ and isinstance(kind, CircularBuffer | Mamba))
    post: profile.new_block_ids != "full" or __return__ == (type(kind) is FullAttention)
    post: profile.new_block_ids != "full-mla" or __return__ == isinstance(kind, FullAttention | MLA)
    post: not __return__ or profile.new_block_ids == "attention-with-mamba" or isinstance(kind, FullAttention | MLA)
    post: not __return__ or profile.new_block_ids in ("full", "full-mla") or has_mamba
    post: __return__ or not has_mamba or not isinstance(kind, FullAttention | MLA) or profile.new_block_ids == "full"
    """
    # crosshair: max_iterations=40
    if isinstance(kind, CircularBuffer):
        return False
    if profile.new_block_ids == "full":
        return type(kind) is FullAttention
    if profile.new_block_ids in ("full-mla", "full-mla-with-mamba"):
        return type(kind) in (FullAttention, MLA)
    if profile.new_block_ids == "full-mla-with-mamba":
        return has_mamba and type(kind) in (FullAttention, MLA)
    return has_mamba and not isinstance(kind, Mamba)
