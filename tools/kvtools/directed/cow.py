"""A directed trace of fine-grained hits with copy-on-write (vLLM 0.26.0 on).

The lockstep machine reaches partial-hit records and the owner's tail-entry
move, but almost never a new request whose hit ends inside a block (the
table copy, ``kvspec.partial_hits.apply_cow``). This script does, twice:
``a`` registers its Mamba tail entry at 12 tokens (inside the 8-token
blocks) and moves it to a private copy; ``b`` and ``c`` hit those 12
tokens and privatise the shared full-attention and Mamba blocks.

``python -m kvtools.directed.cow vllm-0.26.0 ...`` records it on kvspec
under each profile named into ``traces/vllm-<release>/directed/``; the file
is kept only after ``kvref replay --target vllm`` passed on that release.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.config import FullAttention, Mamba, SlidingWindow
from kvspec.profiles import profile_named
from kvtools.directed.record import record_releases
from kvtools.directed.script import Scenario, Script, config

NAME = "cow-partial-hit"


def scenario(profile_name: str) -> Scenario:
    """The scenario under ``profile_name``: FA(8) + Mamba(8, align) + SWA(4, 8), hash block 4."""
    groups = (FullAttention(8), Mamba(8, "align"), SlidingWindow(4, 8))
    cfg = config(*groups, num_blocks=24, hash_block_size=4, profile=profile_named(profile_name))
    return Scenario(NAME, "hits that end inside a block: the table copy and the tail-entry move", cfg, _script)


def _script(s: Script) -> None:
    s.add("a", list(range(13)))
    s.admit("a", new=12)  # the chunk stops at the Mamba tail boundary: a partial entry at 12
    s.new_step()
    s.step("a")  # the owner moves its tail entry to a fresh block (a copy)
    s.new_step()
    s.decode("a", 2)
    s.new_step()
    s.add("b", [*range(12), 50, 51, 52, 53, 54])
    s.admit("b", new=4)  # hits 12 tokens: both shared blocks are copied
    s.new_step()
    s.step("b")
    s.new_step()
    s.decode("b", 2)
    s.new_step()
    s.free("a")
    s.free("b")
    s.add("c", [*range(12), 60, 61, 62])
    s.admit("c")  # hits 12 tokens again, after both owners finished
    s.new_step()
    s.decode("c", 3)
    s.free("c")


def main(argv: Sequence[str] | None = None) -> int:
    """Record the trace under each profile named in ``argv``."""
    return record_releases(argv, lambda release: [scenario(release)], "kvtools.directed.cow")


if __name__ == "__main__":
    raise SystemExit(main())
