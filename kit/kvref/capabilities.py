"""What an adapter can run: features, declared capabilities, skips.

A *feature* is a named part of the protocol a configuration or a history
uses: an attention kind (``kind:FullAttention``), a configuration switch
(``caching``, ``eagle``, ``events``, ``stats``, ``watermark``, ``hybrid`` for
more than one group), an extra-key source of a request (``lora``, ``mm``,
``cache_salt``, ``prompt_embeds``, ``skip_reading_prefix_cache``), a facade
operation (``op:pop_blocks_for_free``) or a non-default argument of
``allocate_slots`` (``lookahead``, ``external``, ``delay_cache_blocks``,
``encoder``, ``full_sequence_must_fit``, ``reserved_blocks``,
``has_scheduled_reqs``). Trace headers list the features a trace uses
(``features``, docs/traces.md).

An adapter's *factory* may declare what it cannot run:

* ``supports(config) -> str | None``: None when it runs ``config``, else the
  reason why not (a class factory defines it as a static or class method; a
  function factory gets it with :func:`declare`);
* ``unsupported``: feature names it lacks, e.g. ``{"events", "op:pop_blocks_for_free"}``.

An adapter may also raise :class:`Unsupported` (or any
:class:`kvspec.errors.UnsupportedOperationError`, or
:class:`kvspec.errors.UnsupportedByProfileError` at construction) from its
factory or from an operation. Every one of these is a *skip*: counted with its
reason, never a divergence and never a crash. The lockstep machine leaves out
what was declared (and, from the next batch on, what was raised); ``kvref
replay`` skips a trace that needs it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from kvref.shapes import Shape, build_kinds
from kvspec.config import AttentionKind, CrossAttention, KVCacheConfig
from kvspec.errors import ConfigError, UnsupportedByProfileError, UnsupportedOperationError
from kvspec.profiles import SemanticsProfile

Json = Any
F = TypeVar("F")

CONFIG_FEATURES = ("caching", "eagle", "events", "stats", "watermark", "hybrid")
"""Features a configuration uses (besides its ``kind:<Class>`` names)."""
REQUEST_FEATURES = ("lora", "mm", "cache_salt", "prompt_embeds", "skip_reading_prefix_cache")
"""Features of ``add_request``: its extra-key sources and the skip flag."""
ALLOCATE_FEATURES = {
    "num_lookahead_tokens": "lookahead",
    "num_external_computed_tokens": "external",
    "delay_cache_blocks": "delay_cache_blocks",
    "num_encoder_tokens": "encoder",
    "full_sequence_must_fit": "full_sequence_must_fit",
    "reserved_blocks": "reserved_blocks",
    "has_scheduled_reqs": "has_scheduled_reqs",
}
"""``allocate_slots`` keyword -> the feature a non-default value of it uses."""
_ALLOCATE_DEFAULTS: dict[str, Json] = {
    "num_lookahead_tokens": 0,
    "num_external_computed_tokens": 0,
    "delay_cache_blocks": False,
    "num_encoder_tokens": 0,
    "full_sequence_must_fit": False,
    "reserved_blocks": 0,
    "has_scheduled_reqs": True,
}


class Unsupported(UnsupportedOperationError):
    """The adapter cannot run this configuration or operation (a skip, not a failure).

    Raise it from a factory (for a configuration) or from an operation, before
    changing any state.

    Attributes:
        feature: The feature it lacks (see the module docstring), or "" when
            the caller should derive it from the operation.
    """

    def __init__(self, message: str, feature: str = "") -> None:
        """``message`` says what is missing; ``feature`` names it."""
        super().__init__(message)
        self.feature = feature


SKIP_ERRORS: tuple[type[BaseException], ...] = (UnsupportedOperationError, UnsupportedByProfileError)
"""Exceptions that mean "cannot run this", never "ran it wrongly"."""


RELEASE_OPERATIONS: tuple[tuple[str, Callable[[SemanticsProfile], bool]], ...] = (
    ("op:pop_blocks_for_free", lambda p: p.deferred_free),
    ("op:take_new_block_ids", lambda p: p.new_block_ids_list),
    ("op:new_step_starts", lambda p: p.mamba_step_guard),
    ("op:get_block_ids_for_computed_tokens", lambda p: p.computed_block_ids_op),
    ("op:estimate_cached_tokens", lambda p: p.estimate_cached_tokens_op),
    ("op:get_prefix_hint", lambda p: p.prefix_hint_op),
    ("op:record_prefix_cache_stats", lambda p: not p.stats_at_lookup),
    ("op:take_kv_cache_block_copies", lambda p: p.partial_hash_hits),
    ("full_sequence_must_fit", lambda p: p.admission_controls),
    ("reserved_blocks", lambda p: p.admission_controls),
    ("has_scheduled_reqs", lambda p: p.admission_controls),
)
"""The facade operations and ``allocate_slots`` arguments that only some
releases have, each with the profile switch that says whether a release has
it (vLLM 0.16.0 has none of the first three nor the admission arguments;
``record_prefix_cache_stats`` came with 0.27.0, ``estimate_cached_tokens`` and
``take_kv_cache_block_copies`` with 0.26.0)."""


def absent_features(profile: SemanticsProfile) -> frozenset[str]:
    """The operations (``op:<name>``) and arguments of :data:`RELEASE_OPERATIONS`
    that ``profile``'s release lacks."""
    return frozenset(feature for feature, has in RELEASE_OPERATIONS if not has(profile))


OPT_IN_FEATURES = ("context-parallelism",)
"""Features added to the protocol after third-party adapters were first
written, which an adapter that predates them would silently ignore (and then
diverge) rather than refuse: a configuration that uses one goes only to an
adapter whose factory names it in ``features`` (``declare(features=...)``);
every other adapter refuses it, counted as a skip. ``context-parallelism``:
``dcp_world_size`` or ``pcp_world_size`` above 1."""


def declare(
    supports: Callable[[KVCacheConfig], str | None] | None = None,
    unsupported: Iterable[str] = (),
    features: Iterable[str] = (),
) -> Callable[[F], F]:
    """Attach ``supports``, ``unsupported`` and the opt-in ``features`` it runs
    (:data:`OPT_IN_FEATURES`) to a factory function.

    Example::

        @declare(supports=lambda c: None if len(c.groups) == 1 else "one group only",
                 unsupported={"events", "op:pop_blocks_for_free"}, features={"context-parallelism"})
        def make(config): ...
    """
    unknown = sorted(set(features) - set(OPT_IN_FEATURES))
    if unknown:
        raise ValueError(f"declare(features=...): {unknown} are not opt-in features (those are {OPT_IN_FEATURES})")

    def attach(factory: F) -> F:
        if supports is not None:
            factory.supports = supports  # type: ignore[attr-defined]  # a declared attribute of the factory
        factory.unsupported = frozenset(unsupported)  # type: ignore[attr-defined]  # same
        factory.features = frozenset(features)  # type: ignore[attr-defined]  # same
        return factory

    return attach


def opt_in_features(config: KVCacheConfig) -> frozenset[str]:
    """The opt-in features (:data:`OPT_IN_FEATURES`) ``config`` uses."""
    return frozenset({"context-parallelism"} if config.dcp_world_size * config.pcp_world_size > 1 else ())


def refusal(factory: object, config: KVCacheConfig) -> str | None:
    """Why ``factory`` does not run ``config`` (an opt-in feature it does not
    declare, or its ``supports``), or None."""
    missing = sorted(opt_in_features(config) - frozenset(getattr(factory, "features", ()) or ()))
    if missing:
        return f"{', '.join(missing)} is opt-in and the adapter's factory does not declare it (declare(features=...))"
    supports = getattr(factory, "supports", None)
    if supports is None:
        return None
    reason = supports(config)
    return None if reason is None else str(reason)


def declared_unsupported(factory: object) -> frozenset[str]:
    """The features ``factory`` declares it lacks (its ``unsupported``)."""
    return frozenset(str(f) for f in getattr(factory, "unsupported", ()) or ())


def config_features(config: KVCacheConfig) -> set[str]:
    """The features a configuration uses."""
    found = {f"kind:{type(k).__name__}" for k in config.groups}
    flags = {
        "caching": config.enable_caching,
        "eagle": config.use_eagle,
        "events": config.enable_kv_cache_events,
        "stats": config.log_stats,
        "watermark": config.watermark > 0,
        "hybrid": len(config.groups) > 1,
    }
    return found | {name for name, on in flags.items() if on}


def op_features(op: Json) -> set[str]:
    """The features one operation (a trace step) uses."""
    name = op.get("op")
    if name == "add_request":
        extra = op.get("extra") or {}
        found = {f for f, key in (("lora", "lora"), ("mm", "mm_features"), ("cache_salt", "cache_salt"),
                                  ("prompt_embeds", "prompt_embeds")) if extra.get(key)}  # fmt: skip
        if op.get("skip_reading_prefix_cache"):
            found.add("skip_reading_prefix_cache")
        return found
    if name in ("append_tokens", "set_request") or name is None:
        return set()
    found = {f"op:{name}"}
    if name == "allocate_slots":
        found |= {ALLOCATE_FEATURES[k] for k, v in _ALLOCATE_DEFAULTS.items() if k in op and op[k] != v}
    return found


def trace_features(config: KVCacheConfig, steps: Iterable[Json]) -> list[str]:
    """Every feature a history uses, sorted (the ``features`` header field)."""
    found = config_features(config)
    for step in steps:
        found |= op_features(step)
    return sorted(found)


def feature_of(exc: BaseException, op: Json | None) -> str:
    """The feature an :data:`SKIP_ERRORS` exception says is missing: its
    ``feature`` attribute, else the operation's (``op:<name>``), else ``config``."""
    feature = getattr(exc, "feature", "")
    if feature:
        return str(feature)
    return f"op:{op['op']}" if op is not None else "config"


def known_features() -> frozenset[str]:
    """Every feature name :func:`trace_features` can produce."""
    from kvref.ops import FACADE_OPS, KIND_CLASSES  # noqa: PLC0415 - kvref.ops imports this module

    kinds = {f"kind:{name}" for name in KIND_CLASSES}
    ops = {f"op:{name}" for name in FACADE_OPS}
    return frozenset({*CONFIG_FEATURES, *REQUEST_FEATURES, *ALLOCATE_FEATURES.values(), *kinds, *ops})


def parse_features(text: str) -> frozenset[str]:
    """A comma-separated feature list; a bare operation name means ``op:<name>``.

    Raises:
        ValueError: Naming an unknown feature and the known ones.
    """
    known = known_features()
    out = set()
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        name = item if item in known or f"op:{item}" not in known else f"op:{item}"
        if name not in known:
            raise ValueError(f"unknown feature {item!r}; known: {', '.join(sorted(known))}")
        out.add(name)
    return frozenset(out)


def probe(
    factories: Iterable[Callable[[KVCacheConfig], object]],
    shapes: Iterable[Shape],
    profile: SemanticsProfile,
    excluded: frozenset[str] = frozenset(),
) -> tuple[tuple[Shape, ...], frozenset[str], list[str]]:
    """Which shapes and switches every factory runs, asked before a run.

    A shape is kept when each factory accepts a small configuration of it
    (caching as the shape wants it, else on; or else off; other switches off):
    ``supports`` says None and construction raises no skip error. On the
    first kept shape each switch (``eagle``, ``events``, ``stats``,
    ``watermark``) is tried alone; a refused one is left out. Shapes using an
    ``excluded`` kind (or several groups, with ``hybrid`` excluded) are dropped
    without asking.

    NOTE: a probe, not a promise: a drawn configuration can still be refused
    (it is then counted and the run rejected). Probing first keeps the
    machine from drawing nothing but refused configurations.

    Returns:
        The kept shapes, the features to leave out, and one line per
        dropped shape or switch saying why.
    """
    factories = list(factories)
    kept: list[Shape] = []
    notes: list[str] = []
    left_out = set(excluded)
    first: KVCacheConfig | None = None
    for shape in shapes:
        kinds = build_kinds(shape, 4, 4)
        if {f"kind:{type(k).__name__}" for k in kinds} & excluded or ("hybrid" in excluded and len(kinds) > 1):
            continue
        if any(isinstance(k, CrossAttention) for k in kinds) and "encoder" in excluded:
            continue
        variants = [True, False] if shape.caching is None else [shape.caching]
        reasons = []
        for caching in variants:
            cfg = _sample(kinds, profile, enable_caching=caching)
            if isinstance(cfg, str):  # the profile's refusal: counted while drawing, as ever
                kept.append(shape)
                break
            reason = _refused(factories, cfg)
            if reason is None:
                kept.append(shape)
                if first is None:
                    first = cfg
                    if caching is False and shape.caching is None:
                        left_out.add("caching")
                break
            reasons.append(reason)
        else:
            notes.append(f"shape {shape.name}: {reasons[0]}")
    if first is not None:
        for feature, key, value in (("eagle", "use_eagle", True), ("events", "enable_kv_cache_events", True),
                                    ("stats", "log_stats", True), ("watermark", "watermark", 0.1)):  # fmt: skip
            if feature in left_out:
                continue
            cfg = _sample(first.groups, profile, enable_caching=first.enable_caching, **{key: value})
            reason = None if isinstance(cfg, str) else _refused(factories, cfg)
            if reason is not None:
                left_out.add(feature)
                notes.append(f"switch {feature}: {reason}")
    return tuple(kept), frozenset(left_out), notes


def _sample(kinds: Iterable[AttentionKind], profile: SemanticsProfile, **fields: Any) -> KVCacheConfig | str:
    """A small configuration, or why the profile refuses it."""
    try:
        return KVCacheConfig(num_blocks=16, groups=tuple(kinds), max_model_len=64, profile=profile, **fields)
    except ConfigError as exc:
        return f"{type(exc).__name__}: {exc}"


def _refused(factories: list[Callable[[KVCacheConfig], object]], config: KVCacheConfig) -> str | None:
    """Why one of ``factories`` does not run ``config`` (None: all run it)."""
    for factory in factories:
        reason = refusal(factory, config)
        if reason is not None:
            return reason
        try:
            factory(config)
        except SKIP_ERRORS as exc:
            return f"{type(exc).__name__}: {exc}"
        except Exception:  # a crash is the machine's to report, with a trace
            return None
    return None
