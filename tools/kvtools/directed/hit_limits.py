"""Directed traces of vLLM 0.34.0's hit limits and its read-only lookup.

The lockstep machine draws these inputs at random (prompt-logprob requests,
an explicit ``max_cache_hit_length``, a skip flag set after the request was
made, ``get_num_cached_tokens``: ``kvref.machine.hit_limits``); one script
each pins them here, step by step:

* ``num-cached-tokens``: the read-only probe against lookups: a plain
  request, one that skips reads (0) and a prompt-logprob one whose lookup is
  capped at its first scored row while the probe is not;
* ``prompt-logprob-hit-limit``: prompt-logprob requests with reads on and
  no start (no hit), start 5 and 9 (hits of 4 and 8 tokens, block size 4),
  and with the flag unset (reads off);
* ``skip-set-late``: a request made reading the cache, its skip flag set
  before its lookup: 0.34.0 still hits (the limit was fixed when it was made);
* ``hit-length-bound`` (full attention) and ``hit-length-bound-hybrid``
  (full attention and a sliding window): lookups bounded at 0, 5, 9 and
  above ``num_tokens - 1``, which 0.34.0 caps there.

``python -m kvtools.directed.hit_limits vllm-0.34.0`` records them on kvspec
into ``traces/vllm-0.34.0/directed/``; real vLLM 0.34.0 replays all of them
(``kvref replay traces/vllm-0.34.0/directed/*.jsonl --target vllm``).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.config import FullAttention, SlidingWindow
from kvspec.profiles import profile_named
from kvtools.directed.record import record_releases
from kvtools.directed.script import Scenario, Script, config

PROMPT = list(range(100, 117))
"""17 tokens: 4 full blocks of 4 and one token."""


def scenarios(profile_name: str) -> list[Scenario]:
    """The scenarios under ``profile_name`` (vLLM 0.34.0 on)."""
    profile = profile_named(profile_name)
    full = config(FullAttention(4), num_blocks=24, profile=profile)
    hybrid = config(FullAttention(4), SlidingWindow(4, 8), num_blocks=32, profile=profile)
    return [
        Scenario("num-cached-tokens", "get_num_cached_tokens against lookups", full, _num_cached),
        Scenario("prompt-logprob-hit-limit", "prompt-logprob requests read up to their first row", full, _logprobs),
        Scenario("skip-set-late", "a skip flag set after the request was made", full, _late_skip),
        Scenario("hit-length-bound", "lookups with max_cache_hit_length", full, _bounds),
        Scenario("hit-length-bound-hybrid", "lookups with max_cache_hit_length in a hybrid", hybrid, _bounds),
    ]


def _cache_prompt(s: Script) -> None:
    """``a`` runs PROMPT and finishes: its 4 full blocks stay cached."""
    s.add("a", PROMPT)
    s.admit("a")
    s.free("a")
    s.new_step()


def _request(s: Script, rid: str, prompt: list[int], **fields: object) -> None:
    s.request({"op": "add_request", "rid": rid, "prompt": prompt, **fields})


def _num_cached(s: Script) -> None:
    _cache_prompt(s)
    _request(s, "b", [*PROMPT, 7])
    _request(s, "c", [*PROMPT, 7], skip_reading_prefix_cache=True)
    _request(s, "d", [*PROMPT, 7], skip_reading_prefix_cache=False, prompt_logprobs=True, prompt_logprob_start=6)
    for rid in ("b", "c", "d"):
        s.call({"op": "get_num_cached_tokens", "rid": rid})
        s.call({"op": "get_computed_blocks", "rid": rid})
    s.admit("d")
    s.call({"op": "get_num_cached_tokens", "rid": "b"})  # d's blocks are not cached yet: still 16
    s.free("d")


def _logprobs(s: Script) -> None:
    _cache_prompt(s)
    _request(s, "b", [*PROMPT, 7], skip_reading_prefix_cache=False, prompt_logprobs=True)
    _request(s, "c", [*PROMPT, 7], skip_reading_prefix_cache=False, prompt_logprobs=True, prompt_logprob_start=5)
    _request(s, "d", [*PROMPT, 7], skip_reading_prefix_cache=False, prompt_logprobs=True, prompt_logprob_start=9)
    _request(s, "e", [*PROMPT, 7], prompt_logprobs=True, prompt_logprob_start=9)  # the flag unset: reads off
    for rid in ("b", "c", "d", "e"):
        s.admit(rid)
    for rid in ("b", "c", "d", "e"):
        s.free(rid)


def _late_skip(s: Script) -> None:
    _cache_prompt(s)
    _request(s, "b", [*PROMPT, 7])
    s.request({"op": "set_request", "rid": "b", "skip_reading_prefix_cache": True})
    s.admit("b")
    s.free("b")


def _bounds(s: Script) -> None:
    _cache_prompt(s)
    _request(s, "b", PROMPT[:16])  # 16 tokens, all cached
    for bound in (0, 5, 9, 15, 16, 40):
        s.call({"op": "get_computed_blocks", "rid": "b", "max_cache_hit_length": bound})
    s.admit("b")
    s.free("b")


def main(argv: Sequence[str] | None = None) -> int:
    """Record the traces under each profile named in ``argv``."""
    return record_releases(argv, scenarios, "kvtools.directed.hit_limits")


if __name__ == "__main__":
    raise SystemExit(main())
