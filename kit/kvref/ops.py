"""Operations as language-neutral records, and their execution on adapters.

An operation is a JSON object ``{"op": NAME, ...arguments}``. Three kinds:

* request operations (``add_request``, ``append_tokens``, ``set_request``)
  change the caller-side request values kept in a :class:`RequestBook`; they
  never call an adapter (a scheduler owns its requests, not the manager);
  with them go the step events of an asynchronous scheduler
  (``step_dispatch``, ``step_output``: :data:`STEP_EVENTS`), which change
  nothing and call no adapter (a safety monitor reads them);
* facade operations (``allocate_slots``, ``free``, ...) call the adapter with
  the current request value and return a JSON-able output;
* a facade operation that raises a :mod:`kvspec.errors` class returns
  ``{"error": ClassName}``, except the "cannot run this" errors of
  :data:`SKIP_ERRORS`, which propagate (a skip, not an
  output).

Adapters of protocol version 2 (:func:`kvref.adapters.protocol_version`)
get the request value, not its id, where vLLM's own methods take the request
(``free``, ``pop_blocks_for_free``).

The exact fields are documented in ``docs/traces.md``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from kvref.adapters import KVCacheAdapter, protocol_version
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
from kvspec.errors import KVCacheError, UnsupportedByProfileError, UnsupportedOperationError
from kvspec.events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvspec.hashing import ExtraKeySource, LoRA, MultiModalFeature
from kvspec.profiles import SemanticsProfile
from kvspec.request import Request, RequestBlockHasher, RequestStatus
from kvspec.view import BlockIds

Json = Any
STEP_EVENTS = ("step_dispatch", "step_output")
"""Where an asynchronous scheduler dispatched a step and processed its output
(:mod:`kvref.scheduler_pipeline`): no adapter call, no request change."""
REQUEST_OPS = ("add_request", "append_tokens", "set_request", *STEP_EVENTS)
SKIP_ERRORS: tuple[type[BaseException], ...] = (UnsupportedOperationError, UnsupportedByProfileError)
"""Exceptions that mean "cannot run this", never "ran it wrongly" (a skip,
:mod:`kvref.capabilities`); :func:`execute` lets them propagate.

NOTE: defined here, where operations run, and re-exported by
:mod:`kvref.capabilities`, which imports this module (the operation names
of its features): the other way round the two modules imported each other."""

FACADE_OPS = (
    "get_computed_blocks",
    "get_computed_blocks_for_connector",
    "truncate_computed_blocks",
    "get_prefix_hint",
    "allocate_slots",
    "allocate_slots_batch",
    "cache_blocks",
    "record_prefix_cache_stats",
    "free",
    "pop_blocks_for_free",
    "free_blocks",
    "remove_skipped_blocks",
    "evict_blocks",
    "reset_prefix_cache",
    "get_num_common_prefix_blocks",
    "take_events",
    "take_new_block_ids",
    "record_blocks_for_zeroing",
    "get_zeroing_block_ids_in_range",
    "take_kv_cache_block_copies",
    "new_step_starts",
    "get_block_ids",
    "get_block_ids_for_computed_tokens",
    "estimate_cached_tokens",
    "get_num_cached_tokens",
    "usage",
    "make_prefix_cache_stats",
)
"""Every facade operation :func:`execute` runs."""
ZEROING_RANGE = "get_zeroing_block_ids_in_range"
"""The operation that lists a delayed load's destinations (vLLM 0.26.0 to 0.31.0)."""
ALLOCATE_KEYS = (
    "num_new_computed_tokens",
    "new_computed_blocks",
    "num_lookahead_tokens",
    "num_external_computed_tokens",
    "delay_cache_blocks",
    "num_encoder_tokens",
    "full_sequence_must_fit",
    "reserved_blocks",
    "has_scheduled_reqs",
    "skip_zeroing_group_ids",
)
"""Optional keyword arguments of ``allocate_slots``, in the protocol's order."""
KIND_CLASSES: dict[str, type] = {
    c.__name__: c
    for c in (
        FullAttention, MLA, SinkFullAttention, SlidingWindow, ChunkedLocal, Mamba, CrossAttention, CircularBuffer,
        KpoolTail,
    )
}  # fmt: skip


class RequestBook:
    """Caller-side request values, advanced by request operations."""

    def __init__(self, config: KVCacheConfig) -> None:
        """An empty book hashing like ``config``."""
        self.hasher = RequestBlockHasher.for_config(config)
        self.requests: dict[str, Request] = {}

    def apply(self, op: Json) -> None:
        """Apply one request operation (a step event changes nothing)."""
        if op["op"] in STEP_EVENTS:
            return
        name, rid = op["op"], op["rid"]
        if name == "add_request":
            extra = extra_from_json(op.get("extra") or {})
            skip = op.get("skip_reading_prefix_cache")  # absent or null: unset (skips with prompt logprobs)
            req = self.hasher.new_request(
                rid, op["prompt"], extra, None if skip is None else bool(skip),
                bool(op.get("prompt_logprobs")), op.get("prompt_logprob_start"),
                op.get("kv_cache_report_mode", "incremental"),
            )  # fmt: skip
            self.requests[rid] = req
        elif name == "append_tokens":
            self.requests[rid] = self.hasher.with_output_tokens(self.requests[rid], op["tokens"])
        elif name == "set_request":
            changes: dict[str, Any] = {}
            for key in ("num_computed_tokens", "num_preemptions", "num_in_flight_tokens"):
                if key in op:
                    changes[key] = op[key]
            if "status" in op:
                changes["status"] = RequestStatus(op["status"])
            if "skip_reading_prefix_cache" in op:  # a scheduler setting the flag late (0.34.0 no longer reads it)
                changes["skip_reading_prefix_cache"] = bool(op["skip_reading_prefix_cache"])
            self.requests[rid] = replace(self.requests[rid], **changes)
        else:
            raise ValueError(f"not a request operation: {name!r}")


def execute(adapter: KVCacheAdapter, book: RequestBook, op: Json) -> Json:
    """Run one facade operation on ``adapter``; caller errors become
    ``{"error": ClassName}``."""
    try:
        return _execute(adapter, book, op)
    except SKIP_ERRORS:
        raise
    except KVCacheError as exc:
        return {"error": type(exc).__name__}


ABSENT: Json = {"error": "UnsupportedOperationError"}
"""The output of an operation (or argument) its release lacks, sent on
purpose: every side must refuse it, whichever skip error it raises (a
:data:`SKIP_ERRORS` class), and change nothing."""


def execute_absent(
    adapter: KVCacheAdapter,
    book: RequestBook,
    op: Json,
    execute_op: Callable[[KVCacheAdapter, RequestBook, Json], Json] | None = None,
) -> Json:
    """``execute_op`` (default :func:`execute`) for an operation the release
    lacks: a skip error is its expected answer, :data:`ABSENT`; anything else
    is what the adapter did instead (an output, or a caller error's
    ``{"error": ...}``)."""
    try:
        return (execute_op or execute)(adapter, book, op)
    except SKIP_ERRORS:
        return dict(ABSENT)


def _optional(a: KVCacheAdapter, name: str) -> Any:
    """The adapter's optional method ``name`` (an operation some releases
    lack).

    Raises:
        UnsupportedOperationError: The adapter has no such method.
    """
    method = getattr(a, name, None)
    if method is None:
        raise UnsupportedOperationError(f"{a.name} has no {name}")
    return method


_TAKES_KEYWORD: dict[tuple[type, str, str], bool] = {}
"""(adapter class, method, keyword) -> whether the class's method takes it (signatures are read once)."""


def _takes_keyword(method: Any, keyword: str) -> bool:
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):  # a builtin without a signature: try it
        return True
    return keyword in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _with_keyword(a: KVCacheAdapter, name: str, keyword: str) -> Any:
    """The adapter's method ``name``, which must take ``keyword`` (an argument
    some releases lack). The answer is kept per adapter class where the class
    defines the method (an instance's own attribute, or one a ``__getattr__``
    forwards, is read every time).

    Raises:
        UnsupportedOperationError: The method has no such parameter.
    """
    method = getattr(a, name)
    if name in getattr(a, "__dict__", {}) or getattr(type(a), name, None) is None:  # not the class's method
        takes = _takes_keyword(method, keyword)
    else:
        key = (type(a), name, keyword)
        if key not in _TAKES_KEYWORD:
            _TAKES_KEYWORD[key] = _takes_keyword(method, keyword)
        takes = _TAKES_KEYWORD[key]
    if not takes:
        exc = UnsupportedOperationError(f"{a.name} has no {name}({keyword}=...)")
        exc.feature = keyword  # type: ignore[attr-defined]  # read by kvref.capabilities.feature_of
        raise exc
    return method


def _execute(a: KVCacheAdapter, book: RequestBook, op: Json) -> Json:
    name = op["op"]
    req = book.requests.get(op.get("rid", ""))
    if name == "get_computed_blocks":
        assert req is not None
        if "max_cache_hit_length" in op:  # only then: adapters older than the argument keep working
            lookup = _with_keyword(a, "get_computed_blocks", "max_cache_hit_length")
            blocks, n = lookup(req, max_cache_hit_length=op["max_cache_hit_length"])
        else:
            blocks, n = a.get_computed_blocks(req)
        return {"blocks": ids_to_json(blocks), "num_tokens": n}
    if name == "get_computed_blocks_for_connector":
        assert req is not None
        lookup = _optional(a, "get_computed_blocks_for_connector")
        if "max_cache_hit_length" in op:
            blocks, n, diverged = lookup(req, max_cache_hit_length=op["max_cache_hit_length"])
        else:
            blocks, n, diverged = lookup(req)
        return {"blocks": ids_to_json(blocks), "num_tokens": n, "hit_diverged": diverged}
    if name == "truncate_computed_blocks":
        truncate = _optional(a, "truncate_computed_blocks")
        return ids_to_json(truncate(tuple(tuple(g) for g in op["blocks"]), op["num_computed_tokens"]))
    if name == "get_num_cached_tokens":
        assert req is not None
        cached = _optional(a, "get_num_cached_tokens")
        return cached(req)
    if name == "get_prefix_hint":
        assert req is not None
        hint = _optional(a, "get_prefix_hint")
        return hint(req)
    if name == "estimate_cached_tokens":
        assert req is not None
        estimate = _optional(a, "estimate_cached_tokens")
        return estimate(req)
    if name == "allocate_slots":
        assert req is not None
        # A key the operation leaves out is not passed: the adapter's default
        # applies, and the defaults are part of the protocol (KVCacheAdapter).
        kwargs = {k: op[k] for k in ALLOCATE_KEYS if k in op}
        if kwargs.get("new_computed_blocks") is not None:
            kwargs["new_computed_blocks"] = tuple(tuple(g) for g in kwargs["new_computed_blocks"])
        if isinstance(kwargs.get("skip_zeroing_group_ids"), list):
            kwargs["skip_zeroing_group_ids"] = tuple(kwargs["skip_zeroing_group_ids"])
        allocate = a.allocate_slots
        if "skip_zeroing_group_ids" in kwargs:  # only then: adapters older than the argument keep working
            allocate = _with_keyword(a, "allocate_slots", "skip_zeroing_group_ids")
        out = allocate(req, op["num_new_tokens"], **kwargs)
        return None if out is None else ids_to_json(out)
    if name == "allocate_slots_batch":
        return _allocate_batch(a, book, op)
    if name == "cache_blocks":
        assert req is not None
        a.cache_blocks(req, op["num_computed_tokens"])
        return None
    if name == "record_prefix_cache_stats":
        assert req is not None
        record = _optional(a, "record_prefix_cache_stats")
        record(req, op["num_hits"])
        return None
    if name == "take_kv_cache_block_copies":
        take = _optional(a, "take_kv_cache_block_copies")
        copies, retained = take()
        return {"copies": [[src, dst] for src, dst in copies], "retained": list(retained)}
    if name in ("free", "pop_blocks_for_free"):
        # Protocol 2 passes the request as vLLM does; an id the book does not
        # know (a caller error) becomes a request with no tokens.
        who: Any = op["rid"]
        if protocol_version(a) >= 2:
            who = req if req is not None else Request(op["rid"], (), 0, ())
        if name == "free":
            a.free(who)
            return None
        return list(a.pop_blocks_for_free(who))
    return _execute_by_id(a, op)


def _execute_by_id(a: KVCacheAdapter, op: Json) -> Json:
    name = op["op"]
    if name == "free_blocks":
        a.free_blocks(op["block_ids"])
        return None
    if name == "remove_skipped_blocks":
        a.remove_skipped_blocks(op["rid"], op["total_computed_tokens"], op.get("num_prompt_tokens"))
        return None
    if name == "evict_blocks":
        a.evict_blocks(op["block_ids"])
        return None
    if name == "reset_prefix_cache":
        return a.reset_prefix_cache()
    if name == "get_num_common_prefix_blocks":
        return list(a.get_num_common_prefix_blocks(op["rid"]))
    if name == "take_events":
        return [event_to_json(e) for e in a.take_events()]
    if name == "take_new_block_ids":
        return list(a.take_new_block_ids())
    if name == "record_blocks_for_zeroing":
        _optional(a, "record_blocks_for_zeroing")(op["rid"], op["start_token"])
        return None
    if name == ZEROING_RANGE:
        in_range = _optional(a, ZEROING_RANGE)
        return list(in_range(op["rid"], op["start_token"], op["end_token"]))
    if name == "new_step_starts":
        a.new_step_starts()
        return None
    if name == "get_block_ids":
        return ids_to_json(a.get_block_ids(op["rid"]))
    if name == "get_block_ids_for_computed_tokens":
        clipped = _optional(a, "get_block_ids_for_computed_tokens")
        return ids_to_json(clipped(op["rid"], op["num_computed_tokens"]))
    if name == "usage":
        return round(a.usage, 9)
    if name == "make_prefix_cache_stats":
        stats = a.make_prefix_cache_stats()
        return None if stats is None else asdict(stats)
    raise ValueError(f"unknown operation {name!r}")


def ids_to_json(blocks: BlockIds) -> list[list[int]]:
    """Block ids per group as nested lists."""
    return [list(g) for g in blocks]


def event_to_json(event: KVCacheEvent) -> Json:
    """An event as a JSON object with a ``type`` field; bytes become hex. A
    ``lookahead_token_ids`` of None is left out (events of releases before
    look-ahead hashes, and traces recorded before them, stay byte-equal)."""
    if isinstance(event, AllBlocksCleared):
        return {"type": "AllBlocksCleared"}
    kind = "BlockStored" if isinstance(event, BlockStored) else "BlockRemoved"
    assert isinstance(event, BlockStored | BlockRemoved)
    fields = asdict(event)
    if fields.get("lookahead_token_ids", 0) is None:
        del fields["lookahead_token_ids"]
    return {"type": kind, **{k: _plain(v) for k, v in fields.items()}}


def _plain(value: Any) -> Json:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def extra_from_json(obj: Json) -> ExtraKeySource:
    """The extra-key sources of an ``add_request`` operation."""
    lora = obj.get("lora")
    embeds = obj.get("prompt_embeds")
    return ExtraKeySource(
        lora=LoRA(lora["name"], lora["adapter_id"], lora.get("path", "")) if lora else None,
        mm_features=tuple(
            MultiModalFeature(f["identifier"], f["offset"], f["length"]) for f in obj.get("mm_features", [])
        ),
        cache_salt=obj.get("cache_salt"),
        prompt_embeds=None if embeds is None else tuple(bytes.fromhex(r) for r in embeds),
    )


def config_to_json(cfg: KVCacheConfig) -> Json:
    """A config as a JSON object; kinds are ``{"kind": ClassName, ...fields}``.
    The semantics profile is not part of it (a trace header names it), nor are
    context-parallel world sizes of 1, a ``num_prefill_lookahead`` or
    ``num_hash_lookahead_tokens`` of 0, a ``prefix_cache_retention_interval``
    of None or a window's ``extra_retained_tokens`` of 0 (traces older than
    them stay byte-equal)."""
    data = asdict(cfg)
    del data["profile"]
    defaults = (
        ("dcp_world_size", 1), ("pcp_world_size", 1), ("num_prefill_lookahead", 0), ("num_hash_lookahead_tokens", 0),
        ("prefix_cache_retention_interval", None),
    )  # fmt: skip
    for name, default in defaults:
        if data[name] == default:
            del data[name]
    data["groups"] = [_kind_to_json(k) for k in cfg.groups]
    data["eagle_groups"] = list(cfg.eagle_groups)
    return data


def _kind_to_json(kind: AttentionKind) -> Json:
    data = {"kind": type(kind).__name__, **asdict(kind)}
    # fields newer than the trace format's first releases are written only when set
    for name, default in (("extra_retained_tokens", 0), ("num_prefill_checkpoint_blocks", 0),
                          ("prefill_checkpoint_alignment", None)):  # fmt: skip
        if name in data and data[name] == default:
            del data[name]
    return data


def config_from_json(obj: Json, profile: SemanticsProfile) -> KVCacheConfig:
    """Inverse of :func:`config_to_json`, under ``profile``."""
    data = dict(obj)
    groups: list[AttentionKind] = []
    for g in data.pop("groups"):
        fields = {k: v for k, v in g.items() if k != "kind"}
        groups.append(KIND_CLASSES[g["kind"]](**fields))
    data["eagle_groups"] = tuple(data.get("eagle_groups", ()))
    return KVCacheConfig(groups=tuple(groups), profile=profile, **data)


def output_problem(op: str, out: Json) -> str | None:
    """What is wrong with the *type* of an adapter's output for ``op`` (as
    :func:`execute` returns it), or None: block ids and counts must be ints
    (a float 1.0 equals 1 in a comparison, so values alone would not tell)."""
    if isinstance(out, dict) and ("error" in out or "crash" in out):
        return None
    if op == "get_computed_blocks":
        if not isinstance(out, dict) or not _int(out.get("num_tokens")):
            return "get_computed_blocks must return (block ids per group, int tokens)"
        return _block_lists_problem(out.get("blocks"))
    if op == "get_computed_blocks_for_connector":
        ok = isinstance(out, dict) and _int(out.get("num_tokens")) and isinstance(out.get("hit_diverged"), bool)
        if not ok:
            return "get_computed_blocks_for_connector must return (block ids per group, int tokens, bool)"
        return _block_lists_problem(out.get("blocks"))
    if op in ("allocate_slots", "get_block_ids", "get_block_ids_for_computed_tokens", "truncate_computed_blocks"):
        return None if out is None and op == "allocate_slots" else _block_lists_problem(out)
    if op == "allocate_slots_batch":
        if not isinstance(out, list):
            return f"allocate_slots_batch must return one output per request, got {out!r}"
        return next((p for p in (_block_lists_problem(o) for o in out if o is not None) if p), None)
    if op in ("pop_blocks_for_free", "take_new_block_ids", "get_num_common_prefix_blocks") or op == ZEROING_RANGE:
        ok = isinstance(out, list) and all(_int(x) for x in out)
        return None if ok else f"{op} must return a sequence of ints, got {out!r}"
    if op in ("get_prefix_hint", "estimate_cached_tokens", "get_num_cached_tokens"):
        return None if _int(out) and out >= 0 else f"{op} must return an int >= 0, got {out!r}"
    if op == "reset_prefix_cache":
        return None if isinstance(out, bool) else f"reset_prefix_cache must return a bool, got {out!r}"
    if op == "take_kv_cache_block_copies":
        ok = isinstance(out, dict) and _block_lists_problem([*out.get("copies", [0]), out.get("retained")]) is None
        return None if ok else f"take_kv_cache_block_copies must return int copies and retained ids, got {out!r}"
    if op == "usage":
        return None if isinstance(out, float | int) and not isinstance(out, bool) else f"usage is {out!r}"
    return None


def _allocate_batch(a: KVCacheAdapter, book: RequestBook, op: Json) -> Json:
    """One scheduler step of several running requests: the adapter's
    ``allocate_slots_batch(requests, num_new_tokens, num_lookahead_tokens)``
    where it has one, else the same ``allocate_slots`` calls one after another
    (what a batch means: kvimpl's batch gives exactly their results and effects).
    Returns the per-request outputs, as ``allocate_slots`` gives them."""
    items = op["items"]
    requests = [book.requests[it["rid"]] for it in items]
    counts = [it["num_new_tokens"] for it in items]
    looks = [it.get("num_lookahead_tokens", 0) for it in items]
    batch = getattr(a, "allocate_slots_batch", None)
    if batch is not None:
        outs = batch(requests, counts, looks)
    else:
        outs = [a.allocate_slots(r, n, num_lookahead_tokens=k) for r, n, k in zip(requests, counts, looks, strict=True)]
    return [None if out is None else ids_to_json(out) for out in outs]


def _int(value: Json) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _block_lists_problem(blocks: Json) -> str | None:
    if not isinstance(blocks, list) or not all(isinstance(g, list) and all(_int(b) for b in g) for g in blocks):
        return f"block ids must be ints per group, got {blocks!r}"
    return None
