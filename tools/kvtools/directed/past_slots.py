"""Directed traces of two cache_blocks corners of partial-tail entries (vLLM 0.26.0 on).

``cache-past-slots``: a KV connector's ``cache_blocks`` count reaches past
the request's allocated slots into the block after its tables. vLLM's
scheduler never sends such a count, but nothing in vLLM refuses it: the full
blocks the tables hold are cached, and the partial-tail entry, whose block
is not in the table yet, is left out until an allocation brings the block
(kvspec's ``cache_partial_tail_block``: "past the table"). The lockstep
machine sends such counts (``SchedulerMachine.cache_past_slots``), but the
tail boundary falls in the block after the table only for a request
prefilled in a chunk that ends just there, in a configuration whose every
cached group is coarser than the hash block; the script does it once.

``evicted-tail-rekeyed``: ``evict_blocks`` uncaches a full block while its
request holds it; the request's next allocation registers the partial-tail
entry again, now as the block's only key, standing for fewer tokens than the
full block holds although the block counts as cached (kvspec's
``inv_hash_content`` accepts such a key; the lockstep against vLLM 0.33.0
reached this at seed 0, where kvspec and vLLM agreed on every output).

``python -m kvtools.directed.past_slots vllm-0.33.0 ...`` records both on
kvspec under each profile named into ``traces/vllm-<release>/directed/``;
a file is kept only after ``kvref replay --target vllm`` passed on that
release (CI replays the newest release's corpus against it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kvspec.config import FullAttention, SlidingWindow
from kvspec.profiles import profile_named
from kvtools.directed.record import record_releases
from kvtools.directed.script import Scenario, Script, config


def scenarios(profile_name: str) -> list[Scenario]:
    """The three scenarios under ``profile_name``: FA(8) + SWA(8, window 8), hash block 4 (2 for
    ``shared-tail-rekeyed``, which needs two hash boundaries inside a block)."""
    profile = profile_named(profile_name)
    cfg = config(FullAttention(8), SlidingWindow(8, 8), num_blocks=16, hash_block_size=4, profile=profile)
    eagle = replace(cfg, use_eagle=True)
    return [
        Scenario("cache-past-slots", "a cache_blocks count past the allocated slots", eagle, _past_slots),
        Scenario("evicted-tail-rekeyed", "a held block evicted, then keyed again by its tail entry", cfg, _rekeyed),
        Scenario(
            "shared-tail-rekeyed",
            "a block two requests hold evicted, then keyed again by both tail entries, the later one last",
            replace(cfg, hash_block_size=2, num_blocks=24),
            _shared_rekeyed,
        ),
    ]


def _past_slots(s: Script) -> None:
    s.add("a", list(range(15)))  # tail boundary 12: inside the second 8-token block
    s.admit("a", new=8)  # one block per group: 8 slots
    s.call({"op": "cache_blocks", "rid": "a", "num_computed_tokens": 15})  # past the slots: block 0 only
    s.call({"op": "take_events"})
    s.new_step()
    s.step("a")  # the second block arrives: the tail entry at 12 registers now
    s.call({"op": "take_events"})
    s.new_step()
    s.decode("a", 2)
    s.free("a")


def _rekeyed(s: Script) -> None:
    s.add("a", list(range(15)))
    s.admit("a")
    s.new_step()
    s.decode("a", 1)  # 16 tokens: block 1 full, keyed at 16 and (tail entry) at 12
    s.call({"op": "take_events"})
    tables = s.call({"op": "get_block_ids", "rid": "a"})
    assert isinstance(tables, list)
    s.call({"op": "evict_blocks", "block_ids": [tables[0][1]]})  # held by a: every key goes
    s.new_step()
    s.decode("a", 1, first_token=2)  # the tail entry registers again: the block's only key
    s.call({"op": "take_events"})
    s.add("b", [*range(12), 70, 71, 72])  # hits 8 tokens (block 0) and the tail entry at 12
    s.admit("b")
    s.free("b")
    s.free("a")


def _shared_rekeyed(s: Script) -> None:
    y = [*range(15), 1, 3]  # y's prompt, then the tokens y and x produce
    s.add("y", y[:15])  # tail boundary 14 (hash block 2): inside the second 8-token block
    s.admit("y")
    s.new_step()
    s.decode("y", 1)  # 16 tokens: y's block 1 full, keyed at 16 and (tail entry) at 14
    s.add("x", y[:11])  # tail boundary 10, in the same block
    s.admit("x")  # hits block 0; x's own block 1 gets the tail entry at 10
    for token in y[11:]:  # x produces y's tokens: its block 1 is keyed at 16 too
        s.new_step()
        s.sched.sample("x", token)
        s.step("x")
    s.preempt("x")
    s.new_step()
    s.admit("x")  # x's lookup hits y's block 1 (the first block under that key)
    s.call({"op": "take_events"})
    tables = s.call({"op": "get_block_ids", "rid": "x"})
    assert isinstance(tables, list)
    s.new_step()
    s.call({"op": "evict_blocks", "block_ids": [tables[0][1]]})  # held by x and y: every key goes
    s.new_step()
    s.decode("x", 1, first_token=2)  # x's tail entry at 10: the block's only key
    s.decode("y", 1, first_token=2)  # y's at 14 stands for more tokens: x's key leaves first
    s.call({"op": "take_events"})
    s.free("x")
    s.free("y")


def main(argv: Sequence[str] | None = None) -> int:
    """Record the traces under each profile named in ``argv``."""
    return record_releases(argv, scenarios, "kvtools.directed.past_slots")


if __name__ == "__main__":
    raise SystemExit(main())
