"""The scheduler model's Mamba ``align`` chunks, release by release
(:func:`kvref.scheduler_chunks.schedule_chunk`).

Worked examples of ``Scheduler._mamba_block_aligned_split``
(vllm/v1/core/sched/scheduler.py) in vLLM 0.25.1, 0.26.0, 0.29.0 and 0.34.0,
each worked out by hand from that release's function (the lines named are
those of the release's file), for a chunk that starts on a block boundary and
one that starts inside a block, with and without EAGLE. Every example uses
scheduler blocks of 4 tokens. Where the release schedules nothing (the chunk
cannot reach its next stop), the kit schedules the smallest chunk the release
schedules when more tokens are wanted; the examples say which.

The installed vLLM's own function, called on a stand-in scheduler, is then
compared with the kit's on a grid (skipped without vLLM).
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from kvref.adapters.vllm import installed_vllm_version
from kvref.scheduler_chunks import align_rule, align_split, last_cache_position, schedule_chunk
from kvspec.config import FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.profiles import PREFILL_CHECKPOINTS_MODELLED, PROFILES, profile_named

BS = 4


def _config(
    release: str, eagle: bool = False, budget: int | None = None, checkpoints: int = 0, alignment: int | None = None
) -> KVCacheConfig:
    mamba = Mamba(BS, "align", num_prefill_checkpoint_blocks=checkpoints, prefill_checkpoint_alignment=alignment)
    return KVCacheConfig(
        num_blocks=64,
        groups=(FullAttention(BS), mamba),
        max_model_len=64,
        max_num_batched_tokens=budget,
        use_eagle=eagle,
        profile=profile_named(f"vllm-{release}"),
    )


def _chunk(release: str, num_tokens: int, start: int, n: int, eagle: bool = False, prompt: int = 0) -> int:
    return schedule_chunk(_config(release, eagle), num_tokens, start, n, num_prompt_tokens=prompt)


def test_the_rule_per_release() -> None:
    """Whole blocks up to 0.25.x; 0.26.0 adds the stop at the end of the start's block where it is
    cacheable; from 0.27.0 on that stop is unconditional (the floor moves to the prefill end)."""
    rules = {r: align_rule(_config(r)) for r in ("0.16.0", "0.25.1", "0.26.0", "0.27.0", "0.29.0", "0.34.0")}
    assert rules == {
        "0.16.0": "whole-blocks",
        "0.25.1": "whole-blocks",
        "0.26.0": "block-end-if-cacheable",
        "0.27.0": "block-end",
        "0.29.0": "block-end",
        "0.34.0": "block-end",
    }


@pytest.mark.parametrize(
    ("release", "num_tokens", "eagle", "last"),
    [
        ("0.25.1", 22, False, 20),  # 0.25.1 line 366: num_tokens less num_tokens % block_size
        ("0.25.1", 20, False, 20),
        ("0.25.1", 22, True, 16),  # 0.25.1 lines 368-369: one block lower under EAGLE
        ("0.29.0", 20, False, 20),  # 0.29.0 line 416: as 0.25.1
        ("0.34.0", 22, False, 20),  # 0.34.0 line 596, kv_cache_interface.py 1212-1220: last boundary <= 21
        ("0.34.0", 20, False, 16),  # ... <= 19: a resend recomputes the last token
        ("0.34.0", 20, True, 16),  # under EAGLE: the last boundary <= 20, one block lower
        ("0.34.0", 3, True, 0),  # never below 0
    ],
)
def test_last_cache_position(release: str, num_tokens: int, eagle: bool, last: int) -> None:
    assert last_cache_position(_config(release, eagle), num_tokens) == last


# -- vLLM 0.25.1 (scheduler.py lines 338-394) -----------------------------------


@pytest.mark.parametrize(
    ("start", "n", "eagle", "expected"),
    [
        # on a boundary: 8 + 10 = 18 < 20 (line 371), so 10 // 4 * 4 = 8 tokens (line 373)
        (8, 10, False, 8),
        # on a boundary, the whole rest: 8 < 20 < 22 (lines 374-377), cut at the last cache position (line 380)
        (8, 14, False, 12),
        # inside a block: 2 + 10 = 12 < 20, 10 // 4 * 4 = 8 tokens: the chunk ends at 10, inside a block
        (2, 10, False, 8),
        # inside a block, 3 wanted: 3 // 4 * 4 = 0, nothing (line 514); 4 wanted give 4, ending at 6
        (2, 3, False, 4),
        # inside a block, the whole rest: cut at the last cache position 20 (line 380)
        (2, 20, False, 18),
        # past the last cache position: left alone (line 382, the last few tokens)
        (21, 1, False, 1),
        # EAGLE: the last cache position is 16 (line 369); 8 + 14 passes it, cut there
        (8, 14, True, 8),
        # EAGLE, inside a block: 2 + 13 = 15 < 16, 13 // 4 * 4 = 12 tokens, ending at 14
        (2, 13, True, 12),
        # EAGLE, inside a block: 2 + 16 = 18 passes 16, cut there: 14 tokens
        (2, 16, True, 14),
    ],
)
def test_vllm_0_25_1(start: int, n: int, eagle: bool, expected: int) -> None:
    """A prompt of 22 tokens: the last cache position is 20 (16 under EAGLE)."""
    assert _chunk("0.25.1", 22, start, n, eagle) == expected


# -- vLLM 0.26.0 (scheduler.py lines 355-423) -----------------------------------


@pytest.mark.parametrize(
    ("start", "n", "eagle", "expected"),
    [
        # on a boundary: the end 18 < 20 is floored to 16 (lines 391-392): 8 tokens
        (8, 10, False, 8),
        # on a boundary, the whole rest: the last cache position 20 is a stop inside it (lines 408, 422)
        (8, 14, False, 12),
        # inside a block: the end 12 is floored to 12, then the end of the start's block, 4 <= 20,
        # stops it (lines 404-406, 422): 2 tokens
        (2, 10, False, 2),
        # inside a block, 1 wanted: the end 3 floors to 0, nothing (line 423); 2 wanted reach 4
        (2, 1, False, 2),
        # inside a block, the whole rest: stops at 4 and 20, the first wins
        (2, 20, False, 2),
        # EAGLE, on a boundary: the last cache position is 16 (line 385): 8 tokens
        (8, 14, True, 8),
        # EAGLE, inside a block before 16: stops at 4 as without EAGLE
        (2, 13, True, 2),
        # EAGLE, inside the block 16-20: its end 20 is past the last cache position 16, so no stop
        # there (line 405): the chunk runs to the end of the prompt
        (18, 4, True, 4),
    ],
)
def test_vllm_0_26_0(start: int, n: int, eagle: bool, expected: int) -> None:
    """A prompt of 22 tokens: the last cache position is 20 (16 under EAGLE)."""
    assert _chunk("0.26.0", 22, start, n, eagle) == expected


def test_vllm_0_26_0_leaves_the_last_partial_block_alone() -> None:
    """From the last cache position on (0.26.0 line 391: the end is not below it) nothing is floored:
    a chunk of 1 from 20 runs as it is, where 0.29.0 schedules the rest of the prompt whole."""
    assert _chunk("0.26.0", 22, 20, 1) == 1
    assert _chunk("0.29.0", 22, 20, 1) == 2


# -- vLLM 0.29.0 (scheduler.py lines 386-466; as 0.27.0 without checkpoint blocks) -----


@pytest.mark.parametrize(
    ("start", "n", "eagle", "expected"),
    [
        # on a boundary: the end 18 is below the prefill end 22 and floored to 16 (lines 431-438)
        (8, 10, False, 8),
        # on a boundary, the whole rest: the last cache position 20 stops it (lines 451, 465)
        (8, 14, False, 12),
        # inside a block: stops at the end of its block (line 449, no condition): 2 tokens
        (2, 10, False, 2),
        (2, 20, False, 2),
        # from the last cache position, 1 wanted: the end 21 < 22 floors to 20, nothing; the rest
        # of the prompt (2) is the smallest chunk scheduled
        (20, 1, False, 2),
        # EAGLE (last cache position 16, line 418), on a boundary: 8 tokens
        (8, 14, True, 8),
        # EAGLE, inside the block 16-20: its end stops the chunk although it is past 16 (0.26.0 does not)
        (18, 4, True, 2),
    ],
)
def test_vllm_0_29_0(start: int, n: int, eagle: bool, expected: int) -> None:
    """A prompt of 22 tokens, no prefill checkpoint blocks."""
    assert _chunk("0.29.0", 22, start, n, eagle) == expected


def test_vllm_0_29_0_prefill_end_of_a_request_with_output_tokens() -> None:
    """The prefill end is ``max(num_prompt_tokens, num_tokens - 1)`` (0.29.0 line 408): with 22
    tokens of which 20 are prompt, a chunk ending at 21 is not floored, so 1 from 20 runs; for a
    prompt of 22 it floors to nothing and the rest (2) runs."""
    assert _chunk("0.29.0", 22, 20, 1, prompt=20) == 1
    assert _chunk("0.29.0", 22, 20, 1) == 2


def test_vllm_0_29_0_block_wider_than_the_budget() -> None:
    """A block wider than the step budget advances inside the block (0.29.0 lines 432-438: the floor
    is skipped when it is not past the start), and a chunk inside a block still stops at its end."""
    cfg = _config("0.29.0", budget=2)
    assert schedule_chunk(cfg, 22, 0, 2) == 2
    assert schedule_chunk(cfg, 22, 2, 2) == 2
    assert schedule_chunk(cfg, 22, 3, 2) == 1


@pytest.mark.parametrize(
    ("start", "n", "eagle", "expected"),
    [
        # on a boundary: not floored (the end 18 stays; 0.29.0 lines 421-431), and no stop at the
        # last cache position 20 (line 425)
        (8, 10, False, 10),
        (8, 14, False, 14),
        (0, 22, False, 22),
        # inside a block: the checkpoint is off, so the chunk stops at the block's end (line 449)
        (10, 12, False, 2),
        # EAGLE: the release's scheduler turns checkpoints off (line 332), so the usual cuts apply
        (8, 10, True, 8),
    ],
)
def test_vllm_0_29_0_prefill_checkpoints(start: int, n: int, eagle: bool, expected: int) -> None:
    """A prompt of 22 tokens whose Mamba group has a prefill checkpoint block: a chunk from a block
    boundary may end anywhere, as the manager keeps the state at the last boundary it crosses."""
    assert schedule_chunk(_config("0.29.0", eagle, checkpoints=1), 22, start, n) == expected


@pytest.mark.parametrize(
    ("release", "start", "n", "eagle", "alignment", "expected"),
    [
        # the final chunk exports the prompt's checkpoint at 8 (the last hash boundary below 10):
        # no stop at the last cache position 8
        ("0.30.0", 0, 10, False, 1, 10),
        ("0.30.0", 4, 6, False, 1, 6),
        ("0.34.0", 0, 10, False, 1, 10),
        # an alignment the offset 8 is no multiple of, or none: the usual stop at 8
        ("0.30.0", 0, 10, False, 3, 8),
        ("0.30.0", 0, 10, False, None, 8),
        # a chunk short of the prefill end has no checkpoint: floored to a block boundary
        ("0.30.0", 0, 7, False, 1, 4),
        # a start inside a block cannot export it: the chunk stops at the block's end
        ("0.30.0", 2, 8, False, 1, 2),
        # EAGLE: the checkpoint is one hash block lower (4), still inside the chunk
        ("0.30.0", 0, 10, True, 1, 10),
        # ... which alignment 3 cannot export: the usual stop at the last cache position, one block
        # lower under EAGLE (4)
        ("0.30.0", 0, 10, True, 3, 4),
    ],
)
def test_positional_prefill_checkpoints(
    release: str, start: int, n: int, eagle: bool, alignment: int | None, expected: int
) -> None:
    """vLLM 0.30.0 on, a prompt of 10 tokens with a prefill checkpoint block: only a chunk that
    reaches the prefill end and can export the prompt's checkpoint runs past the last cache position;
    EAGLE no longer turns checkpoints off."""
    cfg = _config(release, eagle, checkpoints=1, alignment=alignment)
    assert schedule_chunk(cfg, 10, start, n) == expected


# -- vLLM 0.34.0 (scheduler.py lines 563-679) -----------------------------------


@pytest.mark.parametrize(
    ("num_tokens", "start", "n", "eagle", "expected"),
    [
        # on a boundary: the end 18 < 22 floored to 16 (lines 629-636)
        (22, 8, 10, False, 8),
        # on a boundary, the whole rest: the last cache position 20 (lines 596, 668) stops it (line 678)
        (22, 8, 14, False, 12),
        # 20 tokens: the last cache position is 16, not 20 (a resend recomputes the last token)
        (20, 8, 12, False, 8),
        # inside a block: stops at the end of its block (lines 664-665)
        (22, 2, 10, False, 2),
        (22, 2, 20, False, 2),
        # EAGLE: the last cache position is 16; on a boundary, 8 tokens
        (22, 8, 14, True, 8),
        # EAGLE, inside the block 16-20: stops at 20
        (22, 18, 4, True, 2),
        # EAGLE, inside a block, 1 wanted: the end 2 floors to 0, nothing (line 679); 3 reach the block's end
        (22, 1, 1, True, 3),
    ],
)
def test_vllm_0_34_0(num_tokens: int, start: int, n: int, eagle: bool, expected: int) -> None:
    assert _chunk("0.34.0", num_tokens, start, n, eagle) == expected


# -- properties ------------------------------------------------------------------


@pytest.mark.parametrize("release", ["0.25.1", "0.26.0", "0.27.0", "0.29.0", "0.32.0", "0.34.0"])
def test_bounds_and_block_ends(release: str) -> None:
    """Every chunk is 1 to the rest; from 0.26.0 on a chunk that starts inside a block never runs
    past that block's end (the state left behind of ``mamba-align-midblock``), save under EAGLE in
    0.26.0, from the block the last cache position leaves out."""
    for eagle, total in itertools.product((False, True), range(1, 30)):
        cfg = _config(release, eagle)
        for start in range(total):
            for n in range(1, total - start + 1):
                got = schedule_chunk(cfg, total, start, n)
                assert 1 <= got <= total - start
                assert align_split(cfg, total, start, n) in (0, got)
                if release != "0.25.1" and (release != "0.26.0" or not eagle) and start % BS:
                    assert (start + got - 1) // BS == start // BS, (total, start, n, got)


def test_no_split_without_mamba_align() -> None:
    """Full attention and a window: the chunk is what is wanted, cut at the stop."""
    cfg = KVCacheConfig(
        num_blocks=64,
        groups=(FullAttention(BS), SlidingWindow(BS, window=8)),
        max_model_len=64,
        profile=profile_named("vllm-0.34.0"),
    )
    assert schedule_chunk(cfg, 22, 2, 10) == 10
    assert schedule_chunk(cfg, 22, 2, 10, stop=5) == 3
    assert schedule_chunk(cfg, 22, 2, 30) == 20


# -- the installed vLLM's own function ---------------------------------------------

VLLM = installed_vllm_version()


@pytest.mark.skipif(VLLM is None or f"vllm-{VLLM}" not in PROFILES, reason="needs an installed vLLM kvref models")
def test_matches_the_installed_vllm() -> None:
    """The installed release's ``Scheduler._mamba_block_aligned_split`` on a stand-in scheduler (no
    prefix hint, no fine-grained hits) schedules what :func:`align_split` does for every start,
    wanted count, prompt length (with and without output tokens), EAGLE, budget and, where kvspec
    models the release's checkpoints, prefill checkpoint blocks on a grid; where it schedules nothing
    the kit's chunk is its smallest chunk for more tokens."""
    from vllm.v1.core.sched.scheduler import Scheduler  # noqa: PLC0415 - optional dependency

    split = getattr(Scheduler, "_mamba_block_aligned_split", None)
    if split is None:
        pytest.skip("this vLLM has no _mamba_block_aligned_split")
    checked = 0
    form = PROFILES[f"vllm-{VLLM}"].prefill_checkpoints
    modelled = form in PREFILL_CHECKPOINTS_MODELLED
    alignments: tuple[int | None, ...] = (None, 1, 2, 3) if modelled and form != "block-aligned" else (None,)
    grid = itertools.product((False, True), (64, 2), (0, 1) if modelled else (0,), alignments)
    for eagle, budget, checkpoints, alignment in grid:
        if alignment is not None and not checkpoints:
            continue
        cfg = _config(str(VLLM), eagle, budget, checkpoints, alignment)
        # as the release computes it: 0.29.0 leaves EAGLE out
        has_checkpoints = checkpoints > 0 and not (eagle and form == "block-aligned")
        fake = SimpleNamespace(  # every attribute the releases' function reads, at kvref's settings
            cache_config=SimpleNamespace(block_size=BS),
            block_size=BS,
            hash_block_size=BS,
            use_eagle=eagle,
            use_eagle_block_drop=eagle,
            num_hash_lookahead_tokens=0,
            max_num_scheduled_tokens=budget,
            scheduler_config=SimpleNamespace(long_prefill_token_threshold=0),
            mamba_partial_cache_hit=False,
            mamba_has_prefill_checkpoint_blocks=has_checkpoints,
            mamba_prefill_checkpoint_alignment=alignment,
            mamba_fine_grained_prefix_cache=False,
            mamba_shared_prefix_checkpoint=False,
        )
        for total in range(1, 26):
            for prompt in sorted({total, max(total - 1, 1), max(total - 3, 1)}):
                for start in range(total):
                    theirs: list[int] = []
                    for n in range(1, total - start + 1):
                        req = SimpleNamespace(
                            num_computed_tokens=start,
                            num_prompt_tokens=prompt,
                            num_tokens=total,
                            shared_prefix_boundary=0,
                        )
                        theirs.append(split(fake, req, n))
                    for n in range(1, total - start + 1):
                        where = (eagle, budget, checkpoints, alignment, total, prompt, start, n)
                        assert align_split(cfg, total, start, n, num_prompt_tokens=prompt) == theirs[n - 1], where
                        smallest = next(t for t in theirs[n - 1 :] if t)
                        assert schedule_chunk(cfg, total, start, n, num_prompt_tokens=prompt) == smallest, where
                        checked += 1
    assert checked > 10_000
