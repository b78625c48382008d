"""What a lockstep machine runs against, and the configurations it draws.

:class:`MachineSetup` names the adapters and the run's options;
:func:`configs` draws a named configuration (group mix, sizes, caching, EAGLE,
watermark, events) under a semantics profile; :func:`draw_tokens` draws the
tokens of every prompt the machine makes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from kvref.adapters import AdapterFactory
from kvref.divergences import Divergence
from kvref.exits import DEFAULT_OP_TIMEOUT
from kvref.hypothesis_compat import byte_string
from kvref.lockstep import RunStats
from kvref.shapes import SHAPES, Shape, build_kinds, drawable
from kvref.swarm import swarm_default
from kvspec.config import RING_KINDS, AttentionKind, KVCacheConfig, Mamba, scheduler_block_size_of
from kvspec.errors import ConfigError
from kvspec.hashing import HASH_FUNCTION_NAMES
from kvspec.partial_tail import registers_partial_tail
from kvspec.prefill_checkpoints import POSITIONAL_FORMS
from kvspec.profiles import NEWEST, SemanticsProfile
from kvspec.retention import retention_applies

VOCAB = 4
"""Tokens are drawn from a tiny vocabulary so equal blocks recur by chance too."""

DRAWN_CHECKPOINT_FORMS = frozenset({"block-aligned", "chunk-position", "prompt-end", "reachable", "hash-lookahead"})
"""The forms of Mamba prefill checkpoints (the profile switch ``prefill_checkpoints``)
the kit draws: those its scheduler model, its content oracle and kvimpl follow,
which may lag behind kvspec's (:data:`kvspec.profiles.PREFILL_CHECKPOINTS_MODELLED`)."""


@dataclass
class MachineSetup:
    """What a generated machine class runs against."""

    factories: list[AdapterFactory]
    stats: RunStats = field(default_factory=RunStats)
    failure_dir: Path = Path("kvref-failures")
    shapes: Sequence[Shape] = SHAPES
    record_dir: Path | None = None
    """If set, every run that ends without divergence is written there as a trace."""
    recorded: int = 0
    record_limit: int | None = None
    """Stop writing traces once this many were recorded."""
    min_allocations: int = 0
    """Record only runs with at least this many successful ``allocate_slots`` calls."""
    recorded_texts: set[str] = field(default_factory=set)
    """Traces already written (a run identical to an earlier one is not written again)."""
    profile: SemanticsProfile = NEWEST
    """The semantics profile every drawn configuration follows."""
    next_batch: int = 0
    """The seeded batch a continued run starts with (kept by :mod:`kvref.check`)."""
    op_timeout: float | None = DEFAULT_OP_TIMEOUT
    """Watchdog seconds per adapter operation (:func:`kvref.exits.watchdog`)."""
    known: tuple[Divergence, ...] = ()
    """Further known differences of the adapters under test (``--known``)."""
    excluded: frozenset[str] = frozenset()
    """Features left out (:mod:`kvref.capabilities`): declared, chosen, or learned."""
    learn_skips: bool = True
    """Leave out, from the next batch on, every feature an adapter raised a skip for."""
    swarm: bool = field(default_factory=swarm_default)
    """Draw a :class:`kvref.swarm.Swarm` per run (``KVREF_SWARM=1``; off by default)."""
    safety: bool = False
    """Run the safety oracles on the reference adapter (:mod:`kvref.safety`; ``kvref check --level safety``)."""
    asynchronous: bool = False
    """Keep steps in flight as vLLM's asynchronous scheduler does (:mod:`kvref.machine.pipeline`;
    ``kvref check --async-scheduling``)."""


@st.composite
def configs(
    draw: st.DrawFn,
    shapes: Sequence[Shape] = SHAPES,
    profile: SemanticsProfile = NEWEST,
    excluded: frozenset[str] = frozenset(),
) -> tuple[str, KVCacheConfig | str]:
    """A named configuration: group mix, sizes, caching, EAGLE, watermark,
    events, under ``profile``; instead of the configuration, the reason why
    the profile refuses it (:class:`kvspec.errors.ConfigError`).

    A switch named in ``excluded`` (``caching``, ``eagle``, ``events``,
    ``stats``, ``watermark``, ``mtp``, ``lookahead_hashes``, ``retention``,
    ``prefill_checkpoints``) is turned off
    after the draws, so the draws are the same with or without exclusions."""
    shape = draw(st.sampled_from(drawable(shapes, profile)))
    if "mtp" in excluded:  # an MTP shape runs its kinds without the drafter's inputs
        shape = replace(shape, mtp=0)
    bs = draw(st.sampled_from([2, 4]))
    window = draw(st.integers(1, 3 * bs))
    eagle = shape.eagle_ok and draw(st.sampled_from([False, True, True]))
    spec_blocks = draw(st.integers(0, 2)) if eagle else 0
    # a chunked group's chunk is 1 to 3 blocks, read off the window draw (no draw of its own)
    groups = build_kinds(shape, bs, window, spec_blocks, chunk_blocks=1 + (window - 1) // bs)
    caching = shape.caching if shape.caching is not None else draw(st.sampled_from([True, True, False]))
    fields: dict[str, Any] = dict(
        # Pools of 16 blocks first (a shrunk failure keeps a workable pool), then
        # tighter and roomier ones; the tiniest pools starve every admission.
        num_blocks=draw(st.sampled_from([16, 12, 24, 8, 32, 20, 6, 40])),
        groups=groups,
        max_model_len=draw(st.sampled_from([32, 48, 64])),
        max_num_batched_tokens=draw(st.sampled_from([None, 8, 16])),
        enable_caching=caching,
        use_eagle=eagle,
        eagle_groups=tuple(draw(st.sets(st.integers(0, len(groups) - 1)))) if eagle and draw(st.booleans()) else (),
        # Two runs in three keep an event log (checked after every take_events);
        # False stays first so that shrinking drops the events.
        enable_kv_cache_events=draw(st.sampled_from([False, True, True])),
        watermark=draw(st.sampled_from([0.0, 0.0, 0.1, 0.3])),
        hash_function=draw(st.sampled_from(["sha256_cbor", "sha256_cbor", *HASH_FUNCTION_NAMES])),
        hash_seed=draw(st.sampled_from(["0", "42"])),
        log_stats=draw(st.sampled_from([False, True, True])),
        dcp_world_size=shape.dcp,
        pcp_world_size=shape.pcp,
        num_prefill_lookahead=shape.mtp,
    )
    if draw(st.integers(0, 15)) == 15:  # one run in sixteen: besides the null block, none, one or two
        fields["num_blocks"] = draw(st.sampled_from([1, 2, 3]))
    fields["num_blocks"] *= -(-len(groups) // 4)  # kvref.shapes.WIDE: as many blocks per group (1x up to 4 groups)
    # One event log in three carries the block hashes as bytes, not 64-bit ints.
    fields["int_block_hashes"] = draw(st.sampled_from([True, True, False]))
    # One cached hybrid in four hashes finer than every group (half the base block), so every
    # group's block is coarser than the hash block (coarse keys, partial tails, fine-grained hits).
    if draw(st.sampled_from([False, False, False, True])) and caching and len(groups) > 1:
        fields["hash_block_size"] = bs // 2
    # Look-ahead block hashes, vLLM's default for EAGLE-style drafters with prefix caching from
    # 0.33.0 on (one run in three keeps the trailing-block drop, which a KV connector or
    # disable_lookahead_block_hashes selects); drawn last, and only there, so other runs draw as before.
    ahead = 0
    if profile.lookahead_block_hashes and eagle and caching and draw(st.sampled_from([True, True, False])):
        ahead = max(shape.mtp, 1)
    # A prefix-cache retention interval (vLLM 0.23.0 on) in runs with a group it thins: None in a
    # third of them, 0 in a sixth, 1, 2 or 4 scheduler blocks in half; drawn last, and only there,
    # so other runs draw as before.
    retention = None
    if caching and retention_drawable(groups, profile, shape):
        step = scheduler_block_size_of(groups)  # no context parallelism in a run that draws it
        retention = draw(st.sampled_from([None, None, 0, 1, 2, 4]))
        retention = None if retention is None else retention * step
        fields["prefix_cache_retention_interval"] = None if "retention" in excluded else retention
    # Mamba prefill checkpoints (vLLM 0.29.0 on) in runs with a Mamba align group: a count of 0, 1
    # or 2 (2 acts as 1), and with two such groups the second one's 0 in half of the runs (the
    # scheduler then splits as without checkpoints); from 0.30.0 on with checkpoints an alignment
    # too (None turns them off; 1 as Mamba2's kernels, 2 and 16 a coarser kernel chunk); drawn
    # last, and only there.
    align = [g for g, k in enumerate(groups) if isinstance(k, Mamba) and k.mode == "align"]
    if align and profile.prefill_checkpoints in DRAWN_CHECKPOINT_FORMS:
        count = draw(st.sampled_from([0, 1, 1, 2]))
        lone = len(align) > 1 and draw(st.booleans())
        alignment = None
        if count and profile.prefill_checkpoints in POSITIONAL_FORMS:
            alignment = draw(st.sampled_from([None, 1, 1, 1, 2, 16]))
        if count and "prefill_checkpoints" not in excluded:
            fields["groups"] = checkpointed(groups, align[:1] if lone else align, count, alignment)
    for feature, key, off in _SWITCHES:
        if feature in excluded:
            fields[key] = off
    if not fields["use_eagle"] or not profile.eagle_group_flags:
        fields["eagle_groups"] = ()
    if ahead and fields["use_eagle"] and fields["enable_caching"] and "lookahead_hashes" not in excluded:
        # The scheduler then builds the manager without use_eagle; the groups keep their flags.
        fields["num_hash_lookahead_tokens"], fields["use_eagle"] = ahead, False
    if not profile.admission_controls:  # options the release lacks (drawn all the same, so draws line up)
        fields["watermark"], fields["max_num_batched_tokens"] = 0.0, None
    try:
        return shape.name, KVCacheConfig(profile=profile, **fields)
    except ConfigError as exc:  # valid under another release, not under this profile
        return shape.name, f"{type(exc).__name__}: {exc}"


def retention_drawable(groups: Sequence[AttentionKind], profile: SemanticsProfile, shape: Shape) -> bool:
    """Whether a run of ``groups`` under ``profile`` draws a retention interval:
    the release has one and a group acts on it (``kvspec.retention.retention_applies``),
    without context parallelism or ring groups (kvspec does not model those with one)."""
    plain = shape.dcp * shape.pcp == 1 and not any(isinstance(g, RING_KINDS) for g in groups)
    return plain and any(retention_applies(g, profile) for g in groups)


def checkpointed(
    groups: Sequence[AttentionKind], gids: Sequence[int], count: int, alignment: int | None = None
) -> tuple[AttentionKind, ...]:
    """``groups`` with ``num_prefill_checkpoint_blocks = count`` and
    ``prefill_checkpoint_alignment = alignment`` in the Mamba groups ``gids``."""
    return tuple(
        replace(k, num_prefill_checkpoint_blocks=count, prefill_checkpoint_alignment=alignment)
        if g in gids and isinstance(k, Mamba)
        else k
        for g, k in enumerate(groups)
    )


_SWITCHES = (
    ("caching", "enable_caching", False),
    ("eagle", "use_eagle", False),
    ("events", "enable_kv_cache_events", False),
    ("stats", "log_stats", False),
    ("watermark", "watermark", 0.0),
)
"""Configuration switches an exclusion turns off: (feature, field, value)."""


def draw_tokens(data: st.DataObject, min_size: int, max_size: int) -> list[int]:
    """Between ``min_size`` and ``max_size`` tokens of the :data:`VOCAB` vocabulary.

    NOTE: drawn as one byte string, each byte a token modulo VOCAB (uniform,
    as 256 is a multiple of VOCAB), not as a list of integers: Hypothesis
    makes one choice for a byte string and two per list element (the element
    and whether another follows), and the token lists were a sixth of every
    choice a ci run made. It shrinks the same way: shorter, then towards 0.
    """
    return [b % VOCAB for b in byte_string(data, min_size, max_size)]


def fine_tail_group(cfg: KVCacheConfig) -> int | None:
    """The first group that registers partial-tail entries at two hash
    boundaries or more inside one block (the situation of
    ``SchedulerMachine.rekeyed_tails``), or None; only with caching on and
    without EAGLE or context parallelism."""
    if not cfg.enable_caching or cfg.use_eagle or cfg.dcp_world_size * cfg.pcp_world_size > 1:
        return None
    hbs = cfg.resolved_hash_block_size()
    for g, kind in enumerate(cfg.groups):
        if registers_partial_tail(kind, cfg.profile, hbs) and kind.block_size // hbs >= 3:
            return g
    return None
