"""The request value: only the fields the KV-cache manager reads.

The manager never changes a request. The caller (a scheduler, or the
conformance kit) advances it and passes the current value to each call:
``with_output_tokens`` appends sampled tokens and extends the block hashes,
``dataclasses.replace`` updates ``num_computed_tokens``, ``status`` and
``num_preemptions``.

Upstream: ``vllm.v1.request.Request`` (only the fields the KV-cache
manager reads: token ids, prompt length, block hashes, computed tokens,
status, extra-key sources, ``skip_reading_prefix_cache``, preemptions).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NewType

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

    inv: len(self.block_hashes) == self.num_tokens // <hash block size>
    inv: 0 <= self.num_computed_tokens
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

    @classmethod
    def for_config(cls, config: KVCacheConfig) -> RequestBlockHasher:
        """The hasher a scheduler uses with a manager built from ``config``."""
        return cls(config.hash_function, config.hash_seed, config.resolved_hash_block_size(), config.profile)

    def new_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        extra: ExtraKeySource = ExtraKeySource(),
        skip_reading_prefix_cache: bool = False,
    ) -> Request:
        """A WAITING request with its prompt hashed.

        Raises:
            InvalidRequestError: If the id is not a string, the prompt is empty
                or not a sequence of non-negative int token ids, or (in
                profiles that hash it) a LoRA has no path.
        """
        if not isinstance(request_id, str):
            raise InvalidRequestError(f"request id must be a str, got {request_id!r}")
        if isinstance(prompt_token_ids, str | bytes) or not prompt_token_ids:
            raise InvalidRequestError(f"request {request_id!r}: the prompt must be a non-empty sequence of token ids")
        tokens = valid_token_ids(request_id, prompt_token_ids)
        if extra.lora is not None and not extra.lora.path and self.profile.extra_keys_tagged:
            raise InvalidRequestError(
                f"request {request_id!r}: LoRA {extra.lora.name!r} has no path, which {self.profile.name} hashes"
            )
        hashes = self._extend((), tokens, extra)
        return Request(
            request_id=RequestId(request_id),
            all_token_ids=tokens,
            num_prompt_tokens=len(tokens),
            block_hashes=hashes,
            extra=extra,
            skip_reading_prefix_cache=skip_reading_prefix_cache,
        )

    def with_output_tokens(self, request: Request, token_ids: Sequence[int]) -> Request:
        """``request`` with sampled tokens appended and new full blocks hashed
        (upstream: ``Request.append_output_token_ids``).

        Raises:
            InvalidRequestError: If a token id is not a non-negative int.
        """
        tokens = request.all_token_ids + valid_token_ids(request.request_id, token_ids)
        hashes = self._extend(request.block_hashes, tokens, request.extra)
        return replace(request, all_token_ids=tokens, block_hashes=hashes)

    def _extend(
        self, existing: tuple[BlockHash, ...], tokens: tuple[int, ...], extra: ExtraKeySource
    ) -> tuple[BlockHash, ...]:
        fn: HashFunction = get_hash_fn_by_name(self.hash_function)
        p = self.profile
        return extend_block_hashes(
            fn, none_hash(fn, self.seed), self.hash_block_size, existing, tokens, extra,
            p.extra_keys_tagged, p.mm_resume_from_first_feature, v025_key_forms(p),
        )  # fmt: skip


def v025_key_forms(profile: SemanticsProfile) -> bool:
    """Whether extra hash keys have vLLM 0.25.1's forms (offset multimodal
    keys, digested prompt embeddings); before 0.25.1 neither (profile
    switches ``mm_key_with_offset``, ``prompt_embeds_digest``, which change
    together)."""
    return profile.mm_key_with_offset and profile.prompt_embeds_digest


def valid_token_ids(request_id: str, token_ids: Sequence[int]) -> tuple[int, ...]:
    """``token_ids`` as a tuple, after checking each is a non-negative int
    (not a bool, a float or a string).

    Raises:
        InvalidRequestError: Naming the first bad token id.
    """
    if isinstance(token_ids, str | bytes):
        raise InvalidRequestError(f"request {request_id!r}: token ids must be ints, got the string {token_ids!r}")
    tokens = tuple(token_ids)
    for i, t in enumerate(tokens):
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise InvalidRequestError(f"request {request_id!r}: token {i} is {t!r}, not a non-negative int")
    return tokens
