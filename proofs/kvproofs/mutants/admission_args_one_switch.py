"""Mutant: every admission argument of ``allocate_slots`` is accepted from
vLLM 0.21.0 on, where only ``full_sequence_must_fit`` arrived (profile
switches ``full_sequence_arg``, ``reserved_blocks_arg`` from 0.23.0,
``admission_controls`` from 0.24.0)."""

from __future__ import annotations

from kvspec.errors import UnsupportedOperationError
from kvspec.profiles import SemanticsProfile

OWN_CONTRACT = False
HARNESSES = ("bounded:contract:kv_cache_manager.check_admission_args",)


def check_admission_args(profile: SemanticsProfile, must_fit: bool, reserved: int, has_scheduled: bool) -> None:
    """Mutant of the spec function (same contract).

    raises: UnsupportedOperationError
    post: profile.full_sequence_arg or not must_fit
    post: profile.reserved_blocks_arg or reserved == 0
    post: profile.admission_controls or has_scheduled
    """
    args = (
        ("full_sequence_must_fit", must_fit, False, profile.full_sequence_arg),
        ("reserved_blocks", reserved, 0, profile.full_sequence_arg),
        ("has_scheduled_reqs", has_scheduled, True, profile.full_sequence_arg),
    )
    given = [f"{k}={v!r}" for k, v, d, has in args if v != d and not has]
    if given:
        raise UnsupportedOperationError(f"allocate_slots: {profile.name} has no {', '.join(given)}")
