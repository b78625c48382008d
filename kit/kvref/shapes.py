"""The one catalog of configuration shapes.

A *shape* names a mix of KV-cache groups; :func:`build_kinds` turns it into
attention kinds for a base block size ``bs``, a sliding window and a number of
Mamba speculative blocks. The lockstep machine draws shapes from
:data:`SHAPES`, the soak runs one lane per :data:`SOAK_LANES` entry and the
bench times the :data:`BENCH_MIXES`; all of them build their kinds here, so a
name means the same groups everywhere.

Kind tokens (``+`` separates groups in a shape name):

=================== ==============================================================
``full``            ``FullAttention(bs)``
``full@2x``         ``FullAttention(2 * bs)``
``mla``             ``MLA(bs)``
``sink``            ``SinkFullAttention(bs, sink_len=2 * bs)``
``swa``             ``SlidingWindow(bs, window)``
``swa-wide``        ``SlidingWindow(bs, window + bs)`` (one block wider)
``swa@2x``          ``SlidingWindow(2 * bs, window)``
``chunked``         ``ChunkedLocal(bs, chunk=2 * bs)`` (the machine draws 1 to 3 blocks)
``cross``           ``CrossAttention(bs)`` (needs caching off)
``mamba-all``       ``Mamba(bs, "all", spec_blocks)``
``mamba-align``     ``Mamba(bs, "align", spec_blocks)``
``mamba-align@2x``  ``Mamba(2 * bs, "align", spec_blocks)``
``ring``            ``CircularBuffer(bs // 2)`` (vLLM 0.29.0 on)
``kpool``           ``KpoolTail(bs // 2, window)`` (vLLM 0.30.0 and 0.31.0)
=================== ==============================================================

A shape with a ``since`` switch is drawn only under the profiles that set it
(:func:`shape_allowed`); the ring shapes come after every older shape, so the
draws under older profiles do not move.

A shape named ``kinds@mtpN`` (:data:`MTP_SHAPES`) runs the kinds under
multi-module MTP: the configuration's ``num_prefill_lookahead`` is ``N`` and
every sliding window keeps ``N - 1`` tokens below it, as vLLM's planner sets
them (0.28.0 on). They are not in :data:`SHAPES` (``--shapes`` names them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from kvspec.config import (
    MLA,
    AttentionKind,
    ChunkedLocal,
    CircularBuffer,
    CrossAttention,
    FullAttention,
    KpoolTail,
    Mamba,
    SinkFullAttention,
    SlidingWindow,
)
from kvspec.profiles import SemanticsProfile


@dataclass(frozen=True)
class Shape:
    """A named group mix.

    Attributes:
        name: The kind tokens joined by ``+``.
        kinds: One kind token per group, in group order.
        caching: Forced prefix caching (None: drawn).
        eagle_ok: Whether EAGLE may be drawn (chunked local refuses it).
        since: The profile switch a release must set for the shape to be
            drawn (None: every release has its kinds).
        dcp: The configuration's ``dcp_world_size`` (decode context parallelism).
        pcp: The configuration's ``pcp_world_size`` (prefill context parallelism).
        mtp: The configuration's ``num_prefill_lookahead`` (multi-module MTP;
            every sliding window keeps ``mtp - 1`` extra tokens).
    """

    name: str
    kinds: tuple[str, ...]
    caching: bool | None = None
    eagle_ok: bool = True
    since: str | None = None
    dcp: int = 1
    pcp: int = 1
    mtp: int = 0


def _shape(*kinds: str, caching: bool | None = None, eagle_ok: bool = True, since: str | None = None) -> Shape:
    return Shape("+".join(kinds), kinds, caching, eagle_ok, since)


def _cp_shape(kind: str, dcp: int, pcp: int = 1, caching: bool | None = None, eagle_ok: bool = True) -> Shape:
    """A shape under context parallelism, named ``kinds@dcpN`` (``-pcpM``);
    ``kind`` is one kind token or several joined by ``+``."""
    name = f"{kind}@dcp{dcp}" + (f"-pcp{pcp}" if pcp > 1 else "")
    return Shape(name, tuple(kind.split("+")), caching, eagle_ok, None, dcp, pcp)


SHAPES = (
    _shape("full"),
    _shape("mla"),
    _shape("swa"),
    _shape("chunked", eagle_ok=False),
    _shape("mamba-all"),
    _shape("mamba-align"),
    _shape("sink"),
    _shape("full", "cross", caching=False),
    _shape("full", "swa"),
    _shape("full", "swa", "swa"),
    _shape("full", "swa", "swa-wide"),
    _shape("full", "mamba-align"),
    _shape("full", "mamba-all"),
    _shape("full", "chunked", eagle_ok=False),
    _shape("mla", "swa"),
    _shape("full", "swa@2x"),
    _shape("full", "mla", "swa"),
    _shape("full@2x", "swa"),
    _shape("full@2x", "mamba-align@2x", "swa"),
    _shape("full", "ring", since="circular_buffer_kind"),
    _shape("full", "swa", "kpool", since="kpool_tail_kind"),
    _shape("full", "full", "swa"),
    _shape("full", "mamba-align", "mamba-align"),
    _shape("full@2x", "mamba-align"),
    _shape("ring", since="circular_buffer_kind"),
    _shape("cross", caching=False),
    *(
        _cp_shape("full", 2),
        _cp_shape("full", 4),
        _cp_shape("mla", 2, 2),
        _cp_shape("swa", 2, caching=False),
        _cp_shape("chunked", 2, 2, caching=False, eagle_ok=False),
        _cp_shape("sink", 2),
        _cp_shape("full+swa+mamba-all", 2, caching=False),
        _cp_shape("mamba-align", 2, 2),
    ),
)
"""The shapes the lockstep machine draws from (the order is part of the seeded
draws: append new shapes at the end). The ``@dcp`` shapes run under decode
(and prefill) context parallelism; the sliding-window and chunked ones keep
caching off, where their lookups (which refuse context parallelism) never
run, and so does the hybrid one, which up to vLLM 0.25.1 refuses prefix
caching under context parallelism (later releases are not modelled)."""

def _mtp_shape(kind: str, lookahead: int) -> Shape:
    """A shape under multi-module MTP, named ``kinds@mtpN``."""
    return Shape(f"{kind}@mtp{lookahead}", tuple(kind.split("+")), None, True, "prefill_lookahead", mtp=lookahead)


MTP_SHAPES = (
    _mtp_shape("full", 3),
    _mtp_shape("swa", 2),
    _mtp_shape("full+swa", 3),
    _mtp_shape("full+swa+mamba-align", 2),
)
"""Shapes under multi-module MTP (vLLM 0.28.0 on): caching lags the last
``N - 1`` computed tokens, windows keep ``N - 1`` more; with prefix caching
and EAGLE a look-ahead of 3 refuses a 2-token scheduler block (a refused
configuration, counted as such). Not drawn with :data:`SHAPES`: ``--shapes``
names them (the coverage gate runs them under the newest release)."""

WIDE = Shape("wide", ("full",) * 65)
"""65 full-attention groups: more than kvimpl's native core takes (64), so
kvimpl runs the model in pure Python. Not drawn with the others (a step
touches every group); ``--shapes wide`` runs it alone, and the machine
gives it a pool of about as many blocks per group as the others get."""

CP_SHAPES = tuple(s for s in SHAPES if s.dcp * s.pcp > 1)
"""The context-parallel shapes of :data:`SHAPES` (``--shapes`` takes their names)."""

FULL_TYPE_TOKENS = frozenset({"full", "full@2x", "mla", "sink"})
"""Kind tokens that build full-attention-type kinds."""

_BUILDERS: dict[str, Callable[[int, int, int], AttentionKind]] = {
    "full": lambda bs, w, s: FullAttention(bs),
    "full@2x": lambda bs, w, s: FullAttention(bs * 2),
    "mla": lambda bs, w, s: MLA(bs),
    "sink": lambda bs, w, s: SinkFullAttention(bs, bs * 2),
    "swa": lambda bs, w, s: SlidingWindow(bs, w),
    "swa-wide": lambda bs, w, s: SlidingWindow(bs, w + bs),
    "swa@2x": lambda bs, w, s: SlidingWindow(bs * 2, w),
    "chunked": lambda bs, w, s: ChunkedLocal(bs, bs * 2),
    "cross": lambda bs, w, s: CrossAttention(bs),
    "mamba-all": lambda bs, w, s: Mamba(bs, "all", s),
    "mamba-align": lambda bs, w, s: Mamba(bs, "align", s),
    "mamba-align@2x": lambda bs, w, s: Mamba(bs * 2, "align", s),
    "ring": lambda bs, w, s: CircularBuffer(max(bs // 2, 1)),
    "kpool": lambda bs, w, s: KpoolTail(max(bs // 2, 1), w),
}

_SINCE: dict[str, str] = {"ring": "circular_buffer_kind", "kpool": "kpool_tail_kind"}
"""Kind tokens of newer releases -> the profile switch that brings them."""


def build_kind(token: str, bs: int, window: int = 1, spec_blocks: int = 0, chunk_blocks: int = 2) -> AttentionKind:
    """The attention kind of one kind token (see the module docstring; a
    ``chunked`` group's chunk is ``chunk_blocks`` blocks).

    Raises:
        KeyError: For an unknown token.
    """
    if token == "chunked":
        return ChunkedLocal(bs, bs * chunk_blocks)
    return _BUILDERS[token](bs, window, spec_blocks)


def build_kinds(
    shape: Shape, bs: int, window: int = 1, spec_blocks: int = 0, chunk_blocks: int = 2
) -> tuple[AttentionKind, ...]:
    """The groups of ``shape`` for base block size ``bs`` (under MTP, every
    sliding window keeps ``shape.mtp - 1`` extra tokens)."""
    kinds = tuple(build_kind(k, bs, window, spec_blocks, chunk_blocks) for k in shape.kinds)
    if shape.mtp > 1:
        kinds = tuple(
            replace(k, extra_retained_tokens=shape.mtp - 1) if isinstance(k, SlidingWindow) else k for k in kinds
        )
    return kinds


def shape_named(name: str) -> Shape:
    """The catalog shape called ``name``, or a shape parsed from kind tokens.

    Raises:
        ValueError: If a token of ``name`` is not a kind token.
    """
    for shape in (*SHAPES, *MTP_SHAPES, WIDE):
        if shape.name == name:
            return shape
    kinds = tuple(name.split("+"))
    unknown = [k for k in kinds if k not in _BUILDERS]
    if unknown:
        raise ValueError(f"shape {name!r}: unknown kind token(s) {unknown}; known: {', '.join(_BUILDERS)}")
    since = next((_SINCE[k] for k in kinds if k in _SINCE), None)
    return Shape(name, kinds, False if "cross" in kinds else None, "chunked" not in kinds, since)


def shape_allowed(shape: Shape, profile: SemanticsProfile) -> bool:
    """Whether ``profile``'s release has every kind of ``shape`` (its ``since`` switch)."""
    return shape.since is None or bool(getattr(profile, shape.since))


def drawable(shapes: Sequence[Shape], profile: SemanticsProfile) -> list[Shape]:
    """The shapes to draw under ``profile``, each repeated by its weight
    (:func:`shape_weight`); shapes the release lacks are left out unless
    nothing else is left (they are then counted as refused)."""
    allowed = [s for s in shapes if shape_allowed(s, profile)] or list(shapes)
    return [s for s in allowed for _ in range(shape_weight(s))]


def shape_weight(shape: Shape) -> int:
    """How many times the machine's configuration strategy counts ``shape``.

    Shapes with three or more kinds count three times: only they make the
    hybrid hit search iterate (a two-kind hybrid with full attention first
    stops after one pass). Shapes with two distinct kinds outside full
    attention count six times: only there does the search come back to a
    non-full group after another one shortened the hit, the path where an
    EAGLE group must not drop its look-ahead block a second time. A lone
    sliding-window group counts six times too: only there does the unitary
    coordinator run the window lookup with EAGLE's extra block itself (a
    hybrid runs it inside its fixed-point search); at weight 1 a seeded ci
    run drew it cached with EAGLE in about one run in 500. Shapes with a
    ``full@2x`` group count at least three times: only a full-attention
    group coarser than the hash block registers partial-tail keys (vLLM
    0.26.0 on), whose blocks then carry several keys; so do shapes with a
    kind twice (one spec group of several KV-cache groups, looked up
    together). ``full+mamba-align`` counts six times: it is the plain hybrid
    that registers Mamba tail entries (vLLM 0.32.0 on), and at three a
    seeded ci run still missed the tail entry of a block the table does
    not reach. Ring tokens do not count (their groups stay out of the hit
    search).
    """
    kinds = set(shape.kinds) - set(_SINCE)
    if shape.mtp:  # drawn only among themselves (--shapes): equally
        return 1
    if len(kinds - FULL_TYPE_TOKENS) >= 2 or shape.kinds in (("swa",), ("full", "mamba-align")):
        return 6
    if len(kinds) >= 3 or "full@2x" in kinds or len(set(shape.kinds)) < len(shape.kinds):
        return 3
    return 1


BENCH_MIXES = ("full", "full+swa", "full+mamba-all")
"""The group mixes ``kvref bench`` times (block size 16)."""

SOAK_LANES: tuple[tuple[str, str, int, int, dict[str, object]], ...] = (
    ("full", "full", 4, 1, {"enable_kv_cache_events": True, "max_num_batched_tokens": 16}),
    ("swa", "swa", 4, 8, {"hash_function": "xxhash", "enable_kv_cache_events": True}),
    ("full+swa", "full+swa", 4, 6, {"num_blocks": 96, "enable_kv_cache_events": True,
                                    "int_block_hashes": False, "watermark": 0.1}),
    ("full+mamba-align", "full+mamba-align", 4, 1, {"num_blocks": 80, "hash_function": "xxhash_cbor"}),
    ("full+mamba-all", "full+mamba-all", 2, 1, {"num_blocks": 96, "log_stats": True}),
    ("mla+swa@2x", "mla+swa@2x", 2, 5, {"num_blocks": 96, "hash_function": "sha256"}),
    ("full+chunked", "full+chunked", 4, 1, {"num_blocks": 80, "enable_kv_cache_events": True}),
    ("sink", "sink", 4, 1, {"num_blocks": 48}),
    ("full-eagle", "full", 4, 1, {"num_blocks": 48, "use_eagle": True, "enable_kv_cache_events": True}),
    ("full-nocache", "full", 4, 1, {"num_blocks": 40, "enable_caching": False}),
)  # fmt: skip
"""The soak's lanes: (lane name, shape, block size, window, config fields);
64 blocks and ``max_model_len`` 64 unless given."""
