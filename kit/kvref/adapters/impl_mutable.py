"""``--target impl-mutable``: kvimpl driven with its own mutable requests, as a scheduler would.

The lockstep hands every adapter kvspec's immutable
:class:`kvspec.request.Request` values, and kvimpl's managers accept them.
A scheduler on kvimpl keeps one mutable request per request instead
(:mod:`kvimpl.request`, as vLLM's scheduler keeps ``vllm.v1.request.Request``)
and advances it in place, which hashes only the blocks that became full.
This adapter does that: it keeps one kvimpl request per request id, made by
``RequestHasher.new_request`` from the value's prompt and extra keys, and
before each call that takes a request it advances it to match the value it
is given (the new output tokens appended, one int when there is one and the
list when there are several, as a speculative step appends them; then
``num_computed_tokens``, ``status``, ``num_preemptions`` and ``num_in_flight_tokens`` set), then checks
that kvimpl's incrementally extended block hashes equal kvspec's, and that
everything a scheduler reads of the request (all its tokens, its counts,
status, preemptions, block hashes and extra keys) equals kvspec's value. A value
whose prompt, extra keys or skip flag differ from the mirror's (a new request
reusing a freed id) gets a new mirror. New mirrors alternate between the
pure-Python :class:`kvimpl.request.Request` and the C request (when the
extension is built), so both classes meet both managers; appends alternate
between the int and the list form (the scheduler appends one sampled token
as an int, speculative ones as a list).

The first mirror of each class checks every caller error of the request API
(:data:`PROBES`), and each later one checks one of them in turn, so that
every run with two requests meets them all, whatever its length:
``new_request`` with a request id that is not a str, an empty prompt, a
negative token id, or (where extra keys are tagged) a LoRA without a path;
an append of a string or of a list with a negative id. Each
must raise :class:`kvspec.errors.InvalidRequestError`, and a refused append
must leave the request as it was (its block hashes are compared with
kvspec's at the next call). The last probe is a hasher naming a hash
function vLLM does not have: kvimpl's ``RequestHasher`` and kvspec's
``RequestBlockHasher`` (when it hashes the same prompt) must both raise
:class:`kvspec.errors.UnknownHashFunctionError`. A probe that does not
raise is an :class:`AssertionError`, which the lockstep reports as a crash
of ``impl-mutable``.

The manager is the one ``--target impl`` builds, kvimpl's
``create_manager`` (the native core where it implements the configuration,
else the pure-Python manager); everything the lockstep compares is the
manager's output, unchanged.

NOTE: the adapter derives from the impl adapter classes, so the kit still
imports kvimpl in one module only (:mod:`kvref.adapters.impl`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from kvref.adapters.impl import ImplAdapter, NativeImplAdapter, built_adapter, check_config, request_hashers
from kvref.adapters.impl_probes import raised
from kvref.capabilities import OPT_IN_FEATURES, declare
from kvspec.config import KVCacheConfig
from kvspec.errors import InvalidRequestError, UnknownHashFunctionError
from kvspec.hashing import ExtraKeySource, LoRA
from kvspec.profiles import SemanticsProfile
from kvspec.request import Request, RequestBlockHasher
from kvspec.view import BlockIds

PROBES = (
    "request id", "empty prompt", "negative token", "lora without path", "append str", "append negative",
    "unknown hash function", "token past the limit", "append past the limit", "prompt_logprobs not a bool",
    "negative logprob start", "logprob start without logprobs", "unknown report mode",
)  # fmt: skip
"""The caller errors new mirrors check in turn (see the module docstring)."""


@dataclass
class _Mirror:
    """One kvimpl request and the kvspec value it was last advanced to."""

    request: Any
    tokens: tuple[int, ...]
    num_prompt_tokens: int
    extra: ExtraKeySource
    logprobs: tuple[bool, int | None]
    """The request's ``prompt_logprobs`` and ``prompt_logprob_start``."""


class MutableRequests:
    """The request mirroring, mixed into either impl adapter class."""

    name = "impl-mutable"

    def _init_mirrors(self, config: KVCacheConfig) -> None:
        self._profile = config.profile
        self._hashers = request_hashers(config)
        self._mirrors: dict[str, _Mirror] = {}
        self._made = 0
        self._appends = 0

    def _sync(self, request: Any) -> Any:
        """The kvimpl request for the kvspec value ``request``, advanced to match it
        (anything that is not a kvspec request, a caller error, passes through)."""
        if not isinstance(request, Request):
            return request
        rid, tokens = request.request_id, request.all_token_ids
        mirror = self._mirrors.get(rid)
        if mirror is not None and not _same_request(mirror, request):
            mirror = None  # a new request reusing the id
        if mirror is None:
            n = self._made
            self._made += 1
            hasher = self._hashers[n % 2]
            prompt = tokens[: request.num_prompt_tokens]
            made = hasher.new_request(
                rid, prompt, request.extra, _construction_skip(request, self._profile), request.prompt_logprobs,
                request.prompt_logprob_start, request.kv_cache_report_mode,
            )  # fmt: skip
            mirror = self._mirrors[rid] = _Mirror(
                made, prompt, request.num_prompt_tokens, request.extra, _logprobs(request)
            )
            for probe in PROBES if n < 2 else (PROBES[n // 2 % len(PROBES)],):  # every probe on both classes
                _probe(probe, hasher, made, request, self._profile)
        mreq = mirror.request
        if mirror.tokens is not tokens:
            new = tokens[len(mirror.tokens) :]
            if new:
                self._appends += 1
                mreq.append_output_token_ids(new[0] if len(new) == 1 and self._appends % 2 else list(new))
            mirror.tokens = tokens
            if tuple(mreq.block_hashes) != request.block_hashes:
                raise AssertionError(
                    f"impl-mutable: request {rid!r} at {len(tokens)} tokens: kvimpl's incremental block hashes "
                    f"({len(mreq.block_hashes)}) differ from kvspec's ({len(request.block_hashes)})"
                )
        mreq.num_computed_tokens = request.num_computed_tokens
        mreq.status = request.status
        mreq.num_preemptions = request.num_preemptions
        mreq.num_in_flight_tokens = request.num_in_flight_tokens
        # set in place, as a scheduler would: from vLLM 0.34.0 on the manager reads the hit limit
        # the request was made with instead (kvspec's value keeps it too)
        mreq.skip_reading_prefix_cache = request.skip_reading_prefix_cache
        _same_state(rid, mreq, request)
        return mreq

    def _forget(self, request_id: Any) -> None:
        if isinstance(request_id, str):
            self._mirrors.pop(request_id, None)


def _same_state(rid: str, mreq: Any, request: Request) -> None:
    """Everything a scheduler reads of a kvimpl request equals kvspec's value:
    the tokens (all of them, not only the full blocks the managers hash), the
    counts, the status, the preemptions, the block hashes and the extra keys.

    Raises:
        AssertionError: The first field that differs, with both values.
    """
    fields = (
        ("all_token_ids", tuple(mreq.all_token_ids), tuple(request.all_token_ids)),
        ("num_tokens", mreq.num_tokens, request.num_tokens),
        ("num_prompt_tokens", mreq.num_prompt_tokens, request.num_prompt_tokens),
        ("num_computed_tokens", mreq.num_computed_tokens, request.num_computed_tokens),
        ("status", mreq.status, request.status),
        ("num_preemptions", mreq.num_preemptions, request.num_preemptions),
        ("num_in_flight_tokens", mreq.num_in_flight_tokens, request.num_in_flight_tokens),
        ("block_hashes", tuple(mreq.block_hashes), tuple(request.block_hashes)),
        ("extra", mreq.extra, request.extra),
    )
    for name, got, want in fields:
        if got != want:
            raise AssertionError(f"impl-mutable: request {rid!r}: kvimpl's {name} {got!r} != kvspec's {want!r}")


def _probe(probe: str, hasher: Any, mreq: Any, request: Request, profile: SemanticsProfile) -> None:
    """Check that one caller error of the request API raises InvalidRequestError
    (an unknown hash function: UnknownHashFunctionError, from kvimpl and kvspec)."""
    rid, prompt = request.request_id, list(request.all_token_ids[: request.num_prompt_tokens])
    if probe == "unknown hash function":
        _probe_hash_function(hasher, rid, prompt, profile)
        return
    if probe == "lora without path" and not hasher.tagged:
        return  # untagged extra keys do not hash the path: a LoRA without one is valid
    if probe.endswith("past the limit") and hasher.token_limit is None:
        return  # the release stores token ids of any size
    calls: dict[str, Callable[[], object]] = {
        "request id": lambda: hasher.new_request(len(rid), prompt),
        "empty prompt": lambda: hasher.new_request(rid, []),
        "negative token": lambda: hasher.new_request(rid, [*prompt[:-1], -1]),
        "lora without path": lambda: hasher.new_request(rid, prompt, replace(request.extra, lora=LoRA("probe", 1))),
        "append str": lambda: mreq.append_output_token_ids("7"),
        "append negative": lambda: mreq.append_output_token_ids([0, -1]),
        "token past the limit": lambda: hasher.new_request(rid, [*prompt[:-1], hasher.token_limit]),
        "append past the limit": lambda: mreq.append_output_token_ids([0, hasher.token_limit]),
        "prompt_logprobs not a bool": lambda: hasher.new_request(rid, prompt, prompt_logprobs=1),
        "negative logprob start": lambda: hasher.new_request(rid, prompt, request.extra, None, True, -1),
        "logprob start without logprobs": lambda: hasher.new_request(rid, prompt, prompt_logprob_start=0),
        "unknown report mode": lambda: hasher.new_request(rid, prompt, kv_cache_report_mode="all"),
    }
    try:
        calls[probe]()
    except InvalidRequestError:
        if mreq.num_tokens != request.num_prompt_tokens:
            raise AssertionError(f"impl-mutable: {probe} ({rid!r}) was refused but changed the request") from None
        return
    raise AssertionError(f"impl-mutable: {probe} ({rid!r}): kvimpl's request API did not raise InvalidRequestError")


def _probe_hash_function(hasher: Any, rid: str, prompt: list[int], profile: SemanticsProfile) -> None:
    """A hasher naming a hash function vLLM does not have: kvimpl refuses it when it is built,
    kvspec when it hashes; both with UnknownHashFunctionError."""
    name = "md5"  # hashlib has it, vLLM's hash functions do not
    got = raised(lambda: replace(hasher, hash_function=name))
    spec = RequestBlockHasher(name, hasher.seed, hasher.hash_block_size, profile)
    want = raised(lambda: spec.new_request(rid, prompt))
    if type(got) is not UnknownHashFunctionError or type(want) is not UnknownHashFunctionError:
        raise AssertionError(
            f"impl-mutable: hash function {name!r}: kvimpl's RequestHasher raised {got!r}, "
            f"kvspec's RequestBlockHasher {want!r}; both must raise UnknownHashFunctionError"
        )


def _construction_skip(request: Request, profile: SemanticsProfile) -> bool:
    """The skip flag ``request`` was made with, as far as the manager can tell: where the release
    reads the hit limit fixed at construction (vLLM 0.34.0), a limit of 0 (a later change of the
    flag is set in place by the sync, as a scheduler sets it); before, the flag as it is now."""
    if profile.hit_limit_at_construction:
        return request.prefix_cache_hit_limit == 0
    return request.skip_reading_prefix_cache


def _same_request(mirror: _Mirror, request: Request) -> bool:
    """Whether ``request`` is the mirrored request, advanced (not a new one under its id)."""
    tokens, have = request.all_token_ids, len(mirror.tokens)
    return (
        mirror.num_prompt_tokens == request.num_prompt_tokens
        and len(tokens) >= have
        and tokens[:have] == mirror.tokens
        and (mirror.extra is request.extra or mirror.extra == request.extra)
        and mirror.logprobs == _logprobs(request)
        and getattr(mirror.request, "kv_cache_report_mode", "incremental") == request.kv_cache_report_mode
    )


def _logprobs(request: Request) -> tuple[bool, int | None]:
    return request.prompt_logprobs, request.prompt_logprob_start


def _mirrored(base: type) -> type:
    """``base`` (an impl adapter class) with every request-taking call mirrored."""

    class Mirrored(MutableRequests, base):  # type: ignore[misc]  # a class built per base
        def __init__(self, config: KVCacheConfig) -> None:
            super().__init__(config)
            self._init_mirrors(config)

        def get_computed_blocks(self, request: Any, max_cache_hit_length: int | None = None) -> tuple[BlockIds, int]:
            out: tuple[BlockIds, int] = super().get_computed_blocks(self._sync(request), max_cache_hit_length)
            return out

        def get_num_cached_tokens(self, request: Any) -> int:
            out: int = super().get_num_cached_tokens(self._sync(request))
            return out

        def get_computed_blocks_for_connector(
            self, request: Any, max_cache_hit_length: int | None = None
        ) -> tuple[BlockIds, int, bool]:
            out: tuple[BlockIds, int, bool] = super().get_computed_blocks_for_connector(
                self._sync(request), max_cache_hit_length
            )
            return out

        def allocate_slots(self, request: Any, *args: Any, **kwargs: Any) -> BlockIds | None:
            out: BlockIds | None = super().allocate_slots(self._sync(request), *args, **kwargs)
            return out

        def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
            super().cache_blocks(self._sync(request), num_computed_tokens)

        def get_prefix_hint(self, request: Any) -> int:
            out: int = super().get_prefix_hint(self._sync(request))
            return out

        def estimate_cached_tokens(self, request: Any) -> int:
            out: int = super().estimate_cached_tokens(self._sync(request))
            return out

        def record_prefix_cache_stats(self, request: Any, num_hits: int) -> None:
            super().record_prefix_cache_stats(self._sync(request), num_hits)

        def free(self, request_id: str) -> None:
            super().free(request_id)
            self._forget(request_id)

        def pop_blocks_for_free(self, request_id: str) -> Any:
            out = super().pop_blocks_for_free(request_id)
            self._forget(request_id)
            return out

    Mirrored.__name__ = Mirrored.__qualname__ = f"Mutable{base.__name__}"
    return Mirrored


MutableImplAdapter = _mirrored(ImplAdapter)
"""kvimpl's pure-Python manager with mutable requests."""
MutableNativeImplAdapter = _mirrored(NativeImplAdapter)
"""kvimpl's native manager with mutable requests."""


@declare(features=OPT_IN_FEATURES)
def make_impl_mutable_adapter(config: KVCacheConfig) -> Any:
    """Factory for ``--target impl-mutable``: the manager ``--target impl``
    builds, driven with kvimpl's own mutable requests.

    Raises:
        UnsupportedByProfileError: As ``--target impl``.
    """
    check_config(config)  # the same refusals as --target impl, and the same manager: kvimpl's create_manager
    adapter = built_adapter(config, MutableImplAdapter, MutableNativeImplAdapter)
    adapter._init_mirrors(config)
    return adapter
