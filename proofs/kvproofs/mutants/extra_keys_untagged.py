"""Mutant: extra hash keys never carry their source tag (profile switch
``extra_keys_tagged``: vLLM 0.31.0 on hashes ``("lora", name, path)`` and the
like)."""

from __future__ import annotations

import hashlib
from typing import Any

from kvspec.hashing import ExtraKeySource, _mm_extra_keys

OWN_CONTRACT = False
HARNESSES = ("bounded:contract:hashing.block_extra_keys",)


def block_extra_keys(
    src: ExtraKeySource,
    start: int,
    end: int,
    mm_cursor: int,
    tagged: bool = False,
    v025_forms: bool = True,
    embeds_digest: bool | None = None,
) -> tuple[tuple[Any, ...] | None, int]:
    """Mutant of the spec function (same contract).

    pre: 0 <= start < end and mm_cursor >= -1
    post: __return__[0] is None or len(__return__[0]) > 0
    post: not tagged or all(isinstance(k, tuple) and k[0] in ("lora", "mm", "cache_salt", "prompt_embeds") for k in __return__[0] or ())
    post: tagged or v025_forms or not any(isinstance(k, tuple) for k in __return__[0] or ())
    post: len(__return__[0] or ()) == len(block_extra_keys(src, start, end, mm_cursor, not tagged, v025_forms)[0] or ())
    post: embeds_digest is not None or __return__ == block_extra_keys(src, start, end, mm_cursor, tagged, v025_forms, v025_forms)
    """  # noqa: E501 - a PEP 316 condition is one line
    tagged = False
    mm_keys, cursor = _mm_extra_keys(src.mm_features, start, end, mm_cursor, v025_forms)
    keys: list[Any] = []
    if src.lora is not None:
        keys.append(("lora", src.lora.name, src.lora.path) if tagged else src.lora.name)
    keys += [("mm", *k) for k in mm_keys] if tagged else mm_keys
    if start == 0 and src.cache_salt:
        keys.append(("cache_salt", src.cache_salt) if tagged else src.cache_salt)
    if src.prompt_embeds is not None:
        rows = b"".join(src.prompt_embeds[start:end])
        digested = v025_forms if embeds_digest is None else embeds_digest
        digest = hashlib.sha256(rows).digest() if digested else rows
        keys.append(("prompt_embeds", digest) if tagged else digest)
    return (tuple(keys) if keys else None), cursor
