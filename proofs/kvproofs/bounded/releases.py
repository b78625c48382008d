"""How the switches that distinguish releases relate, on the spec's real
classes: each check flips one switch of a release's profile (or compares two
releases) over a finite domain.

* ``hybrid_switch_relations``: the hybrid search's EAGLE switches only ever
  lengthen a hit (``eagle_margin_hashed_cap``: the look-ahead may reach a
  block that ends at the last token; ``mamba_eagle_counts_verified``: a Mamba
  shrink keeps the other groups' verified drops), change nothing without an
  EAGLE group, and each lengthens some hit of the domain.
* ``degenerate_windows``: 0.16.0's external-token cap for a window of one
  token or a chunk below the block is not modelled: every profile without
  ``external_cap_any_skip`` refuses exactly those configurations.
* ``hybrid_caching``: with ``hybrid_cache_reachable_only`` (0.25.1 on) a
  cached hybrid caches at most what 0.16.0's rule caches (every full block of
  every group), and without it exactly that.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from itertools import product

from kvproofs.bounded import check, expect
from kvproofs.bounded.contracts_lookup import HYBRIDS, _classes, _search_case, _slots
from kvproofs.bounded.domains import PROFILE_LIST, subsets
from kvproofs.contracts import ALL_RELEASES, about
from kvspec import kv_cache_coordinator as kcc
from kvspec.config import AttentionKind, ChunkedLocal, FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.errors import ConfigError, UnsupportedByProfileError
from kvspec.kv_cache_manager import KVCacheManager
from kvspec.profiles import SemanticsProfile, unmodelled_v016_rules
from kvspec.request import RequestBlockHasher

SWITCHES = ("eagle_margin_hashed_cap", "mamba_eagle_counts_verified")


def _with(coord: kcc.HybridCoordinator, profile: SemanticsProfile) -> kcc.HybridCoordinator:
    """``coord`` reading ``profile`` (same groups, pool and derived state)."""
    config = copy.copy(coord.config)
    object.__setattr__(config, "profile", profile)
    twin = copy.copy(coord)
    twin.config = config
    return twin


def _flip(profile: SemanticsProfile, switch: str, value: bool) -> SemanticsProfile:
    """``profile`` with the boolean ``switch`` set to ``value``."""
    return replace(profile, **{switch: value})  # type: ignore[arg-type]  # a boolean switch, by name


@check
@about(kcc.hybrid_hit_search, releases=ALL_RELEASES)
def hybrid_switch_relations() -> int:
    """For each EAGLE switch of the search, under one profile of each class
    of the hybrid domain: the hit with the switch on is at least the hit with
    it off, equal without an EAGLE group, and longer for some case."""
    cases = 0
    longer = dict.fromkeys(SWITCHES, False)
    for h in HYBRIDS:
        for profiles in _classes(h):
            profile = profiles[0]
            for cached, max_len in product(subsets(len(_slots(h))), range(h.tokens + 1)):
                coord, hashes, _ = _search_case(h, cached, max_len, profile)
                eagle = any(sg.use_eagle for sg in coord.spec_groups)
                for switch in SWITCHES:
                    cases += 1
                    case = (h, cached, max_len, profile.release, switch)
                    on = kcc.hybrid_hit_search(_with(coord, _flip(profile, switch, True)), hashes, max_len)[0]
                    off = kcc.hybrid_hit_search(_with(coord, _flip(profile, switch, False)), hashes, max_len)[0]
                    expect(on >= off, f"{switch}: on >= off", case)
                    expect(eagle or on == off, f"{switch}: no effect without EAGLE", case)
                    longer[switch] = longer[switch] or on > off
    for switch, seen in longer.items():
        expect(seen, f"{switch}: lengthens some hit", switch)
    return cases


_DEGENERATE: tuple[AttentionKind, ...] = (SlidingWindow(2, 1), ChunkedLocal(4, 2), ChunkedLocal(2, 1))
_REGULAR: tuple[AttentionKind, ...] = (SlidingWindow(2, 2), ChunkedLocal(2, 2), ChunkedLocal(2, 4), FullAttention(2))


@check
@about(unmodelled_v016_rules, releases=ALL_RELEASES)
def degenerate_windows() -> int:
    """Every profile without ``external_cap_any_skip`` (0.16.0) refuses a
    window of one token and a chunk below the block size, naming the rule;
    the others accept them; regular windows are accepted everywhere."""
    cases = 0
    for kind, caching, profile in product((*_DEGENERATE, *_REGULAR), (True, False), PROFILE_LIST):
        cases += 1
        case = (kind, caching, profile.release)
        degenerate = kind in _DEGENERATE
        try:
            KVCacheConfig(8, (kind,), 16, enable_caching=caching, profile=profile)
            refused = ""
        except UnsupportedByProfileError as exc:
            refused = str(exc)
        except ConfigError:
            continue
        expect(bool(refused) == (degenerate and not profile.external_cap_any_skip), "refused exactly then", case)
        expect(not refused or "external-token cap" in refused, "the refusal names the rule", case)
    return cases


_CACHED_HYBRIDS: tuple[tuple[AttentionKind, ...], ...] = (
    (FullAttention(2), SlidingWindow(2, 3)),
    (FullAttention(4), SlidingWindow(2, 3)),
    (FullAttention(2), Mamba(4, "align")),
    (SlidingWindow(2, 3), SlidingWindow(2, 5)),
)


def _cached_per_group(
    groups: tuple[AttentionKind, ...], eagle: bool, tokens: int, profile: SemanticsProfile
) -> tuple[list[int], list[int], list[int]] | None:
    """After one request of ``tokens`` tokens is allocated and cached: per
    group, the table's blocks keyed as full blocks, the blocks that could be
    (not null, full), and the blocks up to the last scheduler-block boundary
    (every token with fine-grained hits; an EAGLE group one block further);
    None where the profile refuses the model."""
    try:
        config = KVCacheConfig(32, groups, 64, use_eagle=eagle, hash_block_size=2, profile=profile)
    except (ConfigError, UnsupportedByProfileError):
        return None
    kv = KVCacheManager(config)
    request = RequestBlockHasher.for_config(config).new_request("r", list(range(tokens)))
    if kv.allocate_slots(request, tokens) is None:
        return None
    kv.cache_blocks(request, tokens)
    pool, coord = kv.block_pool, kv.coordinator
    sched = config.scheduler_block_size
    aligned = tokens if coord.partial_hash_hits else tokens // sched * sched
    cached, full, reachable = [], [], []
    for table, m in zip(kv.get_blocks("r"), coord.managers, strict=True):
        bs = m.block_size
        cached.append(sum(1 for i, b in enumerate(table) if b and pool.hash_num_tokens[b] == (i + 1) * bs))
        full.append(sum(1 for b in table[: tokens // bs] if b))
        reachable.append((min(tokens, aligned + bs) if m.use_eagle and aligned > 0 else aligned) // bs)
    return cached, full, reachable


@check
@about(kcc.HybridCoordinator.cache_blocks, releases=ALL_RELEASES)
def hybrid_caching() -> int:
    """A cached hybrid caches every full block of every group without
    ``hybrid_cache_reachable_only`` (0.16.0); with it never more, only up to
    the last scheduler-block boundary (an EAGLE group one block further), and
    fewer for some case of the domain."""
    cases = 0
    fewer = False
    for groups, eagle, tokens, profile in product(_CACHED_HYBRIDS, (False, True), range(1, 13), PROFILE_LIST):
        got = _cached_per_group(groups, eagle, tokens, profile)
        old = _cached_per_group(groups, eagle, tokens, replace(profile, hybrid_cache_reachable_only=False))
        if got is None or old is None:
            continue
        cases += 1
        case = (groups, eagle, tokens, profile.release)
        expect(old[0] == old[1], "0.16.0 rule: every full block of every group", case)
        expect(all(g <= o for g, o in zip(got[0], old[0], strict=True)), "never more than the 0.16.0 rule", case)
        expect(profile.hybrid_cache_reachable_only or got[0] == got[1], "the profile's own rule when off", case)
        within = all(c <= r for c, r in zip(got[0], got[2], strict=True))
        expect(not profile.hybrid_cache_reachable_only or within, "on: only up to the scheduler-block boundary", case)
        fewer = fewer or got[0] != old[0]
    expect(fewer, "the rule of 0.25.1 on caches fewer blocks somewhere", "hybrid_cache_reachable_only")
    return cases
