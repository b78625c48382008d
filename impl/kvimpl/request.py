"""Requests a scheduler advances in place, with block hashes extended incrementally.

kvspec's :class:`kvspec.request.Request` is an immutable value: advancing it
(``RequestBlockHasher.with_output_tokens`` and ``dataclasses.replace``)
copies the token tuple and the hash list, recomputes the seed hash and
builds a new object for every request in every step. A scheduler on kvimpl
keeps one mutable request per request instead, as vLLM's scheduler keeps
``vllm.v1.request.Request``: it sets ``num_computed_tokens``, ``status``,
``num_preemptions`` and ``num_in_flight_tokens`` and calls :meth:`Request.append_output_token_ids`, which
hashes only the blocks that became full, chained from the last digest.

Two classes with one interface: :class:`Request` here (pure Python, used by
the pure-Python build and for token ids of 2**63 and more) and
``kvimpl._kvnative.Request`` (C, built with the extension; hashes
``sha256_cbor`` blocks without extra keys natively, anything else through
:func:`block_hasher`). :class:`RequestHasher` makes either; both managers
also accept kvspec's immutable values, so the conformance kit drives them
with either kind (its ``impl-mutable`` target keeps one mutable request per
request and advances it to match each value it is given).

Hashes are byte-identical to kvspec's: each append is one call of
``kvspec.hashing.extend_block_hashes`` (same parent chain, same extra keys,
same multimodal cursor restart per call), built from the hashing functions
the stored hash vectors pin down.

NOTE: measured (timeit, CPython 3.11, a 1,000-token request, one token per
call, sha256_cbor): ``with_output_tokens`` + ``replace`` 13-17 µs per call;
this class 0.35 µs per call plus one block hash every ``hash_block_size``
calls (about 2 µs in Python, 0.3 µs in C); the C request 0.06 µs per call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvimpl.config_rules import hash_block_size
from kvimpl.hash_functions import hash_function
from kvspec.errors import InvalidRequestError
from kvspec.hashing import (
    BlockHash,
    ExtraKeySource,
    HashFunction,
    block_extra_keys,
    hash_block_tokens,
    lookahead_extra_keys,
    none_hash,
)
from kvspec.request import REPORT_MODES, ReportMode, RequestStatus

if TYPE_CHECKING:
    from kvspec.config import KVCacheConfig

BlockHasher = Callable[[bytes, tuple[int, ...], int, int, int], tuple[bytes, int]]
"""``(parent, tokens of the block, start, end, mm cursor) -> (digest, cursor)``."""

NATIVE_TOKEN_LIMIT = 1 << 63
"""The C request holds token ids below this (int64); larger ones need :class:`Request`."""


class Request:
    """A request the caller advances in place (upstream: ``vllm.v1.request.Request``).

    Attributes the manager reads: ``request_id``, ``all_token_ids`` (a
    tuple), ``num_tokens``, ``num_prompt_tokens``, ``block_hashes`` (a tuple
    of digests, one per full block), ``num_computed_tokens``, ``status``,
    ``num_preemptions``, ``num_in_flight_tokens``, ``extra``, ``skip_reading_prefix_cache``, and from
    vLLM 0.34.0 on ``prefix_cache_hit_limit`` (fixed when it is made; with
    ``prompt_logprobs`` and ``prompt_logprob_start``, as kvspec's request).

    inv: len(self.block_hashes) == self.num_tokens // <hash block size>
    """

    __slots__ = (
        "_hasher",
        "_hashes",
        "_hashes_tuple",
        "_tokens",
        "_tokens_tuple",
        "extra",
        "kv_cache_report_mode",
        "num_computed_tokens",
        "num_in_flight_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "num_tokens",
        "prefix_cache_hit_limit",
        "prompt_logprob_start",
        "prompt_logprobs",
        "request_id",
        "skip_reading_prefix_cache",
        "status",
    )

    def __init__(
        self,
        hasher: RequestHasher,
        request_id: str,
        tokens: list[int],
        extra: ExtraKeySource,
        skip_reading_prefix_cache: bool,
        prompt_logprobs: bool = False,
        prompt_logprob_start: int | None = None,
        prefix_cache_hit_limit: int | None = None,
        kv_cache_report_mode: ReportMode = "incremental",
    ) -> None:
        """A WAITING request with its prompt hashed (use :meth:`RequestHasher.new_request`)."""
        self._hasher = hasher
        self.request_id = request_id
        self._tokens = tokens
        self._tokens_tuple: tuple[int, ...] | None = None
        self.num_tokens = len(tokens)
        self.num_prompt_tokens = len(tokens)
        self._hashes: list[BlockHash] = []
        self._hashes_tuple: tuple[BlockHash, ...] | None = None
        self.extra = extra
        self.skip_reading_prefix_cache = skip_reading_prefix_cache
        self.prompt_logprobs = prompt_logprobs
        self.prompt_logprob_start = prompt_logprob_start
        self.prefix_cache_hit_limit = prefix_cache_hit_limit
        self.kv_cache_report_mode = kv_cache_report_mode
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.num_in_flight_tokens = 0
        self.status = RequestStatus.WAITING
        hasher.extend(self._tokens, self._hashes, extra)

    @property
    def all_token_ids(self) -> tuple[int, ...]:
        """Prompt and output tokens (a tuple, rebuilt after an append)."""
        if self._tokens_tuple is None:
            self._tokens_tuple = tuple(self._tokens)
        return self._tokens_tuple

    @property
    def block_hashes(self) -> tuple[BlockHash, ...]:
        """The chained hash of every full block."""
        if self._hashes_tuple is None:
            self._hashes_tuple = tuple(self._hashes)
        return self._hashes_tuple

    def append_output_token_ids(self, token_ids: int | Sequence[int]) -> None:
        """Append sampled tokens; hash the blocks that became full.

        Raises:
            InvalidRequestError: If a token id is not a non-negative int
                (nothing is appended then).
        """
        limit = self._hasher.token_limit
        if type(token_ids) is int and token_ids >= 0 and (limit is None or token_ids < limit):
            self._tokens.append(token_ids)
            self.num_tokens += 1
        else:
            new = token_list(self.request_id, token_ids, limit)
            self._tokens += new
            self.num_tokens += len(new)
        self._tokens_tuple = None
        hasher = self._hasher
        if self.num_tokens >= (len(self._hashes) + 1) * hasher.hash_block_size + hasher.lookahead:
            hasher.extend(self._tokens, self._hashes, self.extra)
            self._hashes_tuple = None

    def __repr__(self) -> str:
        return (
            f"<kvimpl Request {self.request_id!r}: {self.num_tokens} tokens ({self.num_prompt_tokens} prompt), "
            f"{self.num_computed_tokens} computed, {len(self._hashes)} block hashes>"
        )


@dataclass(frozen=True)
class RequestHasher:
    """Makes kvimpl requests that hash like ``config`` (upstream: ``get_request_block_hasher``).

    Args:
        hash_function: One of vLLM's hash function names.
        seed: The ``PYTHONHASHSEED`` string the seed hash is derived from.
        hash_block_size: Tokens per hashed block.
        tagged: Extra keys carry their source tag (profile switch ``extra_keys_tagged``).
        resume_from_first: Resumed hashing looks at every multimodal feature
            (profile switch ``mm_resume_from_first_feature``).
        v025_forms: Multimodal keys have their offset form (profile switch
            ``mm_key_with_offset``; see ``kvspec.hashing.block_extra_keys``).
        embeds_digest: Prompt-embedding keys are digests (profile switch
            ``prompt_embeds_digest``; None: as ``v025_forms``).
        native: Make C requests when the extension is built (None: when
            kvimpl's native core is selected, see :func:`kvimpl.native.native_enabled`).
        token_limit: The smallest token id refused (2**31 where the release
            stores 32-bit ids, profile switch ``token_ids_int32``), or None.
            The C request does not check it, so such a hasher makes Python ones.
        logprobs_cap: A prompt-logprob request may read only up to its first
            scored row (profile switch ``prompt_logprobs_hit_cap``).
        limit_read: The manager reads ``prefix_cache_hit_limit`` (profile
            switch ``hit_limit_at_construction``), which the C request does
            not hold, so such a hasher makes Python ones.
        lookahead: Look-ahead tokens of each hash (``num_hash_lookahead_tokens``,
            vLLM 0.33.0 on; ``kvspec.hashing.lookahead_extra_keys``); the C
            request does not hash ahead, so such a hasher makes Python ones.
    """

    hash_function: str
    seed: str
    hash_block_size: int
    tagged: bool = False
    resume_from_first: bool = False
    native: bool | None = None
    v025_forms: bool = True
    embeds_digest: bool | None = None
    token_limit: int | None = None
    logprobs_cap: bool = False
    limit_read: bool = False
    lookahead: int = 0
    fn: HashFunction = field(init=False, repr=False, compare=False)
    seed_hash: BlockHash = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fn = hash_function(self.hash_function)
        object.__setattr__(self, "fn", fn)
        object.__setattr__(self, "seed_hash", none_hash(fn, self.seed))

    @classmethod
    def for_config(cls, config: KVCacheConfig, native: bool | None = None) -> RequestHasher:
        """The hasher a scheduler uses with a manager built from ``config``."""
        p = config.profile
        return cls(
            config.hash_function, config.hash_seed, hash_block_size(config), p.extra_keys_tagged,
            p.mm_resume_from_first_feature, native, p.mm_key_with_offset, p.prompt_embeds_digest,
            1 << 31 if p.token_ids_int32 else None, p.prompt_logprobs_hit_cap, p.hit_limit_at_construction,
            config.num_hash_lookahead_tokens,
        )  # fmt: skip

    @property
    def c_requests_fit(self) -> bool:
        """Whether the release's requests fit the C request: it checks no
        token-id limit and holds no hit limit fixed at construction (vLLM
        0.34.0 has both) and hashes no look-ahead tokens, so under such a
        release every request is a :class:`Request`, which the native core
        serves through its object path and its array API refuses."""
        return self.token_limit is None and not self.limit_read and not self.lookahead

    def new_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        extra: ExtraKeySource = ExtraKeySource(),
        skip_reading_prefix_cache: bool | None = None,
        prompt_logprobs: bool = False,
        prompt_logprob_start: int | None = None,
        kv_cache_report_mode: ReportMode = "incremental",
    ) -> Any:
        """A WAITING request with its prompt hashed: a C request when the
        native core is in use and can hold the tokens (and the request asks
        for no prompt logprobs and is in report mode "incremental", and the
        release has no token-id limit and reads no hit limit), else a
        :class:`Request`.

        Raises:
            InvalidRequestError: As ``kvspec.request.RequestBlockHasher.new_request``.
        """
        if not isinstance(request_id, str):
            raise InvalidRequestError(f"request id must be a str, got {request_id!r}")
        if isinstance(prompt_token_ids, str | bytes) or not prompt_token_ids:
            raise InvalidRequestError(f"request {request_id!r}: the prompt must be a non-empty sequence of token ids")
        tokens = token_list(request_id, prompt_token_ids, self.token_limit)
        check_prompt_logprobs(request_id, prompt_logprobs, prompt_logprob_start)
        check_report_mode(request_id, kv_cache_report_mode)
        if extra.lora is not None and not extra.lora.path and self.tagged:
            raise InvalidRequestError(
                f"request {request_id!r}: LoRA {extra.lora.name!r} has no path, which tagged extra keys hash"
            )
        skip = prompt_logprobs if skip_reading_prefix_cache is None else bool(skip_reading_prefix_cache)
        limit = 0 if skip else (prompt_logprob_start or 0) if prompt_logprobs and self.logprobs_cap else None
        native = self._native_type()
        plain = not prompt_logprobs and kv_cache_report_mode == "incremental" and self.c_requests_fit
        if native is not None and plain and max(tokens) < NATIVE_TOKEN_LIMIT:
            pyhash = None if self._hashed_in_c(extra) else block_hasher(self, extra)
            return native(
                request_id, tokens, self.hash_block_size, self.seed_hash, pyhash, self.resume_from_first, extra,
                skip,
            )  # fmt: skip
        return Request(
            self, request_id, tokens, extra, skip, prompt_logprobs, prompt_logprob_start, limit, kv_cache_report_mode
        )

    def extend(self, tokens: list[int], hashes: list[BlockHash], extra: ExtraKeySource) -> None:
        """Append the hash of every block of ``tokens`` that is full and not
        hashed yet (``kvspec.hashing.extend_block_hashes``, incrementally);
        under look-ahead hashes a block once the ``lookahead`` tokens after it
        exist, its extra keys those of its look-ahead window."""
        bs, fn, ahead = self.hash_block_size, self.fn, self.lookahead
        start = len(hashes) * bs
        if not ahead and _no_extra_keys(extra):
            while start + bs <= len(tokens):
                parent = hashes[-1] if hashes else self.seed_hash
                hashes.append(BlockHash(fn((parent, tuple(tokens[start : start + bs]), None))))
                start += bs
            return
        tagged, forms, digest = self.tagged, self.v025_forms, self.embeds_digest
        cursor = 0 if start == 0 or self.resume_from_first else -1
        keys: tuple[Any, ...] | None
        while start + bs + ahead <= len(tokens):
            end = start + bs
            if ahead:
                keys, cursor = lookahead_extra_keys(extra, tokens, start, end, ahead, cursor, tagged, forms, digest)
            else:
                keys, cursor = block_extra_keys(extra, start, end, cursor, tagged, forms, digest)
            parent = hashes[-1] if hashes else self.seed_hash
            hashes.append(hash_block_tokens(fn, parent, tokens[start:end], keys))
            start = end

    def _hashed_in_c(self, extra: ExtraKeySource) -> bool:
        return self.hash_function == "sha256_cbor" and _no_extra_keys(extra)

    def _native_type(self) -> Any:
        from kvimpl.native import native_module  # noqa: PLC0415 - kvimpl.native imports this module

        mod = native_module() if self.native is not False else None
        if mod is None or (self.native is None and not _native_selected()):
            return None
        return mod.Request


def block_hasher(hasher: RequestHasher, extra: ExtraKeySource) -> BlockHasher:
    """The per-block hash function a C request calls for blocks it cannot hash itself."""
    fn, tagged, forms, digest = hasher.fn, hasher.tagged, hasher.v025_forms, hasher.embeds_digest

    def hash_one(parent: bytes, tokens: tuple[int, ...], start: int, end: int, cursor: int) -> tuple[bytes, int]:
        keys, cursor = block_extra_keys(extra, start, end, cursor, tagged, forms, digest)
        return hash_block_tokens(fn, BlockHash(parent), tokens, keys), cursor

    return hash_one


def check_report_mode(request_id: str, mode: object) -> None:
    """Raise InvalidRequestError unless ``mode`` is "incremental" or "full"
    (``kvspec.request.check_report_mode``)."""
    if not isinstance(mode, str) or mode not in REPORT_MODES:
        raise InvalidRequestError(
            f"request {request_id!r}: kv_cache_report_mode must be one of {REPORT_MODES}, got {mode!r}"
        )


def check_prompt_logprobs(request_id: str, prompt_logprobs: object, start: object) -> None:
    """Raise InvalidRequestError unless ``prompt_logprobs`` is a bool and
    ``start`` None or an int >= 0 of a prompt-logprob request (kvspec's
    ``check_prompt_logprobs``)."""
    if not isinstance(prompt_logprobs, bool):
        raise InvalidRequestError(f"request {request_id!r}: prompt_logprobs must be a bool, got {prompt_logprobs!r}")
    if start is None:
        return
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        raise InvalidRequestError(f"request {request_id!r}: prompt_logprob_start {start!r} is not an int >= 0")
    if not prompt_logprobs:
        raise InvalidRequestError(f"request {request_id!r}: prompt_logprob_start {start} without prompt logprobs")


def token_list(request_id: str, token_ids: int | Sequence[int], limit: int | None = None) -> list[int]:
    """``token_ids`` (one id or a sequence) as a list of non-negative ints (not
    bools) below ``limit`` (None: any).

    Raises:
        InvalidRequestError: Naming the first bad token id.
    """
    if isinstance(token_ids, str | bytes):
        raise InvalidRequestError(f"request {request_id!r}: token ids must be ints, got the string {token_ids!r}")
    tokens: list[int] = [token_ids] if isinstance(token_ids, int) else list(token_ids)
    for i, t in enumerate(tokens):
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise InvalidRequestError(f"request {request_id!r}: token {i} is {t!r}, not a non-negative int")
        if limit is not None and t >= limit:
            raise InvalidRequestError(
                f"request {request_id!r}: token {i} is {t}, which the release's 32-bit token storage cannot hold "
                f"(ids must be below {limit})"
            )
    return tokens


def _no_extra_keys(extra: ExtraKeySource) -> bool:
    """Whether no block of the request has extra keys (kvspec.hashing.block_extra_keys gives None)."""
    return extra.lora is None and not extra.mm_features and not extra.cache_salt and extra.prompt_embeds is None


def _native_selected() -> bool:
    from kvimpl.native import native_enabled  # noqa: PLC0415 - kvimpl.native imports this module

    return native_enabled()
