"""The request value: only the fields the KV-cache manager reads.

The manager never changes a request. The caller (a scheduler, or the
conformance kit) advances it and passes the current value to each call:
``with_output_tokens`` appends sampled tokens and extends the block hashes,
``dataclasses.replace`` updates ``num_computed_tokens``, ``status``,
``num_preemptions`` and ``num_in_flight_tokens``.

Upstream: ``vllm.v1.request.Request`` (only the fields the KV-cache
manager reads: token ids, prompt length, block hashes, computed tokens,
status, extra-key sources, ``skip_reading_prefix_cache``, preemptions, and
the tokens in flight: scheduled in steps whose output is not processed yet;
from vLLM 0.34.0 ``prefix_cache_hit_limit``, fixed when the request is made
from its sampling parameters ``skip_reading_prefix_cache``,
``prompt_logprobs`` and ``prompt_logprob_start``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, NewType

from kvspec.errors import InvalidRequestError
from kvspec.hashing import (
    BlockHash,
    ExtraKeySource,
    HashFunction,
    extend_block_hashes,
    get_hash_fn_by_name,
    none_hash,
)
from kvspec.profiles import NEWEST, SemanticsProfile

if TYPE_CHECKING:
    from kvspec.config import KVCacheConfig

RequestId = NewType("RequestId", str)
ReportMode = Literal["incremental", "full"]
"""A request's ``kv_cache_report_mode`` (:attr:`Request.kv_cache_report_mode`)."""
REPORT_MODES: tuple[ReportMode, ...] = ("incremental", "full")


class RequestStatus(enum.Enum):
    """A request's status, with vLLM's names (``vllm/v1/request.py``).

    The manager tells only two apart from the rest: the watermark applies to
    ``WAITING`` and ``PREEMPTED`` requests. The others are here so that a
    status taken from vLLM keeps its name: the waiting states of the releases
    (``WAITING_FOR_FSM`` is 0.16.0's name of the structured-output wait,
    ``WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`` later releases'), and the finished
    states with their reasons. ``FINISHED`` is a finished request whose reason
    was not recorded (traces name it; the vLLM adapter sends it as
    ``FINISHED_STOPPED``).
    """

    WAITING = "WAITING"
    WAITING_FOR_FSM = "WAITING_FOR_FSM"
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = "WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR"
    WAITING_FOR_REMOTE_KVS = "WAITING_FOR_REMOTE_KVS"
    WAITING_FOR_STREAMING_REQ = "WAITING_FOR_STREAMING_REQ"
    RUNNING = "RUNNING"
    PREEMPTED = "PREEMPTED"
    FINISHED = "FINISHED"
    FINISHED_STOPPED = "FINISHED_STOPPED"
    FINISHED_LENGTH_CAPPED = "FINISHED_LENGTH_CAPPED"
    FINISHED_ABORTED = "FINISHED_ABORTED"
    FINISHED_IGNORED = "FINISHED_IGNORED"
    FINISHED_ERROR = "FINISHED_ERROR"
    FINISHED_REPETITION = "FINISHED_REPETITION"

    def is_finished(self) -> bool:
        """Whether the request has finished (any ``FINISHED`` state)."""
        return self.value.startswith("FINISHED")


@dataclass(frozen=True, slots=True)
class Request:
    """An immutable snapshot of one request.

    inv: len(self.block_hashes) == max(self.num_tokens - <look-ahead>, 0) // <hash block size>
    inv: 0 <= self.num_computed_tokens
    inv: 0 <= self.num_in_flight_tokens
    """

    request_id: RequestId
    all_token_ids: tuple[int, ...]
    num_prompt_tokens: int
    block_hashes: tuple[BlockHash, ...]
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    extra: ExtraKeySource = ExtraKeySource()
    skip_reading_prefix_cache: bool = False
    num_preemptions: int = 0
    num_in_flight_tokens: int = 0
    """Tokens scheduled in steps whose output is not processed yet (an
    asynchronous scheduler's steps in flight; 0 under a synchronous one).
    From vLLM 0.26.0 on ``allocate_slots`` frees skipped blocks only below
    the computed tokens less these (profile switch ``skip_on_processed_tokens``)."""
    prompt_logprobs: bool = False
    """The request asks for prompt logprobs (vLLM: ``prompt_logprobs`` or
    ``prompt_logprob_token_ids`` set)."""
    prompt_logprob_start: int | None = None
    """The first prompt row scored (vLLM's ``prompt_logprob_start``; None: the first)."""
    kv_cache_report_mode: ReportMode = "incremental"
    """How the request's cached blocks are reported in KV-cache events (vLLM's
    sampling-parameter ``extra_args`` key ``kv_cache_report_mode``): "full"
    also announces the blocks a lookup hits (vLLM 0.26.0 on, profile switch
    ``report_mode_full``; earlier releases ignore it)."""
    prefix_cache_hit_limit: int | None = None
    """How many leading tokens the request may read from the prefix cache
    (None: no limit; 0: none), fixed by :meth:`RequestBlockHasher.new_request`
    (:func:`construction_hit_limit`) and read from vLLM 0.34.0 on (profile
    switch ``hit_limit_at_construction``)."""

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens (draft tokens are never part of it)."""
        return len(self.all_token_ids)


@dataclass(frozen=True, slots=True)
class RequestBlockHasher:
    """Computes block hashes the way vLLM's ``get_request_block_hasher`` does
    (in the release of ``profile``)."""

    hash_function: str
    seed: str
    hash_block_size: int
    profile: SemanticsProfile = NEWEST
    lookahead: int = 0
    """Look-ahead tokens of each hash (``num_hash_lookahead_tokens``, vLLM 0.33.0 on)."""

    @classmethod
    def for_config(cls, config: KVCacheConfig) -> RequestBlockHasher:
        """The hasher a scheduler uses with a manager built from ``config``."""
        return cls(
            config.hash_function, config.hash_seed, config.resolved_hash_block_size(), config.profile,
            config.num_hash_lookahead_tokens,
        )  # fmt: skip

    def new_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        extra: ExtraKeySource = ExtraKeySource(),
        skip_reading_prefix_cache: bool | None = None,
        prompt_logprobs: bool = False,
        prompt_logprob_start: int | None = None,
        kv_cache_report_mode: ReportMode = "incremental",
    ) -> Request:
        """A WAITING request with its prompt hashed.

        ``skip_reading_prefix_cache`` None (unset) means "skip when the
        request asks for prompt logprobs", as vLLM's sampling parameters
        resolve it; ``prompt_logprob_start`` needs ``prompt_logprobs``.

        Raises:
            InvalidRequestError: If the id is not a string, the prompt is empty
                or not a sequence of non-negative int token ids (below 2**31
                where the profile stores 32-bit ids), a prompt-logprob start is
                not an int >= 0 or comes without prompt logprobs, or (in
                profiles that hash it) a LoRA has no path, or the report mode
                is not "incremental" or "full".
        """
        if not isinstance(request_id, str):
            raise InvalidRequestError(f"request id must be a str, got {request_id!r}")
        if isinstance(prompt_token_ids, str | bytes) or not prompt_token_ids:
            raise InvalidRequestError(f"request {request_id!r}: the prompt must be a non-empty sequence of token ids")
        tokens = valid_token_ids(request_id, prompt_token_ids, token_id_limit(self.profile))
        check_prompt_logprobs(request_id, prompt_logprobs, prompt_logprob_start)
        check_report_mode(request_id, kv_cache_report_mode)
        if extra.lora is not None and not extra.lora.path and self.profile.extra_keys_tagged:
            raise InvalidRequestError(
                f"request {request_id!r}: LoRA {extra.lora.name!r} has no path, which {self.profile.name} hashes"
            )
        skip = bool(prompt_logprobs) if skip_reading_prefix_cache is None else bool(skip_reading_prefix_cache)
        hashes = self._extend((), tokens, extra)
        return Request(
            request_id=RequestId(request_id),
            all_token_ids=tokens,
            num_prompt_tokens=len(tokens),
            block_hashes=hashes,
            extra=extra,
            skip_reading_prefix_cache=skip,
            prompt_logprobs=bool(prompt_logprobs),
            prompt_logprob_start=prompt_logprob_start,
            kv_cache_report_mode=kv_cache_report_mode,
            prefix_cache_hit_limit=construction_hit_limit(self.profile, skip, prompt_logprobs, prompt_logprob_start),
        )

    def with_output_tokens(self, request: Request, token_ids: Sequence[int]) -> Request:
        """``request`` with sampled tokens appended and new full blocks hashed
        (upstream: ``Request.append_output_token_ids``).

        Raises:
            InvalidRequestError: If a token id is not a non-negative int (below
                2**31 where the profile stores 32-bit ids).
        """
        tokens = request.all_token_ids + valid_token_ids(request.request_id, token_ids, token_id_limit(self.profile))
        hashes = self._extend(request.block_hashes, tokens, request.extra)
        return replace(request, all_token_ids=tokens, block_hashes=hashes)

    def _extend(
        self, existing: tuple[BlockHash, ...], tokens: tuple[int, ...], extra: ExtraKeySource
    ) -> tuple[BlockHash, ...]:
        fn: HashFunction = get_hash_fn_by_name(self.hash_function)
        p = self.profile
        return extend_block_hashes(
            fn, none_hash(fn, self.seed), self.hash_block_size, existing, tokens, extra,
            p.extra_keys_tagged, p.mm_resume_from_first_feature, *key_forms(p), self.lookahead,
        )  # fmt: skip


def key_forms(profile: SemanticsProfile) -> tuple[bool, bool]:
    """The forms of the extra hash keys (:func:`kvspec.hashing.block_extra_keys`'s
    ``v025_forms`` and ``embeds_digest``): offset multimodal keys from vLLM
    0.19.0 on (profile switch ``mm_key_with_offset``), digested prompt
    embeddings from 0.17.0 on (``prompt_embeds_digest``).

    post: __return__ == (profile.mm_key_with_offset, profile.prompt_embeds_digest)
    post: not __return__[0] or __return__[1]
    """
    return profile.mm_key_with_offset, profile.prompt_embeds_digest


def token_id_limit(profile: SemanticsProfile) -> int | None:
    """The smallest token id the profile's release cannot store (2**31 where
    it keeps token ids as 32-bit ints, switch ``token_ids_int32``), or None.

    post: (__return__ is None) == (not profile.token_ids_int32)
    post: __return__ is None or __return__ == 2**31
    """
    return 1 << 31 if profile.token_ids_int32 else None


def construction_hit_limit(
    profile: SemanticsProfile, skip: bool, prompt_logprobs: bool, prompt_logprob_start: int | None
) -> int | None:
    """A new request's ``prefix_cache_hit_limit`` (vLLM 0.34.0's
    ``Request.get_prefix_cache_hit_limit``): 0 when it skips prefix-cache
    reads; for a prompt-logprob request, where the profile caps it (switch
    ``prompt_logprobs_hit_cap``), its first scored row (0 without a start);
    else None (no limit).

    pre: prompt_logprob_start is None or prompt_logprob_start >= 0
    post: __return__ is None or __return__ >= 0
    post: not skip or __return__ == 0
    post: skip or (prompt_logprobs and profile.prompt_logprobs_hit_cap) or __return__ is None
    post: skip or not (prompt_logprobs and profile.prompt_logprobs_hit_cap) or __return__ == (prompt_logprob_start or 0)
    """
    if skip:
        return 0
    if prompt_logprobs and profile.prompt_logprobs_hit_cap:
        return prompt_logprob_start or 0
    return None


def check_prompt_logprobs(request_id: str, prompt_logprobs: object, start: object) -> None:
    """Raise InvalidRequestError unless ``start`` is None, or an int >= 0 of a
    request that asks for prompt logprobs (vLLM's sampling parameters refuse
    the rest).

    raises: InvalidRequestError
    post: isinstance(prompt_logprobs, bool)
    post: start is None or (isinstance(start, int) and not isinstance(start, bool) and start >= 0 and prompt_logprobs)
    """
    if not isinstance(prompt_logprobs, bool):
        raise InvalidRequestError(f"request {request_id!r}: prompt_logprobs must be a bool, got {prompt_logprobs!r}")
    if start is None:
        return
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        raise InvalidRequestError(f"request {request_id!r}: prompt_logprob_start {start!r} is not an int >= 0")
    if not prompt_logprobs:
        raise InvalidRequestError(f"request {request_id!r}: prompt_logprob_start {start} without prompt logprobs")


def check_report_mode(request_id: str, mode: object) -> None:
    """Raise InvalidRequestError unless ``mode`` is one of :data:`REPORT_MODES`.

    raises: InvalidRequestError
    post: mode in REPORT_MODES
    """
    if not isinstance(mode, str) or mode not in REPORT_MODES:
        raise InvalidRequestError(
            f"request {request_id!r}: kv_cache_report_mode must be one of {REPORT_MODES}, got {mode!r}"
        )


def valid_token_ids(request_id: str, token_ids: Sequence[int], limit: int | None = None) -> tuple[int, ...]:
    """``token_ids`` as a tuple, after checking each is a non-negative int
    (not a bool, a float or a string) below ``limit`` (None: any).

    Raises:
        InvalidRequestError: Naming the first bad token id.

    raises: InvalidRequestError
    post: __return__ == tuple(token_ids)
    post: all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in __return__)
    post: limit is None or all(t < limit for t in __return__)
    """
    if isinstance(token_ids, str | bytes):
        raise InvalidRequestError(f"request {request_id!r}: token ids must be ints, got the string {token_ids!r}")
    tokens = tuple(token_ids)
    for i, t in enumerate(tokens):
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise InvalidRequestError(f"request {request_id!r}: token {i} is {t!r}, not a non-negative int")
        if limit is not None and t >= limit:
            raise InvalidRequestError(
                f"request {request_id!r}: token {i} is {t}, which the release's 32-bit token storage cannot hold "
                f"(ids must be below {limit})"
            )
    return tokens
