"""Directed scenarios for prefix hits and the coordinator's hit search: hit ends aligned to
mixed block sizes, holes in the cached blocks, one-token prompts, every prompt length up to
three scheduler blocks, and the hybrid search coming back to an EAGLE group."""

from __future__ import annotations

from collections.abc import Callable

from kvspec.config import MLA, FullAttention, Mamba, SlidingWindow
from kvtools.directed.script import Scenario, Script, config


def scenarios() -> list[Scenario]:
    """This theme's scenarios."""
    out = [
        Scenario(
            "rehit-window-ratio-3",
            "a sliding-window group whose block size is a third of the scheduler block size: hit ends must align",
            config(FullAttention(12), SlidingWindow(4, 13), num_blocks=32),
            _rehit(30, 2),
        ),
        Scenario(
            "rehit-window-ratio-3-eagle",
            "as rehit-window-ratio-3 with EAGLE and window 5: which window blocks are worth caching",
            config(FullAttention(12), SlidingWindow(4, 5), num_blocks=32, use_eagle=True),
            _rehit(30, 2),
        ),
        Scenario(
            "rehit-after-evicting-window-block",
            "a hole in the cached window blocks (one evicted): the hit must end where a whole window is cached",
            config(FullAttention(8), SlidingWindow(4, 8), num_blocks=32),
            _rehit_after_evicting(1, 5),
        ),
        Scenario(
            "rehit-after-evicting-small-full-block",
            "two full-attention groups, the second with half the block size, one of its blocks evicted: the hit "
            "stays aligned to the scheduler block size",
            config(FullAttention(8), FullAttention(4), num_blocks=32),
            _rehit_after_evicting(1, 1),
        ),
        Scenario(
            "one-token-prompts",
            "block size 1 and one-token prompts: a hit never covers the whole prompt",
            config(FullAttention(1), num_blocks=12),
            _one_token_prompts,
        ),
        Scenario(
            "int-block-hashes-off",
            "block hashes kept as bytes (int_block_hashes off): events carry them unchanged",
            config(FullAttention(4), SlidingWindow(4, 5), int_block_hashes=False),
            _hit_lengths,
        ),
        Scenario(
            "eagle-repass",
            "the hybrid hit search comes back to an EAGLE sliding-window group after another one shortened the "
            "hit: it must not drop the look-ahead block again (vllm#33270)",
            config(
                FullAttention(4),
                SlidingWindow(4, 1),
                SlidingWindow(4, 5),
                use_eagle=True,
                max_model_len=32,
                enable_kv_cache_events=False,
            ),
            _eagle_repass,
        ),
        Scenario(
            "unitary-swa-eagle-window-1",
            "one sliding-window group of window 1 with EAGLE: its blocks must be cached (the look-ahead needs them)",
            config(SlidingWindow(2, 1), use_eagle=True),
            _rehit(9, 3),
        ),
    ]
    for name, groups, eagle in (
        ("hit-lengths-full@2x+mamba-align", (FullAttention(8), Mamba(8, "align", 0), SlidingWindow(4, 5)), False),
        ("hit-lengths-mamba-align", (Mamba(4, "align", 0),), False),
        ("hit-lengths-full+swa+swa2-eagle", (FullAttention(4), SlidingWindow(4, 3), SlidingWindow(4, 7)), True),
        ("hit-lengths-mla+swa", (MLA(4), SlidingWindow(4, 6)), False),
    ):
        out.append(
            Scenario(
                name,
                "every prompt length up to three scheduler blocks, cached and hit again (hit alignment)",
                config(*groups, num_blocks=40, use_eagle=eagle),
                _hit_lengths,
            )
        )
    return out


def _rehit(length: int, steps: int) -> Callable[[Script], None]:
    """A prompt of ``length`` tokens computed, decoded ``steps`` times and freed;
    its tokens and first two samples hit again."""

    def script(s: Script) -> None:
        s.add("a", range(length))
        s.admit("a")
        s.decode("a", steps, first_token=40)
        s.free("a")
        s.add("b", [*range(length), 40, 41])
        s.admit("b")

    return script


def _rehit_after_evicting(group: int, index: int) -> Callable[[Script], None]:
    """As :func:`_rehit`, with one cached block of ``a`` (group, table index) evicted before the lookup."""

    def script(s: Script) -> None:
        s.add("a", range(25))
        s.admit("a")
        table = s.call({"op": "get_block_ids", "rid": "a"})[group]
        s.free("a")
        s.call({"op": "evict_blocks", "block_ids": [table[index]]})
        s.add("b", [*range(25), 7])
        s.admit("b")

    return script


def _one_token_prompts(s: Script) -> None:
    s.add("a", [5])
    s.admit("a")
    s.decode("a", 2, first_token=6)
    s.free("a")
    s.add("b", [5])
    s.admit("b")
    s.add("c", [5, 6])
    s.admit("c")


def _eagle_repass(s: Script) -> None:
    # Found by the bug-zoo hunt for eagle_drop_every_pass (vllm#33270): the
    # second pass over an EAGLE sliding-window group must not drop again.
    s.add("r1", [0] * 5)
    s.call({"op": "pop_blocks_for_free", "rid": "r1"})
    s.add("r2", [0] * 9)
    s.admit("r2", new=6, external=1)
    s.step("r2", new=1)
    s.add("r3", [0] * 9)
    s.admit("r3")


def _hit_lengths(s: Script) -> None:
    # Every prompt length from 1 to three scheduler blocks: cached, then hit
    # again by a request that extends it.
    sched = s.config.scheduler_block_size
    for length in range(1, 3 * sched + 2):
        rid, prompt = f"p{length}", [length] * length
        s.add(rid, prompt)
        if s.admit(rid):
            s.decode(rid, 2, first_token=length + 1)
            s.free(rid)
        s.add(f"q{length}", [*prompt, length + 1, 0])
        if s.admit(f"q{length}"):
            s.free(f"q{length}")
        if s.config.enable_kv_cache_events:
            s.call({"op": "take_events"})
