"""CrossHair plugin: symbolic attention kinds and semantics profiles.

CrossHair 0.0.113 cannot build kvspec's attention kinds on its own (``Mamba.mode``
is a ``Literal`` alias, which ``get_type_hints`` rejects), nor a
``SemanticsProfile`` (four ``Literal`` switches). This plugin registers a
creator for each, so that the spec's own contracts on functions taking a kind
or a profile are checked directly:

* every attention kind as ``KVCacheConfig`` accepts it: ``block_size >= 1``,
  a window or chunk ``>= 1``, a sink of a positive number of blocks,
  ``num_speculative_blocks >= 0`` and each Mamba mode; the sizes are symbolic;
* a profile is one of :data:`kvspec.profiles.PROFILES`, chosen by a fork per
  release (the profile as an enumerated input): a condition is confirmed only
  once it held under every release, and a release added to ``PROFILES`` joins
  every check that takes a profile.

Loaded with ``crosshair check --extra_plugin proofs/crosshair_plugin.py``
(:mod:`kvproofs.run` passes it to every CrossHair process).
"""

from __future__ import annotations

from typing import Any

from crosshair import IgnoreAttempt, ResumedTracing, SymbolicFactory, register_type

from kvspec.config import (
    MLA,
    ChunkedLocal,
    CircularBuffer,
    CrossAttention,
    FullAttention,
    KpoolTail,
    Mamba,
    MambaMode,
    SinkFullAttention,
    SlidingWindow,
)
from kvspec.profiles import PROFILES, SemanticsProfile


def _positive(factory: SymbolicFactory, suffix: str, low: int = 1) -> Any:
    """A symbolic int ``>= low``."""
    value: Any = factory(int, suffix)
    if type(value) is int:  # already realized (CrossHair does so at times)
        if value < low:
            raise IgnoreAttempt
        return value
    factory.space.add(value.var >= low)  # the z3 term: creators run without tracing
    return value


def _block_size(factory: SymbolicFactory) -> Any:
    return _positive(factory, "_block_size")


def _sink(factory: SymbolicFactory) -> SinkFullAttention:
    bs = _block_size(factory)
    blocks = _positive(factory, "_sink_blocks")
    with ResumedTracing():  # type: ignore[no-untyped-call]  # crosshair ships no annotations for it
        sink_len = bs * blocks
    return SinkFullAttention(bs, sink_len)


def _mamba(factory: SymbolicFactory) -> Mamba:
    bs = _block_size(factory)
    spec = _positive(factory, "_num_speculative_blocks", 0)
    space = factory.space
    mode: MambaMode = (
        "align" if space.smt_fork(desc="mode_align") else "all" if space.smt_fork(desc="mode_all") else "none"
    )
    return Mamba(bs, mode, spec)


def _profile(factory: SymbolicFactory) -> SemanticsProfile:
    profiles = list(PROFILES.values())
    for p in profiles[:-1]:
        if factory.space.smt_fork(desc=f"profile_{p.release}"):
            return p
    return profiles[-1]


register_type(FullAttention, lambda f: FullAttention(_block_size(f)))
register_type(MLA, lambda f: MLA(_block_size(f)))
register_type(SinkFullAttention, _sink)
register_type(
    SlidingWindow,
    lambda f: SlidingWindow(_block_size(f), _positive(f, "_window"), _positive(f, "_extra_retained_tokens", 0)),
)
register_type(ChunkedLocal, lambda f: ChunkedLocal(_block_size(f), _positive(f, "_chunk")))
register_type(Mamba, _mamba)
register_type(CrossAttention, lambda f: CrossAttention(_block_size(f)))
register_type(CircularBuffer, lambda f: CircularBuffer(_block_size(f)))
register_type(KpoolTail, lambda f: KpoolTail(_block_size(f), _positive(f, "_window")))
register_type(SemanticsProfile, _profile)
