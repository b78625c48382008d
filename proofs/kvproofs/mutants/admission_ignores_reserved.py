"""Mutant: allocate_slots forgets ``reserved_blocks`` in its main capacity
check, so an admitted request can eat the blocks the caller set aside."""

from __future__ import annotations

from kvspec.invariants import require
from kvspec.kv_cache_manager import (
    _WATERMARKED,
    KVCacheManager,
    check_admission_args,
    skip_basis,
    tables_cover_slots,
)
from kvspec.request import Request
from kvspec.view import BlockIds

OWN_CONTRACT = False
TARGET = "kvspec.kv_cache_manager.KVCacheManager.allocate_slots"
HARNESSES = ("bounded:admission.admission",)


def allocate_slots(
    self: KVCacheManager,
    request: Request,
    num_new_tokens: int,
    num_new_computed_tokens: int = 0,
    new_computed_blocks: BlockIds | None = None,
    num_lookahead_tokens: int = 0,
    num_external_computed_tokens: int = 0,
    delay_cache_blocks: bool = False,
    num_encoder_tokens: int = 0,
    full_sequence_must_fit: bool = False,
    reserved_blocks: int = 0,
    has_scheduled_reqs: bool = True,
) -> BlockIds | None:
    """Mutant of the spec method (no contract)."""
    check_admission_args(self.config.profile, full_sequence_must_fit, reserved_blocks, has_scheduled_reqs)
    hits = self._validate_allocation(
        request, num_new_tokens, num_new_computed_tokens, new_computed_blocks, num_lookahead_tokens,
        num_external_computed_tokens, num_encoder_tokens, reserved_blocks,
    )  # fmt: skip
    local = request.num_computed_tokens + num_new_computed_tokens
    total = min(local + num_external_computed_tokens, self.config.max_model_len)
    wm = self.watermark_blocks if has_scheduled_reqs and request.status in _WATERMARKED else 0
    coord, rid = self.coordinator, request.request_id
    if full_sequence_must_fit:
        full = min(request.num_tokens, self.config.max_model_len)
        need = coord.get_num_blocks_to_allocate(rid, full, hits, num_encoder_tokens, total, full, True, num_local=local)
        if need + wm > self.block_pool.get_num_free_blocks():
            return None
    main = total + num_new_tokens
    slots = min(main + num_lookahead_tokens, self.config.max_model_len)
    coord.remove_skipped_blocks(rid, skip_basis(self.config.profile, total, request.num_in_flight_tokens))
    need = coord.get_num_blocks_to_allocate(
        rid, slots, hits, num_encoder_tokens, local + num_external_computed_tokens, main,
        num_external=num_external_computed_tokens, num_local=local,
    )  # fmt: skip
    if need + wm > self.block_pool.get_num_free_blocks():  # the fault: reserved_blocks left out
        return None
    if any(hits) or num_external_computed_tokens > 0:
        coord.allocate_new_computed_blocks(rid, hits, local, num_external_computed_tokens)
    new = coord.allocate_new_blocks(rid, slots, main, num_encoder_tokens)
    self.requests[rid] = request
    require(tables_cover_slots(self, rid, slots), f"request {rid}: tables shorter than {slots} slots")
    if self.enable_caching and not delay_cache_blocks:
        coord.cache_blocks(request, min(total + num_new_tokens, request.num_tokens))
    return self._ids(new)
