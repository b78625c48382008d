"""Mutant: the ring kind ``KpoolTail`` is accepted in every release that has
``CircularBuffer`` (profile switch ``kpool_tail_kind``: 0.30.0 and 0.31.0 only)."""

from __future__ import annotations

from kvspec.config import CircularBuffer, KpoolTail
from kvspec.errors import ConfigError
from kvspec.profiles import SemanticsProfile

# Not its own contract unbounded: ``where`` is an unbounded str that the error
# message realizes character by character, so with 27 profiles the path budget
# runs out first; the spec's contract through its wrapper (bound ``where == ''``)
# refutes it.
OWN_CONTRACT = False
HARNESSES = ("contract:config.validate_ring_kind",)


def validate_ring_kind(where: str, kind: CircularBuffer | KpoolTail, profile: SemanticsProfile) -> None:
    """Mutant of the spec function (same contract).

    raises: ConfigError
    post: not isinstance(kind, CircularBuffer) or profile.circular_buffer_kind
    post: not isinstance(kind, KpoolTail) or profile.kpool_tail_kind
    """
    # crosshair: max_iterations=40
    if isinstance(kind, CircularBuffer) and not profile.circular_buffer_kind:
        raise ConfigError(f"{where}: CircularBufferSpec is new in vLLM 0.29.0; not in {profile.name}")
    if isinstance(kind, KpoolTail) and not profile.circular_buffer_kind:
        raise ConfigError(f"{where}: KpoolTailSpec exists in vLLM 0.30.0 and 0.31.0 only, not in {profile.name}")
