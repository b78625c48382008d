"""Mamba prefill checkpoints of vLLM 0.30.0 to 0.34.0 (``kvspec.prefill_checkpoints``,
the positional forms "chunk-position", "prompt-end", "reachable" and
"hash-lookahead"): the rules as values, and cases measured on the real
``KVCacheManager`` of each release replayed through kvspec.

Every measured case is a full-attention group and a Mamba align group with one
checkpoint block, a 64-block pool, one prompt of ``plen`` tokens allocated in
the given chunks (cached as it goes), then looked up (the same prompt, and one
40 tokens longer) while it runs and again after it is freed. Each step records
the chunk, the Mamba group's estimate (not the admission check), the new block
ids per group (0 is the null block), the Mamba table pattern (N null, B a
block), the keyed Mamba blocks ``index:id@tokens``, the checkpoint
``(position, slot)`` the manager keeps, and the KV events (``S``: BlockStored
with its group, hash count and block size; ``R``: BlockRemoved). Then come the
Mamba keys left after ``free`` as ``(tokens, ids)`` and the two hits
``(tokens, ((index, id), ...))`` while the request runs (the same after the
free, as measured).

A hash block finer than the Mamba block needs fine-grained hits, which kvspec
has not been checked against in lockstep for these releases
(:data:`kvspec.profiles.PARTIAL_HASH_HITS_CHECKED`), so such configurations are
refused; their cases here lift that refusal for the test alone.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

import kvspec.profiles
from kvspec.config import FullAttention, KVCacheConfig, Mamba
from kvspec.errors import ConfigError, UnsupportedByProfileError
from kvspec.events import BlockRemoved, BlockStored, KVCacheEvent
from kvspec.hashing import make_key
from kvspec.kv_cache_manager import KVCacheManager
from kvspec.prefill_checkpoints import (
    CheckpointGeometry,
    checkpoint_granularity,
    checkpoint_kept,
    checkpoint_position,
    checkpoint_prefill_end,
    checkpoint_valid,
    chunk_checkpoint,
)
from kvspec.profiles import (
    PREFILL_CHECKPOINTS_MODELLED,
    PROFILES,
    VLLM_0_29_0,
    VLLM_0_30_0,
    VLLM_0_31_0,
    VLLM_0_32_0,
    VLLM_0_33_0,
    VLLM_0_34_0,
    SemanticsProfile,
    features_used,
    profile_named,
    release_key,
)
from kvspec.request import RequestBlockHasher
from kvspec.single_type_kv_cache_manager import MambaManager

N = 0  # the null block
LATER = (VLLM_0_30_0, VLLM_0_31_0, VLLM_0_32_0, VLLM_0_33_0, VLLM_0_34_0)

Step = tuple[str, int, tuple[tuple[int, ...], ...], str, tuple[str, ...], tuple[int, int] | None, tuple[str, ...]]
Hit = tuple[int, tuple[tuple[int, int], ...]]

MEASURED: list[tuple[str, str, list[Step], tuple[tuple[int, tuple[int, ...]], ...], tuple[Hit, Hit]]] = [
    (
        "0.30.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=70 chunks=70",
        [
            (
                "0->70",
                2,
                ((1, 2, 3, 4, 5), (0, 0, 0, 6, 7)),
                "NNNBB",
                ("3:6@64",),
                (64, 3),
                ("S(g0,n=4,bs=16)", "S(g1,n=1,bs=16)"),
            )
        ],
        ((64, (6,)),),
        ((64, ((3, 6),)), (64, ((3, 6),))),
    ),
    (
        "0.30.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=48 plen=70 chunks=70",
        [
            (
                "0->70",
                2,
                ((1, 2, 3, 4, 5), (0, 0, 0, 6, 7)),
                "NNNBB",
                ("3:6@64",),
                (64, 3),
                ("S(g0,n=4,bs=16)", "S(g1,n=1,bs=16)"),
            )
        ],
        ((64, (6,)),),
        ((64, ((3, 6),)), (64, ((3, 6),))),
    ),
    (
        "0.30.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=0 plen=70 chunks=70",
        [
            (
                "0->70",
                2,
                ((1, 2, 3, 4, 5), (0, 0, 0, 6, 7)),
                "NNNBB",
                (),
                (64, 3),
                ("S(g0,n=4,bs=16)", "S(g1,n=1,bs=16)", "R(g1,n=1)"),
            )
        ],
        (),
        ((0, ()), (0, ())),
    ),
    (
        "0.30.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=70 chunks=32+38",
        [
            ("0->32", 2, ((1, 2), (3, 4)), "BB", ("0:3@16", "1:4@32"), (16, 0), ("S(g0,n=2,bs=16)", "S(g1,n=2,bs=16)")),
            (
                "32->70",
                3,
                ((5, 6, 7), (0, 8, 9)),
                "NBNBB",
                ("1:4@32", "3:8@64"),
                (64, 3),
                ("S(g0,n=2,bs=16)", "S(g1,n=1,bs=16)"),
            ),
        ],
        ((16, (3,)), (32, (4,)), (64, (8,))),
        ((64, ((3, 8),)), (64, ((3, 8),))),
    ),
    (
        "0.30.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=0 plen=70 chunks=32+38",
        [
            ("0->32", 2, ((1, 2), (3, 4)), "BB", (), (16, 0), ("S(g0,n=2,bs=16)", "S(g1,n=0,bs=16)")),
            (
                "32->70",
                3,
                ((3, 5, 6), (0, 7, 8)),
                "NBNBB",
                (),
                (64, 3),
                ("S(g0,n=2,bs=16)", "S(g1,n=1,bs=16)", "R(g1,n=1)"),
            ),
        ],
        (),
        ((0, ()), (0, ())),
    ),
    (
        "0.30.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=48 plen=70 chunks=32+38",
        [
            (
                "0->32",
                2,
                ((1, 2), (3, 4)),
                "BB",
                ("0:3@16",),
                (16, 0),
                ("S(g0,n=2,bs=16)", "S(g1,n=0,bs=16)", "S(g1,n=1,bs=16)"),
            ),
            (
                "32->70",
                3,
                ((5, 6, 7), (0, 8, 9)),
                "NBNBB",
                ("3:8@64",),
                (64, 3),
                ("S(g0,n=2,bs=16)", "S(g1,n=1,bs=16)"),
            ),
        ],
        ((16, (3,)), (64, (8,))),
        ((64, ((3, 8),)), (64, ((3, 8),))),
    ),
    (
        "0.30.0",
        "FA16+M16 hbs=None ncp=1 align=3 ret=None plen=70 chunks=32+38",
        [
            ("0->32", 1, ((1, 2), (0, 3)), "NB", ("1:3@32",), None, ("S(g0,n=2,bs=16)", "S(g1,n=1,bs=16)")),
            ("32->70", 1, ((4, 5, 6), (0, 0, 7)), "NBNNB", ("1:3@32",), None, ("S(g0,n=2,bs=16)", "S(g1,n=0,bs=16)")),
        ],
        ((32, (3,)),),
        ((32, ((1, 3),)), (32, ((1, 3),))),
    ),
    (
        "0.30.0",
        "FA16+M16 hbs=None ncp=1 align=None ret=None plen=70 chunks=32+38",
        [
            ("0->32", 1, ((1, 2), (0, 3)), "NB", ("1:3@32",), None, ("S(g0,n=2,bs=16)", "S(g1,n=1,bs=16)")),
            ("32->70", 1, ((4, 5, 6), (0, 0, 7)), "NBNNB", ("1:3@32",), None, ("S(g0,n=2,bs=16)", "S(g1,n=0,bs=16)")),
        ],
        ((32, (3,)),),
        ((32, ((1, 3),)), (32, ((1, 3),))),
    ),
    (
        "0.30.0",
        "FA16+M16 hbs=None ncp=1 align=8 ret=None plen=70 chunks=70",
        [
            (
                "0->70",
                2,
                ((1, 2, 3, 4, 5), (0, 0, 0, 6, 7)),
                "NNNBB",
                ("3:6@64",),
                (64, 3),
                ("S(g0,n=4,bs=16)", "S(g1,n=1,bs=16)"),
            )
        ],
        ((64, (6,)),),
        ((64, ((3, 6),)), (64, ((3, 6),))),
    ),
    (
        "0.30.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=0 plen=64 chunks=64",
        [
            (
                "0->64",
                2,
                ((1, 2, 3, 4), (0, 0, 5, 6)),
                "NNBB",
                ("2:5@48",),
                (48, 2),
                ("S(g0,n=4,bs=16)", "S(g1,n=1,bs=16)"),
            )
        ],
        ((48, (5,)),),
        ((48, ((2, 5),)), (48, ((2, 5),))),
    ),
    (
        "0.30.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=64 chunks=64",
        [
            (
                "0->64",
                2,
                ((1, 2, 3, 4), (0, 0, 5, 6)),
                "NNBB",
                ("2:5@48", "3:6@64"),
                (48, 2),
                ("S(g0,n=4,bs=16)", "S(g1,n=2,bs=16)"),
            )
        ],
        ((48, (5,)), (64, (6,))),
        ((48, ((2, 5),)), (64, ((3, 6),))),
    ),
    (
        "0.30.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=100 chunks=32+68",
        [
            ("0->32", 2, ((1, 2), (3, 4)), "BB", ("0:3@16", "1:4@32"), (16, 0), ("S(g0,n=2,bs=16)", "S(g1,n=2,bs=16)")),
            (
                "32->100",
                5,
                ((5, 6, 7, 8, 9), (0, 0, 0, 10, 11)),
                "NBNNNBB",
                ("1:4@32", "5:10@96"),
                (96, 5),
                ("S(g0,n=4,bs=16)", "S(g1,n=1,bs=16)"),
            ),
        ],
        ((16, (3,)), (32, (4,)), (96, (10,))),
        ((96, ((5, 10),)), (96, ((5, 10),))),
    ),
    (
        "0.30.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=70 chunks=70 EAGLE(flagged)",
        [
            (
                "0->70",
                2,
                ((1, 2, 3, 4, 5), (0, 0, 0, 6, 7)),
                "NNNBB",
                ("3:6@48",),
                (48, 3),
                ("S(g0,n=4,bs=16)", "S(g1,n=1,bs=16)", "R(g1,n=1)", "S(g1,n=1,bs=16)"),
            )
        ],
        ((48, (6,)),),
        ((48, ((2, 6),)), (48, ((2, 6),))),
    ),
    (
        "0.30.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=64 chunks=64 EAGLE(flagged)",
        [
            (
                "0->64",
                2,
                ((1, 2, 3, 4), (0, 0, 5, 6)),
                "NNBB",
                ("2:5@32", "3:6@64"),
                (32, 2),
                ("S(g0,n=4,bs=16)", "S(g1,n=2,bs=16)", "R(g1,n=1)", "S(g1,n=1,bs=16)"),
            )
        ],
        ((32, (5,)), (64, (6,))),
        ((32, ((1, 5),)), (32, ((1, 5),))),
    ),
    (
        "0.30.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=70 chunks=32+38 EAGLE(flagged)",
        [
            ("0->32", 1, ((1, 2), (0, 3)), "NB", ("1:3@32",), None, ("S(g0,n=2,bs=16)", "S(g1,n=1,bs=16)")),
            (
                "32->70",
                3,
                ((4, 5, 6), (0, 7, 8)),
                "NBNBB",
                ("1:3@32", "3:7@48"),
                (48, 3),
                ("S(g0,n=2,bs=16)", "S(g1,n=1,bs=16)", "R(g1,n=1)", "S(g1,n=1,bs=16)"),
            ),
        ],
        ((32, (3,)), (48, (7,))),
        ((48, ((2, 7),)), (48, ((2, 7),))),
    ),
    (
        "0.30.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=100 chunks=100 EAGLE(flagged)",
        [
            (
                "0->100",
                2,
                ((1, 2, 3, 4, 5, 6, 7), (0, 0, 0, 0, 0, 8, 9)),
                "NNNNNBB",
                ("5:8@80",),
                (80, 5),
                ("S(g0,n=6,bs=16)", "S(g1,n=1,bs=16)", "R(g1,n=1)", "S(g1,n=1,bs=16)"),
            )
        ],
        ((80, (8,)),),
        ((80, ((4, 8),)), (80, ((4, 8),))),
    ),
    (
        "0.31.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=0 plen=70 chunks=70",
        [
            (
                "0->70",
                2,
                ((1, 2, 3, 4, 5), (0, 0, 0, 6, 7)),
                "NNNBB",
                ("3:6@64",),
                (64, 3),
                ("S(g0,n=4,bs=16)", "S(g1,n=1,bs=16)"),
            )
        ],
        ((64, (6,)),),
        ((64, ((3, 6),)), (64, ((3, 6),))),
    ),
    (
        "0.31.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=0 plen=70 chunks=32+38",
        [
            ("0->32", 1, ((1, 2), (0, 3)), "NB", (), None, ("S(g0,n=2,bs=16)", "S(g1,n=0,bs=16)")),
            (
                "32->70",
                2,
                ((4, 5, 6), (0, 7, 8)),
                "NBNBB",
                ("3:7@64",),
                (64, 3),
                ("S(g0,n=2,bs=16)", "S(g1,n=1,bs=16)"),
            ),
        ],
        ((64, (7,)),),
        ((64, ((3, 7),)), (64, ((3, 7),))),
    ),
    (
        "0.31.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=32 plen=70 chunks=32+38",
        [
            (
                "0->32",
                2,
                ((1, 2), (3, 4)),
                "BB",
                ("0:3@16", "1:4@32"),
                (16, 0),
                ("S(g0,n=2,bs=16)", "S(g1,n=1,bs=16)", "S(g1,n=1,bs=16)"),
            ),
            (
                "32->70",
                2,
                ((5, 6, 7), (0, 8, 9)),
                "NBNBB",
                ("1:4@32", "3:8@64"),
                (64, 3),
                ("S(g0,n=2,bs=16)", "S(g1,n=1,bs=16)"),
            ),
        ],
        ((16, (3,)), (32, (4,)), (64, (8,))),
        ((64, ((3, 8),)), (64, ((3, 8),))),
    ),
    (
        "0.31.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=48 plen=70 chunks=32+38",
        [
            (
                "0->32",
                2,
                ((1, 2), (3, 4)),
                "BB",
                ("0:3@16",),
                (16, 0),
                ("S(g0,n=2,bs=16)", "S(g1,n=0,bs=16)", "S(g1,n=1,bs=16)"),
            ),
            (
                "32->70",
                2,
                ((5, 6, 7), (0, 8, 9)),
                "NBNBB",
                ("3:8@64",),
                (64, 3),
                ("S(g0,n=2,bs=16)", "S(g1,n=1,bs=16)"),
            ),
        ],
        ((16, (3,)), (64, (8,))),
        ((64, ((3, 8),)), (64, ((3, 8),))),
    ),
    (
        "0.31.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=0 plen=70 chunks=48+22",
        [
            ("0->48", 1, ((1, 2, 3), (0, 0, 4)), "NNB", (), None, ("S(g0,n=3,bs=16)", "S(g1,n=0,bs=16)")),
            ("48->70", 2, ((5, 6), (7, 8)), "NNBBB", ("3:7@64",), (64, 3), ("S(g0,n=1,bs=16)", "S(g1,n=1,bs=16)")),
        ],
        ((64, (7,)),),
        ((64, ((3, 7),)), (64, ((3, 7),))),
    ),
    (
        "0.31.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=100 chunks=32+68",
        [
            ("0->32", 2, ((1, 2), (3, 4)), "BB", ("0:3@16", "1:4@32"), (16, 0), ("S(g0,n=2,bs=16)", "S(g1,n=2,bs=16)")),
            (
                "32->100",
                2,
                ((5, 6, 7, 8, 9), (0, 0, 0, 10, 11)),
                "NBNNNBB",
                ("1:4@32", "5:10@96"),
                (96, 5),
                ("S(g0,n=4,bs=16)", "S(g1,n=1,bs=16)"),
            ),
        ],
        ((16, (3,)), (32, (4,)), (96, (10,))),
        ((96, ((5, 10),)), (96, ((5, 10),))),
    ),
    (
        "0.31.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=64 chunks=64 EAGLE(flagged)",
        [
            (
                "0->64",
                2,
                ((1, 2, 3, 4), (0, 0, 5, 6)),
                "NNBB",
                ("2:5@32", "3:6@64"),
                (32, 2),
                ("S(g0,n=4,bs=16)", "S(g1,n=2,bs=16)", "R(g1,n=1)", "S(g1,n=1,bs=16)"),
            )
        ],
        ((32, (5,)), (64, (6,))),
        ((32, ((1, 5),)), (32, ((1, 5),))),
    ),
    (
        "0.32.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=70 chunks=32+38",
        [
            ("0->32", 2, ((1, 2), (3, 4)), "BB", ("0:3@16", "1:4@32"), (16, 0), ("S(g0,n=2,bs=16)", "S(g1,n=2,bs=16)")),
            (
                "32->70",
                2,
                ((5, 6, 7), (0, 8, 9)),
                "NBNBB",
                ("1:4@32", "3:8@64"),
                (64, 3),
                ("S(g0,n=2,bs=16)", "S(g1,n=1,bs=16)"),
            ),
        ],
        ((16, (3,)), (32, (4,)), (64, (8,))),
        ((64, ((3, 8),)), (64, ((3, 8),))),
    ),
    (
        "0.32.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=32 plen=70 chunks=32+38",
        [
            ("0->32", 2, ((1, 2), (3, 4)), "BB", ("1:4@32",), (16, 0), ("S(g0,n=2,bs=16)", "S(g1,n=1,bs=16)")),
            (
                "32->70",
                2,
                ((3, 5, 6), (0, 7, 8)),
                "NBNBB",
                ("1:4@32", "3:7@64"),
                (64, 3),
                ("S(g0,n=2,bs=16)", "S(g1,n=1,bs=16)"),
            ),
        ],
        ((32, (4,)), (64, (7,))),
        ((64, ((3, 7),)), (64, ((3, 7),))),
    ),
    (
        "0.32.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=48 plen=70 chunks=32+38",
        [
            ("0->32", 2, ((1, 2), (3, 4)), "BB", (), (16, 0), ("S(g0,n=2,bs=16)", "S(g1,n=0,bs=16)")),
            (
                "32->70",
                2,
                ((3, 5, 6), (0, 7, 8)),
                "NBNBB",
                ("3:7@64",),
                (64, 3),
                ("S(g0,n=2,bs=16)", "S(g1,n=1,bs=16)"),
            ),
        ],
        ((64, (7,)),),
        ((64, ((3, 7),)), (64, ((3, 7),))),
    ),
    (
        "0.32.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=48 plen=70 chunks=20+50",
        [
            ("0->20", 2, ((1, 2), (3, 4)), "BB", (), (16, 0), ("S(g0,n=1,bs=16)", "S(g1,n=0,bs=16)")),
            ("20->70", 1, ((3, 5, 6), (0, 0, 7)), "NBNNB", (), None, ("S(g0,n=3,bs=16)", "S(g1,n=0,bs=16)")),
        ],
        (),
        ((0, ()), (0, ())),
    ),
    (
        "0.32.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=64 chunks=64 EAGLE(flagged)",
        [
            (
                "0->64",
                2,
                ((1, 2, 3, 4), (0, 0, 5, 6)),
                "NNBB",
                ("2:5@48", "3:6@64"),
                (48, 2),
                ("S(g0,n=4,bs=16)", "S(g1,n=2,bs=16)"),
            )
        ],
        ((48, (5,)), (64, (6,))),
        ((48, ((2, 5),)), (48, ((2, 5),))),
    ),
    (
        "0.32.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=70 chunks=32+38 EAGLE(flagged)",
        [
            ("0->32", 2, ((1, 2), (3, 4)), "BB", ("0:3@16", "1:4@32"), (16, 0), ("S(g0,n=2,bs=16)", "S(g1,n=2,bs=16)")),
            (
                "32->70",
                2,
                ((5, 6, 7), (0, 8, 9)),
                "NBNBB",
                ("1:4@32", "3:8@48"),
                (48, 3),
                ("S(g0,n=2,bs=16)", "S(g1,n=1,bs=16)", "R(g1,n=1)", "S(g1,n=1,bs=16)"),
            ),
        ],
        ((16, (3,)), (32, (4,)), (48, (8,))),
        ((48, ((2, 8),)), (48, ((2, 8),))),
    ),
    (
        "0.33.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=70 chunks=32+38",
        [
            ("0->32", 2, ((1, 2), (3, 4)), "BB", ("0:3@16", "1:4@32"), (16, 0), ("S(g0,n=2,bs=16)", "S(g1,n=2,bs=16)")),
            (
                "32->70",
                2,
                ((5, 6, 7), (0, 8, 9)),
                "NBNBB",
                ("1:4@32", "3:8@64"),
                (64, 3),
                ("S(g0,n=2,bs=16)", "S(g1,n=1,bs=16)"),
            ),
        ],
        ((16, (3,)), (32, (4,)), (64, (8,))),
        ((64, ((3, 8),)), (64, ((3, 8),))),
    ),
    (
        "0.33.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=70 chunks=70 lookahead=4",
        [
            (
                "0->70",
                2,
                ((1, 2, 3, 4, 5), (0, 0, 0, 6, 7)),
                "NNNBB",
                ("3:6@64",),
                (64, 3),
                ("S(g0,n=4,bs=16)", "S(g1,n=1,bs=16)"),
            )
        ],
        ((64, (6,)),),
        ((64, ((3, 6),)), (64, ((3, 6),))),
    ),
    (
        "0.33.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=70 chunks=70 lookahead=8",
        [
            (
                "0->70",
                2,
                ((1, 2, 3, 4, 5), (0, 0, 0, 6, 7)),
                "NNNBB",
                ("3:6@48",),
                (48, 3),
                ("S(g0,n=3,bs=16)", "S(g1,n=0,bs=16)", "S(g1,n=1,bs=16)"),
            )
        ],
        ((48, (6,)),),
        ((48, ((2, 6),)), (48, ((2, 6),))),
    ),
    (
        "0.34.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=70 chunks=32+38",
        [
            ("0->32", 2, ((1, 2), (3, 4)), "BB", ("0:3@16", "1:4@32"), (16, 0), ("S(g0,n=2,bs=16)", "S(g1,n=2,bs=16)")),
            (
                "32->70",
                2,
                ((5, 6, 7), (0, 8, 9)),
                "NBNBB",
                ("1:4@32", "3:8@64"),
                (64, 3),
                ("S(g0,n=2,bs=16)", "S(g1,n=1,bs=16)"),
            ),
        ],
        ((16, (3,)), (32, (4,)), (64, (8,))),
        ((64, ((3, 8),)), (64, ((3, 8),))),
    ),
    (
        "0.34.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=0 plen=70 chunks=32+38",
        [
            ("0->32", 1, ((1, 2), (0, 3)), "NB", (), None, ("S(g0,n=2,bs=16)", "S(g1,n=0,bs=16)")),
            (
                "32->70",
                2,
                ((4, 5, 6), (0, 7, 8)),
                "NBNBB",
                ("3:7@64",),
                (64, 3),
                ("S(g0,n=2,bs=16)", "S(g1,n=1,bs=16)"),
            ),
        ],
        ((64, (7,)),),
        ((64, ((3, 7),)), (64, ((3, 7),))),
    ),
    (
        "0.34.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=70 chunks=70 lookahead=8",
        [
            (
                "0->70",
                2,
                ((1, 2, 3, 4, 5), (0, 0, 0, 6, 7)),
                "NNNBB",
                ("3:6@48",),
                (48, 3),
                ("S(g0,n=3,bs=16)", "S(g1,n=0,bs=16)", "S(g1,n=1,bs=16)"),
            )
        ],
        ((48, (6,)),),
        ((48, ((2, 6),)), (48, ((2, 6),))),
    ),
    (
        "0.30.0",
        "FA16+M16 hbs=4 ncp=1 align=1 ret=None plen=70 chunks=32+38",
        [
            (
                "0->32",
                2,
                ((1, 2), (3, 4)),
                "BB",
                ("0:3@28", "1:4@32"),
                (28, 0),
                ("S(g0,n=2,bs=16)", "S(g1,n=2,bs=16)", "R(g1,n=1)", "S(g1,n=1,bs=4)"),
            ),
            (
                "32->70",
                3,
                ((5, 6, 7), (0, 8, 9)),
                "NBNBB",
                ("1:4@32", "3:8@68"),
                (68, 3),
                ("S(g0,n=2,bs=16)", "S(g0,n=1,bs=4)", "S(g1,n=1,bs=16)", "R(g1,n=1)", "S(g1,n=1,bs=4)"),
            ),
        ],
        ((28, (3,)), (32, (4,)), (68, (8,))),
        ((68, ((4, 8),)), (68, ((4, 8),))),
    ),
    (
        "0.30.0",
        "FA16+M16 hbs=4 ncp=1 align=1 ret=None plen=70 chunks=68+2",
        [
            (
                "0->68",
                2,
                ((1, 2, 3, 4, 5), (0, 0, 0, 6, 7)),
                "NNNBB",
                ("3:6@64",),
                (64, 3),
                ("S(g0,n=4,bs=16)", "S(g0,n=1,bs=4)", "S(g1,n=1,bs=16)"),
            ),
            ("68->70", 0, ((), ()), "NNNNB", (), None, ()),
        ],
        ((64, (6,)),),
        ((64, ((3, 6),)), (64, ((3, 6),))),
    ),
    (
        "0.30.0",
        "FA16+M16 hbs=4 ncp=1 align=1 ret=0 plen=70 chunks=68+2",
        [
            (
                "0->68",
                2,
                ((1, 2, 3, 4, 5), (0, 0, 0, 6, 7)),
                "NNNBB",
                (),
                (64, 3),
                ("S(g0,n=4,bs=16)", "S(g0,n=1,bs=4)", "S(g1,n=1,bs=16)", "R(g1,n=1)"),
            ),
            ("68->70", 0, ((), ()), "NNNNB", (), None, ()),
        ],
        (),
        ((0, ()), (0, ())),
    ),
    (
        "0.31.0",
        "FA16+M16 hbs=4 ncp=1 align=1 ret=0 plen=70 chunks=68+2",
        [
            (
                "0->68",
                1,
                ((1, 2, 3, 4, 5), (0, 0, 0, 0, 6)),
                "NNNNB",
                ("4:6@68",),
                None,
                ("S(g0,n=4,bs=16)", "S(g0,n=1,bs=4)", "S(g1,n=0,bs=16)", "S(g1,n=1,bs=4)"),
            ),
            ("68->70", 1, ((), ()), "NNNNB", (), None, ()),
        ],
        ((68, (7,)),),
        ((68, ((4, 7),)), (68, ((4, 7),))),
    ),
    (
        "0.32.0",
        "FA16+M16 hbs=4 ncp=1 align=1 ret=None plen=70 chunks=32+38",
        [
            (
                "0->32",
                2,
                ((1, 2), (3, 4)),
                "BB",
                ("1:4@32",),
                (28, 0),
                ("S(g0,n=2,bs=16)", "S(g1,n=2,bs=16)", "R(g1,n=1)"),
            ),
            (
                "32->70",
                2,
                ((3, 5, 6), (0, 7, 8)),
                "NBNBB",
                ("1:4@32", "3:7@68"),
                (68, 3),
                ("S(g0,n=2,bs=16)", "S(g0,n=1,bs=4)", "S(g1,n=1,bs=16)", "R(g1,n=1)", "S(g1,n=1,bs=4)"),
            ),
        ],
        ((32, (4,)), (68, (7,))),
        ((68, ((4, 7),)), (68, ((4, 7),))),
    ),
    (
        "0.32.0",
        "FA16+M16 hbs=4 ncp=1 align=1 ret=None plen=70 chunks=64+6",
        [
            (
                "0->64",
                2,
                ((1, 2, 3, 4), (0, 0, 5, 6)),
                "NNBB",
                ("3:6@64",),
                (60, 2),
                ("S(g0,n=4,bs=16)", "S(g1,n=2,bs=16)", "R(g1,n=1)"),
            ),
            ("64->70", 1, ((5,), (7,)), "NNNBB", ("3:6@64",), None, ("S(g0,n=1,bs=4)",)),
        ],
        ((64, (6,)),),
        ((64, ((3, 6),)), (64, ((3, 6),))),
    ),
    (
        "0.33.0",
        "FA16+M16 hbs=4 ncp=1 align=1 ret=None plen=70 chunks=70",
        [
            (
                "0->70",
                2,
                ((1, 2, 3, 4, 5), (0, 0, 0, 6, 7)),
                "NNNBB",
                ("3:6@68",),
                (68, 3),
                ("S(g0,n=4,bs=16)", "S(g0,n=1,bs=4)", "S(g1,n=1,bs=16)", "R(g1,n=1)", "S(g1,n=1,bs=4)"),
            )
        ],
        ((68, (6,)),),
        ((68, ((4, 6),)), (68, ((4, 6),))),
    ),
    (
        "0.33.0",
        "FA16+M16 hbs=4 ncp=1 align=1 ret=None plen=70 chunks=70 lookahead=8",
        [
            (
                "0->70",
                2,
                ((1, 2, 3, 4, 5), (0, 0, 0, 6, 7)),
                "NNNBB",
                ("3:6@60",),
                (60, 3),
                ("S(g0,n=3,bs=16)", "S(g0,n=1,bs=4)", "S(g1,n=0,bs=16)", "S(g1,n=1,bs=4)"),
            )
        ],
        ((60, (6,)),),
        ((60, ((3, 6),)), (60, ((3, 6),))),
    ),
    # speculative decoding, one scratch block (measured for this branch, not in the report's matrix)
    (
        "0.30.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=70 chunks=32+38 spec=1",
        [
            (
                "0->32",
                3,
                ((1, 2), (3, 4, 5)),
                "BBB",
                ("0:3@16", "1:4@32"),
                (16, 0),
                ("S(g0,n=2,bs=16)", "S(g1,n=2,bs=16)"),
            ),
            (
                "32->70",
                3,
                ((6, 7, 8), (9, 10, 11)),
                "NBBBBB",
                ("1:4@32", "2:5@48", "3:9@64"),
                (64, 3),
                ("S(g0,n=2,bs=16)", "S(g1,n=2,bs=16)"),
            ),
        ],
        ((16, (3,)), (32, (4,)), (48, (5,)), (64, (9,))),
        ((64, ((3, 9),)), (64, ((3, 9),))),
    ),
    (
        "0.31.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=70 chunks=32+38 spec=1",
        [
            (
                "0->32",
                3,
                ((1, 2), (3, 4, 5)),
                "BBB",
                ("0:3@16", "1:4@32"),
                (16, 0),
                ("S(g0,n=2,bs=16)", "S(g1,n=2,bs=16)"),
            ),
            (
                "32->70",
                3,
                ((6, 7, 8), (9, 10, 11)),
                "NBBBBB",
                ("1:4@32", "2:5@48", "3:9@64"),
                (64, 3),
                ("S(g0,n=2,bs=16)", "S(g1,n=2,bs=16)"),
            ),
        ],
        ((16, (3,)), (32, (4,)), (48, (5,)), (64, (9,))),
        ((64, ((3, 9),)), (64, ((3, 9),))),
    ),
    (
        "0.32.0",
        "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=70 chunks=32+38 spec=1",
        [
            (
                "0->32",
                3,
                ((1, 2), (3, 4, 5)),
                "BBB",
                ("0:3@16", "1:4@32"),
                (16, 0),
                ("S(g0,n=2,bs=16)", "S(g1,n=2,bs=16)"),
            ),
            (
                "32->70",
                2,
                ((6, 7, 8), (5, 9, 10)),
                "NBNBBB",
                ("1:4@32", "3:5@64"),
                (64, 3),
                ("S(g0,n=2,bs=16)", "S(g1,n=1,bs=16)"),
            ),
        ],
        ((16, (3,)), (32, (4,)), (64, (5,))),
        ((64, ((3, 5),)), (64, ((3, 5),))),
    ),
]
"""(release, case, steps, keys after free, hits while running), as measured."""

_LABEL = re.compile(r"FA(\d+)\+M(\d+) hbs=(\w+) ncp=(\d+) align=(\w+) ret=(\w+) plen=(\d+) chunks=([\d+]+)(.*)")


def _opt(text: str) -> int | None:
    return None if text == "None" else int(text)


def config_of(release: str, label: str) -> tuple[KVCacheConfig, int, list[int]]:
    """The configuration, prompt length and chunks a measured case names."""
    m = _LABEL.fullmatch(label)
    assert m is not None, label
    fa, mb, hbs, ncp, al, ret, plen, chunks, rest = m.groups()
    look = re.search(r"lookahead=(\d+)", rest)
    lookahead = int(look.group(1)) if look else 0
    scratch = re.search(r"spec=(\d+)", rest)
    eagle = "EAGLE" in rest
    spec = int(scratch.group(1)) if scratch else 0
    mamba = Mamba(int(mb), "align", spec, int(ncp), _opt(al))
    cfg = KVCacheConfig(
        num_blocks=64, groups=(FullAttention(int(fa)), mamba), max_model_len=512, profile=profile_named(release),
        enable_kv_cache_events=True, use_eagle=eagle, eagle_groups=(0, 1) if "flagged" in rest else (),
        hash_block_size=_opt(hbs), prefix_cache_retention_interval=_opt(ret), num_hash_lookahead_tokens=lookahead,
    )  # fmt: skip
    return cfg, int(plen), [int(c) for c in chunks.split("+")]


def _events(events: list[KVCacheEvent]) -> tuple[str, ...]:
    out = []
    for e in events:
        if isinstance(e, BlockStored):
            out.append(f"S(g{e.group_idx},n={len(e.block_hashes)},bs={e.block_size})")
        elif isinstance(e, BlockRemoved):
            out.append(f"R(g{e.group_idx},n={len(e.block_hashes)})")
    return tuple(out)


def replay(cfg: KVCacheConfig, plen: int, chunks: list[int]) -> tuple[list[Step], Any, tuple[Hit, Hit]]:
    """Run a measured case through kvspec; the same shape as :data:`MEASURED`."""
    mgr = KVCacheManager(cfg)
    hasher = RequestBlockHasher.for_config(cfg)
    h = cfg.resolved_hash_block_size()
    prompt = list(range(1000, 1000 + plen))
    longer = [*prompt, *range(5000, 5040)]
    req = hasher.new_request("a", prompt)
    tokens = {make_key(x, 1): (i + 1) * h for i, x in enumerate(hasher.new_request("l", longer).block_hashes)}
    mamba = mgr.coordinator.managers[1]
    assert isinstance(mamba, MambaManager)
    counts: list[int] = []
    estimate = mamba.get_num_blocks_to_allocate

    def recorded(*args: Any, **kwargs: Any) -> int:
        n = estimate(*args, **kwargs)
        if not (args[5] if len(args) > 5 else kwargs.get("apply_admission_cap", False)):
            counts.append(n)
        return n

    mamba.get_num_blocks_to_allocate = recorded  # type: ignore[method-assign]  # record the estimates
    steps: list[Step] = []
    done = 0
    for n in chunks:
        new = mgr.allocate_slots(req, n)
        assert new is not None
        table = [int(b) for b in mamba.req_to_blocks["a"]]
        keyed = []
        for i, b in enumerate(table):
            held = sorted(tokens[k] for k, ids in mgr.block_pool.cached.items() if k in tokens and b in ids)
            if b != N and held:
                keyed.append(f"{i}:{b}@" + "/".join(map(str, held)))
        pattern = "".join("N" if b == N else "B" for b in table)
        ck = mamba.checkpoints.get("a")
        steps.append((f"{done}->{done + n}", counts[-1], new, pattern, tuple(keyed), ck, _events(mgr.take_events())))
        done += n
        req = dataclasses.replace(req, num_computed_tokens=done)
        mgr.new_step_starts()

    def hits(tag: str) -> tuple[Hit, Hit]:
        found = []
        for rid, toks in ((f"same-{tag}", prompt), (f"longer-{tag}", longer)):
            blocks, num = mgr.get_computed_blocks(hasher.new_request(rid, toks))
            found.append((num, tuple((i, int(b)) for i, b in enumerate(blocks[1]) if b != N)))
        return found[0], found[1]

    running = hits("running")
    mgr.free("a")
    keys: dict[int, list[int]] = {}
    for k, ids in mgr.block_pool.cached.items():
        if k in tokens:
            keys.setdefault(tokens[k], []).extend(int(b) for b in ids)
    assert hits("freed") == running, "hits while the request runs and after it is freed agree (measured)"
    return steps, tuple(sorted((t, tuple(ids)) for t, ids in keys.items())), running


def _fine(label: str) -> bool:
    """The case's hash block is finer than its Mamba block (fine-grained hits)."""
    m = _LABEL.fullmatch(label)
    assert m is not None, label
    return m.group(3) != "None" and int(m.group(3)) < int(m.group(2))


@pytest.mark.parametrize(
    ("release", "label", "steps", "keys", "hits"), MEASURED, ids=[f"{r} {c}" for r, c, *_ in MEASURED]
)
def test_measured_case(
    release: str, label: str, steps: list[Step], keys: Any, hits: tuple[Hit, Hit], monkeypatch: pytest.MonkeyPatch
) -> None:
    """kvspec gives the measured ids, estimates, tables, keys, checkpoints, events and hits."""
    if _fine(label):
        with pytest.raises(UnsupportedByProfileError, match="fine-grained hits"):
            config_of(release, label)
        lifted = kvspec.profiles.PARTIAL_HASH_HITS_CHECKED | {profile_named(release).name}
        monkeypatch.setattr(kvspec.profiles, "PARTIAL_HASH_HITS_CHECKED", lifted)
    cfg, plen, chunks = config_of(release, label)
    assert replay(cfg, plen, chunks) == (steps, keys, hits)


def test_0_34_0_keys_the_first_chunk_checkpoint() -> None:
    """The example the report spells out (0.33.0 and 0.34.0, P=70 as 32+38,
    no retention): the first chunk keys block 3 at 16 tokens (its checkpoint,
    slot 0) and block 4 at 32; the second releases block 3, which keeps its
    key, and keys 8 at 64 (checkpoint slot 3); free count 63 -> 59 -> 55."""
    for profile in (VLLM_0_33_0, VLLM_0_34_0):
        cfg, plen, chunks = config_of(profile.release, "FA16+M16 hbs=None ncp=1 align=1 ret=None plen=70 chunks=32+38")
        steps, keys, _ = replay(cfg, plen, chunks)
        assert steps[0][2] == ((1, 2), (3, 4)) and steps[0][4] == ("0:3@16", "1:4@32") and steps[0][5] == (16, 0)
        assert steps[1][2] == ((5, 6, 7), (N, 8, 9)) and steps[1][4] == ("1:4@32", "3:8@64") and steps[1][5] == (64, 3)
        assert keys == ((16, (3,)), (32, (4,)), (64, (8,)))


def test_fine_rekey_events() -> None:
    """0.33.0, hash block 4, P=70 in one chunk: the checkpoint block is first
    stored under its full-block key, then re-keyed to 68 tokens: a
    BlockRemoved and a BlockStored of one hash unit."""
    cases = [
        c for c in MEASURED if c[0] == "0.33.0" and c[1].endswith("hbs=4 ncp=1 align=1 ret=None plen=70 chunks=70")
    ]
    assert cases and cases[0][2][0][6][-3:] == ("S(g1,n=1,bs=16)", "R(g1,n=1)", "S(g1,n=1,bs=4)")


# -- the rules as values -------------------------------------------------------------------------


def test_positions() -> None:
    """The chunk end's last hash boundary below it; EAGLE one unit lower
    (0.32.0 on from the end itself); 0.33.0 steps back over the look-ahead."""
    assert checkpoint_position(VLLM_0_30_0, 70, 16, False, 0) == 64
    assert checkpoint_position(VLLM_0_30_0, 64, 16, False, 0) == 48
    assert checkpoint_position(VLLM_0_30_0, 70, 4, False, 0) == 68
    assert checkpoint_position(VLLM_0_30_0, 70, 16, True, 0) == 48
    assert checkpoint_position(VLLM_0_31_0, 64, 16, True, 0) == 32
    assert checkpoint_position(VLLM_0_32_0, 64, 16, True, 0) == 48
    assert checkpoint_position(VLLM_0_31_0, 32, 16, True, 0) == 0
    assert checkpoint_position(VLLM_0_32_0, 32, 16, True, 0) == 16
    assert checkpoint_position(VLLM_0_32_0, 70, 16, False, 8) == 64  # no look-ahead before 0.33.0
    assert [checkpoint_position(VLLM_0_33_0, 70, 16, False, la) for la in (0, 1, 4, 8)] == [64, 64, 64, 48]
    assert [checkpoint_position(VLLM_0_34_0, 70, 4, False, la) for la in (4, 8)] == [64, 60]
    assert checkpoint_position(VLLM_0_33_0, 64, 16, True, 8) == 48  # EAGLE ignores the look-ahead


def test_validity() -> None:
    """The alignment is the granularity of the position's offset from the chunk start."""
    assert checkpoint_valid(0, 70, 64, 16, 16, 8)
    assert not checkpoint_valid(0, 70, 64, 16, 16, 3)
    assert not checkpoint_valid(0, 70, 64, 16, 16, None)
    assert checkpoint_valid(32, 70, 64, 16, 16, 1)
    assert not checkpoint_valid(20, 70, 64, 16, 16, 1)  # starts off a hash boundary
    assert not checkpoint_valid(0, 32, 0, 16, 16, 1)  # EAGLE 0.30.0: nothing below the start
    assert checkpoint_valid(20, 50, 44, 4, 16, 1)
    assert not checkpoint_valid(20, 30, 28, 4, 16, 1)  # the slot below the running state is not past the start's


def test_chunk_checkpoint_slot_rules() -> None:
    kind = Mamba(16, "align", 1, 1, 1)
    geometry = CheckpointGeometry(16, 16, False, 0)
    assert chunk_checkpoint(kind, VLLM_0_30_0, geometry, [], 70, 0, False, 0) == (64, 3)
    assert chunk_checkpoint(kind, VLLM_0_30_0, geometry, [N, 5, 6, 7], 70, 32, False, 0) is None  # slot 3 held
    assert chunk_checkpoint(kind, VLLM_0_30_0, geometry, [N, 5, 6, 7], 70, 32, True, 0) == (64, 3)  # a scratch slot
    assert chunk_checkpoint(kind, VLLM_0_31_0, geometry, [], 32, 0, False, 70) is None  # before the prefill end
    assert chunk_checkpoint(kind, VLLM_0_30_0, geometry, [], 32, 0, False, 70) == (16, 0)  # 0.30.0 has none
    assert chunk_checkpoint(kind, VLLM_0_29_0, geometry, [], 70, 0, False, 0) is None  # not a positional form
    assert chunk_checkpoint(Mamba(16, "align", 0, 0, 1), VLLM_0_30_0, geometry, [], 70, 0, False, 0) is None


def test_prefill_end_and_granularity() -> None:
    assert checkpoint_prefill_end(VLLM_0_30_0, 0, 70, 70) == 0
    assert checkpoint_prefill_end(VLLM_0_31_0, 0, 70, 70) == 70
    assert checkpoint_prefill_end(VLLM_0_31_0, 0, 70, 90) == 89  # a resumed request
    assert checkpoint_prefill_end(VLLM_0_31_0, None, 70, 70) == 0
    assert checkpoint_prefill_end(VLLM_0_34_0, 32, 70, 70) == 0
    assert checkpoint_granularity(VLLM_0_31_0, 4, 16) == 4
    assert checkpoint_granularity(VLLM_0_32_0, 4, 16) == 16


def test_transient_rules() -> None:
    """Whether a checkpoint stays cached (block 16, prompt P=70, prompt position 64)."""

    def kept(profile: SemanticsProfile, position: int, retention: int | None, cached: int = 64) -> bool:
        return checkpoint_kept(profile, 16, position, 64, 0, retention, cached, 70)

    assert not kept(VLLM_0_30_0, 64, 0)  # 0.30.0: the hybrid caches 64 < 70 tokens, so even the prompt's is lost
    assert kept(VLLM_0_30_0, 64, 0, cached=70)
    assert kept(VLLM_0_30_0, 16, 48) and kept(VLLM_0_30_0, 68, None)
    assert kept(VLLM_0_31_0, 64, 0) and not kept(VLLM_0_31_0, 16, 0) and kept(VLLM_0_31_0, 16, 48)
    assert kept(VLLM_0_32_0, 16, None) and not kept(VLLM_0_32_0, 28, None)  # sub-block transient ones go
    assert [kept(VLLM_0_32_0, p, 32) for p in (16, 32, 48)] == [False, True, False]
    assert [kept(VLLM_0_32_0, p, 48) for p in (16, 32, 48)] == [False, False, True]
    assert kept(VLLM_0_33_0, 68, 0) is False and kept(VLLM_0_33_0, 64, 0)
    assert checkpoint_kept(VLLM_0_32_0, 16, 28, 64, 28, None, 32, 70)  # the junction


# -- configuration ----------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", list(PROFILES.values()), ids=lambda p: p.name)
def test_every_form_from_0_29_0_is_modelled(profile: SemanticsProfile) -> None:
    """A release with checkpoints accepts them (0.29.0 on); its form is modelled."""
    if release_key(profile.release) < (0, 29, 0):
        assert profile.prefill_checkpoints == "none"
        return
    assert profile.prefill_checkpoints in PREFILL_CHECKPOINTS_MODELLED
    alignment = None if profile is VLLM_0_29_0 else 1
    cfg = KVCacheConfig(
        num_blocks=64, groups=(FullAttention(16), Mamba(16, "align", 0, 1, alignment)), max_model_len=512,
        profile=profile,
    )  # fmt: skip
    assert "prefill-checkpoints" in features_used(cfg)
    KVCacheManager(cfg)


@pytest.mark.parametrize("profile", LATER, ids=lambda p: p.name)
@pytest.mark.parametrize("alignment", [0, -16, 2.0, True])
def test_bad_alignment_is_refused_at_construction(profile: SemanticsProfile, alignment: Any) -> None:
    """vLLM asserts a positive alignment only when it first weighs a
    checkpoint; kvspec refuses it when the configuration is made."""
    with pytest.raises(ConfigError, match="prefill_checkpoint_alignment must be None or a positive int"):
        KVCacheConfig(
            num_blocks=64, groups=(FullAttention(16), Mamba(16, "align", 0, 1, alignment)), max_model_len=512,
            profile=profile,
        )  # fmt: skip


@pytest.mark.parametrize("profile", LATER, ids=lambda p: p.name)
def test_fine_hash_is_refused_for_fine_grained_hits(profile: SemanticsProfile) -> None:
    """A hash block finer than the Mamba block needs fine-grained hits, not
    checked for these releases: refused whether or not checkpoints are on."""
    for ncp in (0, 1):
        with pytest.raises(UnsupportedByProfileError, match="fine-grained hits"):
            KVCacheConfig(
                num_blocks=64, groups=(FullAttention(16), Mamba(16, "align", 0, ncp, 1)), max_model_len=512,
                profile=profile, hash_block_size=4,
            )  # fmt: skip


@pytest.mark.parametrize("profile", LATER, ids=lambda p: p.name)
def test_no_checkpoints_no_change(profile: SemanticsProfile) -> None:
    """Without checkpoint blocks, or without an alignment, no checkpoint is
    ever weighed: the same case runs as with the count at 0 (measured too)."""
    base = "FA16+M16 hbs=None ncp={} align={} ret=None plen=70 chunks=32+38"
    off = replay(*config_of(profile.release, base.format(0, 1)))
    assert replay(*config_of(profile.release, base.format(1, "None"))) == off
    assert off[1] == ((32, (3,)),)
