"""Mutant: from vLLM 0.26.0 on DCP still scales a Mamba group's block size
(profile switch ``cp_block_scaling``: ``MambaManager`` undoes the scaling)."""

from __future__ import annotations

from kvspec.config import FULL_TYPE_KINDS, AttentionKind
from kvspec.profiles import SemanticsProfile

OWN_CONTRACT = False  # its posts name functions the contract wrapper (spec namespace) has
HARNESSES = ("contract:config.scales_by_dcp",)


def scales_by_dcp(kind: AttentionKind, profile: SemanticsProfile) -> bool:
    """Mutant of the spec function (same contract).

    post: profile.cp_block_scaling != "dcp-pcp" or __return__
    post: profile.cp_block_scaling != "dcp-full-attention" or __return__ == isinstance(kind, FULL_TYPE_KINDS)
    post: profile.cp_block_scaling not in ("dcp", "dcp-sharded") or __return__ == (not isinstance(kind, Mamba))
    post: __return__ or isinstance(kind, Mamba) or profile.cp_block_scaling == "dcp-full-attention"
    """
    rule = profile.cp_block_scaling
    if rule == "dcp-pcp":
        return True
    if rule == "dcp-full-attention":
        return isinstance(kind, FULL_TYPE_KINDS)
    return True
