"""Contract domains of value functions CrossHair cannot exhaust: the hash
functions and what feeds them (CrossHair's symbolic callables need not be
deterministic, and symbolic bytes and strings multiply paths), and argument
checks whose error messages realize every symbolic character.

Hash values are distinct opaque bytes: the functions only move, compare,
slice or join them, so distinct values stand for any (their contents never
decide a branch).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from itertools import product

from kvproofs.bounded.domains import PROFILE_LIST, hashes
from kvproofs.bounded.pep316 import Case, contract
from kvspec.config import Mamba, MambaMode
from kvspec.hashing import (
    HASH_FUNCTION_NAMES,
    ExtraKeySource,
    LoRA,
    MultiModalFeature,
    get_hash_fn_by_name,
    none_hash,
)
from kvspec.hashing import extend_block_hashes as _reference_extend  # bound before a mutant replaces it
from kvspec.prefill_checkpoints import CheckpointGeometry

HS = "kvspec.hashing"
KCM = "kvspec.kv_cache_manager"

_NAMES = tuple(n for n in HASH_FUNCTION_NAMES if not n.startswith("xxhash") or importlib.util.find_spec("xxhash"))
"""The hash functions usable here (the xxh3 ones need the optional ``xxhash``)."""


@contract(f"{HS}.get_hash_fn_by_name", "vLLM's four names and five others")
def _hash_fn() -> Iterator[Case]:
    for name in (*HASH_FUNCTION_NAMES, "", "sha", "SHA256", "sha256 ", "xxhash2"):
        yield (name,)


@contract(f"{HS}.none_hash", "each hash function x three seeds")
def _none_hash() -> Iterator[Case]:
    for name, seed in product(_NAMES, ("0", "", "seed")):
        yield get_hash_fn_by_name(name), seed


@contract(
    f"{HS}.hash_block_tokens", "each hash function x two parents x 0-3 tokens x no, untagged and tagged extra keys"
)
def _hash_block_tokens() -> Iterator[Case]:
    extras = (None, ("a",), (("lora", "a", ""), ("mm", "x", 0)))
    for name, parent, n, extra in product(_NAMES, (0, 1), range(4), extras):
        fn = get_hash_fn_by_name(name)
        yield fn, none_hash(fn, str(parent)), list(range(n)), extra


_SOURCES: tuple[ExtraKeySource, ...] = (
    ExtraKeySource(),
    ExtraKeySource(lora=LoRA("a", 1, "/p")),
    ExtraKeySource(cache_salt="s"),
    ExtraKeySource(cache_salt=""),
    ExtraKeySource(mm_features=(MultiModalFeature("x", 0, 2),)),
    ExtraKeySource(mm_features=(MultiModalFeature("x", 1, 2), MultiModalFeature("y", 3, 3))),
    ExtraKeySource(mm_features=(MultiModalFeature("x", 2, 4),), cache_salt="s"),
    ExtraKeySource(prompt_embeds=tuple(bytes([i]) for i in range(8))),
    ExtraKeySource(lora=LoRA("a", 1, "/p"), mm_features=(MultiModalFeature("x", 1, 1),), prompt_embeds=(b"a",) * 8),
)
"""Extra-key sources: none, LoRA, salt (empty too), one and two multimodal
features at block edges and across them, prompt embeddings, all together."""


@contract(
    f"{HS}.block_extra_keys",
    "9 extra-key sources x blocks [start, start + 1..3) for start 0-5 x cursor -1/0/1 x tagged x v0.25 forms "
    "x embeds digest None or the other form",
)
def _block_extra_keys() -> Iterator[Case]:
    for src, start, size, cursor, tagged, v025 in product(
        _SOURCES, range(6), (1, 2, 3), (-1, 0, 1), (False, True), (False, True)
    ):
        for digest in (None, not v025):  # None means v025's form; the other value is the only other case
            yield src, start, start + size, cursor, tagged, v025, digest


@contract(
    f"{HS}.extend_block_hashes",
    "sha256 x 9 extra-key sources x 0-6 tokens x hash blocks 1-3 x the hashes of any shorter prefix as "
    "existing x tagged x resumed from the first feature x v0.25 forms x embeds digest None or the other form; "
    "look-ahead hashes: the sources x 0-7 tokens x hash blocks 1-2 x look-ahead 1-2 x shorter prefixes x tagged",
)
def _extend() -> Iterator[Case]:
    yield from _extend_ahead()
    fn = get_hash_fn_by_name("sha256")
    seed = none_hash(fn, "0")
    for src, n, hbs, tagged, resume, v025 in product(
        _SOURCES, range(7), (1, 2, 3), (False, True), (False, True), (False, True)
    ):
        tokens = [t % 3 for t in range(n)]
        for m, digest in product(range(0, n + 1, hbs), (None, not v025)):
            existing = _reference_extend(fn, seed, hbs, (), tokens[:m], src, tagged, resume, v025, digest)
            yield fn, seed, hbs, existing, tokens, src, tagged, resume, v025, digest, 0


def _extend_ahead() -> Iterator[Case]:
    fn = get_hash_fn_by_name("sha256")
    seed = none_hash(fn, "0")
    for src, n, hbs, ahead, tagged in product(_SOURCES, range(8), (1, 2), (1, 2), (False, True)):
        tokens = [t % 3 for t in range(n)]
        for m in range(0, n + 1, hbs):
            existing = _reference_extend(fn, seed, hbs, (), tokens[:m], src, tagged, True, True, None, ahead)
            yield fn, seed, hbs, existing, tokens, src, tagged, True, True, None, ahead


@contract(
    f"{HS}.lookahead_window_keys",
    "9 extra-key sources x blocks [start, start + 1..2) for start 0-4 x look-ahead 1-3 x cursor -1/0/1 x tagged",
)
def _lookahead_window_keys() -> Iterator[Case]:
    for src, start, size, ahead, cursor, tagged in product(
        _SOURCES, range(5), (1, 2), (1, 2, 3), (-1, 0, 1), (False, True)
    ):
        yield src, start, start + size, ahead, cursor, tagged, True, None


@contract(
    f"{HS}.lookahead_extra_keys",
    "9 extra-key sources x blocks [start, start + 1..2) for start 0-3 x look-ahead 1-2 x 8 tokens x cursor "
    "-1/0 x tagged",
)
def _lookahead_extra_keys() -> Iterator[Case]:
    tokens = [t % 3 for t in range(8)]
    for src, start, size, ahead, cursor, tagged in product(
        _SOURCES, range(4), (1, 2), (1, 2), (-1, 0), (False, True)
    ):
        yield src, tokens, start, start + size, ahead, cursor, tagged, True, None


@contract(
    f"{HS}.coarse_block_hashes",
    "0-7 distinct fine hashes x hash blocks 1-2 x 1-3 fine hashes per block x last fine or concatenated",
)
def _coarse() -> Iterator[Case]:
    for n, hbs, factor, last in product(range(8), (1, 2), (1, 2, 3), (False, True)):
        yield hashes(n), hbs, hbs * factor, last


@contract(
    f"{KCM}.hit_keys",
    "0-6 distinct fine hashes x hash blocks 1-2 x 1-3 fine hashes per block x groups 0-1 x table index "
    "0-3 x partial x last fine",
)
def _hit_keys() -> Iterator[Case]:
    for n, hbs, factor, gid, i, partial, last in product(
        range(7), (1, 2), (1, 2, 3), (0, 1), range(4), (False, True), (False, True)
    ):
        yield hashes(n), hbs, hbs * factor, gid, i, partial, last


@contract(f"{KCM}.is_int", "ints (negative, big), bools, a float, a str, None")
def _is_int() -> Iterator[Case]:
    for value in (0, 1, -3, 2**70, True, False, 1.0, "1", None):
        yield (value,)


@contract(f"{KCM}.check_request_id", "str ids (empty too), an int, None, bytes")
def _check_request_id() -> Iterator[Case]:
    for rid in ("r", "", 3, None, b"r"):
        yield "free", rid


@contract(f"{KCM}.check_admission_args", "every profile x full_sequence_must_fit x reserved 0/2 x has_scheduled_reqs")
def _admission_args() -> Iterator[Case]:
    yield from product(PROFILE_LIST, (False, True), (0, 2), (False, True))


@contract(
    f"{KCM}.check_skip_zeroing",
    "every profile x 1-3 groups x group ids: none, valid, repeated, out of range, negative, a bool, a str, "
    "a non-collection, a str as the collection",
)
def _skip_zeroing() -> Iterator[Case]:
    values: tuple[object, ...] = ((), [0], (0, 0), (1, 2), (3,), (-1,), (True,), ("0",), 0, None, "01")
    yield from product(PROFILE_LIST, (1, 2, 3), values)


@contract(
    "kvspec.request.valid_token_ids",
    "token sequences: empty, valid, negative, a bool, a float, a str, a str and bytes as the sequence, a list, "
    "a range (no limit); 4 sequences around 2**31 x limit None/2/2**31",
)
def _valid_tokens() -> Iterator[Case]:
    for tokens in ((), (0,), (1, 2), (-1,), (True,), (1.0,), ("a",), "ab", b"ab", [3, 4], range(3)):
        yield "r", tokens, None
    near: tuple[tuple[int, ...], ...] = ((0, 1), (1, 2), (2**31 - 1,), (2**31,))
    for ids, limit in product(near, (None, 2, 2**31)):
        yield "r", ids, limit


_BOUNDS: tuple[object, ...] = (None, 0, 3, -1, True, 2.0, "3")


@contract(
    f"{KCM}.check_hit_length_bound",
    "every profile x bound None, 0, 3, -1, True, 2.0 and a str",
)
def _hit_length_bound() -> Iterator[Case]:
    yield from product(PROFILE_LIST, _BOUNDS)


@contract(
    "kvspec.request.check_prompt_logprobs",
    "prompt_logprobs True, False, 1, None x start None, 0, 3, -1, True, 2.0 and a str",
)
def _check_prompt_logprobs() -> Iterator[Case]:
    for logprobs, start in product((True, False, 1, None), _BOUNDS):
        yield "r", logprobs, start


@contract(
    "kvspec.request.check_report_mode",
    "modes incremental, full, all, FULL, the empty str, None, 1 and a list",
)
def _check_report_mode() -> Iterator[Case]:
    for mode in ("incremental", "full", "all", "FULL", "", None, 1, ["full"]):
        yield "r", mode


_RELEASES = ("0.15.0", "0.16.0", "0.17.1", "0.25.1.dev3", "vllm-0.30.0", "0.33.2", "0.40.0", "1.0", "0", "x.y", "")


@contract(
    "kvspec.profiles.profile_for_release",
    "every profile's release and name, and 11 others (older, between, newer, dev, prefixed, unparsable)",
)
def _profile_for_release() -> Iterator[Case]:
    for p in PROFILE_LIST:
        yield (p.release,)
        yield (p.name,)
    for release in _RELEASES:
        yield (release,)


@contract(
    "kvspec.profiles.release_key",
    "every profile's release and name, 11 others, and patch forms (none, rc, dev, +local, negative major)",
)
def _release_key() -> Iterator[Case]:
    yield from _profile_for_release()
    for release in ("0.25", "0.25.rc1", "0.25.1rc1", "0.25.01", "0.25.1+cpu", "-1.2.3", "0.x.1"):
        yield (release,)


@contract(
    "kvspec.single_type_kv_cache_manager.retire_range",
    "first 0-4 x last 0-5 x retired 0-4 x table_len 0-5",
)
def _retire_range() -> Iterator[Case]:
    yield from product(range(5), range(6), range(5), range(6))


@contract(
    "kvspec.prefill_checkpoints.block_aligned_checkpoint_slot",
    "block size 1/2/4 x tables of 0-3 blocks, null or not x chunk ends 0-13 x chunk starts 0-9",
)
def _block_aligned_checkpoint_slot() -> Iterator[Case]:
    tables = ((), (0,), (5,), (0, 0), (0, 5), (5, 6), (0, 5, 0), (0, 0, 7))
    yield from product((1, 2, 4), tables, range(14), range(10))


@contract(
    "kvspec.prefill_checkpoints.num_checkpoint_blocks",
    "Mamba(4) modes none/align x 0-2 checkpoint blocks x every profile x three tables x chunk ends 0-13 "
    "x chunk starts 0, 2, 4, 8",
)
def _num_checkpoint_blocks() -> Iterator[Case]:
    modes: tuple[MambaMode, ...] = ("none", "align")
    for mode, ncp, profile, table, end, start in product(
        modes, range(3), PROFILE_LIST, ((), (0, 5), (0, 0, 7)), range(14), (0, 2, 4, 8)
    ):
        yield Mamba(4, mode, 0, ncp), profile, table, end, start


@contract(
    "kvspec.prefill_checkpoints.positional_checkpoints",
    "Mamba(4) modes none/all/align x 0-2 checkpoint blocks x every profile",
)
def _positional_checkpoints() -> Iterator[Case]:
    modes: tuple[MambaMode, ...] = ("none", "all", "align")
    for mode, ncp, profile in product(modes, range(3), PROFILE_LIST):
        yield Mamba(4, mode, 0, ncp), profile


@contract(
    "kvspec.prefill_checkpoints.checkpoint_granularity",
    "every profile x hash block 1/2/4 x hit alignment 1/2/4/8",
)
def _checkpoint_granularity() -> Iterator[Case]:
    yield from product(PROFILE_LIST, (1, 2, 4), (1, 2, 4, 8))


@contract(
    "kvspec.prefill_checkpoints.checkpoint_position",
    "every profile x 0-20 tokens x granularity 1-4 x EAGLE x look-ahead 0/1/2/5",
)
def _checkpoint_position() -> Iterator[Case]:
    yield from product(PROFILE_LIST, range(21), range(1, 5), (False, True), (0, 1, 2, 5))


@contract(
    "kvspec.prefill_checkpoints.checkpoint_valid",
    "chunk starts 0/1/2/4/6/8 x ends 0-14 x positions 0-14 x hash block 1/2/4 x block 2/4 x alignment None/1/2/3",
)
def _checkpoint_valid() -> Iterator[Case]:
    yield from product((0, 1, 2, 4, 6, 8), range(15), range(15), (1, 2, 4), (2, 4), (None, 1, 2, 3))


@contract(
    "kvspec.prefill_checkpoints.chunk_checkpoint",
    "Mamba(4) none/align x 0-1 checkpoint blocks x 0-1 speculative blocks x alignment None/1/2 (six kinds) x "
    "every profile x four geometries x three tables x chunk ends 0-13 x starts 0/2/4/8 x allocated x prefill end 0/10",
)
def _chunk_checkpoint() -> Iterator[Case]:
    kinds = (
        Mamba(4, "none", 0, 1, 1),
        Mamba(4, "align", 0, 0, 1),
        Mamba(4, "align", 0, 1, 1),
        Mamba(4, "align", 0, 1, 2),
        Mamba(4, "align", 1, 1, 1),
        Mamba(4, "align", 0, 1, None),
    )
    geometries = (
        CheckpointGeometry(2, 2, False, 0),
        CheckpointGeometry(2, 2, True, 0),
        CheckpointGeometry(1, 4, False, 3),
        CheckpointGeometry(4, 4, False, 0),
    )
    tables = ((), (0, 5), (0, 0, 7))
    yield from product(kinds, PROFILE_LIST, geometries, tables, range(14), (0, 2, 4, 8), (False, True), (0, 10))


@contract(
    "kvspec.prefill_checkpoints.checkpoint_prefill_end",
    "every profile x retention None/0/16 x prompts of 0/1/5/9 tokens x 0-12 tokens",
)
def _checkpoint_prefill_end() -> Iterator[Case]:
    yield from product(PROFILE_LIST, (None, 0, 16), (0, 1, 5, 9), range(13))


@contract(
    "kvspec.prefill_checkpoints.checkpoint_kept",
    "every profile x block 2/4 x positions 0-12 x prompt positions 4/6/8 x junction 0/4 x retention None/0/4/8/16 "
    "x 6/9/12 tokens cached x prompts of 9/12 tokens",
)
def _checkpoint_kept() -> Iterator[Case]:
    yield from product(
        PROFILE_LIST, (2, 4), range(13), (4, 6, 8), (0, 4), (None, 0, 4, 8, 16), (6, 9, 12), (9, 12)
    )
