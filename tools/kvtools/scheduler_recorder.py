"""Record the calls a real vLLM scheduler makes to its ``KVCacheManager``.

:class:`RecordingManager` stands in for ``scheduler.kv_cache_manager``: each
call the scheduler makes is passed to the real manager unchanged, and its
arguments, result and the manager's view afterwards become one facade step
of a kvref trace (``docs/traces.md``). Before a call that takes a request,
the request's state is written as kvref's request operations, so that a
replayer's request book holds what the live vLLM request held at that
moment: ``add_request`` with the prompt when the request is first seen,
``append_tokens`` with the tokens it gained since, ``set_request`` with a
changed ``num_computed_tokens``, status, preemption count or (vLLM 0.26.0
on, asynchronous scheduling) ``num_in_flight_tokens``.

What the scheduler does that the format cannot say is refused with
:class:`Unrecordable` naming it (a manager method without an operation, a
keyword away from its default, tokens taken back), except for the calls of
:data:`LEFT_OUT`, which read state kvspec does not model and change no
block: they run, are counted (:attr:`Recorder.left_out`), and are not
written.

Attribute reads the scheduler makes (``coordinator``, ``block_pool``,
``empty_kv_cache_blocks``, ``log_stats``, ...) pass through; the pool's
``free_blocks`` (deferred and copy-on-write frees) is recorded as
``free_blocks``, and the hybrid coordinator's prefix hint read by vLLM
0.25.1's scheduler as ``get_prefix_hint``.
"""

from __future__ import annotations

import inspect
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Final

from kvref.adapters.vllm import VllmApi
from kvref.adapters.vllm.view import convert_event, convert_stats, group_ids, ids_of, to_view
from kvref.ops import ALLOCATE_KEYS, event_to_json, ids_to_json
from kvref.vllm_config import status_from_vllm
from kvspec.view import KVView

Json = Any

LEFT_OUT: Final = frozenset({"take_boundary_state_offloads"})
"""Manager methods the scheduler calls that kvref's format has no operation
for and that change no block (vLLM 0.29.0 on: the Mamba boundary states a
KV connector may offload, drained every step). kvspec does not model them."""

PASSIVE_POOL: Final = frozenset({"get_num_free_blocks", "get_usage"})
"""Block-pool methods that only read (passed through unrecorded)."""


class Unrecordable(RuntimeError):
    """The scheduler did something kvref's trace format cannot express."""


@dataclass(slots=True)
class _Known:
    """What the trace's request book holds for one request id."""

    tokens: tuple[int, ...]
    num_computed_tokens: int
    status: str
    num_preemptions: int
    num_in_flight_tokens: int = 0


class Recorder:
    """The steps recorded so far, and the request book they imply.

    Attributes:
        steps: The trace's steps (request and facade operations).
        left_out: Calls of :data:`LEFT_OUT` methods, by name.
        left_out_nonempty: Those of them that returned something.
        ops: Facade operations recorded, by name.
        views: The real manager's view after each facade step, by step index.
    """

    def __init__(self, api: VllmApi, manager: Any) -> None:
        """Record calls to ``manager`` (the real one), reached through ``api``."""
        self.api = api
        self.manager = manager
        self._pool = api.block_pool(manager)
        self._managers = api.single_type_managers(manager)
        self.steps: list[Json] = []
        self.left_out: Counter[str] = Counter()
        self.left_out_nonempty: Counter[str] = Counter()
        self.ops: Counter[str] = Counter()
        self.views: dict[int, KVView] = {}
        self._known: dict[str, _Known] = {}
        self.last_lookup: str | None = None

    @property
    def calls(self) -> int:
        """Facade operations recorded."""
        return sum(self.ops.values())

    def sync(self, vreq: Any) -> str:
        """Write the request operations that bring the book to ``vreq``'s state; its id.

        Raises:
            Unrecordable: The request lost tokens, or its prompt changed.
        """
        rid = str(vreq.request_id)
        tokens = tuple(int(t) for t in vreq.all_token_ids)
        known = self._known.get(rid)
        if known is None:
            prompt = tokens[: int(vreq.num_prompt_tokens)]
            op: Json = {"op": "add_request", "rid": rid, "prompt": list(prompt)}
            if _skips_reads(vreq):
                op["skip_reading_prefix_cache"] = True
            self.steps.append(op)
            known = self._known[rid] = _Known(prompt, 0, "WAITING", 0)
        if tokens != known.tokens:
            if tokens[: len(known.tokens)] != known.tokens:
                raise Unrecordable(f"request {rid!r}: its tokens changed other than by appending")
            self.steps.append({"op": "append_tokens", "rid": rid, "tokens": list(tokens[len(known.tokens) :])})
            known.tokens = tokens
        now = {
            "num_computed_tokens": int(vreq.num_computed_tokens),
            "status": status_from_vllm(vreq.status).value,
            "num_preemptions": int(vreq.num_preemptions),
            # vLLM 0.26.0 on (an asynchronous scheduler's steps in flight); 0 before, where no request has it
            "num_in_flight_tokens": int(getattr(vreq, "num_in_flight_tokens", 0)),
        }
        changed = {k: v for k, v in now.items() if getattr(known, k) != v}
        if changed:
            self.steps.append({"op": "set_request", "rid": rid, **changed})
            for key, value in changed.items():
                setattr(known, key, value)
        return rid

    def facade(self, op: Json, out: Json) -> None:
        """Write one facade step: ``op``, its output and the view digest after it."""
        step = dict(op)
        if out is not None:
            step["expect"] = out
        view = to_view(self.api, self._pool, self._managers)
        step["view"] = view.digest()
        self.views[len(self.steps)] = view
        self.steps.append(step)
        self.ops[op["op"]] += 1


class RecordingManager:
    """``scheduler.kv_cache_manager``, recording every call (see the module docstring)."""

    def __init__(self, real: Any, recorder: Recorder) -> None:
        """Wrap the real manager ``real``."""
        self._real = real
        self._rec = recorder
        self._api = recorder.api

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._real, name)
        if name == "block_pool":
            return _RecordingPool(value, self._rec)
        if name == "coordinator":
            return _RecordingCoordinator(value, self._rec)
        if name in LEFT_OUT:
            return _left_out(name, value, self._rec)
        if callable(value):
            raise Unrecordable(f"the scheduler called KVCacheManager.{name}, which kvref's format has no operation for")
        return value

    # ------------------------------------------------------------ requests

    def get_computed_blocks(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        """Lookup; also records the prefix hint where the release returns it."""
        _only_defaults(self._real.get_computed_blocks, "get_computed_blocks", 1, args, kwargs)
        rid = self._rec.sync(request)
        out = self._real.get_computed_blocks(request, *args, **kwargs)
        blocks, num_tokens = out[0], int(out[1])
        self._rec.facade(
            {"op": "get_computed_blocks", "rid": rid},
            {"blocks": ids_to_json(group_ids(self._api, blocks)), "num_tokens": num_tokens},
        )
        self._rec.last_lookup = rid
        if self._api.lookup_returns_boundary:
            self._rec.facade({"op": "get_prefix_hint", "rid": rid}, int(out[2]))
        return out

    def allocate_slots(self, request: Any, num_new_tokens: int, **kwargs: Any) -> Any:
        """Allocation, with every keyword the scheduler passed."""
        extra = {k: v for k, v in kwargs.items() if k not in ALLOCATE_KEYS}
        _only_defaults(self._real.allocate_slots, "allocate_slots", 2, (), extra)
        rid = self._rec.sync(request)
        op: Json = {"op": "allocate_slots", "rid": rid, "num_new_tokens": int(num_new_tokens)}
        for key in ALLOCATE_KEYS:
            if key not in kwargs:
                continue
            value = kwargs[key]
            if key == "new_computed_blocks":
                value = None if value is None else ids_to_json(group_ids(self._api, value))
            elif isinstance(value, tuple | list):  # group ids (skip_zeroing_group_ids): left out when empty
                if not value:
                    continue
                value = [int(v) for v in value]
            op[key] = value if isinstance(value, bool | list) or value is None else int(value)
        out = self._real.allocate_slots(request, num_new_tokens, **kwargs)
        self._rec.facade(op, None if out is None else ids_to_json(group_ids(self._api, out)))
        return out

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        """Hash full blocks up to ``num_computed_tokens``."""
        rid = self._rec.sync(request)
        self._real.cache_blocks(request, num_computed_tokens)
        self._rec.facade({"op": "cache_blocks", "rid": rid, "num_computed_tokens": int(num_computed_tokens)}, None)

    def free(self, request: Any) -> None:
        """Free the request's blocks."""
        rid = self._rec.sync(request)
        self._real.free(request)
        self._rec.facade({"op": "free", "rid": rid}, None)

    def pop_blocks_for_free(self, request: Any) -> Any:
        """Detach the request's blocks for a deferred free."""
        rid = self._rec.sync(request)
        out = self._real.pop_blocks_for_free(request)
        self._rec.facade({"op": "pop_blocks_for_free", "rid": rid}, list(ids_of(self._api, out)))
        return out

    def record_prefix_cache_stats(self, request: Any, num_hits: int) -> None:
        """Statistics of an admission (vLLM 0.27.0 on)."""
        rid = self._rec.sync(request)
        self._real.record_prefix_cache_stats(request, num_hits)
        self._rec.facade({"op": "record_prefix_cache_stats", "rid": rid, "num_hits": int(num_hits)}, None)

    def estimate_cached_tokens(self, request: Any) -> int:
        """The prefix the request's cached blocks stand for (vLLM 0.26.0 on)."""
        rid = self._rec.sync(request)
        out = int(self._real.estimate_cached_tokens(request))
        self._rec.facade({"op": "estimate_cached_tokens", "rid": rid}, out)
        return out

    # ------------------------------------------------------------ by id

    def get_blocks(self, request_id: str) -> Any:
        """The request's blocks; recorded as ``get_block_ids`` (their ids are all a caller sees)."""
        out = self._real.get_blocks(request_id)
        self._rec.facade({"op": "get_block_ids", "rid": request_id}, ids_to_json(group_ids(self._api, out)))
        return out

    def get_block_ids(self, request_id: str) -> Any:
        """The request's block ids per group."""
        out = self._real.get_block_ids(request_id)
        self._rec.facade({"op": "get_block_ids", "rid": request_id}, [[int(i) for i in g] for g in out])
        return out

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int) -> Any:
        """The request's block ids cut to its computed tokens."""
        out = self._real.get_block_ids_for_computed_tokens(request_id, num_computed_tokens)
        op = {"op": "get_block_ids_for_computed_tokens", "rid": request_id, "num_computed_tokens": num_computed_tokens}
        self._rec.facade(op, [[int(i) for i in g] for g in out])
        return out

    def get_num_common_prefix_blocks(self, running_request_id: str) -> Any:
        """Common-prefix block counts per group."""
        out = self._real.get_num_common_prefix_blocks(running_request_id)
        op = {"op": "get_num_common_prefix_blocks", "rid": running_request_id}
        self._rec.facade(op, [int(x) for x in out])
        return out

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Free blocks attention no longer reads."""
        self._real.remove_skipped_blocks(request_id, total_computed_tokens, num_prompt_tokens)
        op = {"op": "remove_skipped_blocks", "rid": request_id, "total_computed_tokens": int(total_computed_tokens)}
        self._rec.facade({**op, "num_prompt_tokens": num_prompt_tokens}, None)

    # ------------------------------------------------------------ no request

    def new_step_starts(self) -> None:
        """A scheduler step begins."""
        self._real.new_step_starts()
        self._rec.facade({"op": "new_step_starts"}, None)

    def take_events(self) -> Any:
        """Drain the KV-cache events."""
        out = self._real.take_events()
        self._rec.facade({"op": "take_events"}, [event_to_json(convert_event(self._api, e)) for e in out])
        return out

    def take_new_block_ids(self) -> Any:
        """Drain the fresh block ids."""
        out = self._real.take_new_block_ids()
        self._rec.facade({"op": "take_new_block_ids"}, [int(i) for i in out])
        return out

    def take_kv_cache_block_copies(self) -> Any:
        """Drain the copy-on-write copies (vLLM 0.26.0 on)."""
        copies, retained = out = self._real.take_kv_cache_block_copies()
        pairs = [[int(c.src_block_id), int(c.dst_block_id)] for c in copies]
        out_json = {"copies": pairs, "retained": list(ids_of(self._api, retained))}
        self._rec.facade({"op": "take_kv_cache_block_copies"}, out_json)
        return out

    def evict_blocks(self, block_ids: Any) -> None:
        """Drop blocks from the prefix cache."""
        ids = sorted(int(i) for i in block_ids)
        self._real.evict_blocks(set(ids))
        self._rec.facade({"op": "evict_blocks", "block_ids": ids}, None)

    def reset_prefix_cache(self) -> bool:
        """Clear the prefix cache when nothing is in use."""
        out = bool(self._real.reset_prefix_cache())
        self._rec.facade({"op": "reset_prefix_cache"}, out)
        return out

    def make_prefix_cache_stats(self) -> Any:
        """Take the prefix-cache statistics."""
        out = self._real.make_prefix_cache_stats()
        fields = None if out is None else {name: getattr(out, name) for name in self._api.stats_fields}
        stats = convert_stats(fields)
        self._rec.facade({"op": "make_prefix_cache_stats"}, None if stats is None else asdict(stats))
        return out

    @property
    def usage(self) -> float:
        """Fraction of the pool in use."""
        out = float(self._real.usage)
        self._rec.facade({"op": "usage"}, round(out, 9))
        return out


class _RecordingPool:
    """``kv_cache_manager.block_pool``: ``free_blocks`` recorded, reads passed through."""

    def __init__(self, real: Any, recorder: Recorder) -> None:
        self._real = real
        self._rec = recorder

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._real, name)
        if callable(value) and name not in PASSIVE_POOL:
            raise Unrecordable(f"the scheduler called BlockPool.{name}, which kvref's format has no operation for")
        return value

    def free_blocks(self, ordered_blocks: Any) -> None:
        """The deferred free of popped (or copy-retained) blocks, in the order given."""
        blocks = list(ordered_blocks)
        self._real.free_blocks(blocks)
        self._rec.facade({"op": "free_blocks", "block_ids": list(ids_of(self._rec.api, blocks))}, None)


class _RecordingCoordinator:
    """``kv_cache_manager.coordinator``: the prefix hint recorded, plain reads passed through."""

    _HINT = "num_uncached_common_prefix_tokens"

    def __init__(self, real: Any, recorder: Recorder) -> None:
        self._real = real
        self._rec = recorder

    def __getattr__(self, name: str) -> Any:
        if name == self._HINT and self._rec.last_lookup is not None:
            # vLLM 0.25.1 reads it with a default of 0 right after a lookup; so does get_prefix_hint.
            self._rec.facade({"op": "get_prefix_hint", "rid": self._rec.last_lookup}, int(getattr(self._real, name, 0)))
        value = getattr(self._real, name)
        if callable(value):
            raise Unrecordable(f"the scheduler called the coordinator's {name}, which kvref's format cannot express")
        return value


def _skips_reads(vreq: Any) -> bool:
    """Whether the request reads no prefix cache: its ``skip_reading_prefix_cache``
    (up to 0.33.0), or a hit limit of 0 fixed at construction (0.34.0 on).

    Raises:
        Unrecordable: A hit limit other than none or 0 (prompt logprobs, which the engine never asks for).
    """
    if hasattr(vreq, "skip_reading_prefix_cache"):
        return bool(vreq.skip_reading_prefix_cache)
    limit = getattr(vreq, "prefix_cache_hit_limit", None)
    if limit not in (None, 0):
        raise Unrecordable(f"request {vreq.request_id!r}: a prefix-cache hit limit of {limit}")
    return limit == 0


def _left_out(name: str, method: Any, recorder: Recorder) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        out = method(*args, **kwargs)
        recorder.left_out[name] += 1
        if out:
            recorder.left_out_nonempty[name] += 1
        return out

    return call


def _only_defaults(method: Any, name: str, skip: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse arguments beyond kvref's operation unless they carry the method's default.

    ``skip`` is the number of leading parameters the operation carries.
    """
    params = list(inspect.signature(method).parameters.values())[skip:]
    if len(args) > len(params):
        raise Unrecordable(f"the scheduler passed {name} {len(args) - len(params)} argument(s) more than it takes")
    given = {p.name: v for p, v in zip(params, args, strict=False)} | kwargs
    by_name = {p.name: p for p in params}
    for key, value in given.items():
        param = by_name.get(key)
        if param is None or param.default is inspect.Parameter.empty or value != param.default:
            raise Unrecordable(f"the scheduler passed {name}({key}={value!r}), which kvref's format cannot carry")
