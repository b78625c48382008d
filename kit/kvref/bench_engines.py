"""The engines ``kvref bench`` drives: one class per way of calling a manager.

Each engine runs a scheduler step's phases through its own API, as a
scheduler built on it would: real vLLM through its mutable ``Request`` and
``KVCacheManager``; kvspec through immutable values, advanced with
``with_output_tokens`` and ``dataclasses.replace``; kvimpl (the pure-Python
build or the native core) through its mutable requests, per request
(``object``), one ``allocate_slots_batch`` per running phase (``batch``), or
handles and int32 buffers (``array``: ``allocate_slots_array`` and
``advance_array``, native only); with ``+tables`` the manager also keeps
device block tables (on the CPU) and each step reads them.

Phase methods (the bench loop times each call as a whole):

* ``step``: ``new_step_starts``;
* ``run(rids, news)``: the running requests' allocations in order, up to and
  including the first that does not fit: ``(raw results, how many, whether
  the last one fitted)``;
* ``preempt(rid)``: free the request and reset its state to preempted;
* ``admit(rids, chunk)``: prefix lookup and allocation of waiting requests in
  order, up to and including the first that does not fit;
* ``advance(items)``: request advancing after the step, per request
  ``(rid, computed tokens, their growth in this step, sampled token or None)``:
  computed tokens, running status, the sampled token;
* ``free(rids)``: the finished requests;
* ``tables()``: the step's device-table work (a sync and every group's table).

``ids(raw)`` turns one raw result into block ids, ``run_ids(raw)`` a whole
``run`` result; both outside the timing.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from kvspec.config import KVCacheConfig
from kvspec.request import Request, RequestBlockHasher, RequestId, RequestStatus

Ids = tuple[tuple[int, ...], ...]
Chunk = Callable[[str, int], int]
"""``chunk(rid, hit_tokens)``: the tokens an admission schedules."""
Admitted = tuple[int, int, Any]
"""``(hit tokens, scheduled tokens, raw result)`` of one admission attempt."""
Advance = tuple[str, int, int, int | None]
"""``(rid, computed tokens, their growth in this step, sampled token or None)``."""
RunResult = tuple[Any, int, bool]
"""``(raw results, how many requests were allocated for, whether the last fitted)``."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def allocate_each(
    alloc: Callable[..., Any], reqs: dict[str, Any], rids: Sequence[str], news: Sequence[int]
) -> list[Any]:
    """``alloc(request, n)`` per request in order, up to and including the
    first that returns None: the running phase of every per-request engine."""
    out = []
    for rid, n in zip(rids, news, strict=True):
        got = alloc(reqs[rid], n)
        out.append(got)
        if got is None:
            break
    return out


def admit_each(
    manager: Any,
    reqs: dict[str, Any],
    rids: Sequence[str],
    chunk: Chunk,
    has_hits: Callable[[Any], bool],
    admitted: Callable[[str], None] | None = None,
) -> list[Admitted]:
    """Prefix lookup and ``allocate_slots`` per waiting request in order, up
    to and including the first that does not fit; ``has_hits(blocks)``: whether
    the lookup's blocks are passed on (else None); ``admitted(rid)`` after each
    admission that fitted. Every engine's admission phase."""
    out: list[Admitted] = []
    for rid in rids:
        req = reqs[rid]
        found = manager.get_computed_blocks(req)
        hits, n = found[0], found[1]  # later vLLM releases append the shared-prefix boundary
        n_new = chunk(rid, n)
        got = manager.allocate_slots(req, n_new, n, hits if has_hits(hits) else None)
        out.append((n, n_new, got))
        if got is None:
            break
        if admitted is not None:
            admitted(rid)
    return out


def advance_each(reqs: dict[str, Any], items: Sequence[Advance], running: Any) -> None:
    """Advance mutable requests (vLLM's, kvimpl's): computed tokens, status, the sampled token."""
    for rid, computed, _, token in items:
        req = reqs[rid]
        req.num_computed_tokens = computed
        req.status = running
        if token is not None:
            req.append_output_token_ids(token)


def _vllm_has_hits(blocks: Any) -> bool:
    return any(blocks.blocks)


class VllmEngine:
    """Real vLLM through its own objects (no kvref adapter in the timed path).

    The adapter builds the manager and the requests
    (:meth:`~kvref.adapters.vllm.VllmAdapter.new_vllm_request`); the timed
    calls go to vLLM's ``KVCacheManager`` and ``Request`` directly.
    """

    build = "vllm"

    def __init__(self, config: KVCacheConfig) -> None:
        """Build vLLM's manager the way kvref's vLLM adapter does."""
        from kvref.adapters.vllm import VllmAdapter, make_vllm_adapter  # noqa: PLC0415 - imports vLLM

        self.name = "vllm"
        self.adapter: VllmAdapter = make_vllm_adapter(config)
        self.manager: Any = self.adapter.manager
        self._running: Any = self.adapter.vllm_status("RUNNING")
        self._preempted: Any = self.adapter.vllm_status("PREEMPTED")
        self.reqs: dict[str, Any] = {}
        self.calls = self.allocs = 0

    def add(self, rid: str, prompt: list[int]) -> None:
        """A vLLM Request hashed by vLLM's own hasher."""
        self.adapter.apply_globals()
        self.reqs[rid] = self.adapter.new_vllm_request(Request(RequestId(rid), tuple(prompt), len(prompt), ()))

    def step(self) -> None:
        self.manager.new_step_starts()

    def run(self, rids: Sequence[str], news: Sequence[int]) -> RunResult:
        out = allocate_each(self.manager.allocate_slots, self.reqs, rids, news)
        self.calls += len(out)
        self.allocs += len(out)
        return out, len(out), out[-1] is not None

    def preempt(self, rid: str) -> None:
        req = self.reqs[rid]
        self.manager.free(req)
        req.num_computed_tokens = 0
        req.status = self._preempted
        req.num_preemptions += 1

    def admit(self, rids: Sequence[str], chunk: Chunk) -> list[Admitted]:
        out = admit_each(self.manager, self.reqs, rids, chunk, _vllm_has_hits)
        self.calls += len(out)
        self.allocs += len(out)
        return out

    def prepare_advance(self, items: Sequence[Advance]) -> None:
        """Untimed preparation of the advance (nothing: it advances request objects)."""

    def advance(self, items: Sequence[Advance]) -> None:
        advance_each(self.reqs, items, self._running)

    def free(self, rids: Sequence[str]) -> None:
        reqs, free = self.reqs, self.manager.free
        for rid in rids:
            free(reqs[rid])

    def tables(self) -> None:
        """vLLM's block tables live in its worker, outside the manager: nothing here."""

    def ids(self, raw: Any) -> Ids | None:
        return None if raw is None else tuple(tuple(b.block_id for b in g) for g in raw.blocks)

    def run_ids(self, raw: Any) -> list[Ids | None]:
        return [self.ids(x) for x in raw]


class SpecEngine:
    """kvspec: immutable request values, advanced with ``with_output_tokens`` and ``replace``."""

    build = "spec"

    def __init__(self, config: KVCacheConfig) -> None:
        """A kvspec manager."""
        from kvspec.kv_cache_manager import KVCacheManager  # noqa: PLC0415

        self.name = "spec"
        self.manager: Any = KVCacheManager(config)
        self.hasher = RequestBlockHasher.for_config(config)
        self.reqs: dict[str, Request] = {}
        self.calls = self.allocs = 0

    def add(self, rid: str, prompt: list[int]) -> None:
        self.reqs[rid] = self.hasher.new_request(rid, prompt)

    def step(self) -> None:
        self.manager.new_step_starts()

    def run(self, rids: Sequence[str], news: Sequence[int]) -> RunResult:
        out = allocate_each(self.manager.allocate_slots, self.reqs, rids, news)
        self.calls += len(out)
        self.allocs += len(out)
        return out, len(out), out[-1] is not None

    def preempt(self, rid: str) -> None:
        self.manager.free(rid)
        req = self.reqs[rid]
        self.reqs[rid] = replace(
            req, num_computed_tokens=0, status=RequestStatus.PREEMPTED, num_preemptions=req.num_preemptions + 1
        )

    def admit(self, rids: Sequence[str], chunk: Chunk) -> list[Admitted]:
        out = admit_each(self.manager, self.reqs, rids, chunk, any)
        self.calls += len(out)
        self.allocs += len(out)
        return out

    def prepare_advance(self, items: Sequence[Advance]) -> None:
        """Untimed preparation of the advance (nothing: it advances request objects)."""

    def advance(self, items: Sequence[Advance]) -> None:
        reqs, hasher, running = self.reqs, self.hasher, RequestStatus.RUNNING
        for rid, computed, _, token in items:
            req = reqs[rid]
            if token is not None:
                req = hasher.with_output_tokens(req, [token])
            reqs[rid] = replace(req, num_computed_tokens=computed, status=running)

    def free(self, rids: Sequence[str]) -> None:
        free = self.manager.free
        for rid in rids:
            free(rid)

    def tables(self) -> None:
        """kvspec keeps no device tables."""

    def ids(self, raw: Any) -> Ids | None:
        return raw  # type: ignore[no-any-return]  # kvspec already returns block ids

    def run_ids(self, raw: Any) -> list[Ids | None]:
        return list(raw)


class ImplEngine:
    """kvimpl (the pure-Python build or the native core) with its mutable requests.

    ``api``: ``object`` (one ``allocate_slots`` per request), ``batch`` (the
    running phase as ``allocate_slots_batch`` calls, finished requests as one
    ``free_batch``) or ``array`` (native: handles and int32 buffers,
    ``allocate_slots_array`` and ``advance_array``). ``tables``: the manager
    keeps device block tables on the CPU (or on the device ``tables`` names)
    and each step reads them.
    """

    def __init__(self, name: str, config: KVCacheConfig, native: bool, api: str, tables: bool | str = False) -> None:
        """A kvimpl manager of the wanted build.

        Raises:
            RuntimeError: If ``native`` and the native core cannot run ``config``.
        """
        from kvimpl.native import NativeKVCacheManager, create_manager  # noqa: PLC0415

        self.name = name
        self.build = "native" if native else "python"
        self.api = api
        device = tables if isinstance(tables, str) else ("cpu" if tables else None)
        self.manager: Any = create_manager(config, device, native=native)
        if native != isinstance(self.manager, NativeKVCacheManager):
            raise RuntimeError(f"{name}: the native core cannot run this configuration")
        from kvimpl.request import RequestHasher  # noqa: PLC0415

        self.hasher = RequestHasher.for_config(config, native=native)
        self.groups = len(config.groups)
        self.min_block_size = min(k.block_size for k in config.groups)
        self.with_tables = bool(tables)
        pool = getattr(self.manager, "block_pool", None)
        self._num_free = pool.get_num_free_blocks if pool is not None else self.manager.get_num_free_blocks
        self.reqs: dict[str, Any] = {}
        self.handle_of: dict[str, int] = {}
        self._admitted: list[str] = []
        # The array API's buffers, held as a scheduler holding int32 buffers would: the
        # running requests' handles in running order (appended at admission, removed at
        # finish and preemption), and the next advance's handles, counts and sampled tokens.
        self._live: list[str] = []
        self._live_hs = array("i")
        self._adv: tuple[Any, Any, Any] = (array("i"), array("i"), array("i"))
        self.calls = self.allocs = 0

    def add(self, rid: str, prompt: list[int]) -> None:
        self.reqs[rid] = self.hasher.new_request(rid, prompt)

    def step(self) -> None:
        self.manager.new_step_starts()

    def run(self, rids: Sequence[str], news: Sequence[int]) -> RunResult:
        if self.api == "object":
            out = allocate_each(self.manager.allocate_slots, self.reqs, rids, news)
            self.calls += len(out)
            self.allocs += len(out)
            return out, len(out), out[-1] is not None
        return self._run_planned(rids, news)

    def _run_planned(self, rids: Sequence[str], news: Sequence[int]) -> RunResult:
        """The sequential results through as few batched calls as possible.

        The sequential loop preempts the newest running request as soon as one
        allocation fails and goes on with the next, so a batch must not fail
        before its last request: before each batch the free-block count is
        read and the longest prefix whose worst-case need fits is taken (a
        running request without hits needs at most ``ceil(n / bs) + 1`` new
        blocks per group for ``n`` new tokens). When everything fits (the
        common case) the running phase is one call; otherwise the fitting
        prefix is one call, the next request a batch of one (which may fail:
        the loop then preempts and calls again with the rest).
        """
        mgr, g, bs = self.manager, self.groups, self.min_block_size
        num_free = self._num_free
        array_api = self.api == "array"
        if array_api:
            # The held handle buffer when the batch is the running set (every step but one
            # right after a preemption); the counts are the scheduler's own output buffer.
            hs = self._live_hs if rids == self._live else array("i", map(self.handle_of.__getitem__, rids))
            ns = array("i", news)
        else:
            reqs = list(map(self.reqs.__getitem__, rids))
        chunks: list[Any] = []
        i, n, last_ok = 0, len(rids), True
        while i < n:
            free = num_free()
            j = n
            if g * (sum(news[i:]) // bs + (n - i)) > free:
                need, j = 0, i
                while j < n and need + g * _cdiv(news[j], bs) <= free:
                    need += g * _cdiv(news[j], bs)
                    j += 1
                j = max(j, i + 1)
            self.calls += 1
            if array_api:
                whole = i == 0 and j == n  # the common case: no slice copies
                counts, ids, first_none = mgr.allocate_slots_array(hs if whole else hs[i:j], ns if whole else ns[i:j])
                chunks.append((counts, ids, j - i))
            else:
                got = mgr.allocate_slots_batch(reqs[i:j], news[i:j])
                chunks.append(got)
                first_none = got.index(None) if None in got else -1
            if first_none >= 0:
                if first_none != j - i - 1:
                    raise RuntimeError(f"{self.name}: a planned batch failed before its last request")
                last_ok = False
                i = j
                break
            i = j
        self.allocs += i
        return chunks, i, last_ok

    def preempt(self, rid: str) -> None:
        self.manager.free(rid)
        self.handle_of.pop(rid, None)
        self._drop_live([rid])
        req = self.reqs[rid]
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1

    def admit(self, rids: Sequence[str], chunk: Chunk) -> list[Admitted]:
        out = admit_each(self.manager, self.reqs, rids, chunk, any, self._hold if self.api == "array" else None)
        self.calls += len(out)
        self.allocs += len(out)
        return out

    def advance(self, items: Sequence[Advance]) -> None:
        if self.api == "array":
            self._advance_array(items)
            return
        advance_each(self.reqs, items, RequestStatus.RUNNING)

    def prepare_advance(self, items: Sequence[Advance]) -> None:
        """Untimed: the array API's advance buffers (scheduled handles, their
        computed-token growth, the sampled tokens, -1 for none). A scheduler on
        the array API has them as buffers already (its schedule and the model
        runner's int32 output); here they come from the loop's Python items."""
        if self.api == "array":
            handle_of = self.handle_of
            self._adv = (
                array("i", [handle_of[it[0]] for it in items]),
                array("i", [it[2] for it in items]),
                array("i", [-1 if it[3] is None else it[3] for it in items]),
            )

    def _advance_array(self, items: Sequence[Advance]) -> None:
        """One ``advance_array`` call on the prepared buffers; only requests
        admitted in this step change status."""
        running = RequestStatus.RUNNING
        for rid in self._admitted:
            self.reqs[rid].status = running
        self._admitted.clear()
        self.manager.advance_array(*self._adv)

    def _hold(self, rid: str) -> None:
        """An admitted request joins the array API's held buffers (its handle at the end)."""
        h = self.manager.handle(rid)
        self.handle_of[rid] = h
        self._admitted.append(rid)
        self._live.append(rid)
        self._live_hs.append(h)

    def _drop_live(self, rids: Sequence[str]) -> None:
        """Remove requests from the held handle buffer (finish, preemption)."""
        live, hs = self._live, self._live_hs
        for rid in rids:
            if rid in live:
                i = live.index(rid)
                del live[i]
                del hs[i]

    def free(self, rids: Sequence[str]) -> None:
        for rid in rids:
            self.handle_of.pop(rid, None)
        if self.api == "array":
            self._drop_live(rids)
        if self.api == "object":
            free = self.manager.free
            for rid in rids:
                free(rid)
        elif rids:
            self.manager.free_batch(list(rids))

    def tables(self) -> None:
        """What a scheduler pays per step for device tables beyond the row
        writes inside the manager's calls: one ``sync`` (one batched copy of
        the live rows of every group when something changed; on the CPU the
        host table is the device table and nothing is copied)."""
        if self.with_tables:
            self.manager.device_tables.sync()

    def ids(self, raw: Any) -> Ids | None:
        return raw  # type: ignore[no-any-return]  # kvimpl already returns block ids

    def run_ids(self, raw: Any) -> list[Ids | None]:
        if self.api == "object":
            return list(raw)
        out: list[Ids | None] = []
        for chunk in raw:
            if self.api == "array":
                counts, ids, n = chunk
                out.extend(split_array(counts, ids, n, self.groups))
            else:
                out.extend(chunk)
        return out


def split_array(counts: Any, ids: Any, n: int, groups: int) -> list[Ids | None]:
    """``allocate_slots_array``'s (counts, ids) buffers as per-request block ids."""
    out: list[Ids | None] = []
    pos = 0
    for i in range(n):
        row = counts[i * groups : (i + 1) * groups]
        if row[0] < 0:
            out.append(None)
            continue
        per = []
        for k in row:
            per.append(tuple(ids[pos : pos + k]))
            pos += k
        out.append(tuple(per))
    return out


ENGINE_NAMES = (
    "vllm", "spec", "impl-python", "impl-python-batched", "impl-python+tables", "impl-native", "impl-native-batched",
    "impl-native-array", "impl-native+tables",
)  # fmt: skip
"""Every engine, in table order."""


def engine_builders(config: KVCacheConfig) -> dict[str, Callable[[], Any]]:
    """A builder per engine installed here that can run ``config`` (vLLM only
    for the release of ``config.profile``; native engines only when the
    native core is built and implements the configuration; ``+tables`` only
    with torch)."""
    builders: dict[str, Callable[[], Any]] = {}
    from kvref.adapters.vllm import installed_vllm_version, vllm_available  # noqa: PLC0415

    if vllm_available() and installed_vllm_version() == config.profile.release:
        builders["vllm"] = lambda: VllmEngine(config)
    builders["spec"] = lambda: SpecEngine(config)
    from kvimpl.native import native_module, native_unsupported  # noqa: PLC0415

    torch = _has_torch()
    variants = [("impl-python", False, "object", False), ("impl-python-batched", False, "batch", False)]
    if torch:
        variants.append(("impl-python+tables", False, "object", True))
    if native_module() is not None and native_unsupported(config) is None:
        variants += [("impl-native", True, "object", False), ("impl-native-batched", True, "batch", False),
                     ("impl-native-array", True, "array", False)]  # fmt: skip
        if torch:
            variants.append(("impl-native+tables", True, "object", True))
    for name, native, api, tables in variants:
        builders[name] = lambda n=name, nat=native, a=api, t=tables: ImplEngine(n, config, nat, a, t)  # type: ignore[misc]
    return builders


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401, PLC0415 - optional
    except ImportError:
        return False
    return True
