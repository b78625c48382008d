"""Mutant: 0.16.0's external-token cap for a window of one token or a chunk
below the block is taken as modelled (profile switch ``external_cap_any_skip``),
so 0.16.0 runs such a window under the later releases' cap."""

from __future__ import annotations

from kvspec.config import KVCacheConfig

OWN_CONTRACT = False
HARNESSES = ("bounded:releases.degenerate_windows",)


def unmodelled_v016_rules(config: KVCacheConfig) -> str | None:
    """Mutant of the spec function (same contract).

    post: __return__ is None or not config.profile.external_cap_any_skip
    """
    del config
    return None
