"""Mutant: a sliding window keeps ``w`` tokens instead of ``w - 1`` (skips one
token too few)."""

from __future__ import annotations

from kvspec.config import AttentionKind, ChunkedLocal, Mamba, SlidingWindow

OWN_CONTRACT = False  # AttentionKind includes Mamba's Literal mode: CrossHair cannot build it
HARNESSES = (
    "arith.skipped_props",
    "arith.skipped_monotone",
    "contract:single_type_kv_cache_manager.num_skipped_tokens",
)


def num_skipped_tokens(kind: AttentionKind, num_computed_tokens: int) -> int:
    """Mutant of the spec function (same contract).

    pre: num_computed_tokens >= 0
    pre: not isinstance(kind, SlidingWindow) or (kind.window >= 1 and kind.extra_retained_tokens >= 0)
    pre: not isinstance(kind, ChunkedLocal) or kind.chunk >= 1
    post: __return__ <= num_computed_tokens
    post: not isinstance(kind, SlidingWindow) or num_computed_tokens - __return__ == min(num_computed_tokens, kind.window - 1 + kind.extra_retained_tokens)
    post: not isinstance(kind, ChunkedLocal) or (__return__ % kind.chunk == 0 and num_computed_tokens - __return__ < kind.chunk)
    post: not isinstance(kind, Mamba) or __return__ == num_computed_tokens - 1
    post: isinstance(kind, SlidingWindow | ChunkedLocal | Mamba) or __return__ == 0
    """  # noqa: E501 - a PEP 316 condition is one line
    # crosshair: max_iterations=40
    if isinstance(kind, SlidingWindow):
        return max(0, num_computed_tokens - kind.window - kind.extra_retained_tokens)
    if isinstance(kind, ChunkedLocal):
        return num_computed_tokens // kind.chunk * kind.chunk
    if isinstance(kind, Mamba):
        return num_computed_tokens - 1
    return 0
