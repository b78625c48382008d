"""Coverage of configuration properties, reported like branch coverage.

Branch coverage says which decisions of the managers went both ways; it does
not say which *configurations* the decisions were taken under. A fault that
lives only where a group's block is coarser than the hash block, or where a
window is not a whole number of blocks, hides from a generator that never
draws such a group, however many branches it takes elsewhere. So each machine
run records the properties of its configuration (:func:`properties_of`), and
``kvref check`` reports which of the classes of :data:`PROPERTIES` its runs
took, like the outcomes of a branch.

The classes are the ranges the machine's configuration strategy
(:func:`kvref.stateful.configs`) means to cover: each group's block size as a
ratio of the scheduler block and of the hash block, window and chunk sizes in
blocks, Mamba speculative blocks, EAGLE on all or some groups or with
look-ahead block hashes (vLLM 0.33.0 on), tiny and small
pools, context-parallel world sizes, and the switches (caching, events,
statistics, watermark, a token budget).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from fractions import Fraction

from kvspec.config import ChunkedLocal, KVCacheConfig, Mamba, SlidingWindow
from kvspec.profiles import features_used

Predicate = Callable[[KVCacheConfig], bool]


def _ratios(cfg: KVCacheConfig, to_hash: bool) -> set[Fraction]:
    """Each group's manager block size over the scheduler block (or the hash block)."""
    base = cfg.resolved_hash_block_size() if to_hash else cfg.scheduler_block_size
    return {Fraction(k.block_size, base) for k in cfg.manager_groups()}


def _windows(cfg: KVCacheConfig) -> set[Fraction]:
    """Each sliding-window group's window in blocks."""
    return {Fraction(k.window, k.block_size) for k in cfg.groups if isinstance(k, SlidingWindow)}


def _chunks(cfg: KVCacheConfig) -> set[Fraction]:
    return {Fraction(k.chunk, k.block_size) for k in cfg.groups if isinstance(k, ChunkedLocal)}


def _spec_blocks(cfg: KVCacheConfig) -> set[int]:
    return {k.num_speculative_blocks for k in cfg.groups if isinstance(k, Mamba)}


def _eagle(cfg: KVCacheConfig) -> str:
    if not cfg.use_eagle:
        return "off"
    return "some groups" if 0 < len(cfg.eagle_group_ids()) < len(cfg.groups) else "every group"


RETENTION_CLASSES = ("retention interval 0", "retention interval above 0")
"""The classes of runs with a prefix-cache retention interval (the verdict counts them)."""

CHECKPOINT_CLASS = "mamba: prefill checkpoints"
"""The class of runs with Mamba prefill checkpoints (the verdict counts them)."""

PROPERTIES: tuple[tuple[str, Predicate], ...] = (
    ("block = scheduler block", lambda c: Fraction(1) in _ratios(c, False)),
    ("block = 1/2 scheduler block", lambda c: Fraction(1, 2) in _ratios(c, False)),
    ("block = hash block", lambda c: c.enable_caching and Fraction(1) in _ratios(c, True)),
    ("block = 2 hash blocks", lambda c: c.enable_caching and Fraction(2) in _ratios(c, True)),
    ("window < 1 block", lambda c: any(w < 1 for w in _windows(c))),
    ("window = 1 block", lambda c: Fraction(1) in _windows(c)),
    ("window in (1, 2) blocks", lambda c: any(1 < w < 2 for w in _windows(c))),
    ("window = 2 blocks", lambda c: Fraction(2) in _windows(c)),
    ("window in (2, 3) blocks", lambda c: any(2 < w < 3 for w in _windows(c))),
    ("window = 3 blocks", lambda c: Fraction(3) in _windows(c)),
    ("window > 3 blocks", lambda c: any(w > 3 for w in _windows(c))),
    ("chunk = 1 block", lambda c: Fraction(1) in _chunks(c)),
    ("chunk = 2 blocks", lambda c: Fraction(2) in _chunks(c)),
    ("chunk = 3 blocks", lambda c: Fraction(3) in _chunks(c)),
    ("mamba: 0 speculative blocks", lambda c: 0 in _spec_blocks(c)),
    ("mamba: 1 speculative block", lambda c: 1 in _spec_blocks(c)),
    ("mamba: 2 speculative blocks", lambda c: 2 in _spec_blocks(c)),
    (CHECKPOINT_CLASS, lambda c: "prefill-checkpoints" in features_used(c)),
    ("eagle: off", lambda c: _eagle(c) == "off"),
    ("eagle: every group", lambda c: _eagle(c) == "every group"),
    ("eagle: some groups", lambda c: _eagle(c) == "some groups"),
    ("eagle: look-ahead block hashes", lambda c: c.num_hash_lookahead_tokens > 0),
    (RETENTION_CLASSES[0], lambda c: c.prefix_cache_retention_interval == 0),
    (RETENTION_CLASSES[1], lambda c: (c.prefix_cache_retention_interval or 0) > 0),
    ("pool: at most 2 usable blocks", lambda c: c.num_blocks <= 3),
    ("pool: fewer usable blocks than 2 per group", lambda c: 3 < c.num_blocks <= 2 * len(c.groups)),
    ("pool: 6 to 8 blocks", lambda c: 6 <= c.num_blocks <= 8),
    ("pool: 12 blocks or more", lambda c: c.num_blocks >= 12),
    ("decode context parallelism 2", lambda c: c.dcp_world_size == 2),
    ("decode context parallelism 4", lambda c: c.dcp_world_size == 4),
    ("prefill context parallelism 2", lambda c: c.pcp_world_size == 2),
    ("prefix caching off", lambda c: not c.enable_caching),
    ("prefix caching on, hybrid", lambda c: c.enable_caching and len(c.groups) > 1),
    ("kv-cache events on", lambda c: c.enable_kv_cache_events),
    ("statistics on", lambda c: c.log_stats),
    ("watermark above 0", lambda c: c.watermark > 0),
    ("token budget below the model length", lambda c: c.batched_tokens() < c.max_model_len),
)
"""The configuration classes a run may take: a name and whether a configuration is in it."""

NAMES = tuple(name for name, _ in PROPERTIES)


def properties_of(cfg: KVCacheConfig) -> frozenset[str]:
    """The classes of :data:`PROPERTIES` that ``cfg`` is in."""
    return frozenset(name for name, holds in PROPERTIES if holds(cfg))


def missing(taken: Iterable[str]) -> list[str]:
    """The classes of :data:`PROPERTIES` not in ``taken``, in table order."""
    seen = set(taken)
    return [name for name in NAMES if name not in seen]
