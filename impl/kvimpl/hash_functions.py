"""vLLM's block hash functions by name: kvimpl's own copy of the lookup.

kvimpl's requests (:mod:`kvimpl.request`) and the native core hash blocks
themselves, so they need the function a configuration names. The lookup is
kvimpl's own (like every rule kvimpl shares with the spec, see
:mod:`kvimpl.config_rules`); the functions are the same four vLLM has
(``vllm/utils/hashing.py``): pickle or canonical CBOR, then SHA-256 or
xxh3-128. ``tests/impl/test_native.py`` compares their digests with
kvspec's, which the stored hash vectors pin.
"""

from __future__ import annotations

import hashlib
import pickle
from typing import Any

import cbor2

from kvspec.errors import UnknownHashFunctionError
from kvspec.hashing import HashFunction


def hash_function(name: str) -> HashFunction:
    """The hash function a configuration's ``hash_function`` names.

    Raises:
        UnknownHashFunctionError: For a name vLLM does not have.
    """
    fn = _BY_NAME.get(name)
    if fn is None:
        raise UnknownHashFunctionError(f"unknown hash function {name!r}; expected one of {', '.join(_BY_NAME)}")
    return fn


def _sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _sha256_cbor(obj: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def _xxhash(obj: Any) -> bytes:
    return _xxh3_128(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _xxhash_cbor(obj: Any) -> bytes:
    return _xxh3_128(cbor2.dumps(obj, canonical=True))


def _xxh3_128(data: bytes) -> bytes:
    import xxhash  # noqa: PLC0415 - optional, as in vLLM; imported only when used

    return xxhash.xxh3_128_digest(data)


_BY_NAME: dict[str, HashFunction] = {
    "sha256": _sha256, "sha256_cbor": _sha256_cbor, "xxhash": _xxhash, "xxhash_cbor": _xxhash_cbor,
}  # fmt: skip
