"""Directed traces of look-ahead block hashes (vLLM 0.33.0 on).

From vLLM 0.33.0 on, an EAGLE-style drafter with prefix caching (and no KV
connector that keeps the old hashes) makes each block hash cover the ``L``
tokens after the block (``num_hash_lookahead_tokens``: 1, or ``N`` for
multi-module MTP), and the scheduler then builds the manager without
``use_eagle`` (no trailing-block drop). One script each pins down:

* ``lookahead-hashes-eagle`` (``L = 1``, full attention): a 16-token prompt
  has 3 hashes, so its allocation caches 3 blocks; the first sampled token
  hashes block 3, which the next allocation caches (its stored event names
  that token); a request with the same 16 tokens and another 17th one hits
  3 blocks, one with the sampled token hits all 4;
* ``lookahead-hashes-mtp`` (``L = 3``, multi-module MTP, full attention and a
  Mamba ``align`` group): caching lags the hashed tokens (and the tokens the
  drafter may prefill again); a prefill chunk ending at the Mamba tail (at or
  below ``num_prompt_tokens - 3``) keeps the state there, which a request
  with the same prompt hits;
* ``lookahead-hashes-extra-keys`` (``L = 2``): a multimodal item that starts
  inside a block's look-ahead window keys that block too, and the cache salt
  and LoRA key every block; the stored events carry the window's keys;
* ``lookahead-hashes-partial-tail`` (``L = 3``, full attention of 4-token
  blocks hashed in units of 2, and a sliding window): the full-attention
  partial tail is keyed at most at the hashed tokens.

``python -m kvtools.directed.lookahead_hashes vllm-0.33.0 vllm-0.34.0``
records them on kvspec into ``traces/<release>/directed/``; real vLLM 0.33.0
and 0.34.0 replay them (``kvref replay traces/vllm-0.34.0/directed/*.jsonl
--target vllm``).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.config import FullAttention, Mamba, SlidingWindow
from kvspec.profiles import profile_named
from kvtools.directed.record import record_releases
from kvtools.directed.script import Scenario, Script, config

PROMPT = list(range(100, 116))
"""16 tokens: 4 full blocks of 4."""


def scenarios(profile_name: str) -> list[Scenario]:
    """The scenarios under ``profile_name`` (vLLM 0.33.0 on)."""
    profile = profile_named(profile_name)
    eagle = config(FullAttention(4), num_blocks=24, num_hash_lookahead_tokens=1, profile=profile)
    mtp = config(
        FullAttention(4), Mamba(4, "align"), num_blocks=32, num_hash_lookahead_tokens=3, num_prefill_lookahead=3,
        profile=profile,
    )  # fmt: skip
    keyed = config(FullAttention(4), num_blocks=24, num_hash_lookahead_tokens=2, profile=profile)
    tail = config(
        FullAttention(4), SlidingWindow(4, 4), num_blocks=32, hash_block_size=2, num_hash_lookahead_tokens=3,
        num_prefill_lookahead=3, profile=profile,
    )  # fmt: skip
    return [
        Scenario("lookahead-hashes-eagle", "look-ahead hashes of one token: caching waits for them", eagle, _eagle),
        Scenario("lookahead-hashes-mtp", "look-ahead hashes of three tokens in a Mamba hybrid", mtp, _mtp),
        Scenario("lookahead-hashes-extra-keys", "extra keys of a block's look-ahead window", keyed, _extra_keys),
        Scenario("lookahead-hashes-partial-tail", "a partial tail capped at the hashed tokens", tail, _partial_tail),
    ]


def _eagle(s: Script) -> None:
    s.add("a", PROMPT)
    s.admit("a")  # 16 tokens computed, 3 hashes: blocks 0-2 cached
    s.call({"op": "take_events"})
    s.new_step()
    s.decode("a", 1, first_token=7)  # token 7 hashes block 3; this allocation caches it
    s.call({"op": "take_events"})
    s.add("b", [*PROMPT, 8, 9])  # another 17th token: block 3's hash differs
    s.call({"op": "get_computed_blocks", "rid": "b"})
    s.add("c", [*PROMPT, 7, 9])
    s.call({"op": "get_computed_blocks", "rid": "c"})
    s.new_step()
    s.admit("c")
    s.free("a")
    s.free("c")


def _mtp(s: Script) -> None:
    s.add("a", [*PROMPT, 1, 2])  # 18 tokens: hashes up to 15 tokens (3 blocks); Mamba tail at 12
    s.admit("a", new=12)  # a chunk that ends at the tail: the Mamba state at 12 is kept
    s.call({"op": "take_events"})
    s.new_step()
    s.step("a")
    s.call({"op": "take_events"})
    s.new_step()
    s.decode("a", 3, first_token=5)
    s.call({"op": "take_events"})
    s.add("b", [*PROMPT, 1, 2, 3])  # the same prompt and one more token
    s.new_step()
    s.admit("b")
    s.free("a")
    s.free("b")


def _extra_keys(s: Script) -> None:
    extra = {
        "mm_features": [{"identifier": "img", "offset": 5, "length": 2}],
        "cache_salt": "salt",
        "lora": {"name": "l1", "adapter_id": 1, "path": "adapters/l1"},
    }
    s.add("a", PROMPT[:14], **extra)  # blocks 0 ([0, 6) window) and 1 ([4, 10)) hold the item's key
    s.admit("a")
    s.call({"op": "take_events"})
    s.add("b", PROMPT[:14], **{**extra, "mm_features": [{"identifier": "img2", "offset": 5, "length": 2}]})
    s.call({"op": "get_computed_blocks", "rid": "b"})  # block 0 already differs (the item is in its window)
    s.add("c", PROMPT[:14], **extra)
    s.call({"op": "get_computed_blocks", "rid": "c"})
    s.free("a")


def _partial_tail(s: Script) -> None:
    s.add("a", PROMPT[:9])  # the tail boundary at 8 (9 - 1), hashes up to 6 tokens: the tail stays at 4
    s.admit("a")
    s.call({"op": "take_events"})
    s.new_step()
    s.decode("a", 2, first_token=3)  # 11 tokens: hashes up to 8; full attention keys its tail at 8
    s.call({"op": "take_events"})
    s.add("b", [*PROMPT[:9], 3])
    s.call({"op": "get_computed_blocks", "rid": "b"})
    s.free("a")


def main(argv: Sequence[str] | None = None) -> int:
    """Record the traces under each profile named in ``argv``."""
    return record_releases(argv, scenarios, "kvtools.directed.lookahead_hashes")


if __name__ == "__main__":
    raise SystemExit(main())
