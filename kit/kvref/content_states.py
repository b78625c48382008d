"""The Mamba side of the content oracle (:mod:`kvref.content`): a Mamba
group's block holds no per-position KV but one recurrent state, the state
after a prefix of the request's inputs. Where a step reads that state and
which blocks it writes depend on vLLM's ``mamba_cache_mode``
(:func:`state_read_index`, :func:`state_writes`); a prefill checkpoint
(vLLM 0.29.0 on) writes one more state (:func:`checkpoint_write`,
:func:`positional_checkpoint_write`); a prefix
hit of ``n`` tokens serves the state at ``n`` from its last block
(:func:`state_hit_index`). An ``align`` group with speculative blocks
follows the worker's rules for speculative decoding: a row with draft
tokens writes the state after each of its tokens into the running block
and the ones after it (:func:`draft_row_writes`), and the accepted count
decides where the next step reads and which block-boundary state is copied
back (:func:`accepted_copy`). ``none`` and ``all`` groups with speculative
blocks stay unchecked (:func:`mamba_checked`).
"""

from __future__ import annotations

from kvref.scheduler_chunks import checkpoint_unit
from kvspec.config import AttentionKind, KVCacheConfig, Mamba
from kvspec.prefill_checkpoints import POSITIONAL_FORMS, checkpoint_position, checkpoint_valid


def mamba_checked(kind: AttentionKind) -> bool:
    """Whether the content oracle checks the states of a Mamba group of ``kind``.

    An ``align`` group with speculative blocks is checked under the worker's
    rules for rows with draft tokens (:func:`draft_row_writes`,
    :func:`accepted_copy`). NOTE: ``none`` and ``all`` groups with
    speculative blocks are left out: their draft rows follow other rules,
    not modelled. A row with draft tokens in a group without a speculative
    block per draft (vLLM gives a Mamba group one per draft token, so no
    release runs it) leaves its request's states unchecked from then on
    (:meth:`kvref.safety_steps.StepChecks._run_states`).

    post: __return__ == (isinstance(kind, Mamba) and (kind.num_speculative_blocks == 0 or kind.mode == "align"))
    """
    return isinstance(kind, Mamba) and (kind.num_speculative_blocks == 0 or kind.mode == "align")


def draft_row_writes(kind: Mamba, start: int, end: int) -> list[tuple[int, int]]:
    """``(table index, length)`` pairs a row with draft tokens computing
    ``[start, end)`` writes in an ``align`` group with speculative blocks:
    the state after each of its tokens, the first into the running block (the
    block of the row's last position, ``cdiv(end, block_size) - 1``) and each
    next one into the block after (the speculative blocks).

    NOTE: vLLM's worker (``preprocess_mamba`` in vllm/v1/worker/mamba_utils.py,
    0.30.0 to 0.33.0; its fused kernels in 0.34.0) takes the running block at
    the row's end, drafts included; the decode kernels write the state of
    token ``i`` of the row into the ``i``-th of the ``1 + num_speculative_blocks``
    blocks from there. Such a row writes no prefill checkpoint (the checkpoint
    rows are the rows without drafts).

    pre: 0 <= start < end
    post: [n for _, n in __return__] == list(range(start + 1, end + 1))
    post: __return__[0][0] == (end - 1) // kind.block_size
    """
    first = (end - 1) // kind.block_size
    return [(first + i, start + i + 1) for i in range(end - start)]


def accepted_copy(kind: Mamba, end: int, num_drafts: int, accepted: int) -> tuple[tuple[int, int] | None, bool]:
    """What the worker does once a row computing up to ``end`` with
    ``num_drafts`` draft tokens has ``accepted`` of them accepted, in an
    ``align`` group: the copy ``(source index, destination index)`` that puts
    the state at the last block boundary the accepted tokens reach into the
    block ending there (None: no copy), and whether the next step reads the
    running block itself (True) or the block of the last accepted token.

    The row's states lie from its running block on (:func:`draft_row_writes`):
    the state at ``end - num_drafts`` in the running block, one more token per
    block after it. When the accepted tokens reach a block boundary at or past
    that first state, the state at the boundary goes into the block ending
    there; when that block is the running block, the next step reads it there.

    NOTE: vLLM's ``postprocess_mamba`` rule (vllm/v1/worker/mamba_utils.py,
    the decision its fused kernel takes from 0.30.0 on): only the last
    boundary reached is saved.

    pre: 0 <= accepted <= num_drafts < end
    post: __return__[0] is None or __return__[0][1] <= __return__[0][0]
    """
    bs = kind.block_size
    running = end - num_drafts
    aligned = (running + accepted) // bs * bs
    first = (end - 1) // bs
    if aligned < running:
        return None, False
    bias, dest = aligned - running, aligned // bs - 1
    copy = None if dest == first and bias == 0 else (first + bias, dest)
    return copy, dest == first


def state_read_index(kind: Mamba, computed: int) -> int | None:
    """Table index of the block whose state a step that starts at ``computed``
    tokens reads (the state at ``computed``), or None at 0 (no state read).

    ``none``: the first entry, one running state per request (vLLM sizes the
    group's block by the model length). ``all`` and ``align``: the block of
    the last computed token. In ``align`` mode the worker copies that state
    into the block the step writes before the step (when the two differ), and
    the step reads the copy, which holds the same state.

    pre: computed >= 0
    post: __return__ is None or __return__ >= 0
    post: (__return__ is None) == (computed == 0)
    """
    if computed == 0:
        return None
    if kind.mode == "none":
        return 0
    return (computed - 1) // kind.block_size


def state_writes(kind: Mamba, start: int, end: int) -> list[tuple[int, int]]:
    """``(table index, length)`` pairs: the blocks a step computing ``[start,
    end)`` writes, each with the length whose state it then holds.

    ``none``: the state at ``end`` into the first entry. ``align``: the state
    at ``end`` into the block of the last token computed (the scheduler
    caches it when it lands on a block boundary). ``all``: the same, and
    the state at each block boundary the step crosses into the block that
    ends there (each of those becomes cacheable once full).

    pre: 0 <= start < end
    post: __return__[-1][1] == end
    post: all(start < n <= end for _, n in __return__)
    """
    if kind.mode == "none":
        return [(0, end)]
    bs = kind.block_size
    last = (end - 1) // bs
    crossed = [(j, (j + 1) * bs) for j in range(start // bs, last)] if kind.mode == "all" else []
    return [*crossed, (last, end)]


def checkpoint_write(kind: Mamba, form: str, start: int, end: int) -> tuple[int, int] | None:
    """``(table index, length)`` of the state a prefill checkpoint of a step
    computing ``[start, end)`` writes, or None: with vLLM 0.29.0's
    block-aligned form (``form``, the profile switch ``prefill_checkpoints``)
    in an ``align`` group with ``num_prefill_checkpoint_blocks`` above 0, a
    step that ends inside a block and crosses a block boundary writes the
    state at the last boundary it crosses into the slot before the running
    state. The entry holds the null block unless the manager kept that slot
    for the checkpoint; a write into the null block is dropped.

    NOTE: the worker of vLLM 0.29.0 (the KDA metadata builder of
    vllm/models/kimi_k3) also needs the offset of that boundary from the
    step's start to be a multiple of its kernel's chunk; the oracle takes a
    kernel whose chunk divides the block size, as every step from a block
    boundary has.

    pre: 0 <= start < end
    post: __return__ is None or (start < __return__[1] < end and __return__[1] % kind.block_size == 0)
    post: __return__ is None or __return__[0] == __return__[1] // kind.block_size - 1
    """
    bs = kind.block_size
    if form != "block-aligned" or kind.mode != "align" or kind.num_prefill_checkpoint_blocks <= 0:
        return None
    boundary = end // bs * bs
    if end % bs == 0 or boundary <= start:
        return None
    return boundary // bs - 1, boundary


def positional_checkpoint_write(kind: Mamba, config: KVCacheConfig, start: int, end: int) -> tuple[int, int] | None:
    """``(table index, length)`` of the state a prefill checkpoint of a step
    computing ``[start, end)`` writes under the positional forms of vLLM
    0.30.0 on, or None: in an ``align`` group with
    ``num_prefill_checkpoint_blocks`` above 0, when the step can export the
    checkpoint position of its end (kvspec's ``checkpoint_position`` at the
    release's unit, ``checkpoint_valid`` with the group's
    ``prefill_checkpoint_alignment``), the state at that position goes into
    the slot before the running state, ``cdiv(end, block_size) - 2``. As with
    :func:`checkpoint_write` the entry holds the null block unless the manager
    kept the slot, and a write into the null block is dropped.

    NOTE: this is the worker's rule, which vLLM's Mamba backends apply to
    every prefill row with no regard for what the manager decided
    (``compute_mamba_prefill_checkpoints`` in
    vllm/model_executor/layers/mamba/checkpoint.py, 0.31.0 on; the KDA
    metadata builder of vllm/models/kimi_k3 in 0.30.0): the manager's own
    bookkeeping (which slot it keeps, under what key) is what the oracle
    then checks. Its unit is the scheduler's and the manager's
    (:func:`kvref.scheduler_chunks.checkpoint_unit`).

    pre: 0 <= start < end
    post: __return__ is None or start < __return__[1] < end
    post: __return__ is None or __return__[0] == -(-end // kind.block_size) - 2 >= 0
    """
    profile = config.profile
    if profile.prefill_checkpoints not in POSITIONAL_FORMS:
        return None
    if kind.mode != "align" or kind.num_prefill_checkpoint_blocks <= 0:
        return None
    hbs = config.resolved_hash_block_size()
    unit, ahead = checkpoint_unit(config), config.num_hash_lookahead_tokens
    position = checkpoint_position(profile, end, unit, config.use_eagle, ahead)
    if not checkpoint_valid(start, end, position, hbs, kind.block_size, kind.prefill_checkpoint_alignment):
        return None
    return -(-end // kind.block_size) - 2, position


def stale_index(kind: Mamba, start: int, end: int) -> int | None:
    """Table index of the block an ``align`` step (or load) computing
    ``[start, end)`` leaves holding the state at ``start`` although its
    tokens now fill it: the step starts inside that block and ends past it
    (None when it does not).

    NOTE: a start inside a block comes from a connector load that ends
    inside one (vLLM's scheduler does not align ``num_external_computed_tokens``
    in ``align`` mode: NIXL's transfer from a decode instance back to a
    prefill one, for one, loads the decoder's computed tokens), or from a
    fine-grained hit inside a coarser Mamba block (0.29.0 on). The manager
    then caches the block as the state at its end. Up to 0.25.x the
    scheduler keeps such a chunk a whole number of blocks long
    (``_mamba_block_aligned_split`` in vllm/v1/core/sched/scheduler.py), so
    it runs past the block's end: the registered defect
    ``mamba-align-midblock`` (:mod:`kvref.safety_defects`). From 0.26.0 the
    same function stops a chunk that starts inside a block at that block's
    end (0.26.0: where that end is cacheable; 0.30.0 on: unless the backend
    saves the checkpoint inside the chunk, which kvref does not model), and
    the kit's scheduler model does the same
    (:func:`kvref.scheduler_chunks.schedule_chunk`).

    pre: 0 <= start < end
    post: __return__ is None or kind.mode == "align"
    """
    bs = kind.block_size
    if kind.mode != "align" or start % bs == 0 or start // bs == (end - 1) // bs:
        return None
    return start // bs


def state_hit_index(kind: Mamba, num_tokens: int) -> int:
    """Table index of the block a prefix hit of ``num_tokens`` tokens serves
    its state from: the hit's last block (the entries before it are null).

    pre: num_tokens >= 1
    post: __return__ >= 0
    """
    return 0 if kind.mode == "none" else (num_tokens - 1) // kind.block_size
