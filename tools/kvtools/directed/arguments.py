"""Directed scenarios for caller errors and defaults: caller-given hits that are wrong,
``cache_blocks`` / ``remove_skipped_blocks`` / ``free_blocks`` / ``evict_blocks`` at and past
their bounds, negative counts, and ``allocate_slots`` with only its required arguments."""

from __future__ import annotations

from kvspec.config import FullAttention, SlidingWindow
from kvtools.directed.script import Scenario, Script, config


def scenarios() -> list[Scenario]:
    """This theme's scenarios."""
    out = [
        Scenario(
            "bad-hits",
            "caller-given hits: an id equal to num_blocks, a stale id, a list one entry too long, a null entry, then "
            "the real hit; a hit for a request with nothing cached",
            config(FullAttention(16), SlidingWindow(16, 32), num_blocks=12),
            _bad_hits,
        ),
        Scenario(
            "bad-hits-mixed-block-sizes",
            "as bad-hits, with group block sizes 32 and 16 (two hash blocks per full-attention block)",
            config(FullAttention(32), SlidingWindow(16, 32), num_blocks=12),
            _bad_hits,
        ),
        Scenario(
            "null-hits",
            "the null block in a full-attention hit is a caller error (StaleHitError); a sliding-window hit's "
            "leading null blocks are not",
            config(FullAttention(4), SlidingWindow(4, 5), num_blocks=24),
            _null_hits,
        ),
        Scenario(
            "hits-without-caching",
            "with prefix caching off no hit is valid, not even an all-null one (vLLM asserts there)",
            config(FullAttention(16), SlidingWindow(16, 32), num_blocks=8, enable_caching=False),
            _hits_without_caching,
        ),
        Scenario(
            "cache-and-skip-edges",
            "cache_blocks at 0, inside, at and past the table and negative; remove_skipped_blocks at 0 and -1; "
            "free_blocks / evict_blocks with id num_blocks",
            config(FullAttention(16), num_blocks=8),
            _cache_and_skip_edges,
        ),
        Scenario(
            "cache-without-blocks",
            "cache_blocks(0) for a request that holds no block leaves the common prefix alone",
            config(FullAttention(4), num_blocks=12),
            _cache_without_blocks,
        ),
        Scenario(
            "negative-counts",
            "every count of allocate_slots at -1 in turn, and a negative num_computed_tokens, is an "
            "InvalidTokenCountError; zero new tokens only with connector tokens",
            config(FullAttention(4), SlidingWindow(4, 8), num_blocks=12),
            _negative_counts,
        ),
        Scenario(
            "defaults",
            "allocate_slots with only the required keys: every default of the protocol applies",
            config(FullAttention(16), num_blocks=8, watermark=0.2),
            _defaults,
        ),
    ]
    return out


def _bad_hits(s: Script) -> None:
    n = s.config.num_blocks
    s.add("a", range(48))
    s.admit("a", new=40)
    s.decode("a", 2, first_token=5)
    s.free("a")
    s.add("b", range(48))
    found = s.call({"op": "get_computed_blocks", "rid": "b"})
    hit, blocks = found["num_tokens"], found["blocks"]
    base = {"op": "allocate_slots", "rid": "b", "num_new_tokens": 4, "num_new_computed_tokens": hit}
    groups = len(s.config.groups)
    s.call({**base, "new_computed_blocks": [[n]] + [[]] * (groups - 1)})
    s.call({**base, "new_computed_blocks": [[n - 1]] + [[]] * (groups - 1)})
    s.call({**base, "new_computed_blocks": [[*g, g[-1] if g else 1] for g in blocks]})
    s.call({**base, "new_computed_blocks": [[0, *g] for g in blocks]})
    s.call({**base, "new_computed_blocks": blocks})
    s.add("c", range(10))
    s.call(
        {"op": "allocate_slots", "rid": "c", "num_new_tokens": 4, "new_computed_blocks": [[1]] + [[]] * (groups - 1)}
    )


def _null_hits(s: Script) -> None:
    # A sliding-window hit may lead with null blocks; a full-attention hit never
    # holds one, and with prefix caching off no hit is valid at all.
    s.add("a", range(40))
    s.admit("a")
    s.decode("a", 2, first_token=5)
    s.free("a")
    s.add("b", range(40))
    found = s.call({"op": "get_computed_blocks", "rid": "b"})
    hit, blocks = found["num_tokens"], found["blocks"]
    base = {"op": "allocate_slots", "rid": "b", "num_new_tokens": 4, "num_new_computed_tokens": hit}
    s.call({**base, "new_computed_blocks": [[0, *blocks[0][1:]], blocks[1]]})
    s.call({**base, "new_computed_blocks": [[0] * len(blocks[0]), [0] * len(blocks[1])]})
    s.call({**base, "new_computed_blocks": blocks})


def _hits_without_caching(s: Script) -> None:
    s.add("a", range(20))
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 4, "num_new_computed_tokens": 16,
            "new_computed_blocks": [[0], []]})  # fmt: skip
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 4, "num_new_computed_tokens": 16,
            "new_computed_blocks": [[], [0]]})  # fmt: skip
    s.admit("a")


def _cache_and_skip_edges(s: Script) -> None:
    n = s.config.num_blocks
    s.add("a", range(40))
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 20, "delay_cache_blocks": True})
    for k in (0, 16, 20, 40, 41, 48, -1):
        s.call({"op": "cache_blocks", "rid": "a", "num_computed_tokens": k})
    s.call({"op": "remove_skipped_blocks", "rid": "a", "total_computed_tokens": 0})
    s.call({"op": "remove_skipped_blocks", "rid": "a", "total_computed_tokens": -1})
    s.add("b", range(40))
    s.call({"op": "allocate_slots", "rid": "b", "num_new_tokens": 16, "delay_cache_blocks": True})
    s.call({"op": "cache_blocks", "rid": "b", "num_computed_tokens": 40})  # past b's one-block table
    s.call({"op": "cache_blocks", "rid": "b", "num_computed_tokens": 16})
    s.call({"op": "free_blocks", "block_ids": [n]})
    s.call({"op": "free_blocks", "block_ids": [n - 1]})
    s.call({"op": "evict_blocks", "block_ids": [n]})
    s.free("a")


def _cache_without_blocks(s: Script) -> None:
    s.add("a", range(10))
    s.admit("a")
    s.add("b", range(10))
    s.call({"op": "cache_blocks", "rid": "b", "num_computed_tokens": 0})
    s.call({"op": "get_num_common_prefix_blocks", "rid": "a"})
    s.admit("b")
    s.call({"op": "get_num_common_prefix_blocks", "rid": "a"})


def _negative_counts(s: Script) -> None:
    s.add("a", range(20))
    base = {"op": "allocate_slots", "rid": "a", "num_new_tokens": 4}
    for key in ("num_new_tokens", "num_new_computed_tokens", "num_lookahead_tokens", "num_external_computed_tokens",
                "num_encoder_tokens", "reserved_blocks"):  # fmt: skip
        s.call({**base, key: -1})
    s.request({"op": "set_request", "rid": "a", "num_computed_tokens": -1})
    s.call(base)
    s.request({"op": "set_request", "rid": "a", "num_computed_tokens": 0})
    s.call({**base, "num_new_tokens": 0})
    s.call({**base, "num_new_tokens": 0, "num_external_computed_tokens": 4, "delay_cache_blocks": True})


def _defaults(s: Script) -> None:
    # Only the required keys: every optional argument takes the protocol's default.
    s.add("a", range(16))
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 16})
    s.request({"op": "set_request", "rid": "a", "status": "RUNNING", "num_computed_tokens": 16})
    s.request({"op": "append_tokens", "rid": "a", "tokens": [3]})
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 1})
    s.add("b", range(16))
    s.call({"op": "get_computed_blocks", "rid": "b"})
    s.add("c", range(100, 140))
    s.call({"op": "allocate_slots", "rid": "c", "num_new_tokens": 40})
    s.call({"op": "allocate_slots", "rid": "c", "num_new_tokens": 40, "num_external_computed_tokens": 0})
