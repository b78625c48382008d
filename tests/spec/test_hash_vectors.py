"""kvspec's block hashes are byte-identical to vLLM 0.25.1's.

``traces/vectors/hash-vectors.json`` was computed by real vLLM 0.25.1, not by
kvspec: ``python -m kvtools hash-vectors`` builds ``vllm.v1.request.Request`` objects
with ``block_hasher=get_request_block_hasher(...)`` after setting
``PYTHONHASHSEED`` to each case's seed and calling ``init_none_hash``, appends
the output tokens one at a time with ``append_output_token_ids``, and also
records direct ``hash_block_tokens`` calls and ``BlockHashListWithBlockSize``
views. This test replays every case through ``kvspec.request.RequestBlockHasher``
and ``kvspec.hashing``; it does not need vLLM. Regenerate the vectors (with
vLLM 0.25.1 installed) with::

    VLLM_LOGGING_LEVEL=WARNING python -m kvtools hash-vectors
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict

import pytest

from kvspec.errors import UnknownHashFunctionError
from kvspec.hashing import (
    HASH_FUNCTION_NAMES,
    BlockHash,
    ExtraKeySource,
    LoRA,
    MultiModalFeature,
    block_extra_keys,
    coarse_block_hashes,
    external_block_hash,
    get_hash_fn_by_name,
    hash_block_tokens,
    make_key,
    none_hash,
    split_key,
)
from kvspec.profiles import VLLM_0_25_1
from kvspec.request import RequestBlockHasher

VECTORS_PATH = Path(__file__).resolve().parents[2] / "traces" / "vectors" / "hash-vectors.json"
CBOR_FNS = ("sha256_cbor", "xxhash_cbor")
MIN_REQUEST_CASES = {"sha256_cbor": 12, "xxhash_cbor": 12, "sha256": 4, "xxhash": 4}


class LoRAJson(TypedDict):
    name: str
    adapter_id: int


class MMFeatureJson(TypedDict):
    identifier: str
    offset: int
    length: int


class RequestCase(TypedDict):
    name: str
    hash_function: str
    seed: str
    hash_block_size: int
    prompt: list[int]
    outputs: list[int]
    lora: LoRAJson | None
    mm_features: list[MMFeatureJson]
    cache_salt: str | None
    prompt_embeds_hex: list[str] | None
    none_hash_hex: str
    block_hashes_hex: list[str]


class DirectCase(TypedDict):
    """One ``hash_block_tokens`` call; ``parent_hex`` None means NONE_HASH.

    Extra keys are tagged: ``{"str": s}``, ``{"mm": [identifier, offset]}``
    (a tuple) or ``{"bytes_hex": h}``.
    """

    name: str
    hash_function: str
    seed: str
    none_hash_hex: str
    parent_hex: str | None
    tokens: list[int]
    extra_keys: list[dict[str, Any]] | None
    block_hash_hex: str


class CoarseCase(TypedDict):
    name: str
    hash_function: str
    hash_block_size: int
    block_size: int
    fine_hashes_hex: list[str]
    coarse_hashes_hex: list[str]


class Vectors(TypedDict):
    vllm_version: str
    generator: str
    request_cases: list[RequestCase]
    hash_block_tokens_cases: list[DirectCase]
    coarse_cases: list[CoarseCase]


def _load() -> Vectors:
    with VECTORS_PATH.open(encoding="utf-8") as f:
        vectors: Vectors = json.load(f)
    return vectors


VECTORS = _load()


def _extra_source(case: RequestCase) -> ExtraKeySource:
    lora = case["lora"]
    embeds = case["prompt_embeds_hex"]
    return ExtraKeySource(
        lora=LoRA(lora["name"], lora["adapter_id"]) if lora is not None else None,
        mm_features=tuple(MultiModalFeature(m["identifier"], m["offset"], m["length"]) for m in case["mm_features"]),
        cache_salt=case["cache_salt"],
        prompt_embeds=tuple(bytes.fromhex(row) for row in embeds) if embeds is not None else None,
    )


def _decode_extra_keys(extra: list[dict[str, Any]] | None) -> tuple[Any, ...] | None:
    if extra is None:
        return None
    keys: list[Any] = []
    for item in extra:
        if "str" in item:
            keys.append(str(item["str"]))
        elif "mm" in item:
            identifier, offset = item["mm"]
            keys.append((str(identifier), int(offset)))
        else:
            keys.append(bytes.fromhex(item["bytes_hex"]))
    return tuple(keys)


def test_vectors_come_from_vllm_0_25_1() -> None:
    assert VECTORS["vllm_version"] == "0.25.1"


def test_vectors_cover_every_hash_function() -> None:
    counts = {name: 0 for name in HASH_FUNCTION_NAMES}
    for case in VECTORS["request_cases"]:
        counts[case["hash_function"]] += 1
    for name, minimum in MIN_REQUEST_CASES.items():
        assert counts[name] >= minimum, (name, counts[name])


@pytest.mark.parametrize("case", VECTORS["request_cases"], ids=[c["name"] for c in VECTORS["request_cases"]])
def test_request_block_hashes_match_vllm(case: RequestCase) -> None:
    hasher = RequestBlockHasher(case["hash_function"], case["seed"], case["hash_block_size"], VLLM_0_25_1)
    fn = get_hash_fn_by_name(case["hash_function"])
    assert none_hash(fn, case["seed"]).hex() == case["none_hash_hex"]

    request = hasher.new_request(case["name"], case["prompt"], _extra_source(case))
    for token in case["outputs"]:
        request = hasher.with_output_tokens(request, [token])

    assert request.all_token_ids == tuple(case["prompt"] + case["outputs"])
    assert [h.hex() for h in request.block_hashes] == case["block_hashes_hex"]


@pytest.mark.parametrize(
    "case",
    VECTORS["hash_block_tokens_cases"],
    ids=[c["name"] for c in VECTORS["hash_block_tokens_cases"]],
)
def test_hash_block_tokens_matches_vllm(case: DirectCase) -> None:
    fn = get_hash_fn_by_name(case["hash_function"])
    seed_hash = none_hash(fn, case["seed"])
    assert seed_hash.hex() == case["none_hash_hex"]
    parent_hex = case["parent_hex"]
    parent = BlockHash(bytes.fromhex(parent_hex)) if parent_hex is not None else seed_hash

    digest = hash_block_tokens(fn, parent, case["tokens"], _decode_extra_keys(case["extra_keys"]))

    assert digest.hex() == case["block_hash_hex"]


@pytest.mark.parametrize("case", VECTORS["coarse_cases"], ids=[c["name"] for c in VECTORS["coarse_cases"]])
def test_coarse_view_matches_vllm(case: CoarseCase) -> None:
    fine = [BlockHash(bytes.fromhex(h)) for h in case["fine_hashes_hex"]]

    coarse = coarse_block_hashes(fine, case["hash_block_size"], case["block_size"])

    assert [h.hex() for h in coarse] == case["coarse_hashes_hex"]


def test_unknown_hash_function_name_is_rejected() -> None:
    with pytest.raises(UnknownHashFunctionError):
        get_hash_fn_by_name("nope")
    with pytest.raises(ValueError, match="nope"):
        get_hash_fn_by_name("nope")


@pytest.mark.parametrize("salt", [None, ""], ids=["no-salt", "empty-salt"])
def test_plain_block_has_no_extra_keys(salt: str | None) -> None:
    extra, cursor = block_extra_keys(ExtraKeySource(cache_salt=salt), 0, 4, 0)

    assert extra is None
    assert cursor == 0


@pytest.mark.parametrize("group_id", [0, 1, 255, 2**32 - 1], ids=lambda g: f"group-{g}")
@pytest.mark.parametrize("fn_name", CBOR_FNS)
def test_make_key_split_key_round_trip(fn_name: str, group_id: int) -> None:
    block_hash = none_hash(get_hash_fn_by_name(fn_name), "kvref")

    key = make_key(block_hash, group_id)

    assert key == block_hash + group_id.to_bytes(4, "big")
    assert split_key(key) == (block_hash, group_id)


@pytest.mark.parametrize("fn_name", HASH_FUNCTION_NAMES)
def test_external_block_hash_is_low_64_bits_big_endian(fn_name: str) -> None:
    block_hash = none_hash(get_hash_fn_by_name(fn_name), "0")

    as_int = external_block_hash(block_hash, as_int=True)

    assert as_int == int.from_bytes(block_hash[-8:], "big")
    assert isinstance(as_int, int)
    assert 0 <= as_int < 2**64
    assert external_block_hash(block_hash, as_int=False) == block_hash
