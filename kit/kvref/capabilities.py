"""What an adapter can run: features, declared capabilities, skips.

A *feature* is a named part of the protocol a configuration or a history
uses: an attention kind (``kind:FullAttention``), a configuration switch
(``caching``, ``eagle``, ``events``, ``stats``, ``watermark``, ``hybrid`` for
more than one group), an extra-key source of a request (``lora``, ``mm``,
``cache_salt``, ``prompt_embeds``, ``skip_reading_prefix_cache``), a facade
operation (``op:pop_blocks_for_free``) or a non-default argument of
``allocate_slots`` (``lookahead``, ``external``, ``delay_cache_blocks``,
``encoder``, ``full_sequence_must_fit``, ``reserved_blocks``,
``has_scheduled_reqs``). Two more name how a history uses the facade:
``chunked-prefill`` (:data:`CHUNKED_PREFILL`: a request's tokens computed
over several allocations) and ``caller-errors`` (:data:`CALLER_ERRORS`:
invalid calls, sent on purpose, that every side must refuse with the same
:mod:`kvspec.errors` class, changing nothing). Trace headers list the
features a trace uses (``features``, docs/traces.md).

An adapter's *factory* may declare what it cannot run:

* ``supports(config) -> str | None``: None when it runs ``config``, else the
  reason why not (a class factory defines it as a static or class method; a
  function factory gets it with :func:`declare`);
* ``unsupported``: feature names it lacks, e.g. ``{"events", "op:pop_blocks_for_free"}``;
* the capabilities :func:`declare` names for engines unlike vLLM's
  scheduler: ``trusts_caller`` (it validates nothing, as its own scheduler
  never sends an invalid call: ``caller-errors``), ``whole_prompts`` (it
  admits a request's tokens in one allocation: ``chunked-prefill``) and
  ``one_token_decode`` (a running step allocates for the one token it
  decodes: ``lookahead``).

An adapter may also raise :class:`Unsupported` (or any
:class:`kvspec.errors.UnsupportedOperationError`, or
:class:`kvspec.errors.UnsupportedByProfileError` at construction) from its
factory or from an operation. Every one of these is a *skip*: counted with its
reason, never a divergence and never a crash. The lockstep machine leaves out
what was declared (and, from the next batch on, what was raised, when the
error names its feature: one that names none stops every run that meets it,
and the summary warns about it); ``kvref replay`` skips a trace that needs it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from kvref.ops import ABSENT, FACADE_OPS, KIND_CLASSES, SKIP_ERRORS
from kvref.shapes import Shape, build_kinds
from kvspec.config import AttentionKind, CrossAttention, KVCacheConfig, uses_prefill_lookahead
from kvspec.errors import ConfigError, UnsupportedOperationError
from kvspec.profiles import SemanticsProfile, features_used

__all__ = [
    "ALLOCATE_FEATURES",
    "CALLER_ERRORS",
    "CAPABILITIES",
    "CHUNKED_PREFILL",
    "CONFIG_FEATURES",
    "OPT_IN_FEATURES",
    "RELEASE_OPERATIONS",
    "REQUEST_FEATURES",
    "SCHEDULER_FEATURES",
    "SKIP_ERRORS",
    "Unsupported",
    "absent_features",
    "config_features",
    "declare",
    "declared_unsupported",
    "feature_of",
    "known_features",
    "op_features",
    "opt_in_features",
    "parse_features",
    "probe",
    "refusal",
    "trace_features",
]

Json = Any
F = TypeVar("F")

CALLER_ERRORS = "caller-errors"
"""The feature of invalid calls: the machine sends calls a scheduler never
makes (a negative count, a stale hit, a double free, ...) and every side must
refuse each with the :mod:`kvspec.errors` class kvspec raises, in kvspec's
order of checks, changing nothing (docs/writing-an-adapter.md lists the
rules). An engine that trusts its caller lacks it (``declare(trusts_caller=True)``):
those calls are then never sent."""
CHUNKED_PREFILL = "chunked-prefill"
"""The feature of an allocation that leaves some of a request's tokens for a
later step (a prompt computed in chunks, an admission within the step's token
budget, a running step that continues a prefill); connector loads with delayed
caching are ``delay_cache_blocks``. An engine that admits whole prompts lacks
it (``declare(whole_prompts=True)``): every admission then computes all of the
request's tokens, and every running step the one token it decodes."""
SCHEDULER_FEATURES = (CHUNKED_PREFILL, CALLER_ERRORS)
"""How the scheduler drives an engine (:func:`trace_features` finds them in a history's steps)."""
CAPABILITIES = {
    "trusts_caller": frozenset({CALLER_ERRORS}),
    "whole_prompts": frozenset({CHUNKED_PREFILL}),
    "one_token_decode": frozenset({"lookahead"}),
}
"""The capabilities :func:`declare` names and the features each leaves out."""

CONFIG_FEATURES = (
    "caching", "eagle", "events", "stats", "watermark", "hybrid", "mtp", "lookahead_hashes", "retention",
    "prefill_checkpoints",
)  # fmt: skip
"""Features a configuration uses (besides its ``kind:<Class>`` names); ``mtp``:
multi-module MTP inputs (``num_prefill_lookahead``, a window's
``extra_retained_tokens``; vLLM 0.28.0 on); ``lookahead_hashes``: look-ahead
block hashes (``num_hash_lookahead_tokens``; vLLM 0.33.0 on, where EAGLE-style
speculative decoding with prefix caching uses them by default); ``retention``: a
prefix-cache retention interval (``prefix_cache_retention_interval``; vLLM 0.23.0 on);
``prefill_checkpoints``: Mamba prefill checkpoints (``num_prefill_checkpoint_blocks``
above 0 in an ``align`` group, with ``prefill_checkpoint_alignment`` from vLLM
0.30.0 on; vLLM 0.29.0 on)."""
REQUEST_FEATURES = (
    "lora", "mm", "cache_salt", "prompt_embeds", "skip_reading_prefix_cache", "prompt_logprobs", "report_mode_full",
)  # fmt: skip
"""Features of ``add_request``: its extra-key sources, the skip flag, prompt
logprobs and report mode "full" (``kv_cache_report_mode``; vLLM 0.26.0 on a
lookup announces a hit again in the KV-cache events)."""
ALLOCATE_FEATURES = {
    "num_lookahead_tokens": "lookahead",
    "num_external_computed_tokens": "external",
    "delay_cache_blocks": "delay_cache_blocks",
    "num_encoder_tokens": "encoder",
    "full_sequence_must_fit": "full_sequence_must_fit",
    "reserved_blocks": "reserved_blocks",
    "has_scheduled_reqs": "has_scheduled_reqs",
    "skip_zeroing_group_ids": "skip_zeroing_group_ids",
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
    "skip_zeroing_group_ids": [],
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


RELEASE_OPERATIONS: tuple[tuple[str, Callable[[SemanticsProfile], bool]], ...] = (
    ("op:pop_blocks_for_free", lambda p: p.deferred_free),
    ("op:take_new_block_ids", lambda p: p.new_block_ids_list),
    ("op:new_step_starts", lambda p: p.mamba_step_guard),
    ("op:get_block_ids_for_computed_tokens", lambda p: p.computed_block_ids_op),
    ("op:estimate_cached_tokens", lambda p: p.estimate_cached_tokens_op),
    ("op:get_prefix_hint", lambda p: p.prefix_hint_op),
    ("op:record_prefix_cache_stats", lambda p: not p.stats_at_lookup),
    ("op:take_kv_cache_block_copies", lambda p: p.partial_hash_hits),
    ("op:get_num_common_prefix_blocks", lambda p: p.common_prefix != "absent"),
    ("full_sequence_must_fit", lambda p: p.full_sequence_arg),
    ("reserved_blocks", lambda p: p.reserved_blocks_arg),
    ("has_scheduled_reqs", lambda p: p.admission_controls),
    ("max_cache_hit_length", lambda p: p.hit_length_bound != "absent"),
    ("op:get_num_cached_tokens", lambda p: p.num_cached_tokens_op),
    ("op:record_blocks_for_zeroing", lambda p: p.record_zeroing_op),
    ("op:get_zeroing_block_ids_in_range", lambda p: p.zeroing_range_op),
    ("skip_zeroing_group_ids", lambda p: p.skip_zeroing_arg),
    ("op:get_computed_blocks_for_connector", lambda p: p.connector_lookup_op),
    ("op:truncate_computed_blocks", lambda p: p.connector_lookup_op),
)
"""The facade operations and ``allocate_slots`` arguments that only some
releases have, each with the profile switch that says whether a release has
it (vLLM 0.16.0 has none of the first three nor the admission arguments;
``new_step_starts`` came with 0.17.0, ``take_new_block_ids`` with 0.17.1,
``full_sequence_must_fit`` with 0.21.0, ``reserved_blocks`` with 0.23.0,
``pop_blocks_for_free``, ``has_scheduled_reqs`` and the prefix hint with
0.24.0, ``get_block_ids_for_computed_tokens`` with 0.25.0,
``record_prefix_cache_stats`` with 0.27.0, ``estimate_cached_tokens``,
``take_kv_cache_block_copies`` and ``record_blocks_for_zeroing`` with 0.26.0,
``get_computed_blocks_for_connector`` and ``truncate_computed_blocks`` with 0.27.0, ``get_computed_blocks``'s
``max_cache_hit_length`` with 0.33.0, ``get_num_cached_tokens`` with 0.34.0;
``get_num_common_prefix_blocks`` is gone from 0.34.0 on;
``get_zeroing_block_ids_in_range`` exists from 0.26.0 to 0.31.0 and
``allocate_slots``' ``skip_zeroing_group_ids`` from 0.32.0 on)."""


UNPROBED_ABSENT: tuple[tuple[str, Callable[[SemanticsProfile], bool]], ...] = ()
"""Operations and arguments that only some releases have, like
:data:`RELEASE_OPERATIONS`, which the state machine's probe of absent
operations does not send yet: where a release lacks one, the lockstep leaves
it out (:func:`unprobed_absent`) instead of probing that every side refuses it.
None today: a release-dependent operation joins it only until the probe can
send it."""


def unprobed_absent(profile: SemanticsProfile) -> frozenset[str]:
    """The features of :data:`UNPROBED_ABSENT` that ``profile``'s release lacks."""
    return frozenset(feature for feature, has in UNPROBED_ABSENT if not has(profile))


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
    *,
    trusts_caller: bool = False,
    whole_prompts: bool = False,
    one_token_decode: bool = False,
) -> Callable[[F], F]:
    """Attach ``supports``, ``unsupported`` and the opt-in ``features`` it runs
    (:data:`OPT_IN_FEATURES`) to a factory; the capabilities add their
    features to ``unsupported`` (:data:`CAPABILITIES`): ``trusts_caller``
    (no invalid call is sent), ``whole_prompts`` (every admission allocates
    all of the request's tokens) and ``one_token_decode`` (a running step
    allocates for one token, no lookahead slots).

    A factory that cannot carry attributes (a bound method such as
    ``VllmLineage.make``, a ``functools.partial``) is wrapped in a function
    that can; use what ``declare`` returns.

    Example::

        @declare(supports=lambda c: None if len(c.groups) == 1 else "one group only",
                 unsupported={"events", "op:pop_blocks_for_free"}, trusts_caller=True, whole_prompts=True)
        def make(config): ...

    Raises:
        ValueError: For a name in ``unsupported`` that is no feature (a typo
            would leave it in every history) or one in ``features`` that is
            not opt-in.
    """
    unknown = sorted(set(features) - set(OPT_IN_FEATURES))
    if unknown:
        raise ValueError(f"declare(features=...): {unknown} are not opt-in features (those are {OPT_IN_FEATURES})")
    chosen = {"trusts_caller": trusts_caller, "whole_prompts": whole_prompts, "one_token_decode": one_token_decode}
    lacking = frozenset(unsupported).union(*(CAPABILITIES[name] for name, on in chosen.items() if on))
    misspelt = sorted(f for f in lacking if f not in known_features() and f"op:{f}" not in known_features())
    if misspelt:
        raise ValueError(
            f"declare(unsupported=...): {misspelt} are not features; see kvref.capabilities.known_features()"
        )
    lacking = frozenset(f if f in known_features() else f"op:{f}" for f in lacking)

    def attach(factory: F) -> F:
        target: Any = factory
        try:
            _set_declarations(target, supports, lacking, frozenset(features))
        except AttributeError:  # a bound method or a builtin: a function that forwards to it
            target = _forwarding(factory)
            _set_declarations(target, supports, lacking, frozenset(features))
        result: F = target
        return result

    return attach


def _set_declarations(
    factory: Any,
    supports: Callable[[KVCacheConfig], str | None] | None,
    lacking: frozenset[str],
    opt_in: frozenset[str],
) -> None:
    if supports is not None:
        factory.supports = supports
    factory.unsupported = lacking
    factory.features = opt_in


def _forwarding(factory: Any) -> Callable[[KVCacheConfig], object]:
    def build(config: KVCacheConfig) -> object:
        return factory(config)

    build.__name__ = getattr(factory, "__name__", "factory")
    build.__qualname__ = getattr(factory, "__qualname__", build.__name__)
    build.__doc__ = getattr(factory, "__doc__", None)
    return build


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
        "mtp": uses_prefill_lookahead(config),
        "lookahead_hashes": config.num_hash_lookahead_tokens > 0,
        "retention": config.prefix_cache_retention_interval is not None,
        "prefill_checkpoints": "prefill-checkpoints" in features_used(config),
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
        if op.get("prompt_logprobs"):
            found.add("prompt_logprobs")
        if op.get("kv_cache_report_mode", "incremental") != "incremental":
            found.add("report_mode_full")
        return found
    if name in ("append_tokens", "set_request") or name is None:
        return set()
    if name == "allocate_slots_batch":  # the same calls one after another: their features
        return set().union(*(op_features({**item, "op": "allocate_slots"}) for item in op.get("items", ())))
    found = {f"op:{name}"}
    if name == "allocate_slots":
        found |= {ALLOCATE_FEATURES[k] for k, v in _ALLOCATE_DEFAULTS.items() if k in op and op[k] != v}
    if name == "get_computed_blocks" and op.get("max_cache_hit_length") is not None:
        found.add("max_cache_hit_length")
    return found


def refused_only(steps: Iterable[Json]) -> frozenset[str]:
    """The operation features (``op:<name>``) whose every step in ``steps``
    expects the refusal of an operation the release lacks: an adapter that
    declares it lacks them refuses them as the trace expects."""
    probed: set[str] = set()
    used: set[str] = set()
    for step in steps:
        feature = f"op:{step.get('op')}"
        (probed if step.get("expect") == ABSENT else used).add(feature)
    return frozenset(probed - used)


def trace_features(config: KVCacheConfig, steps: Iterable[Json]) -> list[str]:
    """Every feature a history uses, sorted (the ``features`` header field):
    those of its configuration, of each step, and the :data:`SCHEDULER_FEATURES`
    its steps show (an allocation that leaves some of the request's tokens
    for a later step; a step whose expected output is a caller error)."""
    found = config_features(config)
    tokens: dict[str, int] = {}
    computed: dict[str, int] = {}
    for step in steps:
        found |= op_features(step)  # a probe of an absent operation too (replay: refused_only)
        name, rid = step.get("op"), step.get("rid", "")
        expect = step.get("expect")
        if isinstance(expect, dict) and "error" in expect and expect != {"error": "UnsupportedOperationError"}:
            found.add(CALLER_ERRORS)
            continue
        if name == "add_request":
            tokens[rid], computed[rid] = len(step.get("prompt", ())), 0
        elif name == "append_tokens" and rid in tokens:
            tokens[rid] += len(step.get("tokens", ()))
        elif name == "set_request" and "num_computed_tokens" in step:
            computed[rid] = int(step["num_computed_tokens"])
        elif (
            name == "allocate_slots"
            and rid in tokens
            and isinstance(expect, list)
            and not step.get("delay_cache_blocks")
        ):
            after = computed.get(rid, 0) + sum(
                int(step.get(k, 0))
                for k in ("num_new_computed_tokens", "num_external_computed_tokens", "num_new_tokens")
            )
            if after < tokens[rid]:
                found.add(CHUNKED_PREFILL)
    return sorted(found)


def feature_of(exc: BaseException, op: Json | None) -> str:
    """The feature an :data:`SKIP_ERRORS` exception says is missing: its
    ``feature`` attribute, else the operation's (``op:<name>``; for a lookup
    with ``max_cache_hit_length``, that argument: an adapter older than it
    still runs plain lookups, which leaving out ``op:get_computed_blocks``
    would stop), else ``config``."""
    feature = getattr(exc, "feature", "")
    if feature:
        return str(feature)
    if op is None:
        return "config"
    if op["op"] == "get_computed_blocks" and op.get("max_cache_hit_length") is not None:
        return "max_cache_hit_length"
    return f"op:{op['op']}"


def known_features() -> frozenset[str]:
    """Every feature name :func:`trace_features` can produce."""
    kinds = {f"kind:{name}" for name in KIND_CLASSES}
    ops = {f"op:{name}" for name in FACADE_OPS}
    lookup = {"max_cache_hit_length"}
    return frozenset(
        {*CONFIG_FEATURES, *REQUEST_FEATURES, *ALLOCATE_FEATURES.values(), *SCHEDULER_FEATURES, *kinds, *ops, *lookup}
    )


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
