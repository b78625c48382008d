"""Mamba prefill checkpoints (``kvspec.prefill_checkpoints``): the configuration
fields and their refusals, and vLLM 0.29.0's block-aligned rule on the cases
measured on the real 0.29.0 ``KVCacheManager`` (a full-attention group and a
Mamba align group, a 64-block pool, one prompt allocated in the given chunks,
then looked up while it runs and after it is freed). Block ids, the Mamba
estimate, the tables, the keyed blocks and the hits are the measured ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from kvspec.config import FullAttention, KVCacheConfig, Mamba
from kvspec.errors import ConfigError, UnsupportedByProfileError
from kvspec.hashing import make_key
from kvspec.kv_cache_manager import KVCacheManager
from kvspec.prefill_checkpoints import block_aligned_checkpoint_slot
from kvspec.profiles import PROFILES, VLLM_0_28_0, VLLM_0_29_0, SemanticsProfile, features_used, release_key
from kvspec.request import RequestBlockHasher
from kvspec.single_type_kv_cache_manager import MambaManager

N = 0  # the null block


def checkpoint_config(
    profile: SemanticsProfile = VLLM_0_29_0, ncp: int = 1, alignment: int | None = None, **kw: Any
) -> KVCacheConfig:
    """FA16 + Mamba16 align with ``ncp`` checkpoint blocks, 64 blocks."""
    fa, mb = kw.pop("fa", 16), kw.pop("mb", 16)
    mamba = Mamba(mb, "align", num_prefill_checkpoint_blocks=ncp, prefill_checkpoint_alignment=alignment)
    return KVCacheConfig(
        num_blocks=64, groups=(FullAttention(fa), mamba), max_model_len=512, profile=profile, **kw
    )  # fmt: skip


@dataclasses.dataclass
class Chunk:
    count: int
    """The Mamba group's ``get_num_blocks_to_allocate`` (not the admission check)."""
    new: tuple[tuple[int, ...], ...]
    table: list[int]
    keyed: list[str]
    """``index:id@tokens`` for every keyed block of the Mamba table."""


def run(cfg: KVCacheConfig, plen: int, chunks: Sequence[int]) -> tuple[list[Chunk], list[tuple[int, int]], list[str]]:
    """Allocate a ``plen``-token prompt in ``chunks``; return the chunks, the
    Mamba keys left after ``free`` as ``(tokens, block id)``, and the hits
    ``tokens@index:id`` of the same prompt and of a longer one, while the
    request runs and after it is freed."""
    mgr = KVCacheManager(cfg)
    hasher = RequestBlockHasher.for_config(cfg)
    h = cfg.resolved_hash_block_size()
    prompt = list(range(1000, 1000 + plen))
    longer = [*prompt, *range(5000, 5040)]
    req = hasher.new_request("a", prompt)
    tokens = {make_key(x, 1): (i + 1) * h for i, x in enumerate(hasher.new_request("l", longer).block_hashes)}
    mamba = mgr.coordinator.managers[1]
    assert isinstance(mamba, MambaManager)
    counts: list[int] = []
    estimate = mamba.get_num_blocks_to_allocate

    def recorded(*args: Any, **kwargs: Any) -> int:
        n = estimate(*args, **kwargs)
        if not (args[5] if len(args) > 5 else kwargs.get("apply_admission_cap", False)):
            counts.append(n)
        return n

    mamba.get_num_blocks_to_allocate = recorded  # type: ignore[method-assign]
    out, done = [], 0
    for n in chunks:
        new = mgr.allocate_slots(req, n)
        assert new is not None
        table = [int(b) for b in mamba.req_to_blocks["a"]]
        held = {i: sorted(tokens[k] for k, ids in mgr.block_pool.cached.items() if k in tokens and b in ids)
                for i, b in enumerate(table) if b != N}  # fmt: skip
        keyed = [f"{i}:{table[i]}@" + "/".join(map(str, t)) for i, t in held.items() if t]
        out.append(Chunk(counts[-1], new, table, keyed))
        done += n
        req = dataclasses.replace(req, num_computed_tokens=done)
        mgr.new_step_starts()

    def hits(tag: str) -> list[str]:
        found = []
        for rid, toks in ((f"same-{tag}", prompt), (f"longer-{tag}", longer)):
            blocks, num = mgr.get_computed_blocks(hasher.new_request(rid, toks))
            found.append(f"{num}@" + ",".join(f"{i}:{b}" for i, b in enumerate(blocks[1]) if b != N))
        return found

    running = hits("running")
    mgr.free("a")
    keys = sorted((tokens[k], int(b)) for k, ids in mgr.block_pool.cached.items() if k in tokens for b in ids)
    assert hits("freed") == running, "hits while the request runs and after it is freed agree (measured)"
    return out, keys, running


# -- configuration ---------------------------------------------------------------------------


def test_checkpoints_are_refused_before_0_29_0() -> None:
    with pytest.raises(UnsupportedByProfileError, match=r"new in vllm-0\.29\.0"):
        checkpoint_config(VLLM_0_28_0)
    assert checkpoint_config(VLLM_0_28_0, ncp=0).groups[1] == Mamba(16, "align")


def test_alignment_is_refused_before_0_30_0() -> None:
    with pytest.raises(UnsupportedByProfileError, match=r"new in vllm-0\.30\.0"):
        checkpoint_config(VLLM_0_29_0, alignment=1)


@pytest.mark.parametrize(("ncp", "alignment"), [(-1, None), (True, None), (1.0, None), (0, 0), (0, -4), (0, 2.0)])
def test_bad_values_are_config_errors(ncp: Any, alignment: Any) -> None:
    """A negative or non-int count (vLLM treats any count <= 0 as off), an
    alignment <= 0 (vLLM fails an assertion in allocate_slots) or non-int."""
    with pytest.raises(ConfigError, match="prefill_checkpoint"):
        checkpoint_config(VLLM_0_29_0, ncp=ncp, alignment=alignment)


@pytest.mark.parametrize("profile", list(PROFILES.values()), ids=lambda p: p.name)
def test_every_form_is_modelled(profile: SemanticsProfile) -> None:
    """0.29.0's form and the later releases' forms are modelled (the later ones:
    tests/spec/test_prefill_checkpoints_later.py)."""
    if release_key(profile.release) < (0, 29, 0):
        return
    alignment = None if profile.prefill_checkpoints == "block-aligned" else 1
    assert "prefill-checkpoints" in features_used(checkpoint_config(profile, alignment=alignment))
    assert checkpoint_config(profile, ncp=0, alignment=alignment).groups[1] == Mamba(16, "align", 0, 0, alignment)


def test_feature_needs_align_mode_and_a_positive_count() -> None:
    assert "prefill-checkpoints" not in features_used(checkpoint_config(ncp=0))
    cfg = KVCacheConfig(
        num_blocks=64, groups=(Mamba(16, num_prefill_checkpoint_blocks=1),), max_model_len=512,
        enable_caching=False, profile=VLLM_0_29_0,
    )  # fmt: skip
    assert "prefill-checkpoints" not in features_used(cfg)
    uncached = dataclasses.replace(checkpoint_config(), enable_caching=False)
    assert "prefill-checkpoints" in features_used(uncached)


# -- vLLM 0.29.0 --------------------------------------------------------------------------------


def test_slot_rule() -> None:
    """Start on a block boundary, end inside a block, slot before the running
    state not held yet."""
    assert block_aligned_checkpoint_slot(16, [], 70, 0) == 3
    assert block_aligned_checkpoint_slot(16, [], 64, 0) is None  # ends on a boundary
    assert block_aligned_checkpoint_slot(16, [N, 3], 70, 20) is None  # starts inside a block
    assert block_aligned_checkpoint_slot(16, [], 15, 0) is None  # no slot below the running state
    assert block_aligned_checkpoint_slot(16, [N, 3], 70, 32) == 3
    assert block_aligned_checkpoint_slot(16, [N, 3], 40, 32) is None  # the slot holds the last state
    assert block_aligned_checkpoint_slot(16, [N, N], 40, 32) == 1


@pytest.mark.parametrize("ret", [None, 0, 32, 48])
def test_one_chunk(ret: int | None) -> None:
    """P=70 in one chunk: slot 3 kept (count 2), keyed at 64 under every
    retention (0 keeps the replay boundary 64); hits 64 at index 3."""
    chunks, keys, hits = run(checkpoint_config(prefix_cache_retention_interval=ret), 70, [70])
    assert chunks == [Chunk(2, ((1, 2, 3, 4, 5), (N, N, N, 6, 7)), [N, N, N, 6, 7], ["3:6@64"])]
    assert keys == [(64, 6)]
    assert hits == ["64@3:6", "64@3:6"]


@pytest.mark.parametrize("ncp", [0, 2])
def test_count_zero_disables_and_two_acts_as_one(ncp: int) -> None:
    chunks, keys, hits = run(checkpoint_config(ncp=ncp), 70, [70])
    if ncp == 0:
        assert chunks == [Chunk(1, ((1, 2, 3, 4, 5), (N, N, N, N, 6)), [N, N, N, N, 6], [])]
        assert (keys, hits) == ([], ["0@", "0@"])
    else:
        assert chunks == [Chunk(2, ((1, 2, 3, 4, 5), (N, N, N, 6, 7)), [N, N, N, 6, 7], ["3:6@64"])]


@pytest.mark.parametrize(("ret", "first_keyed", "keys"), [(None, ["1:3@32"], [(32, 3), (64, 7)]), (0, [], [(64, 7)])])
def test_two_chunks(ret: int | None, first_keyed: list[str], keys: list[tuple[int, int]]) -> None:
    """P=70 as 32+38: the first chunk ends on a boundary (no checkpoint), the
    second starts on one (slot 3 kept)."""
    chunks, got_keys, hits = run(checkpoint_config(prefix_cache_retention_interval=ret), 70, [32, 38])
    assert chunks == [
        Chunk(1, ((1, 2), (N, 3)), [N, 3], first_keyed),
        Chunk(2, ((4, 5, 6), (N, 7, 8)), [N, 3, N, 7, 8], [*first_keyed, "3:7@64"]),
    ]
    assert got_keys == keys
    assert hits == ["64@3:7", "64@3:7"]


def test_second_chunk_starting_inside_a_block() -> None:
    """P=70 as 20+50: the first chunk keeps slot 0 (state 16); the second
    starts mid-block, so it has none; the hit is 32."""
    chunks, keys, hits = run(checkpoint_config(), 70, [20, 50])
    assert chunks == [
        Chunk(2, ((1, 2), (3, 4)), [3, 4], ["0:3@16"]),
        Chunk(1, ((5, 6, 7), (N, N, 8)), [N, 4, N, N, 8], ["1:4@32"]),
    ]
    assert keys == [(16, 3), (32, 4)]
    assert hits == ["32@1:4", "32@1:4"]


@pytest.mark.parametrize(("ret", "keys", "hits"), [(None, [(64, 5)], ["0@", "64@3:5"]), (0, [], ["0@", "0@"])])
def test_block_aligned_prompt(ret: int | None, keys: list[tuple[int, int]], hits: list[str]) -> None:
    """P=64: no checkpoint; a resend's cap of 63 tokens cannot reach key 64."""
    chunks, got_keys, got_hits = run(checkpoint_config(prefix_cache_retention_interval=ret), 64, [64])
    keyed = [] if ret == 0 else ["3:5@64"]
    assert chunks == [Chunk(1, ((1, 2, 3, 4), (N, N, N, 5)), [N, N, N, 5], keyed)]
    assert (got_keys, got_hits) == (keys, hits)


def test_short_prompt_and_long_second_chunk() -> None:
    chunks, keys, hits = run(checkpoint_config(), 33, [33])
    assert chunks == [Chunk(2, ((1, 2, 3), (N, 4, 5)), [N, 4, 5], ["1:4@32"])]
    assert (keys, hits) == ([(32, 4)], ["32@1:4", "32@1:4"])
    chunks, keys, hits = run(checkpoint_config(prefix_cache_retention_interval=0), 100, [32, 68])
    assert chunks[1] == Chunk(2, ((4, 5, 6, 7, 8), (N, N, N, 9, 10)), [N, 3, N, N, N, 9, 10], ["5:9@96"])
    assert (keys, hits) == ([(96, 9)], ["96@5:9", "96@5:9"])


def test_fine_hash_keeps_the_block_boundary() -> None:
    """FA4 + Mamba16 (hash block 4): the checkpoint is still 64, not 68; a
    68+2 split also registers the partial tail entry 68 (fine-grained hits)."""
    chunks, keys, hits = run(checkpoint_config(fa=4), 70, [70])
    assert chunks[0].count == 2 and chunks[0].table == [N, N, N, 19, 20] and chunks[0].keyed == ["3:19@64"]
    assert (keys, hits) == ([(64, 19)], ["64@3:19", "64@3:19"])
    chunks, keys, hits = run(checkpoint_config(fa=4), 70, [68, 2])
    assert chunks[0] == Chunk(2, (tuple(range(1, 18)), (N, N, N, 18, 19)), [N, N, N, 18, 19], ["3:18@64", "4:19@68"])
    assert chunks[1].count == 2 and chunks[1].table == [N, N, N, N, 19]
    assert hits == ["68@4:21", "68@4:21"]


def test_eagle_keeps_the_slot_but_cannot_reach_it() -> None:
    """The 0.29.0 manager keeps slot 3 under EAGLE too (its scheduler would
    not make such chunks); an EAGLE lookup drops the block."""
    chunks, keys, hits = run(checkpoint_config(use_eagle=True, eagle_groups=(0, 1)), 70, [70])
    assert chunks[0].keyed == ["3:6@64"] and keys == [(64, 6)]
    assert hits == ["0@", "0@"]
    chunks, keys, hits = run(checkpoint_config(use_eagle=True, eagle_groups=(0, 1)), 70, [32, 38])
    assert keys == [(32, 3), (64, 7)] and hits == ["32@1:3", "32@1:3"]


def test_coarser_mamba_and_small_blocks() -> None:
    """FA16 + Mamba32: slot 1 (state 64); FA8 + Mamba8, P=35: slot 3 (state 32)."""
    chunks, keys, hits = run(checkpoint_config(mb=32), 70, [70])
    assert chunks[0].count == 2 and chunks[0].table == [N, 6, 7] and chunks[0].keyed == ["1:6@64"]
    assert (keys, hits) == ([(64, 6)], ["64@1:6", "64@1:6"])
    chunks, keys, hits = run(checkpoint_config(fa=8, mb=8), 35, [35])
    assert chunks[0].count == 2 and chunks[0].table == [N, N, N, 6, 7] and chunks[0].keyed == ["3:6@32"]
    assert (keys, hits) == ([(32, 6)], ["32@3:6", "32@3:6"])
