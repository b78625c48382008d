"""Directed traces of the prefix-cache retention interval (vLLM 0.23.0 on).

Under a retention interval sliding-window and Mamba groups cache only the
blocks a hit ending on a multiple of it (none at 0) or on a reachable
boundary reads (``kvspec.retention``). One script each pins down:

* ``retention-window-zero`` (full attention of 16-token blocks and a window of
  8 in 4-token blocks, interval 0): a 70-token prompt keeps only the window
  blocks a replay reads (blocks 14-15, ending at 64); the same prompt again
  hits 64 tokens, one sharing its first 40 tokens hits nothing, as the window
  blocks before 32 are not cached; that lookup's shared-prefix boundary (32,
  the full-attention hit) is kept reachable by its own caching from vLLM
  0.26.0 on, so a third request sharing the 40 tokens then hits 32;
* ``retention-window-segments`` (interval 32): the window also keeps the
  blocks a hit at 32 reads, so the 40-token sibling hits 32 at once;
* ``retention-window-eagle`` (EAGLE, interval 0): the EAGLE window caches one
  block further; from vLLM 0.30.0 on the reachable positions are those a
  resend and a longer sibling resume at (48), not the prompt's last token;
* ``retention-mamba`` (full attention and Mamba ``align`` in 4-token blocks,
  interval 8): a prompt prefilled in chunks of 4 keeps the Mamba states at 8,
  16 and the last boundary below its last token (20), not those at 4 and 12;
  a request sharing 14 tokens hits 8, one sharing 18 hits 16.

``python -m kvtools.directed.retention vllm-0.25.1 vllm-0.29.0 vllm-0.33.0
vllm-0.34.0`` records them on kvspec into ``traces/<release>/directed/``; the
real release replays them (``kvref replay traces/vllm-0.34.0/directed/retention-*.jsonl
--target vllm``; up to 0.28.0 the vLLM adapter sets the environment variable
``VLLM_PREFIX_CACHE_RETENTION_INTERVAL``, from 0.29.0 on the ``KVCacheConfig``
field).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.config import FullAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.profiles import profile_named
from kvtools.directed.script import Scenario, Script, config

PROMPT = [(7 * i) % 50 + 100 for i in range(70)]
"""70 tokens: four full-attention blocks of 16 and a partial one."""


def scenarios(profile_name: str = "vllm-0.25.1") -> list[Scenario]:
    """The scenarios under ``profile_name`` (vLLM 0.23.0 on; the Mamba one from 0.24.0;
    by default 0.25.1's, a theme of the directed corpus, :data:`kvtools.directed.record.THEMES`)."""
    profile = profile_named(profile_name)

    def window(retention: int, eagle: bool = False) -> KVCacheConfig:
        return config(
            FullAttention(16), SlidingWindow(4, 8), num_blocks=96, max_model_len=128, use_eagle=eagle,
            enable_kv_cache_events=True, prefix_cache_retention_interval=retention, profile=profile,
        )  # fmt: skip

    mamba = config(
        FullAttention(4), Mamba(4, "align"), num_blocks=48, max_model_len=64, enable_kv_cache_events=True,
        prefix_cache_retention_interval=8, profile=profile,
    )  # fmt: skip
    out = [
        Scenario("retention-window-zero", "interval 0: only the reachable window blocks", window(0), _siblings),
        Scenario("retention-window-segments", "interval 32: and those of each segment", window(32), _siblings),
        Scenario("retention-window-eagle", "interval 0 under EAGLE", window(0, eagle=True), _eagle),
    ]
    if profile.retention_kinds == "swa+mamba":
        out.append(Scenario("retention-mamba", "interval 8 on a Mamba align group", mamba, _mamba))
    return out


def _cached_then_replayed(s: Script) -> None:
    """``a`` caches the prompt and finishes; ``b`` with the same prompt is looked up
    (a replay: its limit is 69)."""
    s.add("a", PROMPT)
    s.admit("a")
    s.call({"op": "take_events"})
    s.free("a")
    s.new_step()
    s.add("b", PROMPT)
    s.call({"op": "get_computed_blocks", "rid": "b"})


def _siblings(s: Script) -> None:
    _cached_then_replayed(s)
    s.add("c", [*PROMPT[:40], *range(1, 11)])  # a sibling sharing 40 tokens
    s.admit("c")
    s.call({"op": "take_events"})
    s.new_step()
    s.add("d", [*PROMPT[:40], *range(20, 30)])  # another one, after c's caching
    s.call({"op": "get_computed_blocks", "rid": "d"})
    s.free("c")


def _eagle(s: Script) -> None:
    _cached_then_replayed(s)
    s.add("c", [*PROMPT, 1, 2, 3])
    s.call({"op": "get_computed_blocks", "rid": "c"})


def _mamba(s: Script) -> None:
    s.add("a", PROMPT[:22])
    s.admit("a", new=4)
    for _ in range(4):
        s.new_step()
        s.step("a", 4)
    s.new_step()
    s.step("a")
    s.call({"op": "take_events"})
    s.free("a")
    s.new_step()
    s.add("b", [*PROMPT[:14], 1, 2, 3])
    s.call({"op": "get_computed_blocks", "rid": "b"})
    s.add("c", [*PROMPT[:18], 1, 2, 3])
    s.call({"op": "get_computed_blocks", "rid": "c"})


def main(argv: Sequence[str] | None = None) -> int:
    """Record the traces under each profile named in ``argv``."""
    from kvtools.directed.record import record_releases  # noqa: PLC0415 - record imports this theme

    return record_releases(argv, scenarios, "kvtools.directed.retention")


if __name__ == "__main__":
    raise SystemExit(main())
