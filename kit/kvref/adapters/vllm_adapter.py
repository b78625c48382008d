"""Adapter around the REAL vLLM 0.25.1 ``KVCacheManager``.

The adapter drives unmodified vLLM code (``vllm.v1.core``) and converts its
live objects into the plain values of :mod:`kvspec` (block ids per group,
:class:`kvspec.events` dataclasses, :class:`kvspec.view.KVView`). It is the
ground truth the specification and every implementation are checked against.

What the adapter adds on top of vLLM, and nothing more:

* **Request mirroring.** kvref passes immutable :class:`kvspec.request.Request`
  values; the adapter keeps one vLLM ``Request`` per request id, created from
  the prompt and advanced by appending output tokens one at a time (exactly
  like vLLM's scheduler), so vLLM computes every block hash itself. The
  kvspec ``block_hashes`` are never handed to vLLM.
* **Caller-error pre-validation.** kvref's contract is that a caller error
  raises the named :mod:`kvspec.errors` class before any state change. vLLM
  sometimes asserts half-way through an operation or silently corrupts its
  bookkeeping, so the adapter checks the documented caller errors against
  vLLM's own state first (see the ``_check_*`` methods). Everything vLLM
  raises that is not a documented caller error propagates unchanged.
* **Process globals.** ``NONE_HASH`` (derived from ``PYTHONHASHSEED``) and
  ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` are process-wide in vLLM; the adapter
  re-applies its own values before each operation that may hash or emit
  events, so adapters with different seeds can coexist in one process.
* **SinkFull construction shim.** vLLM 0.25.1 cannot construct a manager with
  a ``SinkFullAttentionSpec`` group (``TypeError``: unexpected keyword
  ``scheduler_block_size``). For such configs only, construction is retried
  with ``SinkFullAttentionManager.__init__`` temporarily replaced (see
  :func:`_sinkfull_init_shim`); the patch is restored right after and
  ``construction_workaround`` records ``"sinkfull-ctor"``.

vLLM and torch are untyped here: every object coming from them is ``Any`` and
stays inside this module; the public methods are typed like
:class:`kvref.adapters.KVCacheAdapter`.
"""

from __future__ import annotations

import importlib
import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from kvref.adapters import DeclaredSemantics
from kvspec.config import (
    FULL_TYPE_KINDS,
    MLA,
    AttentionKind,
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    KVCacheConfig,
    Mamba,
    SinkFullAttention,
    SlidingWindow,
)
from kvspec.errors import (
    CacheBeyondAllocationError,
    DoubleFreeError,
    ExceedsMaxModelLenError,
    GroupCountError,
    InvalidBlockIdError,
    InvalidTokenCountError,
    StaleHitError,
    UnexpectedPrefixHitError,
    UnknownRequestError,
)
from kvspec.events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvspec.hashing import ExtraKeySource
from kvspec.request import Request, RequestStatus
from kvspec.stats import PrefixCacheStats
from kvspec.view import BlockIds, KVView

__all__ = [
    "REQUIRED_VLLM_VERSION",
    "VllmAdapter",
    "VllmUnavailable",
    "make_vllm_adapter",
    "vllm_available",
]

REQUIRED_VLLM_VERSION: Final = "0.25.1"
_INSTALL_HINT: Final = "vLLM 0.25.1 is not installed; run `bash ci/setup.sh --with-vllm`"

_ENV_RETENTION: Final = "VLLM_PREFIX_CACHE_RETENTION_INTERVAL"
_ENV_INT_HASHES: Final = "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"
_ENV_SEED: Final = "PYTHONHASHSEED"

SINKFULL_WORKAROUND: Final = "sinkfull-ctor"
"""Value of :attr:`VllmAdapter.construction_workaround` when the shim was used."""

# Head settings shared by every attention spec: they only influence page sizes,
# never the bookkeeping, and being equal they keep "equal kinds -> equal specs".
_NUM_KV_HEADS: Final = 1
_HEAD_SIZE: Final = 8
_MAMBA_SHAPES: Final = ((2, 4),)

_MAX_TOKENS: Final = 1_000_000


class VllmUnavailable(RuntimeError):
    """vLLM 0.25.1 (and torch) cannot be imported in this environment."""


# --------------------------------------------------------------------------
# Loading vLLM lazily (importing this module never needs vLLM)
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Vllm:
    """The vLLM/torch modules the adapter uses (all untyped)."""

    torch: Any
    kci: Any  # vllm.v1.kv_cache_interface
    kcm: Any  # vllm.v1.core.kv_cache_manager
    ku: Any  # vllm.v1.core.kv_cache_utils
    stm: Any  # vllm.v1.core.single_type_kv_cache_manager
    hashing: Any  # vllm.utils.hashing
    request: Any  # vllm.v1.request
    sampling: Any  # vllm.sampling_params
    lora: Any  # vllm.lora.request
    mm: Any  # vllm.multimodal.inputs
    events: Any  # vllm.distributed.kv_events


_LOADED: _Vllm | None = None


def _load_vllm() -> _Vllm:
    """Import vLLM 0.25.1 and the modules the adapter needs.

    Raises:
        VllmUnavailable: If vLLM (or torch) cannot be imported or the version
            is not 0.25.1.
    """
    global _LOADED  # noqa: PLW0603 - import once per process
    if _LOADED is not None:
        return _LOADED
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        vllm = importlib.import_module("vllm")
    except Exception as exc:  # ImportError, or anything torch/vLLM raise on import
        raise VllmUnavailable(f"{_INSTALL_HINT} (import vllm failed: {exc!r})") from exc
    version = getattr(vllm, "__version__", None)
    if version != REQUIRED_VLLM_VERSION:
        raise VllmUnavailable(f"{_INSTALL_HINT} (found vLLM {version})")
    try:
        loaded = _Vllm(
            torch=importlib.import_module("torch"),
            kci=importlib.import_module("vllm.v1.kv_cache_interface"),
            kcm=importlib.import_module("vllm.v1.core.kv_cache_manager"),
            ku=importlib.import_module("vllm.v1.core.kv_cache_utils"),
            stm=importlib.import_module("vllm.v1.core.single_type_kv_cache_manager"),
            hashing=importlib.import_module("vllm.utils.hashing"),
            request=importlib.import_module("vllm.v1.request"),
            sampling=importlib.import_module("vllm.sampling_params"),
            lora=importlib.import_module("vllm.lora.request"),
            mm=importlib.import_module("vllm.multimodal.inputs"),
            events=importlib.import_module("vllm.distributed.kv_events"),
        )
    except Exception as exc:
        raise VllmUnavailable(f"{_INSTALL_HINT} (importing vLLM's KV core failed: {exc!r})") from exc
    _LOADED = loaded
    return loaded


def vllm_available() -> bool:
    """Whether vLLM 0.25.1 can be imported (imports it on the first call)."""
    try:
        _load_vllm()
    except VllmUnavailable:
        return False
    return True


def make_vllm_adapter(config: KVCacheConfig) -> VllmAdapter:
    """Factory: a :class:`VllmAdapter` around a fresh vLLM ``KVCacheManager``.

    Raises:
        VllmUnavailable: If vLLM 0.25.1 is not installed.
    """
    return VllmAdapter(config, _load_vllm())


# --------------------------------------------------------------------------
# Construction helpers
# --------------------------------------------------------------------------


def _make_spec(v: _Vllm, kind: AttentionKind) -> Any:
    """The vLLM ``KVCacheSpec`` of one kvspec attention kind."""
    fp16 = v.torch.float16
    attn: dict[str, Any] = {
        "block_size": kind.block_size,
        "num_kv_heads": _NUM_KV_HEADS,
        "head_size": _HEAD_SIZE,
        "dtype": fp16,
    }
    if isinstance(kind, FullAttention):
        return v.kci.FullAttentionSpec(**attn)
    if isinstance(kind, MLA):
        return v.kci.MLAAttentionSpec(**attn)
    if isinstance(kind, SlidingWindow):
        return v.kci.SlidingWindowSpec(**attn, sliding_window=kind.window)
    if isinstance(kind, ChunkedLocal):
        return v.kci.ChunkedLocalAttentionSpec(**attn, attention_chunk_size=kind.chunk)
    if isinstance(kind, Mamba):
        return v.kci.MambaSpec(
            block_size=kind.block_size,
            shapes=_MAMBA_SHAPES,
            dtypes=(fp16,),
            mamba_cache_mode=kind.mode,
            num_speculative_blocks=kind.num_speculative_blocks,
        )
    if isinstance(kind, CrossAttention):
        return v.kci.CrossAttentionSpec(**attn)
    if isinstance(kind, SinkFullAttention):
        return v.kci.SinkFullAttentionSpec(**attn, sink_len=kind.sink_len)
    raise TypeError(f"unknown attention kind {kind!r}")


def _sinkfull_init_shim(v: _Vllm) -> Callable[..., None]:
    """A corrected ``SinkFullAttentionManager.__init__`` (construction-time only).

    vLLM 0.25.1's own ``__init__`` lacks the ``scheduler_block_size`` and
    ``max_admission_blocks_per_request`` parameters that the factory passes by
    keyword (and would pass ``dcp_world_size`` positionally into the base
    class's ``scheduler_block_size`` slot). This replacement accepts the base
    class signature, forwards every argument to the base ``__init__`` by
    keyword, and then does exactly what the original body does (as in vLLM
    0.16.0): check ``sink_len`` and pop ``sink_len // block_size`` blocks from
    the head of the free queue into ``sink_blocks`` (ref_cnt stays 0, they are
    in no table and are never returned).
    """
    sink_cls = v.stm.SinkFullAttentionManager

    def __init__(
        self: Any,
        kv_cache_spec: Any,
        block_pool: Any,
        enable_caching: bool,
        kv_cache_group_id: int,
        scheduler_block_size: int,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        max_admission_blocks_per_request: int | None = None,
    ) -> None:
        super(sink_cls, self).__init__(
            kv_cache_spec,
            block_pool,
            enable_caching,
            kv_cache_group_id,
            scheduler_block_size=scheduler_block_size,
            dcp_world_size=dcp_world_size,
            pcp_world_size=pcp_world_size,
            max_admission_blocks_per_request=max_admission_blocks_per_request,
        )
        sink_len = kv_cache_spec.sink_len
        assert sink_len is not None and sink_len > 0 and sink_len % self.block_size == 0
        num_sink_block = sink_len // self.block_size
        self.sink_blocks = self.block_pool.free_block_queue.popleft_n(num_sink_block)

    return __init__


_STATUS_NAMES: Final[dict[RequestStatus, str]] = {
    RequestStatus.WAITING: "WAITING",
    RequestStatus.RUNNING: "RUNNING",
    RequestStatus.PREEMPTED: "PREEMPTED",
    RequestStatus.WAITING_FOR_REMOTE_KVS: "WAITING_FOR_REMOTE_KVS",
    RequestStatus.FINISHED: "FINISHED_STOPPED",
}


@dataclass(slots=True)
class _RidOnly:
    """Stand-in for a vLLM ``Request`` where vLLM only reads ``request_id``."""

    request_id: str


@dataclass(slots=True)
class _Mirror:
    """The vLLM request mirroring one kvspec request id."""

    vreq: Any
    tokens: tuple[int, ...]  # the kvspec all_token_ids last synced
    num_prompt_tokens: int
    extra: ExtraKeySource


def _freeze(value: Any) -> Any:
    """Lists/tuples (nested) -> tuples; everything else unchanged."""
    if isinstance(value, list | tuple):
        return tuple(_freeze(x) for x in value)
    return value


def _ids(blocks: Iterable[Any]) -> tuple[int, ...]:
    return tuple(int(b.block_id) for b in blocks)


# --------------------------------------------------------------------------
# The adapter
# --------------------------------------------------------------------------


class VllmAdapter:
    """:class:`kvref.adapters.KVCacheAdapter` over vLLM 0.25.1's ``KVCacheManager``.

    Attributes:
        name: ``"vllm"``.
        config: The kvspec configuration.
        manager: The real vLLM ``KVCacheManager`` (for debugging; do not mutate).
        construction_workaround: ``"sinkfull-ctor"`` if the SinkFull shim was
            needed to construct the manager, else None.
    """

    name: str = "vllm"
    semantics = DeclaredSemantics(f"vllm-{REQUIRED_VLLM_VERSION}", upstream=True)

    def __init__(self, config: KVCacheConfig, v: _Vllm) -> None:
        self.config = config
        self._v = v
        self._seed = config.hash_seed
        self._int_flag = "1" if config.int_block_hashes else "0"
        self._hash_fn: Any = v.hashing.get_hash_fn_by_name(config.hash_function)
        self._hbs = config.resolved_hash_block_size()
        self._num_blocks = config.num_blocks
        self._num_groups = len(config.groups)

        os.environ.pop(_ENV_RETENTION, None)
        os.environ[_ENV_INT_HASHES] = self._int_flag
        os.environ[_ENV_SEED] = self._seed
        v.ku.init_none_hash(self._hash_fn)
        self._none_hash: Any = v.ku.NONE_HASH
        self._hasher: Any = v.ku.get_request_block_hasher(self._hbs, self._hash_fn)

        self.construction_workaround: str | None = None
        self.manager: Any = self._construct()
        self._pool: Any = self.manager.block_pool
        self._managers: tuple[Any, ...] = tuple(self.manager.coordinator.single_type_managers)
        self._block_sizes: tuple[int, ...] = tuple(int(m.block_size) for m in self._managers)
        self._is_cross: tuple[bool, ...] = tuple(isinstance(m, v.stm.CrossAttentionManager) for m in self._managers)

        self._mirrors: dict[str, _Mirror] = {}
        self._last_hits: dict[str, tuple[BlockIds, Any]] = {}
        self._pending: Counter[int] = Counter()

    # ------------------------------------------------------------ globals

    def _apply_globals(self) -> None:
        """Re-install this adapter's NONE_HASH and event-hash format."""
        env = os.environ
        if env.get(_ENV_INT_HASHES) != self._int_flag:
            env[_ENV_INT_HASHES] = self._int_flag
        ku = self._v.ku
        if env.get(_ENV_SEED) != self._seed or getattr(ku, "NONE_HASH", None) != self._none_hash:
            env[_ENV_SEED] = self._seed
            ku.init_none_hash(self._hash_fn)

    # ------------------------------------------------------------ construction

    def _construct(self) -> Any:
        v, cfg = self._v, self.config
        groups = [
            v.kci.KVCacheGroupSpec(
                layer_names=[f"layer.{i}"],
                kv_cache_spec=_make_spec(v, kind),
                is_eagle_group=(i in cfg.eagle_groups),
            )
            for i, kind in enumerate(cfg.groups)
        ]
        kv_cache_config = v.kci.KVCacheConfig(num_blocks=cfg.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)

        def build() -> Any:
            return v.kcm.KVCacheManager(
                kv_cache_config,
                max_model_len=cfg.max_model_len,
                scheduler_block_size=cfg.scheduler_block_size,
                hash_block_size=self._hbs,
                max_num_batched_tokens=cfg.max_num_batched_tokens,
                enable_caching=cfg.enable_caching,
                use_eagle=cfg.use_eagle,
                log_stats=cfg.log_stats,
                enable_kv_cache_events=cfg.enable_kv_cache_events,
                watermark=cfg.watermark,
            )

        try:
            return build()
        except TypeError as exc:
            has_sink = any(isinstance(k, SinkFullAttention) for k in cfg.groups)
            if not (has_sink and "scheduler_block_size" in str(exc)):
                raise
        # Known vLLM 0.25.1 defect (SinkFullAttentionManager.__init__ signature).
        # Patch the constructor for this one construction only, then restore it:
        # every later operation runs unmodified vLLM code.
        sink_cls = v.stm.SinkFullAttentionManager
        original = sink_cls.__dict__["__init__"]
        sink_cls.__init__ = _sinkfull_init_shim(v)
        try:
            manager = build()
        finally:
            sink_cls.__init__ = original
        self.construction_workaround = SINKFULL_WORKAROUND
        return manager

    # ------------------------------------------------------------ requests

    def _new_vreq(self, request: Request) -> Any:
        v = self._v
        extra = request.extra
        prompt = request.all_token_ids[: request.num_prompt_tokens]
        prompt_ids: list[int] | None = list(prompt)
        embeds: Any = None
        if extra.prompt_embeds is not None:
            embeds = self._embeds_tensor(extra.prompt_embeds)
            prompt_ids = None
        lora = None
        if extra.lora is not None:
            lora = v.lora.LoRARequest(
                lora_name=extra.lora.name,
                lora_int_id=extra.lora.adapter_id,
                lora_path="/nonexistent",
            )
        mm_features = [
            v.mm.MultiModalFeatureSpec(
                data=None,
                modality="image",
                identifier=f.identifier,
                mm_position=v.mm.PlaceholderRange(offset=f.offset, length=f.length),
            )
            for f in extra.mm_features
        ]
        sampling = v.sampling.SamplingParams(
            max_tokens=_MAX_TOKENS,
            skip_reading_prefix_cache=request.skip_reading_prefix_cache,
        )
        vreq = v.request.Request(
            request_id=request.request_id,
            prompt_token_ids=prompt_ids,
            sampling_params=sampling,
            pooling_params=None,
            prompt_embeds=embeds,
            mm_features=mm_features or None,
            lora_request=lora,
            cache_salt=extra.cache_salt,
            block_hasher=self._hasher,
        )
        return vreq

    def _embeds_tensor(self, rows: tuple[bytes, ...]) -> Any:
        """A float16 ``(n, len(row) // 2)`` tensor whose bytes are the rows'."""
        torch = self._v.torch
        if not rows:
            raise ValueError("prompt_embeds has no rows")
        width = len(rows[0])
        if any(len(r) != width for r in rows):
            raise ValueError("prompt_embeds rows must all have the same length")
        data = bytearray(b"".join(rows))
        if width % 2 == 0 and width > 0:
            flat = torch.frombuffer(data, dtype=torch.float16)
            return flat.reshape(len(rows), width // 2).clone()
        # An odd row length cannot be float16; uint8 carries the same bytes.
        return torch.frombuffer(data, dtype=torch.uint8).reshape(len(rows), width).clone()

    def _sync(self, request: Request) -> Any:
        """The vLLM request for ``request``, advanced to match it."""
        rid = request.request_id
        tokens = request.all_token_ids
        mirror = self._mirrors.get(rid)
        if mirror is not None and mirror.tokens is not tokens:
            have = len(mirror.tokens)
            if (
                mirror.num_prompt_tokens != request.num_prompt_tokens
                or len(tokens) < have
                or tokens[:have] != mirror.tokens
                or (mirror.extra is not request.extra and mirror.extra != request.extra)
            ):
                mirror = None  # a different request reusing the id
                self._last_hits.pop(rid, None)
        if mirror is None:
            vreq = self._new_vreq(request)
            mirror = _Mirror(
                vreq=vreq,
                tokens=tokens[: request.num_prompt_tokens],
                num_prompt_tokens=request.num_prompt_tokens,
                extra=request.extra,
            )
            self._mirrors[rid] = mirror
        vreq = mirror.vreq
        if mirror.tokens is not tokens:
            # One token at a time, like the scheduler: each call runs the hasher.
            for tok in tokens[len(mirror.tokens) :]:
                vreq.append_output_token_ids(tok)
            mirror.tokens = tokens
        vreq.num_computed_tokens = request.num_computed_tokens
        vreq.status = getattr(self._v.request.RequestStatus, _STATUS_NAMES[request.status])
        vreq.num_preemptions = request.num_preemptions
        vreq.skip_reading_prefix_cache = request.skip_reading_prefix_cache
        return vreq

    def _ref(self, request_id: str) -> Any:
        mirror = self._mirrors.get(request_id)
        return mirror.vreq if mirror is not None else _RidOnly(request_id)

    def _forget(self, request_id: str) -> None:
        self._mirrors.pop(request_id, None)
        self._last_hits.pop(request_id, None)

    # ------------------------------------------------------------ state queries

    def _table_len(self, group: int, request_id: str) -> int:
        table = self._managers[group].req_to_blocks.get(request_id)
        return 0 if table is None else len(table)

    def _has_table(self, request_id: str) -> bool:
        return any(self._table_len(g, request_id) for g in range(self._num_groups))

    def _is_allocated(self, request_id: str) -> bool:
        return self._has_table(request_id) or any(request_id in m.num_cached_block for m in self._managers)

    def _group_hashes(self, vreq: Any, group: int) -> list[Any]:
        """The request's block hashes at group ``group``'s block size."""
        fine = list(vreq.block_hashes)
        k = self._block_sizes[group] // self._hbs
        if k == 1:
            return fine
        return [fine[(j + 1) * k - 1] for j in range(len(fine) // k)]

    def _check_block_ids(self, ids: Iterable[int]) -> None:
        for i in ids:
            if not 0 <= i < self._num_blocks:
                raise InvalidBlockIdError(f"block id {i} is outside 0 .. {self._num_blocks - 1}")

    # ------------------------------------------------------------ facade

    def get_computed_blocks(self, request: Request) -> tuple[BlockIds, int]:
        self._apply_globals()
        vreq = self._sync(request)
        blocks, num_tokens = self.manager.get_computed_blocks(vreq)
        ids: BlockIds = tuple(_ids(g) for g in blocks.blocks)
        self._last_hits[request.request_id] = (ids, blocks)
        return ids, int(num_tokens)

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: BlockIds | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
    ) -> BlockIds | None:
        self._apply_globals()
        vreq = self._sync(request)
        rid = request.request_id
        hits: BlockIds | None = None if new_computed_blocks is None else tuple(tuple(g) for g in new_computed_blocks)
        self._check_allocate(
            vreq,
            num_new_tokens,
            num_new_computed_tokens,
            hits,
            num_lookahead_tokens,
            num_external_computed_tokens,
            num_encoder_tokens,
            reserved_blocks,
        )
        ncb: Any = None
        if hits is not None and any(hits):
            last = self._last_hits.get(rid)
            if last is not None and last[0] == hits:
                ncb = last[1]  # the very object vLLM returned (identity matters)
            else:
                pool_blocks = self._pool.blocks
                ncb = self._v.kcm.KVCacheBlocks(tuple([pool_blocks[i] for i in g] for g in hits))
        result = self.manager.allocate_slots(
            vreq,
            num_new_tokens,
            num_new_computed_tokens=num_new_computed_tokens,
            new_computed_blocks=ncb,
            num_lookahead_tokens=num_lookahead_tokens,
            num_external_computed_tokens=num_external_computed_tokens,
            delay_cache_blocks=delay_cache_blocks,
            num_encoder_tokens=num_encoder_tokens,
            full_sequence_must_fit=full_sequence_must_fit,
            reserved_blocks=reserved_blocks,
            has_scheduled_reqs=has_scheduled_reqs,
        )
        if result is None:
            return None
        self._last_hits.pop(rid, None)
        return tuple(_ids(g) for g in result.blocks)

    def _check_allocate(
        self,
        vreq: Any,
        n: int,
        h: int,
        hits: BlockIds | None,
        k: int,
        e: int,
        enc: int,
        reserved: int,
    ) -> None:
        """Caller errors of ``allocate_slots``, in kvref's precedence order."""
        c = int(vreq.num_computed_tokens)
        counts = {
            "num_new_tokens": n,
            "num_new_computed_tokens": h,
            "num_lookahead_tokens": k,
            "num_external_computed_tokens": e,
            "num_encoder_tokens": enc,
            "reserved_blocks": reserved,
            "request.num_computed_tokens": c,
        }
        for what, value in counts.items():
            if value < 0:
                raise InvalidTokenCountError(f"{what} is negative ({value})")
        if n == 0 and e == 0:
            raise InvalidTokenCountError(
                "num_new_tokens must be greater than 0 when there are no external computed tokens"
            )
        if hits is not None and len(hits) != self._num_groups:
            raise GroupCountError(f"new_computed_blocks has {len(hits)} groups, the config has {self._num_groups}")
        max_len = self.config.max_model_len
        if c + h + e + n > max_len:
            raise ExceedsMaxModelLenError(
                f"request {vreq.request_id!r}: {c} computed + {h} hit + {e} external + "
                f"{n} new tokens exceed max_model_len {max_len}"
            )
        has_hits = hits is not None and any(hits)
        rid = vreq.request_id
        if (has_hits or e > 0) and self._is_allocated(rid):
            raise UnexpectedPrefixHitError(
                f"request {rid!r} already holds blocks; prefix hits and external tokens "
                "are only accepted on its first allocation"
            )
        if hits is None or not has_hits:
            return
        for group in hits:
            self._check_block_ids(group)
        # vLLM asserts on hits with caching off and accepts a null block in a
        # full-attention hit (leaving a table no hit search could produce): both are
        # caller errors in the protocol (kvspec's _validate_hits).
        if not self.config.enable_caching:
            raise StaleHitError(f"request {rid!r}: prefix caching is off, so it can have no hit")
        for g, kind in enumerate(self.config.groups):
            if isinstance(kind, FULL_TYPE_KINDS) and 0 in hits[g]:
                raise StaleHitError(f"request {rid!r}: the null block in group {g}'s full-attention hit")
        blocks = self._pool.blocks
        make_key = self._v.ku.make_block_hash_with_group_id
        for g, group in enumerate(hits):
            if not any(group):
                continue
            hashes = self._group_hashes(vreq, g)
            for i, bid in enumerate(group):
                if bid == 0:
                    continue
                if i >= len(hashes) or blocks[bid].block_hash != make_key(hashes[i], g):
                    raise StaleHitError(
                        f"request {rid!r}: block {bid} (group {g}, index {i}) is no longer "
                        "cached under the hash the request expects"
                    )

    def free(self, request_id: str) -> None:
        self.manager.free(self._ref(request_id))
        self._forget(request_id)

    def pop_blocks_for_free(self, request_id: str) -> tuple[int, ...]:
        blocks = self.manager.pop_blocks_for_free(self._ref(request_id))
        ids = _ids(blocks)
        self._pending.update(i for i in ids if i != 0)
        self._forget(request_id)
        return ids

    def free_blocks(self, block_ids: Sequence[int]) -> None:
        ids = list(block_ids)
        self._check_block_ids(ids)
        wanted = Counter(i for i in ids if i != 0)
        for bid, times in sorted(wanted.items()):
            if self._pending[bid] < times:
                raise DoubleFreeError(
                    f"block {bid} freed {times} time(s) but only {self._pending[bid]} "
                    "pending reference(s) came from pop_blocks_for_free"
                )
        blocks = self._pool.blocks
        self._pool.free_blocks([blocks[i] for i in ids])
        self._pending.subtract(wanted)
        for bid in wanted:
            if self._pending[bid] <= 0:
                del self._pending[bid]

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        if total_computed_tokens < 0:
            raise InvalidTokenCountError(f"total_computed_tokens is negative ({total_computed_tokens})")
        self.manager.remove_skipped_blocks(request_id, total_computed_tokens, num_prompt_tokens)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        ids = sorted(set(block_ids))
        self._check_block_ids(ids)
        self._apply_globals()
        for bid in ids:
            # vLLM iterates a set (undefined order); kvref fixes ascending order.
            self.manager.evict_blocks({bid})

    def reset_prefix_cache(self) -> bool:
        self._apply_globals()
        return bool(self.manager.reset_prefix_cache())

    def get_num_common_prefix_blocks(self, request_id: str) -> tuple[int, ...]:
        if not self._has_table(request_id):
            # vLLM would create a phantom (empty) table that skews later answers.
            raise UnknownRequestError(f"request {request_id!r} holds no blocks")
        return tuple(int(x) for x in self.manager.get_num_common_prefix_blocks(request_id))

    def take_events(self) -> list[KVCacheEvent]:
        return [self._convert_event(ev) for ev in self.manager.take_events()]

    def _convert_event(self, ev: Any) -> KVCacheEvent:
        ev_mod = self._v.events
        if isinstance(ev, ev_mod.BlockStored):
            return BlockStored(
                block_hashes=_freeze(ev.block_hashes),
                parent_block_hash=ev.parent_block_hash,
                token_ids=tuple(int(t) for t in ev.token_ids),
                block_size=int(ev.block_size),
                lora_id=ev.lora_id,
                medium=ev.medium,
                lora_name=ev.lora_name,
                extra_keys=_freeze(ev.extra_keys),
                group_idx=ev.group_idx,
                kv_cache_spec_kind=ev.kv_cache_spec_kind,
                kv_cache_spec_sliding_window=ev.kv_cache_spec_sliding_window,
            )
        if isinstance(ev, ev_mod.BlockRemoved):
            return BlockRemoved(
                block_hashes=_freeze(ev.block_hashes),
                medium=ev.medium,
                group_idx=ev.group_idx,
            )
        if isinstance(ev, ev_mod.AllBlocksCleared):
            return AllBlocksCleared()
        raise TypeError(f"unexpected vLLM KV-cache event {ev!r}")

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        if not self.config.enable_caching:
            return  # vLLM ignores the call
        self._apply_globals()
        vreq = self._sync(request)
        n = num_computed_tokens
        if n < 0:
            raise InvalidTokenCountError(f"num_computed_tokens is negative ({n})")
        if n > vreq.num_tokens:
            raise CacheBeyondAllocationError(
                f"request {request.request_id!r}: cannot cache {n} tokens, it has {vreq.num_tokens}"
            )
        for g in range(self._num_groups):
            if self._is_cross[g]:
                continue
            have = self._table_len(g, request.request_id)
            if n // self._block_sizes[g] > have:
                raise CacheBeyondAllocationError(
                    f"request {request.request_id!r}: {n} tokens need "
                    f"{n // self._block_sizes[g]} blocks in group {g}, it holds {have}"
                )
        self.manager.cache_blocks(vreq, n)

    def take_new_block_ids(self) -> list[int]:
        return [int(i) for i in self.manager.take_new_block_ids()]

    def new_step_starts(self) -> None:
        self.manager.new_step_starts()

    def get_block_ids(self, request_id: str) -> BlockIds:
        return tuple(tuple(int(i) for i in g) for g in self.manager.get_block_ids(request_id))

    @property
    def usage(self) -> float:
        return float(self.manager.usage)

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        stats = self.manager.make_prefix_cache_stats()
        if stats is None:
            return None
        return PrefixCacheStats(
            reset=bool(stats.reset),
            requests=int(stats.requests),
            queries=int(stats.queries),
            hits=int(stats.hits),
            preempted_requests=int(stats.preempted_requests),
            preempted_queries=int(stats.preempted_queries),
            preempted_hits=int(stats.preempted_hits),
        )

    def to_view(self) -> KVView:
        pool = self._pool
        free_queue = _ids(pool.free_block_queue.get_all_free_blocks())
        ref_cnt = tuple((int(b.block_id), int(b.ref_cnt)) for b in pool.blocks[1:] if b.ref_cnt > 0)
        block_cls = self._v.ku.KVCacheBlock
        cached: list[tuple[bytes, tuple[int, ...]]] = []
        for key, entry in pool.cached_block_hash_to_block._cache.items():
            ids = (int(entry.block_id),) if isinstance(entry, block_cls) else _ids(entry.values())
            cached.append((bytes(key), ids))
        cached.sort(key=lambda kv: kv[0])
        rids: set[str] = set()
        for m in self._managers:
            rids.update(m.req_to_blocks.keys())
        tables: list[tuple[str, BlockIds]] = []
        for rid in sorted(rids):
            groups = tuple(_ids(m.req_to_blocks.get(rid, ())) for m in self._managers)
            if any(groups):
                tables.append((rid, groups))
        return KVView(
            free_queue=free_queue,
            ref_cnt=ref_cnt,
            cached=tuple(cached),
            tables=tuple(tables),
            usage=float(pool.get_usage()),
        )
