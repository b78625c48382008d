"""Mutant: an explicit ``max_cache_hit_length`` replaces the lookup length as
given in every release (vLLM 0.33.0's rule), although from 0.34.0 on it can
only lower it (profile switch ``hit_length_bound`` ``"capped"``)."""

from __future__ import annotations

from kvspec.profiles import SemanticsProfile
from kvspec.request import Request

OWN_CONTRACT = False
HARNESSES = ("bounded:contract:kv_cache_manager.lookup_length",)


def lookup_length(profile: SemanticsProfile, request: Request, bound: int | None) -> int:
    """Mutant of the spec function (same contract).

    pre: request.num_tokens >= 1
    pre: bound is None or bound >= 0
    post: __return__ >= 0
    post: bound is not None or __return__ <= request.num_tokens - 1
    post: bound is not None or profile.hit_limit_at_construction or __return__ == request.num_tokens - 1
    post: bound is None or profile.hit_length_bound != "capped" or __return__ == min(lookup_length(profile, request, None), bound)
    post: bound is None or profile.hit_length_bound == "capped" or __return__ == bound
    """  # noqa: E501 - a PEP 316 condition is one line
    length = request.num_tokens - 1
    limit = request.prefix_cache_hit_limit
    if profile.hit_limit_at_construction and limit is not None:
        length = min(length, limit)
    if bound is None:
        return length
    return bound
