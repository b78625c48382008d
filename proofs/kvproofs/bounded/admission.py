"""The admission checks of ``KVCacheManager.allocate_slots`` on the real facade.

A fresh request (no hits) is allocated under every combination of watermark,
``reserved_blocks``, ``full_sequence_must_fit``, ``has_scheduled_reqs`` and
status, on a pool with some blocks already in use. The blocks a plain
allocation takes are measured on a large, unconstrained twin manager, so the
properties never restate the spec's block arithmetic:

* admitted: it takes exactly what the plain allocation takes, and leaves at
  least the applicable watermark plus the reserved blocks free;
* refused: nothing changed;
* refused exactly when the new tokens would eat into watermark plus reserve,
  or (with the gate) when the whole request, capped per request by
  :func:`kvspec.config.admission_cap` for sliding window and chunked local,
  would eat into the watermark.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import product

from kvproofs.bounded import check, expect
from kvproofs.contracts import about
from kvspec.config import AttentionKind, ChunkedLocal, FullAttention, KVCacheConfig, SlidingWindow, admission_cap
from kvspec.kv_cache_manager import KVCacheManager
from kvspec.profiles import NEWEST
from kvspec.request import Request, RequestBlockHasher, RequestStatus

BS, NUM_BLOCKS, MAX_LEN, BATCH = 2, 8, 16, 4
KINDS: tuple[AttentionKind, ...] = (FullAttention(BS), SlidingWindow(BS, 3), ChunkedLocal(BS, 4))
_HASHER = RequestBlockHasher("sha256", "0", BS)
_WATERMARKED = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


def _manager(kind: AttentionKind, busy: int, num_blocks: int, watermark: float) -> KVCacheManager:
    """A manager whose pool has ``busy`` blocks held by a running request."""
    config = KVCacheConfig(num_blocks, (kind,), MAX_LEN, max_num_batched_tokens=BATCH, watermark=watermark)
    mgr = KVCacheManager(config)
    if busy:
        other = replace(_HASHER.new_request("o", [900 + i for i in range(busy * BS)]), status=RequestStatus.RUNNING)
        mgr.allocate_slots(other, busy * BS, has_scheduled_reqs=False)
    return mgr


def _taken(kind: AttentionKind, busy: int, request: Request, n_new: int) -> int:
    """Blocks a plain allocation of ``n_new`` tokens takes (large pool, no watermark)."""
    mgr = _manager(kind, busy, 64, 0.0)
    before = mgr.block_pool.get_num_free_blocks()
    mgr.allocate_slots(replace(request, status=RequestStatus.RUNNING), n_new, has_scheduled_reqs=False)
    return before - mgr.block_pool.get_num_free_blocks()


@check
@about(KVCacheManager.allocate_slots, releases=(NEWEST.release,))
def admission() -> int:
    """Every kind, prompt length, chunk, pool load and admission setting."""
    cases = 0
    for kind, length, busy in product(KINDS, range(1, MAX_LEN + 1), (0, 2)):
        request = _HASHER.new_request("r", range(length))
        cap = admission_cap(kind, BATCH, MAX_LEN)
        whole = _taken(kind, busy, request, length)
        gate_need = whole if cap is None else min(whole, cap)
        for n_new in sorted({length, min(length, BATCH)}):
            need = _taken(kind, busy, request, n_new)
            settings = product((0.0, 0.25), range(3), (False, True), (False, True), tuple(RequestStatus)[:3])
            for watermark, reserved, gate, scheduled, status in settings:
                cases += 1
                case = (kind, length, busy, n_new, watermark, reserved, gate, scheduled, status)
                mgr = _manager(kind, busy, NUM_BLOCKS, watermark)
                wm = mgr.watermark_blocks if scheduled and status in _WATERMARKED else 0
                free, view = mgr.block_pool.get_num_free_blocks(), mgr.to_view()
                got = mgr.allocate_slots(
                    replace(request, status=status), n_new,
                    full_sequence_must_fit=gate, reserved_blocks=reserved, has_scheduled_reqs=scheduled,
                )  # fmt: skip
                after = mgr.block_pool.get_num_free_blocks()
                refuse = need + wm > free - reserved or (gate and gate_need + wm > free)
                expect((got is None) == refuse, "refused exactly when watermark, reserve or gate is crossed", case)
                expect(got is not None or mgr.to_view() == view, "a refusal changes nothing", case)
                expect(got is None or free - after == need, "admitted: takes what a plain allocation takes", case)
                expect(got is None or after >= wm + reserved, "admitted: watermark and reserve stay free", case)
    return cases
