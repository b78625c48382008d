"""Contract domains of the configuration rules: validators, context
parallelism, the features a configuration uses and the profile lookup.

Validators get unvalidated configuration values (:func:`raw_config`), so the
raising paths are in the domain too; the other functions get every valid
configuration of :func:`configs` and the refused ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import product

from kvproofs.bounded.domains import KINDS, PROFILE_LIST, configs, raw_config, refused_configs
from kvproofs.bounded.pep316 import Case, contract
from kvspec.config import (
    AttentionKind,
    ChunkedLocal,
    CircularBuffer,
    FullAttention,
    KpoolTail,
    Mamba,
    SinkFullAttention,
    SlidingWindow,
)

CFG = "kvspec.config"


@contract(
    f"{CFG}.validate_release_options",
    "every profile x watermark 0/0.25 x max_num_batched_tokens None/8 x eagle_groups ()/(0,) x MTP inputs "
    "(none, num_prefill_lookahead 2, a window's extra_retained_tokens 1)",
)
def _release_options() -> Iterator[Case]:
    mtp = (((FullAttention(2),), 0), ((FullAttention(2),), 2), ((SlidingWindow(2, 3, 1),), 0))
    for profile, watermark, mnbt, eagle, (groups, lookahead) in product(
        PROFILE_LIST, (0.0, 0.25), (None, 8), ((), (0,)), mtp
    ):
        yield (
            raw_config(
                groups, profile, watermark=watermark, max_num_batched_tokens=mnbt, eagle_groups=eagle,
                num_prefill_lookahead=lookahead,
            ),
        )  # fmt: skip


_LOOKAHEAD_GROUPS = ((FullAttention(2),), (FullAttention(4),), (FullAttention(2), SlidingWindow(4, 3, 1)))


@contract(
    f"{CFG}.validate_prefill_lookahead",
    "full attention (block 2 or 4) or a hybrid of scheduler block 4 x num_prefill_lookahead 0-5 x caching "
    "x EAGLE on/off x eagle_groups ()/(0,) x every profile",
)
def _prefill_lookahead() -> Iterator[Case]:
    for groups, lookahead, caching, eagle, flags, profile in product(
        _LOOKAHEAD_GROUPS, range(6), (True, False), (False, True), ((), (0,)), PROFILE_LIST
    ):
        cfg = raw_config(
            groups, profile, num_prefill_lookahead=lookahead, enable_caching=caching, use_eagle=eagle,
            eagle_groups=flags if profile.eagle_group_flags else (),
        )  # fmt: skip
        yield (cfg,)


@contract(
    f"{CFG}.uses_prefill_lookahead",
    "num_prefill_lookahead 0-3 x full attention, a window keeping 0 or 1 extra token, or both",
)
def _uses_lookahead() -> Iterator[Case]:
    groups_set = (
        (FullAttention(2),),
        (SlidingWindow(2, 3),),
        (SlidingWindow(2, 3, 1),),
        (FullAttention(2), SlidingWindow(2, 3, 1)),
    )
    for lookahead, groups in product(range(4), groups_set):
        yield (raw_config(groups, PROFILE_LIST[-1], num_prefill_lookahead=lookahead),)


@contract(
    f"{CFG}.num_reprefillable_tokens", "num_prefill_lookahead 0-6 x one group or a hybrid with a retaining window"
)
def _reprefillable() -> Iterator[Case]:
    for lookahead, groups in product(range(7), _LOOKAHEAD_GROUPS):
        yield (raw_config(groups, PROFILE_LIST[-1], num_prefill_lookahead=lookahead),)


_GROUP_PAIRS = [
    (a, b) for a, b in product((FullAttention(2), SlidingWindow(2, 3), CircularBuffer(2), KpoolTail(2, 2)), repeat=2)
]


@contract(
    f"{CFG}.validate_groups",
    "every profile x caching on/off x one group or two of full, window, ring kinds (equal ones too)",
)
def _groups() -> Iterator[Case]:
    for profile, caching, groups in product(PROFILE_LIST, (True, False), [(FullAttention(2),), *_GROUP_PAIRS]):
        yield (raw_config(groups, profile, enable_caching=caching),)


_INVALID_KINDS: tuple[object, ...] = (
    FullAttention(0),
    SlidingWindow(2, 0),
    KpoolTail(2, 0),
    ChunkedLocal(2, 0),
    SinkFullAttention(2, 3),
    SinkFullAttention(2, 0),
    Mamba(2, "sometimes"),  # type: ignore[arg-type]  # an invalid mode on purpose
    Mamba(2, "align", -1),
    SlidingWindow(2, 3, -1),
    "not a kind",
)


@contract(
    f"{CFG}.validate_kind",
    "the kind catalog and 10 invalid kinds, as group 0 or 1 after a full-attention group, x every profile "
    "x caching x EAGLE on/off",
)
def _kind() -> Iterator[Case]:
    for kind, gid, profile, caching, eagle in product(
        (*KINDS, *_INVALID_KINDS), (0, 1), PROFILE_LIST, (True, False), (False, True)
    ):
        groups = (kind,) if gid == 0 else (FullAttention(2), kind)
        yield gid, kind, raw_config(groups, profile, enable_caching=caching, use_eagle=eagle)


_CHECKPOINT_VALUES: tuple[object, ...] = (0, 1, 2, -1, True, 1.0, "1")
_ALIGNMENT_VALUES: tuple[object, ...] = (None, 1, 8, 0, -3, True, 2.0)


@contract(
    f"{CFG}.validate_prefill_checkpoints",
    "Mamba modes none/align x num_prefill_checkpoint_blocks 0, 1, 2, -1, True, 1.0, '1' x alignment None, 1, 8, "
    "0, -3, True, 2.0 x every profile",
)
def _prefill_checkpoints() -> Iterator[Case]:
    for mode, ncp, alignment, profile in product(
        ("none", "align"), _CHECKPOINT_VALUES, _ALIGNMENT_VALUES, PROFILE_LIST
    ):
        kind = Mamba(2, mode, 0, ncp, alignment)  # type: ignore[arg-type]  # invalid values on purpose
        yield "group 0 (Mamba)", kind, profile


@contract(f"{CFG}.cp_scale", "the kind catalog x dcp 1/2/4 x pcp 1/2 x every profile")
def _cp_scale() -> Iterator[Case]:
    for kind, dcp, pcp, profile in product(KINDS, (1, 2, 4), (1, 2), PROFILE_LIST):
        yield kind, raw_config((kind,), profile, dcp_world_size=dcp, pcp_world_size=pcp)


_ODD_SIZES: tuple[AttentionKind, ...] = (FullAttention(3), SlidingWindow(6, 4), Mamba(5, "align"), FullAttention(9))


@contract(
    f"{CFG}.scheduler_block_size_of",
    "every one- and two-group tuple of the kind catalog and of kinds of block 3, 5, 6 and 9, "
    "and every three-group tuple of those four",
)
def _scheduler_block_size_of() -> Iterator[Case]:
    pool = KINDS + _ODD_SIZES
    for n in (1, 2):
        for kinds in product(pool, repeat=n):
            yield (kinds,)
    for kinds in product(_ODD_SIZES, repeat=3):
        yield (kinds,)


@contract(f"{CFG}.cp_lookup_refusal", "the kind catalog x dcp 1/2/4 x pcp 1/2 x every profile")
def _cp_lookup_refusal() -> Iterator[Case]:
    yield from _cp_scale()


@contract(
    f"{CFG}.validate_cp",
    "one or two groups (sink fitting or not the scaled block) x caching x dcp 1/2 x pcp 1/2 x every profile",
)
def _validate_cp() -> Iterator[Case]:
    groups_set = (
        (SinkFullAttention(2, 2),),
        (SinkFullAttention(2, 4),),
        (FullAttention(2),),
        (FullAttention(2), SlidingWindow(2, 3)),
        (FullAttention(2), SinkFullAttention(2, 2)),
    )
    for groups, caching, dcp, pcp, profile in product(groups_set, (True, False), (1, 2), (1, 2), PROFILE_LIST):
        yield (raw_config(groups, profile, enable_caching=caching, dcp_world_size=dcp, pcp_world_size=pcp),)


@contract(
    f"{CFG}.validate_sink_room", "1-2 SinkFull groups of 1-2 sink blocks x num_blocks 1-5 x dcp 1/2 x every profile"
)
def _sink_room() -> Iterator[Case]:
    groups_set = (
        (SinkFullAttention(2, 2),),
        (SinkFullAttention(2, 4),),
        (SinkFullAttention(2, 4), SinkFullAttention(2, 2)),
        (FullAttention(2),),
    )
    for groups, n, dcp, profile in product(groups_set, range(1, 6), (1, 2), PROFILE_LIST):
        yield (raw_config(groups, profile, num_blocks=n, dcp_world_size=dcp),)


@contract(
    f"{CFG}.validate_unitary_hash_block",
    "one or two groups x hash_block_size None/1/2/4 x caching x dcp 1/2 x every profile",
)
def _unitary_hash_block() -> Iterator[Case]:
    groups_set = ((FullAttention(2),), (FullAttention(4),), (FullAttention(2), SlidingWindow(2, 3)))
    for groups, hbs, caching, dcp, profile in product(groups_set, (None, 1, 2, 4), (True, False), (1, 2), PROFILE_LIST):
        yield (raw_config(groups, profile, hash_block_size=hbs, enable_caching=caching, dcp_world_size=dcp),)


PROF = "kvspec.profiles"


@contract(f"{PROF}.profile_named", "every profile's name and release, and four unknown names")
def _profile_named() -> Iterator[Case]:
    for p in PROFILE_LIST:
        yield (p.name,)
        yield (p.release,)
    for name in ("", "vllm-", "0.0.0", "vllm-9.9.9"):
        yield (name,)


_CHECKPOINT_GROUPS = (
    (Mamba(4, "align", 0, 1),),
    (Mamba(4, "none", 0, 1),),
    (FullAttention(4), Mamba(4, "align", 0, 2)),
    (FullAttention(2), Mamba(4, "align", 0, 1)),
)


@contract(
    f"{PROF}.features_used",
    "the configuration domain (valid and refused), and checkpointing Mamba groups x caching x every profile",
)
def _features_used() -> Iterator[Case]:
    for cfg in (*configs(), *refused_configs()):
        yield (cfg,)
    for groups, caching, profile in product(_CHECKPOINT_GROUPS, (True, False), PROFILE_LIST):
        yield (raw_config(groups, profile, enable_caching=caching),)


@contract(f"{PROF}.unsupported_reason", "the configuration domain (valid and refused)")
def _unsupported_reason() -> Iterator[Case]:
    yield from _features_used()


@contract(f"{PROF}.unmodelled_v016_rules", "the configuration domain (valid and refused)")
def _unmodelled_v016() -> Iterator[Case]:
    yield from _features_used()


@contract(f"{PROF}.unmodelled_cp_rules", "the configuration domain (valid and refused)")
def _unmodelled_cp() -> Iterator[Case]:
    yield from _features_used()


@contract("kvspec.partial_hits.partial_hash_hits_enabled", "the configuration domain (valid and refused)")
def _partial_hash_hits_enabled() -> Iterator[Case]:
    yield from _features_used()


@contract("kvspec.kv_cache_coordinator.make_coordinator", "every valid configuration of the domain")
def _make_coordinator() -> Iterator[Case]:
    for cfg in configs():
        yield (cfg,)


STM = "kvspec.single_type_kv_cache_manager"


@contract(f"{STM}.num_sink_blocks", "block sizes 1-16 x sinks of 0-64 tokens (whole blocks or not) x every profile")
def _num_sink_blocks() -> Iterator[Case]:
    # Enumerated, not left to CrossHair: its condition `__return__ * kind.block_size == kind.sink_len`
    # is nonlinear, and twice a clean-clone CI run ended it "not refuted" where every local run
    # exhausted it (proofs/README.md, "Determinism and time").
    for bs, sink, profile in product(range(1, 17), range(65), PROFILE_LIST):
        yield SinkFullAttention(bs, sink), profile


KCM = "kvspec.kv_cache_manager"


@contract(f"{KCM}.lagging_hits_allowed", "every valid configuration of the domain")
def _lagging_hits_allowed() -> Iterator[Case]:
    for cfg in configs():
        yield (cfg,)


@contract(f"{KCM}.hit_list_fits", "the kind catalog x lengths 0-4 x needs 0-4 x lagging or not")
def _hit_list_fits() -> Iterator[Case]:
    yield from product(KINDS, range(5), range(5), (False, True))


@contract(
    f"{KCM}.truncated_group",
    "the kind catalog x lists of 0-3 blocks (with a null one) x lengths 0-10 x group 0 x every profile",
)
def _truncated_group() -> Iterator[Case]:
    lists: tuple[list[int], ...] = ([], [5], [0, 5], [5, 6, 7])
    for kind, ids, n, profile in product(KINDS, lists, range(11), PROFILE_LIST):
        yield kind, list(ids), n, 0, profile


_RETENTION_GROUPS = (
    (FullAttention(2),),
    (SlidingWindow(2, 3),),
    (Mamba(2, "align"),),
    (FullAttention(4), SlidingWindow(2, 3)),
    (FullAttention(2), Mamba(2, "all")),
    (FullAttention(2), CircularBuffer(1)),
)


@contract(
    f"{CFG}.validate_retention",
    "full attention, a window, Mamba, full attention with a window (scheduler block 4), with Mamba, with a ring "
    "x retention None, 0, 2, 3, 4, 8, -4, True x DCP 1/2 x every profile",
)
def _retention() -> Iterator[Case]:
    for groups, retention, dcp, profile in product(
        _RETENTION_GROUPS, (None, 0, 2, 3, 4, 8, -4, True), (1, 2), PROFILE_LIST
    ):
        yield (raw_config(groups, profile, prefix_cache_retention_interval=retention, dcp_world_size=dcp),)


@contract(
    "kvspec.retention.reachable_boundaries",
    "every profile x prompts of 1-9 tokens x scheduler blocks 2/4 x an EAGLE model or not x junctions 0-9 "
    "x an EAGLE group or not x group blocks 1/2",
)
def _boundaries() -> Iterator[Case]:
    yield from product(
        PROFILE_LIST, range(1, 10), (2, 4), (False, True), range(10), (False, True), (1, 2)
    )


@contract("kvspec.retention.retention_applies", "every kind of the catalog x every profile")
def _retention_applies() -> Iterator[Case]:
    yield from product(KINDS, PROFILE_LIST)


@contract(
    "kvspec.single_type_kv_cache_manager.retention_block_mask",
    "full attention, windows of 1, 3 and 5 tokens and Mamba at blocks 1-2 x blocks [start, end) within 0-6 "
    "x alignment 1-2 blocks x EAGLE x retention 0-3 alignments x up to two boundaries in -2..13",
)
def _retention_mask() -> Iterator[Case]:
    kinds: tuple[FullAttention | SlidingWindow | Mamba, ...] = (
        FullAttention(2), SlidingWindow(1, 1), SlidingWindow(2, 3), SlidingWindow(2, 5), Mamba(1, "all"),
        Mamba(2, "align"),
    )  # fmt: skip
    spans = [(s, e) for s in range(7) for e in range(s, 7)]
    bounds = ((), (5,), (-2,), (13,), (3, 9))
    for kind, (start, end), per, eagle, ret, bs in product(kinds, spans, (1, 2), (False, True), range(4), bounds):
        alignment = per * kind.block_size
        yield kind, start, end, alignment, eagle, ret * alignment, bs
