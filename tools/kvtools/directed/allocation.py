"""Directed scenarios for ``allocate_slots``'s gates: block caching on a quiet step, look-ahead,
the watermark, steps refused after a window slid, chunks past the prompt, cross attention,
reserved blocks and whole-sequence admission on running requests, Mamba-only groups."""

from __future__ import annotations

from kvspec.config import CrossAttention, FullAttention, Mamba, SlidingWindow
from kvtools.directed.script import Scenario, Script, config


def scenarios() -> list[Scenario]:
    """This theme's scenarios."""
    out = [
        Scenario(
            "decode-fills-first-block",
            "a short prompt decoded until its first block fills: that step must cache the block (quiet-step cache "
            "limit, kvimpl _allocate_running)",
            config(FullAttention(16), num_blocks=8),
            _decode_fills_first_block,
        ),
        Scenario(
            "lookahead-cap",
            "look-ahead slots are capped at max_model_len",
            config(FullAttention(16), num_blocks=8, max_model_len=32, use_eagle=True),
            _lookahead_cap,
        ),
        Scenario(
            "watermark-waiting-again",
            "a waiting request whose table is already longer than the step needs still passes the watermark check",
            config(FullAttention(16), num_blocks=10, watermark=0.5),
            _watermark_waiting_again,
        ),
        Scenario(
            "watermark-waiting-again-hybrid",
            "as watermark-waiting-again, with a sliding-window group",
            config(FullAttention(16), SlidingWindow(16, 32), num_blocks=14, watermark=0.5),
            _watermark_waiting_again,
        ),
        Scenario(
            "refused-after-window-slide",
            "a step refused after the window slid past blocks it freed (device rows must follow)",
            config(SlidingWindow(4, 4), num_blocks=4, enable_caching=False, enable_kv_cache_events=False),
            _refused_after_window_slide,
        ),
        Scenario(
            "refused-after-window-slide-hybrid",
            "as refused-after-window-slide, with a full-attention group",
            config(FullAttention(4), SlidingWindow(4, 4), num_blocks=7, enable_caching=False),
            _refused_after_window_slide,
        ),
        Scenario(
            "refused-after-window-slide-mamba",
            "as refused-after-window-slide, with a Mamba group without prefix caching",
            config(Mamba(4, "none", 0), SlidingWindow(4, 4), num_blocks=7, enable_caching=False),
            _refused_after_window_slide,
        ),
        Scenario(
            "schedule-past-the-prompt",
            "a step scheduling more tokens than the request has caches only the request's full blocks",
            config(FullAttention(4)),
            _schedule_past_the_prompt,
        ),
        Scenario(
            "schedule-past-the-prompt-hybrid",
            "as schedule-past-the-prompt, with a sliding-window group",
            config(FullAttention(4), SlidingWindow(4, 8)),
            _schedule_past_the_prompt,
        ),
        Scenario(
            "cross-without-encoder",
            "cross attention takes blocks only for encoder tokens: a request without any gets none",
            config(
                FullAttention(16), CrossAttention(16), num_blocks=6, enable_caching=False, enable_kv_cache_events=False
            ),
            _cross_without_encoder,
        ),
        Scenario(
            "running-gates",
            "reserved_blocks on a running request whose table is longer than the step needs",
            config(FullAttention(4), num_blocks=6, use_eagle=True),
            _running_gates,
        ),
        Scenario(
            "running-full-sequence",
            "full_sequence_must_fit on a running sliding-window request: the per-request admission cap applies",
            config(SlidingWindow(4, 4), num_blocks=6, max_num_batched_tokens=8),
            _running_full_sequence,
        ),
        Scenario(
            "two-mamba-groups",
            "two Mamba groups (all and align with a speculative block) and no attention group",
            config(Mamba(8, "all", 0), Mamba(8, "align", 1), num_blocks=24, use_eagle=True),
            _two_mamba_groups,
        ),
    ]
    return out


def _decode_fills_first_block(s: Script) -> None:
    s.add("a", range(10))
    s.admit("a")
    s.request({"op": "append_tokens", "rid": "a", "tokens": [7]})
    s.decode("a", 8, first_token=20)
    s.add("b", [*range(16), 99])
    s.admit("b")


def _lookahead_cap(s: Script) -> None:
    s.add("a", range(30))
    s.admit("a", lookahead=4)
    s.add("b", range(100, 120))
    s.admit("b", new=8, lookahead=30)


def _watermark_waiting_again(s: Script) -> None:
    # A request allocated with look-ahead while still WAITING (connector
    # scheduling), allocated again: its table is already longer than the step needs.
    s.add("a", range(16))
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 16, "num_lookahead_tokens": 16})
    s.add("b", range(100, 148))
    s.request({"op": "set_request", "rid": "b", "status": "RUNNING"})  # a running request's chunk
    s.call({"op": "allocate_slots", "rid": "b", "num_new_tokens": 48})
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 16})
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 16, "has_scheduled_reqs": False})


def _refused_after_window_slide(s: Script) -> None:
    s.add("a", range(8))
    s.admit("a")
    s.add("b", range(50, 54))
    s.admit("b")
    s.request({"op": "append_tokens", "rid": "a", "tokens": list(range(20, 28))})
    s.step("a", new=8)  # refused on this pool, after the window slid
    s.free("b")
    s.step("a", new=8)


def _schedule_past_the_prompt(s: Script) -> None:
    s.add("a", range(5))
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 8})
    s.add("b", range(5))
    s.call({"op": "get_computed_blocks", "rid": "b"})


def _cross_without_encoder(s: Script) -> None:
    s.add("a", range(10))
    s.admit("a")
    s.decode("a", 8, first_token=30)
    s.add("b", range(40, 45))
    s.admit("b", num_encoder_tokens=20)
    s.decode("b", 3, first_token=60)
    # The encoder length passed again on a running request's step: its cross
    # table already covers it, so the step needs no encoder block.
    s.request({"op": "append_tokens", "rid": "b", "tokens": [61]})
    s.call({"op": "allocate_slots", "rid": "b", "num_new_tokens": 1, "num_encoder_tokens": 20})
    s.free("a")
    s.add("c", range(70, 90))
    s.admit("c")


def _running_gates(s: Script) -> None:
    # reserved_blocks and full_sequence_must_fit on a running request whose
    # table is already longer than the step needs (an earlier look-ahead).
    s.add("a", range(8))
    s.admit("a", lookahead=8)
    s.request({"op": "append_tokens", "rid": "a", "tokens": [1]})
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 1, "reserved_blocks": 3})
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 1, "reserved_blocks": 1})


def _running_full_sequence(s: Script) -> None:
    s.add("a", range(40))
    s.admit("a", new=8)
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 8, "full_sequence_must_fit": True})
    s.call({"op": "allocate_slots", "rid": "a", "num_new_tokens": 8})


def _two_mamba_groups(s: Script) -> None:
    for rid, base in (("a", 0), ("b", 0), ("c", 50)):
        s.add(rid, range(base, base + 20))
        s.admit(rid, new=16)
        s.decode(rid, 6, first_token=base + 3)
    s.free("b")
    s.add("d", range(20))
    s.admit("d")
