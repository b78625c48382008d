"""Contract domains of the prefix-hit lookups: one group's search
(:func:`find_longest_cache_hit`, the fine-grained searches of
:mod:`kvspec.partial_hits`, 0.16.0's EAGLE probe) and the hybrid fixed
point in every release's form.

The pool's cache map is filled directly (:func:`kvproofs.bounded.domains.fill`);
the lookups only read it. The hybrid domain builds a real
``HybridCoordinator`` per profile (a :class:`~kvproofs.bounded.pep316.Scenario`):
every cached/uncached assignment of each group's hash boundaries and every
``max_len`` up to the prompt, for the hybrids whose search differs between
releases (a sliding window, a Mamba align group, a coarse Mamba group whose
hits are fine-grained from 0.26.0 on, a coarse full-attention group that
probes inside its blocks, two windows, three kinds), with and without EAGLE.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache, partial
from itertools import product

from kvproofs.bounded.domains import PROFILE_LIST, fill, hashes, kinds, subsets
from kvproofs.bounded.pep316 import Case, Scenario, contract
from kvspec.block_pool import BlockPool
from kvspec.config import (
    AttentionKind,
    FullAttention,
    KVCacheConfig,
    Mamba,
    SinkFullAttention,
    SlidingWindow,
)
from kvspec.errors import ConfigError, UnsupportedByProfileError
from kvspec.hashing import BlockHash, coarse_block_hashes
from kvspec.kv_cache_coordinator import HybridCoordinator, make_coordinator
from kvspec.partial_hits import fine_grained
from kvspec.profiles import PROFILES, SemanticsProfile

STM = "kvspec.single_type_kv_cache_manager"
KCC = "kvspec.kv_cache_coordinator"


def _pool(block_size: int, keyed: list[tuple[BlockHash, int]]) -> BlockPool:
    pool = BlockPool(64, True, block_size)
    fill(pool, keyed)
    return pool


@contract(
    f"{STM}.find_longest_cache_hit",
    "the kind catalog at block sizes 1-2 x every cached subset of 4 blocks x max_length 0 to 4 blocks + 1"
    " x EAGLE drop x alignment 1-3 blocks; and two groups (full, window, Mamba) with 3 blocks each cached"
    " independently",
)
def _find_longest() -> Iterator[Case]:
    h = hashes(4)
    for bs, cached in product((1, 2), subsets(4)):
        pool = _pool(bs, [(h[i], 0) for i in range(4) if cached[i]])
        for kind, max_length, drop, per in product(kinds(bs), range(4 * bs + 2), (False, True), (1, 2, 3)):
            yield kind, h, max_length, [0], pool, drop, per * bs
    h = hashes(3)
    for first, second in product(subsets(3), subsets(3)):
        keyed = [(h[i], 0) for i in range(3) if first[i]] + [(h[i], 1) for i in range(3) if second[i]]
        pool = _pool(2, keyed)
        two: tuple[AttentionKind, ...] = (FullAttention(2), SlidingWindow(2, 3), Mamba(2, "align"))
        for group_kind, max_length, drop in product(two, range(8), (False, True)):
            yield group_kind, h, max_length, [0, 1], pool, drop, 2


@contract(
    f"{STM}.eagle_window_hit_before_drop",
    "windows 1-5 at block sizes 1-2 x every cached subset of 5 blocks x max_length 0 to 5 blocks + 1 x "
    "alignment 1-2 blocks",
)
def _eagle_window() -> Iterator[Case]:
    h = hashes(5)
    for bs, cached in product((1, 2), subsets(5)):
        pool = _pool(bs, [(h[i], 0) for i in range(5) if cached[i]])
        for window, max_length, per in product(range(1, 6), range(5 * bs + 2), (1, 2)):
            yield SlidingWindow(bs, window), h, max_length, [0], pool, per * bs


@contract(
    "kvspec.partial_hits.fine_full_attention_hit",
    "full attention, MLA and SinkFull blocks of 4 tokens at hash granularity 1 and 2 x every cached "
    "subset of 8 hash boundaries x max_length 0-17 x EAGLE drop; and two groups",
)
def _fine_full() -> Iterator[Case]:
    h = hashes(8)
    for alignment, cached in product((1, 2), subsets(8)):
        pool = _pool(alignment, [(h[i], 0) for i in range(8) if cached[i]])
        for kind, max_length, drop in product((FullAttention(4), SinkFullAttention(4, 4)), range(18), (False, True)):
            yield kind, h, max_length, [0], pool, drop, alignment
    h = hashes(4)
    for first, second in product(subsets(4), subsets(4)):
        keyed = [(h[i], 0) for i in range(4) if first[i]] + [(h[i], 1) for i in range(4) if second[i]]
        pool = _pool(2, keyed)
        for max_length, drop in product(range(10), (False, True)):
            yield FullAttention(4), h, max_length, [0, 1], pool, drop, 2


@contract(
    "kvspec.partial_hits.fine_mamba_hit",
    "Mamba align blocks of 4 tokens at hash granularity 1 and 2 x every cached subset of 8 hash "
    "boundaries x max_length 0-17; and two groups",
)
def _fine_mamba() -> Iterator[Case]:
    h = hashes(8)
    for alignment, cached in product((1, 2), subsets(8)):
        pool = _pool(alignment, [(h[i], 0) for i in range(8) if cached[i]])
        for max_length in range(18):
            yield Mamba(4, "align"), h, max_length, [0], pool, alignment
    h = hashes(4)
    for first, second in product(subsets(4), subsets(4)):
        keyed = [(h[i], 0) for i in range(4) if first[i]] + [(h[i], 1) for i in range(4) if second[i]]
        pool = _pool(2, keyed)
        for max_length in range(10):
            yield Mamba(4, "align"), h, max_length, [0, 1], pool, 2


# --- the hybrid fixed point ---------------------------------------------------------


@dataclass(frozen=True)
class Hybrid:
    """A hybrid of the domain: its groups, prompt tokens, EAGLE and the hash
    block size (None: the spec's default)."""

    groups: tuple[AttentionKind, ...]
    tokens: int
    eagle: bool = False
    hash_block_size: int | None = None


HYBRIDS: tuple[Hybrid, ...] = (
    Hybrid((FullAttention(2), SlidingWindow(2, 3)), 6),
    Hybrid((FullAttention(2), SlidingWindow(2, 3)), 6, eagle=True),
    Hybrid((FullAttention(4), SlidingWindow(2, 3)), 8, eagle=True),
    Hybrid((SlidingWindow(2, 3), SlidingWindow(2, 5)), 6),
    Hybrid((SlidingWindow(2, 3), SlidingWindow(2, 5)), 8, eagle=True),
    Hybrid((FullAttention(2), Mamba(2, "align")), 6, eagle=True),
    Hybrid((FullAttention(2), Mamba(4, "align")), 8),
    Hybrid((FullAttention(4), Mamba(4, "align")), 8, eagle=True, hash_block_size=2),
    Hybrid((FullAttention(4), SlidingWindow(2, 3), Mamba(4, "align")), 6),
    Hybrid((SlidingWindow(2, 3), Mamba(4, "align")), 8, eagle=True),
)
"""The hybrids of the domain (hash block 2 tokens)."""


@cache
def _config(h: Hybrid, release: str) -> KVCacheConfig | None:
    """The validated configuration of ``h`` under a release, or None where
    the spec refuses it (built once: validation reads switches that the
    lookups do not, which would split the profile classes for nothing)."""
    try:
        return KVCacheConfig(
            64, h.groups, 64, use_eagle=h.eagle, hash_block_size=h.hash_block_size, profile=PROFILES[f"vllm-{release}"]
        )
    except (ConfigError, UnsupportedByProfileError):
        return None


@cache
def _base(h: Hybrid, release: str) -> HybridCoordinator | None:
    """The coordinator of ``h`` under a release (None where refused)."""
    config = _config(h, release)
    if config is None:
        return None
    coord = make_coordinator(config)
    assert isinstance(coord, HybridCoordinator)
    return coord


def _fingerprint(coord: HybridCoordinator) -> tuple[object, ...]:
    """Everything a coordinator's construction derived from its profile that
    the searches and their contracts read: the spec groups (EAGLE flags
    included), fine-grained hits, the alignments and block sizes."""
    managers = tuple((m.kind, m.block_size) for m in coord.managers)
    return (tuple(coord.spec_groups), coord.partial_hash_hits, coord.hit_alignment, coord.hash_block_size,
            coord.scheduler_block_size, managers)  # fmt: skip


@cache
def _classes(h: Hybrid) -> tuple[tuple[SemanticsProfile, ...], ...]:
    """The accepting profiles of ``h`` grouped by :func:`_fingerprint`; within
    a group the engine splits further by the switches each run reads."""
    groups: dict[tuple[object, ...], list[SemanticsProfile]] = {}
    for p in PROFILE_LIST:
        base = _base(h, p.release)
        if base is not None:
            groups.setdefault(_fingerprint(base), []).append(p)
    return tuple(tuple(g) for g in groups.values())


def _coordinator(h: Hybrid, profile: SemanticsProfile) -> HybridCoordinator:
    """A copy of ``h``'s coordinator under ``profile``'s release whose
    configuration holds ``profile`` (a recording twin with the same switches,
    so the run notes what it reads) and whose pool is empty."""
    release = object.__getattribute__(profile, "release")  # not a switch read by the code under test
    base = _base(h, release)
    assert base is not None, f"{h} is refused under {release}"
    config = copy.copy(base.config)
    object.__setattr__(config, "profile", profile)
    coord = copy.copy(base)
    coord.config = config
    coord.pool = BlockPool(64, True, base.hash_block_size)
    return coord


def _slots(h: Hybrid) -> list[tuple[int, int]]:
    """``(group, hash unit)`` pairs: the prefix up to that unit is cached in that group."""
    return [(g, f) for g in range(len(h.groups)) for f in range(h.tokens // 2)]


def _filled(
    h: Hybrid, cached: tuple[bool, ...], profile: SemanticsProfile, slots: list[tuple[int, int]] | None = None
) -> HybridCoordinator:
    """The coordinator under ``profile`` with the ``cached`` slots (of
    ``slots``, default every slot) in its map: a group that looks up hash units
    takes the unit's key; any other takes its own block's key (in the
    profile's coarse form) where the unit ends a block."""
    coord = _coordinator(h, profile)
    fine = hashes(h.tokens // 2)
    keyed = []
    for (g, f), on in zip(_slots(h) if slots is None else slots, cached, strict=True):
        kind = coord.managers[g].kind
        k = kind.block_size // 2
        if not on:
            continue
        if fine_grained(kind, coord.hit_alignment) or k == 1:
            keyed.append((fine[f], g))
        elif (f + 1) % k == 0:
            coarse = coarse_block_hashes(fine, 2, kind.block_size, profile.coarse_hash_last_fine)
            keyed.append((coarse[(f + 1) // k - 1], g))
    fill(coord.pool, keyed)
    return coord


def _search_case(h: Hybrid, cached: tuple[bool, ...], max_len: int, profile: SemanticsProfile) -> Case:
    return _filled(h, cached, profile), hashes(h.tokens // 2), max_len


def _search_scenarios(hybrids: tuple[Hybrid, ...] = HYBRIDS) -> Iterator[Scenario]:
    for h in hybrids:
        for cached, max_len in product(subsets(len(_slots(h))), range(h.tokens + 1)):
            for profiles in _classes(h):
                yield Scenario(partial(_search_case, h, cached, max_len), profiles)


@contract(
    f"{KCC}.hybrid_hit_search",
    "12 hybrids (full attention, windows, Mamba align, coarse and fine-grained groups, with and without "
    "EAGLE) x every cached subset of each group's hash boundaries x max_len 0 to the prompt x every "
    "profile",
)
def _hybrid() -> Iterator[Scenario]:
    yield from _search_scenarios()


@contract(f"{KCC}.hybrid_hit_search_longest", "as hybrid_hit_search")
def _hybrid_longest() -> Iterator[Scenario]:
    yield from _search_scenarios()


@contract(f"{KCC}.hybrid_hit_search_v016", "as hybrid_hit_search")
def _hybrid_v016() -> Iterator[Scenario]:
    yield from _search_scenarios()


def _group_case(
    h: Hybrid, idx: int, cached: tuple[bool, ...], limit: int, drop: bool, profile: SemanticsProfile
) -> Case:
    coord = _coordinator(h, profile)
    sg = coord.spec_groups[idx]
    coord = _filled(h, cached, profile, _group_slots(h, sg.group_ids))
    return coord, sg, hashes(h.tokens // 2), limit, drop


def _group_slots(h: Hybrid, group_ids: tuple[int, ...]) -> list[tuple[int, int]]:
    return [(g, f) for g, f in _slots(h) if g in group_ids]


def _group_scenarios(with_drop: bool) -> Iterator[Scenario]:
    """Each spec group of each hybrid (only its own groups' slots vary: the
    lookup reads no other) x every limit (x EAGLE drop), per class of profiles."""
    drops = (False, True) if with_drop else (False,)
    for h in HYBRIDS:
        for profiles in _classes(h):
            base = _base(h, profiles[0].release)
            assert base is not None
            for idx, sg in enumerate(base.spec_groups):
                slots = _group_slots(h, sg.group_ids)
                for cached, limit, drop in product(subsets(len(slots)), range(h.tokens + 1), drops):
                    yield Scenario(partial(_group_case, h, idx, cached, limit, drop), profiles)


@contract(
    f"{KCC}.spec_group_hit",
    "each spec group of the hybrids of hybrid_hit_search x every cached subset of its hash boundaries x "
    "limit 0 to the prompt x EAGLE drop x every profile",
)
def _spec_group() -> Iterator[Scenario]:
    yield from _group_scenarios(True)


def _v016_case(
    h: Hybrid, idx: int, cached: tuple[bool, ...], limit: int, drop: bool, profile: SemanticsProfile
) -> Case:
    return _group_case(h, idx, cached, limit, drop, profile)[:4]


@contract(
    f"{KCC}.v016_spec_group_hit",
    "each spec group of the hybrids of hybrid_hit_search x every cached subset of its hash boundaries x "
    "limit 0 to the prompt x every profile",
)
def _v016_group() -> Iterator[Scenario]:
    for scenario in _group_scenarios(False):
        assert isinstance(scenario.build, partial)
        yield Scenario(partial(_v016_case, *scenario.build.args), scenario.profiles)
