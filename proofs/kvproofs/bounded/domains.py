"""Finite domains shared by the contract checks of :mod:`kvproofs.bounded.pep316`.

Everything is built with the spec's real classes, in a fixed order, and
under every semantics profile of :data:`kvspec.profiles.PROFILES` (a release
added there joins every domain that takes a profile).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import fields
from functools import cache
from itertools import product
from typing import Any

from kvspec.block_pool import BlockId, BlockPool
from kvspec.config import (
    MLA,
    AttentionKind,
    ChunkedLocal,
    CircularBuffer,
    CrossAttention,
    FullAttention,
    KpoolTail,
    KVCacheConfig,
    Mamba,
    SinkFullAttention,
    SlidingWindow,
)
from kvspec.errors import ConfigError, UnsupportedByProfileError
from kvspec.hashing import BlockHash, make_key
from kvspec.profiles import PROFILES, SemanticsProfile

PROFILE_LIST: tuple[SemanticsProfile, ...] = tuple(PROFILES.values())
"""Every supported profile, oldest first."""


def kinds(block_size: int) -> tuple[AttentionKind, ...]:
    """One kind of each class with ``block_size`` (windows and chunks below,
    at and above it; each Mamba mode, with and without a speculative block)."""
    b = block_size
    return (
        FullAttention(b),
        MLA(b),
        SinkFullAttention(b, b),
        SlidingWindow(b, 1),
        SlidingWindow(b, b + 1),
        SlidingWindow(b, 2 * b + 1),
        SlidingWindow(b, b + 1, 1),
        ChunkedLocal(b, b),
        ChunkedLocal(b, 2 * b),
        Mamba(b, "none"),
        Mamba(b, "all"),
        Mamba(b, "align"),
        Mamba(b, "align", 1),
        CrossAttention(b),
        CircularBuffer(b),
        KpoolTail(b, b),
    )


KINDS: tuple[AttentionKind, ...] = kinds(2) + kinds(4)
"""The kind catalog: every class at block sizes 2 and 4."""


def raw_config(groups: tuple[Any, ...], profile: SemanticsProfile, **values: Any) -> KVCacheConfig:
    """A ``KVCacheConfig`` value with these fields that skips validation: the
    input a validator must judge (defaults as the dataclass's)."""
    cfg = object.__new__(KVCacheConfig)
    given = {"num_blocks": 16, "groups": groups, "max_model_len": 64, "profile": profile, **values}
    for f in fields(KVCacheConfig):
        object.__setattr__(cfg, f.name, given.get(f.name, f.default))
    return cfg


def config(groups: tuple[AttentionKind, ...], profile: SemanticsProfile, **values: Any) -> KVCacheConfig | None:
    """A validated configuration, or None where the spec refuses it."""
    try:
        return KVCacheConfig(
            values.pop("num_blocks", 32), groups, values.pop("max_model_len", 64), profile=profile, **values
        )
    except (ConfigError, UnsupportedByProfileError):
        return None


CONFIG_GROUPS: tuple[tuple[AttentionKind, ...], ...] = (
    *((k,) for k in KINDS),
    (FullAttention(2), SlidingWindow(2, 3)),
    (FullAttention(4), SlidingWindow(2, 3)),
    (FullAttention(2), FullAttention(2)),
    (FullAttention(2), ChunkedLocal(2, 4)),
    (FullAttention(2), Mamba(2, "align")),
    (FullAttention(2), Mamba(4, "align")),
    (FullAttention(4), Mamba(2, "align", 1)),
    (FullAttention(2), Mamba(4, "all")),
    (FullAttention(2), CircularBuffer(2)),
    (FullAttention(2), KpoolTail(2, 2)),
    (SlidingWindow(2, 3), Mamba(4, "align")),
    (SlidingWindow(4, 5), Mamba(4, "align")),
    (MLA(2), SinkFullAttention(2, 2)),
    (FullAttention(4), Mamba(4, "align"), SlidingWindow(2, 3)),
    (FullAttention(2), CrossAttention(2)),
    (CircularBuffer(2), KpoolTail(2, 2)),
)
"""Group tuples of the configuration domain: every kind alone, and the hybrids
whose rules differ between releases (coarse full attention and Mamba align
groups, rings, one kind twice, a coarse window)."""


@cache
def configs() -> tuple[KVCacheConfig, ...]:
    """Every valid configuration over :data:`CONFIG_GROUPS` x caching on/off x
    EAGLE (none, every group, group 0 flagged) x context parallelism
    (1, dcp 2, dcp 2 with pcp 2) x every profile."""
    out = []
    eagle: tuple[dict[str, Any], ...] = ({}, {"use_eagle": True}, {"use_eagle": True, "eagle_groups": (0,)})
    cp: tuple[dict[str, int], ...] = ({}, {"dcp_world_size": 2}, {"dcp_world_size": 2, "pcp_world_size": 2})
    for groups, caching, e, c, profile in product(CONFIG_GROUPS, (True, False), eagle, cp, PROFILE_LIST):
        cfg = config(groups, profile, enable_caching=caching, **e, **c)
        if cfg is not None:
            out.append(cfg)
    return tuple(out)


@cache
def refused_configs() -> tuple[KVCacheConfig, ...]:
    """Configurations of the same domain that every check but the profile's
    own passes (:func:`kvspec.profiles.unsupported_reason` refuses them), as
    unvalidated values."""
    out = []
    for groups, caching, dcp, profile in product(CONFIG_GROUPS, (True, False), (1, 2), PROFILE_LIST):
        values = {"enable_caching": caching, "dcp_world_size": dcp}
        try:
            KVCacheConfig(32, groups, 64, profile=profile, **values)  # type: ignore[arg-type]
        except UnsupportedByProfileError:
            out.append(raw_config(groups, profile, num_blocks=32, **values))
        except ConfigError:
            continue
    return tuple(out)


def fill(pool: BlockPool, keyed: Sequence[tuple[BlockHash, int]]) -> None:
    """Cache one fresh block per ``(hash, group)`` directly in the pool's map
    (ids from 1 on, in order); the lookups only read that map."""
    for i, (h, gid) in enumerate(keyed, start=1):
        b, key = BlockId(i), make_key(h, gid)
        pool.cached.setdefault(key, []).append(b)
        if pool.block_hash[b] is None:
            pool.block_hash[b] = key


def hashes(n: int) -> list[BlockHash]:
    """``n`` distinct fine hashes."""
    return [BlockHash(bytes([i + 1])) for i in range(n)]


def subsets(n: int) -> Iterator[tuple[bool, ...]]:
    """Every cached/uncached assignment of ``n`` positions."""
    return product((False, True), repeat=n)
