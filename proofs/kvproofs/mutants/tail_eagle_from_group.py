"""Mutant: from 0.31.0 on the Mamba tail's EAGLE shift still follows the
group's own EAGLE flag (0.30.x's rule) instead of the model's ``use_eagle``
(profile switch ``mamba_tail_eagle`` ``"model"``)."""

from __future__ import annotations

from kvspec.single_type_kv_cache_manager import MambaManager

OWN_CONTRACT = False
HARNESSES = ("bounded:contract:mamba_tail.tail_eagle_shift",)


def tail_eagle_shift(manager: MambaManager) -> bool:
    """Mutant of the spec function (same contract).

    post: manager.profile.mamba_tail_eagle != "none" or not __return__
    post: manager.profile.mamba_tail_eagle != "group" or __return__ == manager.use_eagle
    post: manager.profile.mamba_tail_eagle != "model" or __return__ == manager.drop_eagle_checkpoint
    """
    rule = manager.profile.mamba_tail_eagle
    if rule in ("group", "model"):
        return manager.use_eagle
    return rule == "model" and manager.drop_eagle_checkpoint
