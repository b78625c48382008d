"""Naming what a drift class is: the profile switches that explain its trace.

``kvref drift`` runs the lockstep of a semantics profile (the *working*
profile) against an installed vLLM. When kvspec already has a profile for
that release (the *reference* profile), each divergence class found can be
attributed: its shrunk trace holds vLLM's outputs and views, so replaying it
on kvspec under the working profile with one switch (or two) set to the
reference profile's value shows which modelled change explains it.

An attributed class is *accepted*: the hunt goes on under the working profile
with those switches set, so another behaviour change that shows on the same
operation and aspect is still found (a class registered as known by its
operation and aspect would hide it). A class no switch explains is a change
kvspec does not model; it is registered as known for the rest of the run,
exactly as without a reference profile.

NOTE: attribution is by replay, never by reading vLLM's version: a switch is
named only when kvspec with that switch reproduces every recorded output and
view digest of the trace, and only when the working profile does not (so a
divergence that replay cannot reproduce, for instance one seen only by the
event consumer, stays unattributed instead of being credited to a switch).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from itertools import combinations

from kvref.adapters import AdapterFactory
from kvref.traces import Trace, replay
from kvspec.errors import ConfigError
from kvspec.profiles import PROFILES, SemanticsProfile

SWITCHES: tuple[str, ...] = tuple(f.name for f in fields(SemanticsProfile) if f.name not in ("name", "release"))
"""Every behaviour switch of a semantics profile, in declaration order."""

REFUSED_AT_CONSTRUCTION = "crashed: ConfigError"
"""How a lockstep failure message says an adapter refused the configuration
at construction (:meth:`kvref.lockstep.Lockstep._construct`)."""

MAX_SWITCHES = 2
"""The largest set of switches tried together for one class (22 switches give
253 replays of a short trace at most: well under a second)."""


@dataclass(frozen=True, slots=True)
class Attribution:
    """The switches that explain a drift class, with the release that
    introduced each one's reference value."""

    switches: tuple[str, ...]
    releases: tuple[str, ...]

    def describe(self) -> str:
        """``"new_block_ids (0.26.0), ..."``."""
        return ", ".join(f"{s} ({r})" for s, r in zip(self.switches, self.releases, strict=True))


def differing_switches(working: SemanticsProfile, reference: SemanticsProfile) -> tuple[str, ...]:
    """The switches whose value differs between the two profiles, ordered by
    the release that introduced the reference value (then by name)."""
    differ = [s for s in SWITCHES if getattr(working, s) != getattr(reference, s)]
    order = list(PROFILES)
    return tuple(sorted(differ, key=lambda s: (order.index(f"vllm-{introduced_in(s, reference)}"), s)))


def introduced_in(switch: str, reference: SemanticsProfile) -> str:
    """The oldest release from which every profile up to ``reference`` has
    ``reference``'s value of ``switch`` (for 0.33.0, 0.27.x's first-in-first-out
    free queue gives 0.28.0, the release that reverted it)."""
    value = getattr(reference, switch)
    releases = list(PROFILES.values())
    end = next((i for i, p in enumerate(releases) if p.release == reference.release), len(releases) - 1)
    start = end
    while start > 0 and getattr(releases[start - 1], switch) == value:
        start -= 1
    return releases[start].release


def with_switches(
    profile: SemanticsProfile, switches: tuple[str, ...], reference: SemanticsProfile
) -> SemanticsProfile:
    """``profile`` with each of ``switches`` set to ``reference``'s value (the
    name and release stay ``profile``'s: traces name the base profile and
    list the changed switches, :mod:`kvref.traces`)."""
    return replace(profile, **{s: getattr(reference, s) for s in switches})


def attribute(
    trace: Trace, factory: AdapterFactory, working: SemanticsProfile, reference: SemanticsProfile
) -> Attribution | None:
    """The smallest set of switches (up to :data:`MAX_SWITCHES`) whose
    ``reference`` values make ``factory`` (kvspec) replay ``trace`` exactly;
    None when the working profile already replays it, or no such set exists.
    """
    if _replays(trace, factory, working):
        return None
    for combo in _candidates(differing_switches(working, reference)):
        if _replays(trace, factory, with_switches(working, combo, reference)):
            return Attribution(combo, tuple(introduced_in(s, reference) for s in combo))
    return None


def _candidates(switches: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    for size in range(1, MAX_SWITCHES + 1):
        yield from combinations(switches, size)


def _replays(trace: Trace, factory: AdapterFactory, profile: SemanticsProfile) -> bool:
    """Whether ``factory`` under ``profile`` reproduces every recorded output
    and view digest of ``trace``.

    A trace of a reference that refused its configuration at construction
    (no steps, the failure a ConfigError) is reproduced by a profile that
    refuses the configuration too; any other trace is not.
    """
    refused = not trace.steps and REFUSED_AT_CONSTRUCTION in str(trace.meta.get("failure", ""))
    try:
        config = replace(trace.config, profile=profile)
    except ConfigError:
        return refused
    if refused:
        return False
    result = replay(Trace(config, trace.steps, trace.meta), factory)
    return result.ok
