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

Drift also compares *surfaces* (:mod:`kvref.surface`): the installed
release's manager, block-pool and request API, KV-cache spec classes and
event fields against the surface recorded for the working profile's release.
Each new, removed or changed entry is a class of its own; :data:`SURFACE_SWITCHES`
names the switches that model an entry, and :func:`explain_surface` says
whether one of them tells the working profile from the reference profile.
A behaviour class no switch explains is matched to the surface entry of its
operation (:func:`surface_for_class`), when there is one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from itertools import combinations
from pathlib import Path

from kvref.adapters import AdapterFactory
from kvref.exits import InputError
from kvref.surface import SurfaceChange
from kvref.traces import Trace, replay
from kvref.traces import load as load_trace
from kvspec.errors import ConfigError
from kvspec.profiles import PROFILES, SemanticsProfile, features_used

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


SURFACE_SWITCHES: dict[str, tuple[str, ...]] = {
    "KVCacheManager.__init__": ("admission_controls", "prefill_lookahead", "lookahead_block_hashes"),
    "KVCacheManager.allocate_slots": (
        "full_sequence_arg",
        "reserved_blocks_arg",
        "admission_controls",
        "adopt_hit_without_new_tokens",
        "skip_zeroing_arg",
    ),
    "KVCacheManager.get_computed_blocks": ("hit_length_bound", "lookup_returns_boundary"),
    "KVCacheManager.get_num_common_prefix_blocks": ("common_prefix",),
    "KVCacheManager.get_num_cached_tokens": ("num_cached_tokens_op",),
    "KVCacheManager.get_computed_blocks_for_connector": ("connector_lookup_op",),
    "KVCacheManager.truncate_computed_blocks": ("connector_lookup_op", "truncate_mamba_lagging"),
    "KVCacheManager.take_new_block_ids": ("new_block_ids_list",),
    "KVCacheManager.record_blocks_for_zeroing": ("record_zeroing_op",),
    "KVCacheManager.get_zeroing_block_ids_in_range": ("zeroing_range_op",),
    "KVCacheManager.pop_blocks_for_free": ("deferred_free",),
    "KVCacheManager.new_step_starts": ("mamba_step_guard",),
    "KVCacheManager.get_block_ids_for_computed_tokens": ("computed_block_ids_op",),
    "KVCacheManager.estimate_cached_tokens": ("estimate_cached_tokens_op",),
    "KVCacheManager.record_prefix_cache_stats": ("stats_at_lookup",),
    "KVCacheManager.take_kv_cache_block_copies": ("partial_hash_hits",),
    "Request.skip_reading_prefix_cache": ("hit_limit_at_construction",),
    "Request.get_skip_reading_prefix_cache": ("hit_limit_at_construction",),
    "Request.prefix_cache_hit_limit": ("hit_limit_at_construction",),
    "Request.get_prefix_cache_hit_limit": ("prompt_logprobs_hit_cap",),
    "Request.get_max_cache_hit_length": ("hit_length_bound",),
    "Request.prompt_token_ids": ("token_ids_int32",),
    "BlockStored.extra_keys": ("event_extra_keys",),
    "BlockStored.group_idx": ("event_group_idx",),
    "BlockStored.kv_cache_spec_kind": ("event_annotations",),
    "BlockStored.kv_cache_spec_sliding_window": ("event_annotations",),
    "BlockStored.lookahead_token_ids": ("lookahead_block_hashes",),
    "BlockRemoved.group_idx": ("event_group_idx",),
    "BlockPool.free_blocks": ("skipped_unhashed_first", "free_unhashed_first"),
    "KVCacheGroupSpec.is_eagle_group": ("eagle_group_flags",),
    "SlidingWindowSpec.extra_retained_tokens": ("prefill_lookahead",),
    "CircularBufferSpec": ("circular_buffer_kind",),
    "KpoolTailSpec": ("kpool_tail_kind",),
}
"""Surface entry -> the profile switches that model a change of it (an entry
not listed has no switch: a change there is a lead, not modelled)."""


def explain_surface(change: SurfaceChange, working: SemanticsProfile, reference: SemanticsProfile | None) -> str:
    """What explains a surface change: the switches of :data:`SURFACE_SWITCHES`
    for its entry that tell ``working`` from ``reference`` (each with the
    release that introduced the reference value); without a reference profile
    (a release newer than every profile), the switches that model the entry;
    else ``"not modelled"``."""
    switches = SURFACE_SWITCHES.get(change.entry, ())
    if reference is None:
        return f"not modelled (switches of this entry: {', '.join(switches)})" if switches else "not modelled"
    differ = tuple(s for s in switches if getattr(working, s) != getattr(reference, s))
    if not differ:
        return "not modelled"
    return Attribution(differ, tuple(introduced_in(s, reference) for s in differ)).describe()


def features_of_trace(path: Path) -> list[str]:
    """The state-adding features (:func:`kvspec.profiles.features_used`) the
    configuration of the trace at ``path`` uses, sorted; [] if it cannot be read."""
    try:
        trace = load_trace(path)
    except (OSError, ValueError, InputError):
        return []
    return sorted(features_used(trace.config))


def surface_for_class(key: str, changes: list[SurfaceChange]) -> SurfaceChange | None:
    """The surface change of the operation a behaviour class shows on
    (``"get_num_common_prefix_blocks/output"`` -> the change of
    ``KVCacheManager.get_num_common_prefix_blocks``), or None."""
    op = key.split("/", 1)[0]
    for owner in ("KVCacheManager", "BlockPool"):
        found = next((c for c in changes if c.entry == f"{owner}.{op}"), None)
        if found is not None:
            return found
    return None
