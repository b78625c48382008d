"""The upstream bug zoo: faults that really happened in vLLM's KV-cache code,
re-planted one at a time into kvimpl.

Every entry of :data:`ZOO` is an adapter factory of the same name exported
here, so each one is a valid target::

    kvref check --target kvtools.zoo:touch_before_capacity_check --against spec

A mutant is kvimpl's ``KVCacheManager`` with *one* method replaced on the
instance (impl/ is never edited; :mod:`kvtools.zoo.base`). The entries live
by the part of the manager they break: :mod:`~kvtools.zoo.facade` (the
facade's arguments, results and statistics), :mod:`~kvtools.zoo.pool`,
:mod:`~kvtools.zoo.managers` (single-type managers and Mamba),
:mod:`~kvtools.zoo.coordinator` (the hybrid hit search) and
:mod:`~kvtools.zoo.hashing` (request hashing, planted on the caller side) and
:mod:`~kvtools.zoo.context_parallel` (hashing under context parallelism) and
:mod:`~kvtools.zoo.production` (kvimpl's own entry points beyond vLLM's facade:
the array API, multi-request batches, mutable requests, a native crash);
:mod:`~kvtools.zoo.safety` holds the faults hunted at the safety level (alone,
under the safety oracles, no reference).
:mod:`kvtools.zoo.vllm` plants faults into the installed vLLM instead.

``python -m kvtools zoo`` (or ``ci/mutation.sh``) hunts every entry with the
kit's lockstep (:mod:`kvtools.zoo.runner`) and writes
``docs/reports/bug-zoo.md`` and ``docs/reports/zoo.json``
(:mod:`kvtools.zoo.report`).

Upstream numbers are vLLM pull requests / issues / advisories; where the
number could not be matched to the described fault it says "unconfirmed".
"""

from __future__ import annotations

from kvtools.zoo.base import ENTRIES, Factory, ZooEntry
from kvtools.zoo.context_parallel import dcp_unscaled_request_hashes
from kvtools.zoo.coordinator import (
    eagle_drop_every_pass,
    eagle_window_drops_last,
    hits_touched_per_group,
    second_full_group_untrimmed,
    unscaled_hash_block_size,
)
from kvtools.zoo.facade import (
    cross_attn_batch_budget,
    full_hit_keeps_last_block,
    preempted_counted_in_hit_rate,
    touch_before_capacity_check,
)
from kvtools.zoo.hashing import (
    cache_salt_dropped,
    constant_none_hash,
    extra_keys_concatenated,
    lora_missing_from_hash,
    mm_item_at_block_end,
)
from kvtools.zoo.managers import (
    common_prefix_by_ref_cnt,
    double_free_in_call,
    mamba_state_wrong_unit,
    wrong_num_cached_blocks,
)
from kvtools.zoo.pool import free_count_before_assert, removed_event_per_copy, unhashed_freed_to_tail
from kvtools.zoo.production import (
    array_first_unfitted_late,
    batch_first_lookahead,
    native_crash_on_free,
    stale_token_tuple,
)
from kvtools.zoo.safety import (
    cache_before_load,
    cache_beyond_computed,
    checkpoint_eagle_shift_without_eagle,
    checkpoint_ignores_alignment,
    checkpoint_on_block_end,
    chunked_frees_current_chunk,
    cross_blocks_rounded_down,
    cross_frees_encoder_blocks,
    failed_load_zeroes_valid_block,
    hit_blocks_listed_for_zeroing,
    load_caches_whole_blocks,
    swa_frees_in_window,
    swa_hit_nulls_window_block,
    unchained_block_hash,
)

ORDER: tuple[Factory, ...] = (
    touch_before_capacity_check,
    free_count_before_assert,
    double_free_in_call,
    wrong_num_cached_blocks,
    common_prefix_by_ref_cnt,
    cross_attn_batch_budget,
    unhashed_freed_to_tail,
    eagle_drop_every_pass,
    unscaled_hash_block_size,
    hits_touched_per_group,
    mamba_state_wrong_unit,
    removed_event_per_copy,
    constant_none_hash,
    extra_keys_concatenated,
    lora_missing_from_hash,
    cache_salt_dropped,
    mm_item_at_block_end,
    full_hit_keeps_last_block,
    preempted_counted_in_hit_rate,
    second_full_group_untrimmed,
    eagle_window_drops_last,
    dcp_unscaled_request_hashes,
    array_first_unfitted_late,
    batch_first_lookahead,
    stale_token_tuple,
    native_crash_on_free,
    swa_frees_in_window,
    chunked_frees_current_chunk,
    cache_beyond_computed,
    cache_before_load,
    hit_blocks_listed_for_zeroing,
    unchained_block_hash,
    load_caches_whole_blocks,
    swa_hit_nulls_window_block,
    failed_load_zeroes_valid_block,
    cross_frees_encoder_blocks,
    cross_blocks_rounded_down,
    checkpoint_on_block_end,
    checkpoint_ignores_alignment,
    checkpoint_eagle_shift_without_eagle,
)
"""The order of the report's rows: the order in which the entries joined the zoo."""

ZOO: dict[str, ZooEntry] = {f.__name__: ENTRIES[f.__name__] for f in ORDER}
"""Every entry by name, in :data:`ORDER` (``tests/tools/test_zoo.py`` checks that none is left out)."""
