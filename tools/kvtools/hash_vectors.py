"""Compute block-hash test vectors with real vLLM 0.25.1.

Writes ``traces/vectors/hash-vectors.json`` (the vectors a port must match
byte for byte; ``docs/traces.md`` describes them), which
``tests/spec/test_hash_vectors.py`` replays against ``kvspec.hashing`` /
``kvspec.request`` (that test does not need vLLM). Regenerate with::

    VLLM_LOGGING_LEVEL=WARNING python -m kvtools hash-vectors

The script refuses to run unless ``vllm.__version__ == "0.25.1"``. It imports
only vLLM, torch, json and os, never kvspec, so the vectors are vLLM's own
output. ``PYTHONHASHSEED`` need not be set by the caller: the script sets it to
each case's seed before calling vLLM's ``init_none_hash``, which reads it from
the environment (``NONE_HASH = hash_fn(PYTHONHASHSEED)``). The output is
deterministic; running the script twice gives a byte-identical file.

Every request case is built exactly as the engine does it: a
``vllm.v1.request.Request`` with ``block_hasher=get_request_block_hasher(...)``
(prompt blocks hashed at construction), then ``append_output_token_ids`` one
token at a time (each call hashes any block it completes).
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
import vllm
from vllm.lora.request import LoRARequest
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.request import Request

EXPECTED_VLLM_VERSION = "0.25.1"
OUTPUT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "traces", "vectors", "hash-vectors.json"
)
CBOR_FNS = ("sha256_cbor", "xxhash_cbor")
PICKLE_FNS = ("sha256", "xxhash")
EMBED_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def toks(n: int, base: int = 0) -> list[int]:
    """``n`` deterministic token ids spread over a 152k vocabulary."""
    return [(base + 7919 * i + 13) % 152064 for i in range(n)]


def case(name: str, hash_block_size: int, prompt: list[int], **kw: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "hash_block_size": hash_block_size,
        "seed": "0",
        "prompt": prompt,
        "outputs": [],
        "lora": None,
        "mm": [],
        "cache_salt": None,
        "embeds": None,
        "cbor_only": False,
    }
    unknown = set(kw) - set(spec)
    if unknown:
        raise ValueError(f"unknown case fields {sorted(unknown)}")
    spec.update(kw)
    return spec


LORA = ("sql-adapter", 7)

# Each request spec runs under every hash function (``cbor_only`` specs: CBOR only).
REQUEST_SPECS: list[dict[str, Any]] = [
    case("plain-bs16", 16, toks(40)),
    case("plain-bs16-seed42", 16, toks(40), seed="42"),
    case("plain-bs16-seed-kvref", 16, toks(40), seed="kvref"),
    case("plain-bs4-exact-multiple", 4, toks(16, 5)),
    case("plain-bs1-with-outputs", 1, toks(5, 11), outputs=toks(3, 99)),
    case("plain-bs4-large-token-ids", 4, [0, 2**31 - 1, 151935, 65535, 65536, 1, 255, 256]),
    case("short-prompt-bs16-no-full-block", 16, toks(3)),
    case("short-prompt-bs4-outputs-complete-blocks", 4, toks(3, 2), outputs=toks(10, 50)),
    case("partial-prompt-bs4-outputs-seed42", 4, toks(13, 3), outputs=toks(7, 60), seed="42"),
    case("lora-bs4", 4, toks(10, 4), outputs=toks(6, 70), lora=LORA),
    case("cache-salt-bs4", 4, toks(12, 6), cache_salt="tenant-a"),
    case("cache-salt-empty-string-bs4", 4, toks(8, 6), cache_salt=""),
    case(
        "cache-salt-short-prompt-completed-by-outputs",
        4,
        toks(2, 8),
        outputs=toks(7, 80),
        cache_salt="tenant-b",
    ),
    case("mm-straddles-block-boundary", 4, toks(16, 9), mm=[("img-a", 2, 5)]),
    case(
        "mm-ends-exactly-at-block-boundary",
        4,
        toks(16, 10),
        mm=[("img-a", 4, 4), ("img-b", 8, 3)],
    ),
    case("mm-two-items-in-one-block", 16, toks(20, 12), mm=[("img-a", 2, 3), ("img-b", 7, 4)]),
    case(
        "mm-item-in-partial-prompt-block-completed-by-outputs",
        4,
        toks(10, 13),
        outputs=toks(4, 90),
        mm=[("img-a", 1, 2), ("img-b", 9, 1)],
    ),
    case(
        "mm-last-item-cursor-skips-earlier-item-in-partial-block",
        4,
        toks(11, 14),
        outputs=toks(3, 91),
        mm=[("img-a", 2, 2), ("img-b", 8, 1), ("img-c", 10, 1)],
    ),
    case(
        "mm-item-straddles-into-partial-block",
        4,
        toks(10, 15),
        outputs=toks(6, 92),
        mm=[("img-a", 6, 3)],
    ),
    case("mm-long-item-bs16", 16, toks(64, 16), mm=[("img-a", 5, 40), ("img-b", 50, 10)]),
    # CBOR only: pickle memoizes by object identity, so under sha256/xxhash the
    # digest of a block holding one identifier string twice depends on whether
    # the two are the same str object, which a value-level spec cannot express.
    case(
        "mm-same-identifier-twice-in-one-block",
        8,
        toks(16, 17),
        mm=[("img-dup", 1, 2), ("img-dup", 5, 2)],
        cbor_only=True,
    ),
    case("embeds-float16-bs4", 4, [], outputs=toks(6, 93), embeds=("float16", 10, 8, False)),
    case("embeds-bfloat16-noncontiguous-bs4", 4, [], embeds=("bfloat16", 8, 6, True)),
    case(
        "combined-lora-mm-salt-bs4",
        4,
        toks(14, 18),
        outputs=toks(5, 94),
        lora=LORA,
        mm=[("img-a", 3, 6), ("img-b", 12, 2)],
        cache_salt="tenant-c",
        seed="kvref",
    ),
    case(
        "combined-embeds-lora-salt-bs4",
        4,
        [],
        outputs=toks(4, 95),
        lora=LORA,
        cache_salt="tenant-d",
        embeds=("float16", 9, 4, False),
        seed="42",
    ),
]


def make_embeds(dtype: str, n: int, hidden: int, noncontiguous: bool) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * n + hidden)
    if noncontiguous:
        return torch.randn((hidden, n), generator=gen).to(EMBED_DTYPES[dtype]).t()
    return torch.randn((n, hidden), generator=gen).to(EMBED_DTYPES[dtype])


def row_hex(row: torch.Tensor) -> str:
    """The raw bytes of one embedding row, in logical (row-major) order."""
    return bytes(row.contiguous().view(torch.uint8).numpy().tobytes()).hex()


def run_request(fn_name: str, spec: dict[str, Any]) -> dict[str, Any]:
    os.environ["PYTHONHASHSEED"] = spec["seed"]
    fn = get_hash_fn_by_name(fn_name)
    kv_cache_utils.init_none_hash(fn)
    hasher = kv_cache_utils.get_request_block_hasher(spec["hash_block_size"], fn)

    embeds = make_embeds(*spec["embeds"]) if spec["embeds"] is not None else None
    prompt = [0] * len(embeds) if embeds is not None else list(spec["prompt"])
    lora = spec["lora"]
    request = Request(
        request_id=spec["name"],
        prompt_token_ids=None if embeds is not None else list(prompt),
        sampling_params=SamplingParams(max_tokens=len(spec["outputs"]) + 1),
        pooling_params=None,
        prompt_embeds=embeds,
        mm_features=[
            MultiModalFeatureSpec(
                data=None,
                modality="image",
                identifier=ident,
                mm_position=PlaceholderRange(offset=offset, length=length),
            )
            for ident, offset, length in spec["mm"]
        ],
        lora_request=(
            LoRARequest(lora_name=lora[0], lora_int_id=lora[1], lora_path="/nonexistent") if lora is not None else None
        ),
        cache_salt=spec["cache_salt"],
        block_hasher=hasher,
    )
    for tok in spec["outputs"]:
        request.append_output_token_ids(tok)

    all_tokens = prompt + list(spec["outputs"])
    if list(request.all_token_ids) != all_tokens:
        raise RuntimeError(f"{spec['name']}: unexpected token ids")
    if len(request.block_hashes) != len(all_tokens) // spec["hash_block_size"]:
        raise RuntimeError(f"{spec['name']}: unexpected number of block hashes")
    return {
        "name": f"{fn_name}/{spec['name']}",
        "hash_function": fn_name,
        "seed": spec["seed"],
        "hash_block_size": spec["hash_block_size"],
        "prompt": prompt,
        "outputs": list(spec["outputs"]),
        "lora": {"name": lora[0], "adapter_id": lora[1]} if lora is not None else None,
        "mm_features": [
            {"identifier": ident, "offset": offset, "length": length} for ident, offset, length in spec["mm"]
        ],
        "cache_salt": spec["cache_salt"],
        "prompt_embeds_hex": ([row_hex(embeds[i]) for i in range(len(embeds))] if embeds is not None else None),
        "none_hash_hex": kv_cache_utils.NONE_HASH.hex(),
        "block_hashes_hex": [h.hex() for h in request.block_hashes],
    }


# Extra keys are written tagged: {"str": s} | {"mm": [identifier, offset]} | {"bytes_hex": h}.
BYTES32 = bytes(range(32))
DIRECT_SPECS: list[dict[str, Any]] = [
    {"name": "parent-none-extra-none", "seed": "0", "parent": None, "tokens": [1, 2, 3, 4],
     "extra": None},
    {"name": "parent-none-seed-kvref-large-tokens", "seed": "kvref", "parent": None,
     "tokens": [0, 2**31 - 1, 151935, 65536], "extra": None},
    {"name": "parent-digest-lora-str", "seed": "0", "parent": "digest", "tokens": [5, 6, 7, 8],
     "extra": [{"str": "sql-adapter"}]},
    {"name": "parent-digest-mm-tuples", "seed": "42", "parent": "digest",
     "tokens": [9, 10, 11, 12], "extra": [{"mm": ["img-a", 0]}, {"mm": ["img-b", -3]}]},
    {"name": "parent-none-all-key-kinds", "seed": "42", "parent": None,
     "tokens": [13, 14, 15, 16],
     "extra": [{"str": "sql-adapter"}, {"mm": ["img-c", 2]}, {"str": "tenant-a"},
               {"bytes_hex": BYTES32.hex()}]},
    {"name": "parent-digest-bytes-only", "seed": "0", "parent": "digest", "tokens": [0],
     "extra": [{"bytes_hex": BYTES32[::-1].hex()}]},
]  # fmt: skip


def decode_extra(extra: list[dict[str, Any]] | None) -> tuple[Any, ...] | None:
    if extra is None:
        return None
    keys: list[Any] = []
    for item in extra:
        if "str" in item:
            keys.append(item["str"])
        elif "mm" in item:
            keys.append((item["mm"][0], item["mm"][1]))
        else:
            keys.append(bytes.fromhex(item["bytes_hex"]))
    return tuple(keys)


def run_direct(fn_name: str, spec: dict[str, Any]) -> dict[str, Any]:
    os.environ["PYTHONHASHSEED"] = spec["seed"]
    fn = get_hash_fn_by_name(fn_name)
    kv_cache_utils.init_none_hash(fn)
    parent = kv_cache_utils.BlockHash(fn("kvref-parent")) if spec["parent"] == "digest" else None
    digest = kv_cache_utils.hash_block_tokens(fn, parent, spec["tokens"], decode_extra(spec["extra"]))
    return {
        "name": f"{fn_name}/{spec['name']}",
        "hash_function": fn_name,
        "seed": spec["seed"],
        "none_hash_hex": kv_cache_utils.NONE_HASH.hex(),
        "parent_hex": parent.hex() if parent is not None else None,
        "tokens": spec["tokens"],
        "extra_keys": spec["extra"],
        "block_hash_hex": digest.hex(),
    }


def run_coarse(fn_name: str, hash_block_size: int, n_tokens: int) -> list[dict[str, Any]]:
    spec = case(f"coarse-source-bs{hash_block_size}", hash_block_size, toks(n_tokens, 21))
    fine = [kv_cache_utils.BlockHash(bytes.fromhex(h)) for h in run_request(fn_name, spec)["block_hashes_hex"]]
    out = []
    for scale in (2, 4):
        block_size = hash_block_size * scale
        view = kv_cache_utils.BlockHashListWithBlockSize(fine, hash_block_size, block_size)
        out.append(
            {
                "name": f"{fn_name}/bs{hash_block_size}-to-bs{block_size}-{len(fine)}-fine",
                "hash_function": fn_name,
                "hash_block_size": hash_block_size,
                "block_size": block_size,
                "fine_hashes_hex": [h.hex() for h in fine],
                "coarse_hashes_hex": [h.hex() for h in view],
            }
        )
    return out


def main(argv: list[str] | None = None) -> None:
    if vllm.__version__ != EXPECTED_VLLM_VERSION:
        raise SystemExit(f"need vLLM {EXPECTED_VLLM_VERSION}, found {vllm.__version__}")
    saved_seed = os.environ.get("PYTHONHASHSEED")
    fns = CBOR_FNS + PICKLE_FNS
    vectors: dict[str, Any] = {
        "vllm_version": vllm.__version__,
        "generator": "python -m kvtools hash-vectors",
        "request_cases": [
            run_request(fn, spec) for fn in fns for spec in REQUEST_SPECS if fn in CBOR_FNS or not spec["cbor_only"]
        ],
        "hash_block_tokens_cases": [run_direct(fn, spec) for fn in fns for spec in DIRECT_SPECS],
        "coarse_cases": [
            entry for fn in CBOR_FNS for hbs, n in ((4, 30), (1, 9), (16, 70)) for entry in run_coarse(fn, hbs, n)
        ],
    }
    if saved_seed is None:
        os.environ.pop("PYTHONHASHSEED", None)
    else:
        os.environ["PYTHONHASHSEED"] = saved_seed
    with open(os.path.normpath(OUTPUT), "w", encoding="utf-8") as f:
        json.dump(vectors, f, indent=1)
        f.write("\n")
    counts = {fn: sum(c["hash_function"] == fn for c in vectors["request_cases"]) for fn in fns}
    print(f"wrote {os.path.normpath(OUTPUT)}: request cases per hash function {counts}")


if __name__ == "__main__":
    main()
