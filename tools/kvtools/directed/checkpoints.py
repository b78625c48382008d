"""Directed traces of Mamba prefill checkpoints (vLLM 0.29.0's block-aligned form).

A Mamba ``align`` group with ``num_prefill_checkpoint_blocks`` above 0 keeps,
for a prefill chunk that starts on a block boundary and ends inside a block,
the table slot below the running state; the model writes the state at the
last block boundary of the chunk into it and the ordinary caching keys it
(``kvspec.prefill_checkpoints``). Full attention of 16-token blocks and Mamba
of 16-token blocks, a 70-token prompt, KV-cache events on. One script each
pins down:

* ``checkpoint-one-chunk``: the prompt in one chunk keeps slot 3 (the state
  at 64) beside the running state (slot 4); after the request finishes, the
  same prompt hits 64 tokens and so does a longer one;
* ``checkpoint-two-chunks-retention-zero`` (retention interval 0): chunks of
  32 and 38; the first caches no state (0 keeps only the blocks a replay at
  the prompt's last token reads), the second's checkpoint is that block, so
  the same prompt hits 64;
* ``checkpoint-chunk-inside-a-block``: a chunk of 20 from 0 keeps the state at
  16 as its checkpoint; the next chunk (the other 50 tokens, as a caller
  that does not split chunks sends it) starts inside a block, so it has
  none, and the state at 64 is not kept: both prompts hit 32;
* ``checkpoint-fine-hash`` (hashes of 4 tokens, so the Mamba group takes
  fine-grained hits): the checkpoint is still the block boundary (64), and a
  chunk ending at 68 also keys the Mamba tail entry there.

Under vLLM 0.30.0, 0.31.0 and 0.32.0 one script pins down how a checkpoint
meets a speculative (scratch) block:

* ``checkpoint-scratch-block`` (the Mamba group has one speculative block and
  the checkpoint alignment 1): chunks of 32 and 38. In 0.30.0 and 0.31.0 the
  first chunk's scratch block stays at slot 2 while the second chunk's
  checkpoint takes slot 3, so the full-block caching keys the scratch block
  as the state at 48, and a request sharing 48 tokens hits them with its
  Mamba state served from that block, which no step wrote the state at 48
  into (a scratch block holds the states after draft tokens, and a prefill
  chunk has none). From 0.32.0 on the scratch block moves into the
  checkpoint slot and the same request hits 32 tokens.

``python -m kvtools.directed.checkpoints vllm-0.29.0 vllm-0.30.0 vllm-0.31.0
vllm-0.32.0`` records them on kvspec into ``traces/<release>/directed/``; the
real releases replay them (``kvref replay traces/vllm-0.29.0/directed/checkpoint-*.jsonl
--target vllm``, and so on).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvspec.config import FullAttention, KVCacheConfig, Mamba
from kvspec.profiles import profile_named
from kvtools.directed.record import record_releases
from kvtools.directed.script import Scenario, Script, config

PROMPT = [(11 * i) % 60 + 100 for i in range(70)]
"""70 tokens: four blocks of 16 and a partial one."""


def scenarios(profile_name: str = "vllm-0.29.0") -> list[Scenario]:
    """The scenarios under ``profile_name`` (vLLM 0.29.0; 0.30.0 on: the scratch block's)."""
    profile = profile_named(profile_name)
    if profile.prefill_checkpoints != "block-aligned":
        scratch = config(
            FullAttention(16), Mamba(16, "align", 1, num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1),
            num_blocks=64, max_model_len=128, enable_kv_cache_events=True, profile=profile,
        )  # fmt: skip
        return [Scenario("checkpoint-scratch-block", "a scratch block below the checkpoint", scratch, _scratch)]

    def model(**kw: Any) -> KVCacheConfig:
        return config(
            FullAttention(16), Mamba(16, "align", num_prefill_checkpoint_blocks=1), num_blocks=64,
            max_model_len=128, enable_kv_cache_events=True, profile=profile, **kw,
        )  # fmt: skip

    zero, fine = model(prefix_cache_retention_interval=0), model(hash_block_size=4)
    return [
        Scenario("checkpoint-one-chunk", "one chunk keeps the state at 64", model(), _chunks((70,))),
        Scenario("checkpoint-two-chunks-retention-zero", "32 + 38, retention interval 0", zero, _chunks((32, 38))),
        Scenario("checkpoint-chunk-inside-a-block", "20, then a chunk from inside a block", model(), _chunks((20, 50))),
        Scenario("checkpoint-fine-hash", "hashes of 4 tokens, chunks 68 + 2", fine, _chunks((68, 2))),
    ]


def _chunks(sizes: Sequence[int]) -> Any:
    """``a`` computes the prompt in chunks of ``sizes``, finishes; the same
    prompt and a longer one are looked up."""

    def script(s: Script) -> None:
        s.add("a", PROMPT)
        s.admit("a", new=sizes[0])
        for n in sizes[1:]:
            s.new_step()
            s.step("a", n)
        s.call({"op": "take_events"})
        s.free("a")
        s.new_step()
        s.add("b", PROMPT)
        s.call({"op": "get_computed_blocks", "rid": "b"})
        s.add("c", [*PROMPT, 1, 2, 3])
        s.call({"op": "get_computed_blocks", "rid": "c"})

    return script


def _scratch(s: Script) -> None:
    """``a`` computes the prompt in chunks of 32 and 38 and finishes; ``b`` shares 48 tokens."""
    s.add("a", PROMPT)
    s.admit("a", new=32)
    s.new_step()
    s.step("a", 38)
    s.call({"op": "take_events"})
    s.free("a")
    s.new_step()
    s.add("b", [*PROMPT[:48], *range(1, 18)])
    s.call({"op": "get_computed_blocks", "rid": "b"})


def main(argv: Sequence[str] | None = None) -> int:
    """Record the traces under each profile named in ``argv``."""
    return record_releases(argv, scenarios, "kvtools.directed.checkpoints")


if __name__ == "__main__":
    raise SystemExit(main())
