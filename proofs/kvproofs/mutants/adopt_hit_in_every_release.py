"""Mutant: an allocation with no new or external tokens may adopt hit tokens
in every release (profile switch ``adopt_hit_without_new_tokens``: 0.31.0 on)."""

from __future__ import annotations

from kvspec.profiles import SemanticsProfile

OWN_CONTRACT = False  # its posts name functions the contract wrapper (spec namespace) has
HARNESSES = ("contract:kv_cache_manager.allocation_without_tokens",)


def allocation_without_tokens(profile: SemanticsProfile, n_new: int, n_hit: int, n_external: int) -> bool:
    """Mutant of the spec function (same contract).

    post: __return__ == (n_new > 0 or n_external > 0 or (profile.adopt_hit_without_new_tokens and n_hit > 0))
    post: not __return__ or allocation_without_tokens(replace(profile, adopt_hit_without_new_tokens=True), n_new, n_hit, n_external)
    """  # noqa: E501 - a PEP 316 condition is one line
    if n_new > 0 or n_external > 0:
        return True
    return n_hit > 0
