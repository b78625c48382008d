"""Mutant: token ids are never checked against the release's storage limit
(vLLM releases that keep token ids as 32-bit ints, profile switch
``token_ids_int32``: :func:`kvspec.request.token_id_limit`)."""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.errors import InvalidRequestError

OWN_CONTRACT = False
HARNESSES = ("bounded:contract:request.valid_token_ids",)


def valid_token_ids(request_id: str, token_ids: Sequence[int], limit: int | None = None) -> tuple[int, ...]:
    """Mutant of the spec function (same contract).

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
    return tokens
