"""Mamba prefill checkpoints (vLLM 0.29.0 on; profile switch ``prefill_checkpoints``).

In align mode a Mamba table is indexed by position: slot ``i`` holds the
state after ``(i + 1) * block_size`` tokens, a chunk ending at ``end`` writes
its running state into slot ``cdiv(end, block_size) - 1``, and every slot
before it that no step wrote is the null block. A prompt whose end falls
inside a block therefore leaves no state a later request can resume from,
except the partial one the tail entries key (:mod:`kvspec.mamba_tail`).

A *prefill checkpoint* fixes that: a chunk keeps one more state block, the
slot just below its running state, into which the model writes the state at
a position inside the chunk. The group's ``num_prefill_checkpoint_blocks``
switches it on (any value above 0 means one block per chunk).

* vLLM 0.29.0 ("block-aligned", :func:`block_aligned_checkpoint_slot`): a
  chunk gets a checkpoint when it starts on a block boundary and ends inside
  a block, and the slot ``cdiv(end, block_size) - 2`` is not yet held (past
  the table's end, or null). The slot is simply not nulled and gets a fresh
  block; its state is the block boundary ``floor(end / block_size) *
  block_size``, so the ordinary full-block caching keys it (under the
  ordinary retention mask) and nothing else about it is remembered. The
  admission estimate counts the extra block.

* vLLM 0.30.0 ("chunk-position", :func:`chunk_checkpoint`): the checkpoint
  has a *position*, :func:`checkpoint_position` of the chunk end: the last
  hash boundary below it (one hash unit lower under EAGLE), which may lie
  inside a block. The chunk must be able to export it
  (:func:`checkpoint_valid`: it starts on a hash boundary, the position is
  at least one hash unit past its start, strictly inside it, a multiple of
  the group's ``prefill_checkpoint_alignment`` tokens past its start, and
  its slot lies past the slot the chunk starts from); any chunk may get one,
  a chunk ending on a block boundary too. The manager remembers
  ``(position, slot)`` for the request until its next estimate
  (``MambaManager.checkpoints``), and after the ordinary full-block caching
  re-keys the slot's block to the position (:func:`rekey_checkpoint_block`:
  every key of the block removed, then the request's hash at the position
  stored), unless :func:`checkpoint_kept` says the checkpoint is transient,
  in which case the block loses every key instead. A chunk with a
  checkpoint registers no Mamba tail entry (:mod:`kvspec.mamba_tail`). For
  a running request the estimate of a checkpoint chunk is the table's whole
  shortfall, not capped; speculative scratch blocks stay where they are in
  a checkpoint chunk.
* vLLM 0.31.0 ("prompt-end"): ``allocate_slots`` hands the prefill end
  (:func:`checkpoint_prefill_end`) down, and with a retention interval of 0
  only a chunk reaching it gets a checkpoint; the prompt's own checkpoint
  is never transient. The estimate is capped again (a checkpoint chunk
  still counts the speculative blocks).
* vLLM 0.32.0 ("reachable"): positions are multiples of the hit alignment
  (:func:`checkpoint_granularity`); under EAGLE the position is taken from
  the chunk end itself, not one token below; a checkpoint other than the
  prompt's (or the junction's) stays cached only on a block boundary that
  the retention mask keeps. Scratch blocks move in a checkpoint chunk too,
  except the one in the checkpoint's slot.
* vLLM 0.33.0 ("hash-lookahead"): without EAGLE the position steps back
  over the pool's look-ahead tokens (at least one token).

NOTE: vLLM decides in ``get_num_blocks_to_allocate`` (the call that is not
the full-sequence admission check), looking at the request's table *before*
this step's prefix hits are added, and keeps the count per request for the
``allocate_new_blocks`` that follows; kvspec does the same
(``MambaManager.num_checkpoint_blocks``). For a new request whose hit ends in
the checkpoint slot this counts a block the allocation then does not take.

NOTE: the scheduler decides where chunks end, and so where checkpoints can
be; it is not part of kvspec. In 0.29.0 it disables checkpoints under EAGLE,
while the manager alone still keeps the slot, which EAGLE lookups cannot
reach. From 0.30.0 on the scheduler only plans for the final prefill chunk's
checkpoint, while the 0.30.0 manager gives every chunk that can export one a
checkpoint (a 0.30.0 checkpoint of an earlier chunk is real, and cached).

NOTE: in vLLM 0.30.0 and 0.31.0 a speculative scratch block that a
checkpoint chunk leaves in place below the checkpoint slot is then cached by
the ordinary full-block caching at that slot's block boundary, although no
state of that length was written into it (measured: one scratch block, a
70-token prompt as 32+38 tokens, block size 16: the scratch block is keyed at
48 tokens). kvspec does the same; from 0.32.0 on the scratch block moves into
the checkpoint slot instead.

NOTE: with a retention interval of 0, vLLM 0.30.0 keeps no checkpoint of a
prompt that does not end on a scheduler-block boundary: the hybrid caches
only up to the last such boundary, so even the final chunk's call covers
fewer tokens than the prompt and its checkpoint counts as transient. kvspec
models that loss (fixed in 0.31.0).

NOTE: vLLM asserts that the alignment is positive only when it first weighs
a checkpoint; kvspec refuses an alignment below 1 when the configuration is
made (:func:`kvspec.config.validate_prefill_checkpoints`).

Upstream: ``MambaManager._needs_internal_checkpoint``,
``MambaManager._cache_partial_tail_block`` and
``MambaSpec.num_prefill_checkpoint_blocks`` (vLLM 0.29.0 on,
vllm/v1/core/single_type_kv_cache_manager.py);
``get_mamba_prefill_checkpoint_position`` and
``is_mamba_prefill_checkpoint_valid`` (0.30.0 on, vllm/v1/kv_cache_interface.py);
``BlockPool.cache_partial_block`` with ``replace_existing_hashes`` (0.30.0 on).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvspec.block_pool import NULL_BLOCK, BlockId, BlockPool
from kvspec.config import Mamba
from kvspec.hashing import BlockHashWithGroupId, make_key
from kvspec.partial_tail import partial_stored_event
from kvspec.profiles import PrefillCheckpoints, SemanticsProfile
from kvspec.request import Request

FORMS: tuple[PrefillCheckpoints, ...] = (
    "none", "block-aligned", "chunk-position", "prompt-end", "reachable", "hash-lookahead",
)  # fmt: skip
"""The forms of the profile switch ``prefill_checkpoints``, oldest first."""

POSITIONAL_FORMS: frozenset[PrefillCheckpoints] = frozenset(FORMS[2:])
"""The forms whose checkpoint has a position of its own (vLLM 0.30.0 on)."""


def _since(profile: SemanticsProfile, form: PrefillCheckpoints) -> bool:
    """The profile's form is ``form`` or a later one."""
    return profile.prefill_checkpoints in FORMS[FORMS.index(form) :]


@dataclass(frozen=True, slots=True)
class CheckpointGeometry:
    """What a Mamba manager's checkpoint positions depend on besides the chunk."""

    hash_block_size: int
    """The pool's hash block: a chunk must start on one, and the position be one past its start."""
    granularity: int
    """Positions are multiples of it (:func:`checkpoint_granularity`)."""
    drop_eagle: bool
    """The model uses EAGLE: the position is one granularity unit lower."""
    lookahead: int
    """The pool's look-ahead hash tokens (read from vLLM 0.33.0 on)."""


def positional_checkpoints(kind: Mamba, profile: SemanticsProfile) -> bool:
    """Whether a group of ``kind`` takes checkpoints of a positional form
    (vLLM 0.30.0 on): align mode, a count above 0, and such a form.

    post: __return__ == (kind.mode == "align" and kind.num_prefill_checkpoint_blocks > 0 and profile.prefill_checkpoints in POSITIONAL_FORMS)
    """  # noqa: E501 - a PEP 316 condition is one line
    form = profile.prefill_checkpoints
    return kind.mode == "align" and kind.num_prefill_checkpoint_blocks > 0 and form in POSITIONAL_FORMS


def num_checkpoint_blocks(
    kind: Mamba, profile: SemanticsProfile, table: Sequence[int], num_tokens: int, num_computed_tokens: int
) -> int:
    """How many checkpoint blocks (0 or 1) a chunk of an align-mode group
    needs when its request's table is ``table`` (before this step's hits),
    the chunk ends at ``num_tokens`` and starts at ``num_computed_tokens``.

    pre: kind.block_size >= 1 and num_tokens >= 0 and num_computed_tokens >= 0
    post: __return__ in (0, 1)
    post: __return__ == 0 or (kind.mode == "align" and kind.num_prefill_checkpoint_blocks > 0)
    post: __return__ == 0 or profile.prefill_checkpoints == "block-aligned"
    post: profile.prefill_checkpoints != "block-aligned" or kind.mode != "align" or kind.num_prefill_checkpoint_blocks <= 0 or __return__ == (block_aligned_checkpoint_slot(kind.block_size, table, num_tokens, num_computed_tokens) is not None)
    """  # noqa: E501 - a PEP 316 condition is one line
    if kind.mode != "align" or kind.num_prefill_checkpoint_blocks <= 0:
        return 0
    if profile.prefill_checkpoints != "block-aligned":
        return 0
    slot = block_aligned_checkpoint_slot(kind.block_size, table, num_tokens, num_computed_tokens)
    return int(slot is not None)


def block_aligned_checkpoint_slot(
    block_size: int, table: Sequence[int], num_tokens: int, num_computed_tokens: int
) -> int | None:
    """The table slot a vLLM 0.29.0 checkpoint keeps, or None: the slot before
    the running state, ``cdiv(num_tokens, block_size) - 2``, when the chunk
    starts on a block boundary, ends inside a block, and the slot exists
    and is not held yet (past the table's end, or the null block).

    pre: block_size >= 1 and num_tokens >= 0 and num_computed_tokens >= 0
    post: __return__ is None or __return__ == -(-num_tokens // block_size) - 2
    post: __return__ is None or (__return__ >= 0 and num_tokens % block_size != 0 and num_computed_tokens % block_size == 0)
    post: __return__ is None or __return__ >= len(table) or table[__return__] == NULL_BLOCK
    post: __return__ is not None or num_tokens % block_size == 0 or num_computed_tokens % block_size != 0 or num_tokens < block_size or (-(-num_tokens // block_size) - 2 < len(table) and table[-(-num_tokens // block_size) - 2] != NULL_BLOCK)
    """  # noqa: E501 - a PEP 316 condition is one line
    slot = -(-num_tokens // block_size) - 2
    if num_tokens % block_size == 0 or num_computed_tokens % block_size != 0 or slot < 0:
        return None
    if slot < len(table) and table[slot] != NULL_BLOCK:
        return None
    return slot


def checkpoint_granularity(profile: SemanticsProfile, hash_block_size: int, hit_alignment: int) -> int:
    """The unit checkpoint positions are multiples of: the pool's hash block,
    from vLLM 0.32.0 on the coordinator's hit alignment (the hash block with
    fine-grained hits, else the scheduler block).

    pre: hash_block_size >= 1 and hit_alignment >= 1
    post: __return__ == (hit_alignment if profile.prefill_checkpoints in ("reachable", "hash-lookahead") else hash_block_size)
    """  # noqa: E501 - a PEP 316 condition is one line
    return hit_alignment if _since(profile, "reachable") else hash_block_size


def checkpoint_position(
    profile: SemanticsProfile, num_tokens: int, granularity: int, drop_eagle: bool, lookahead: int
) -> int:
    """The checkpoint position of a chunk (or prompt) ending at
    ``num_tokens``: the last multiple of ``granularity`` at or below a limit,
    never negative. The limit is ``num_tokens - 1`` (a resend recomputes the
    last token); from vLLM 0.33.0 on ``num_tokens - max(1, lookahead)`` (the
    position's hash needs the look-ahead tokens). Under EAGLE
    (``drop_eagle``) the position is one unit lower, and from 0.32.0 on its
    limit is ``num_tokens`` itself (EAGLE recomputes that unit anyway).

    pre: num_tokens >= 0 and granularity >= 1 and lookahead >= 0
    post: __return__ >= 0 and __return__ % granularity == 0
    post: __return__ < num_tokens or __return__ == 0
    post: drop_eagle or __return__ == max(num_tokens - max(1, lookahead if profile.prefill_checkpoints == "hash-lookahead" else 0), 0) // granularity * granularity
    post: not drop_eagle or __return__ == max((num_tokens if profile.prefill_checkpoints in ("reachable", "hash-lookahead") else num_tokens - 1) // granularity * granularity - granularity, 0)
    """  # noqa: E501 - a PEP 316 condition is one line
    if drop_eagle:
        limit = num_tokens if _since(profile, "reachable") else num_tokens - 1
    else:
        limit = num_tokens - max(1, lookahead if _since(profile, "hash-lookahead") else 0)
    position = limit // granularity * granularity
    if drop_eagle:
        position -= granularity
    return max(position, 0)


def checkpoint_valid(
    num_computed_tokens: int,
    num_tokens: int,
    position: int,
    hash_block_size: int,
    block_size: int,
    alignment: int | None,
) -> bool:
    """Whether a chunk from ``num_computed_tokens`` to ``num_tokens`` can
    export the state at ``position`` (vLLM 0.30.0 on): the group has an
    alignment; the chunk starts on a hash boundary; the slot below the
    running state lies past the slot of the state the chunk starts from; the
    position is at least one hash unit past the start, strictly inside the
    chunk, and a multiple of ``alignment`` tokens past the start.

    pre: num_computed_tokens >= 0 and num_tokens >= 0 and position >= 0
    pre: hash_block_size >= 1 and block_size >= 1 and (alignment is None or alignment >= 1)
    post: not __return__ or alignment is not None
    post: not __return__ or (num_computed_tokens < position < num_tokens and position - num_computed_tokens >= hash_block_size)
    post: not __return__ or (num_computed_tokens % hash_block_size == 0 and (position - num_computed_tokens) % alignment == 0)
    post: not __return__ or -(-num_tokens // block_size) - 2 > (num_computed_tokens - 1) // block_size
    post: not __return__ or -(-num_tokens // block_size) - 2 >= 0
    post: __return__ or alignment is None or num_computed_tokens % hash_block_size != 0 or -(-num_tokens // block_size) - 2 <= (num_computed_tokens - 1) // block_size or position - num_computed_tokens < hash_block_size or not num_computed_tokens < position < num_tokens or (position - num_computed_tokens) % alignment != 0
    """  # noqa: E501 - a PEP 316 condition is one line
    if alignment is None:
        return False
    start_col = (num_computed_tokens - 1) // block_size
    col = -(-num_tokens // block_size) - 2
    return (
        num_computed_tokens % hash_block_size == 0
        and col > start_col
        and num_computed_tokens + hash_block_size <= position
        and num_computed_tokens < position < num_tokens
        and (position - num_computed_tokens) % alignment == 0
    )


def chunk_checkpoint(
    kind: Mamba,
    profile: SemanticsProfile,
    geometry: CheckpointGeometry,
    table: Sequence[int],
    num_tokens: int,
    num_computed_tokens: int,
    allocated: bool,
    prefill_end: int,
) -> tuple[int, int] | None:
    """The checkpoint ``(position, slot)`` a chunk of an align-mode group
    gets under a positional form (vLLM 0.30.0 on), or None. The chunk runs
    from ``num_computed_tokens`` to ``num_tokens``; ``table`` is the
    request's table before this step's hits, ``allocated`` whether the
    request had an allocation already; ``prefill_end`` is 0 or the prefill
    end (read from 0.31.0 on, :func:`checkpoint_prefill_end`). The position is
    :func:`checkpoint_position` of the chunk end, the slot the one before the
    running state, ``cdiv(num_tokens, block_size) - 2``; the chunk must
    export the position (:func:`checkpoint_valid`), reach the prefill end,
    and find the slot past the table's end, null, or (an allocated request)
    among its last ``num_speculative_blocks`` entries (a scratch block).

    pre: kind.block_size >= 1 and num_tokens >= 0 and num_computed_tokens >= 0 and prefill_end >= 0
    pre: geometry.hash_block_size >= 1 and geometry.granularity >= 1 and geometry.lookahead >= 0
    pre: kind.prefill_checkpoint_alignment is None or kind.prefill_checkpoint_alignment >= 1
    post: __return__ is None or (kind.mode == "align" and kind.num_prefill_checkpoint_blocks > 0 and profile.prefill_checkpoints in POSITIONAL_FORMS)
    post: __return__ is None or __return__[0] == checkpoint_position(profile, num_tokens, geometry.granularity, geometry.drop_eagle, geometry.lookahead)
    post: __return__ is None or checkpoint_valid(num_computed_tokens, num_tokens, __return__[0], geometry.hash_block_size, kind.block_size, kind.prefill_checkpoint_alignment)
    post: __return__ is None or __return__[1] == -(-num_tokens // kind.block_size) - 2 >= 0
    post: __return__ is None or profile.prefill_checkpoints == "chunk-position" or num_tokens >= prefill_end
    post: __return__ is None or __return__[1] >= len(table) or table[__return__[1]] == NULL_BLOCK or (allocated and __return__[1] >= len(table) - kind.num_speculative_blocks)
    post: __return__ is not None or kind.mode != "align" or kind.num_prefill_checkpoint_blocks <= 0 or profile.prefill_checkpoints not in POSITIONAL_FORMS or not checkpoint_valid(num_computed_tokens, num_tokens, checkpoint_position(profile, num_tokens, geometry.granularity, geometry.drop_eagle, geometry.lookahead), geometry.hash_block_size, kind.block_size, kind.prefill_checkpoint_alignment) or (profile.prefill_checkpoints != "chunk-position" and num_tokens < prefill_end) or (-(-num_tokens // kind.block_size) - 2 < len(table) and table[-(-num_tokens // kind.block_size) - 2] != NULL_BLOCK and not (allocated and -(-num_tokens // kind.block_size) - 2 >= len(table) - kind.num_speculative_blocks))
    """  # noqa: E501 - a PEP 316 condition is one line
    if kind.mode != "align" or kind.num_prefill_checkpoint_blocks <= 0:
        return None
    if profile.prefill_checkpoints not in POSITIONAL_FORMS:
        return None
    g = geometry
    position = checkpoint_position(profile, num_tokens, g.granularity, g.drop_eagle, g.lookahead)
    if _since(profile, "prompt-end") and num_tokens < prefill_end:
        return None
    bs = kind.block_size
    if not checkpoint_valid(
        num_computed_tokens, num_tokens, position, g.hash_block_size, bs, kind.prefill_checkpoint_alignment
    ):
        return None
    slot = -(-num_tokens // bs) - 2
    scratch = allocated and slot >= len(table) - kind.num_speculative_blocks
    if slot < len(table) and table[slot] != NULL_BLOCK and not scratch:
        return None
    return position, slot


def checkpoint_prefill_end(
    profile: SemanticsProfile, retention: int | None, num_prompt_tokens: int, num_tokens: int
) -> int:
    """The prefill end a Mamba manager weighs checkpoints against (vLLM 0.31.0
    on): ``max(num_prompt_tokens, num_tokens - 1)`` (a resumed request
    replays its output tokens too) with a retention interval of 0, else 0
    (every chunk may keep its checkpoint). Always 0 before 0.31.0.

    pre: num_prompt_tokens >= 0 and num_tokens >= 0
    post: __return__ == 0 or (retention == 0 and profile.prefill_checkpoints in ("prompt-end", "reachable", "hash-lookahead"))
    post: __return__ == 0 or __return__ == max(num_prompt_tokens, num_tokens - 1)
    post: __return__ != 0 or retention != 0 or profile.prefill_checkpoints not in ("prompt-end", "reachable", "hash-lookahead") or max(num_prompt_tokens, num_tokens - 1) <= 0
    """  # noqa: E501 - a PEP 316 condition is one line
    if not _since(profile, "prompt-end") or retention != 0:
        return 0
    return max(num_prompt_tokens, num_tokens - 1)


def checkpoint_kept(
    profile: SemanticsProfile,
    block_size: int,
    position: int,
    prompt_position: int,
    junction: int,
    retention: int | None,
    num_tokens: int,
    num_prompt_tokens: int,
) -> bool:
    """Whether a checkpoint at ``position`` stays cached after a
    ``cache_blocks`` call up to ``num_tokens`` (else it is *transient* and its
    block loses every key). ``prompt_position`` is the prompt's own
    checkpoint position, ``junction`` the request's shared-prefix boundary (0
    for none), ``retention`` the retention interval.

    * vLLM 0.30.0: transient iff the interval is 0, the call covers fewer
      tokens than the prompt, and the position is not the junction;
    * 0.31.0: the prompt's own position is never transient either;
    * 0.32.0 on: kept iff it is the prompt's position or the junction, or a
      block boundary whose state block the retention mask keeps (every one
      without an interval; a segment end with one; none with 0).

    pre: block_size >= 1 and position >= 0 and prompt_position >= 0 and junction >= 0
    pre: retention is None or retention >= 0
    post: profile.prefill_checkpoints in POSITIONAL_FORMS or __return__
    post: not (position == junction or (position == prompt_position and profile.prefill_checkpoints != "chunk-position")) or __return__
    post: profile.prefill_checkpoints not in ("chunk-position", "prompt-end") or __return__ or (retention == 0 and num_tokens < num_prompt_tokens)
    post: profile.prefill_checkpoints not in ("reachable", "hash-lookahead") or not __return__ or position in (prompt_position, junction) or (position % block_size == 0 and retention != 0)
    post: profile.prefill_checkpoints not in ("reachable", "hash-lookahead") or __return__ or position % block_size != 0 or (retention is not None and (retention == 0 or (retention // block_size > 1 and position // block_size % (retention // block_size) != 0)))
    """  # noqa: E501 - a PEP 316 condition is one line
    form = profile.prefill_checkpoints
    if form not in POSITIONAL_FORMS or position == junction:
        return True
    if form == "chunk-position":
        return not (retention == 0 and num_tokens < num_prompt_tokens)
    if position == prompt_position:
        return True
    if form == "prompt-end":
        return not (retention == 0 and num_tokens < num_prompt_tokens)
    if position % block_size:
        return False
    if retention is None:
        return True
    per = retention // block_size
    return retention > 0 and (per <= 1 or position // block_size % per == 0)


def rekey_checkpoint_block(
    pool: BlockPool, request: Request, b: BlockId, num_tokens: int, group_id: int
) -> BlockHashWithGroupId | None:
    """Key block ``b`` at the request's hash at ``num_tokens`` and nothing
    else (its contents were replaced by the checkpoint state; upstream
    ``BlockPool.cache_partial_block`` with ``replace_existing_hashes``):
    every key it had goes first (one BlockRemoved each, primary first), then
    the new key becomes its primary key, with one BlockStored of one hash
    unit (:func:`kvspec.partial_tail.partial_stored_event`) even if it was
    among the removed keys. The null block is left alone (None).

    pre: num_tokens > 0 and num_tokens % pool.hash_block_size == 0
    pre: num_tokens // pool.hash_block_size <= len(request.block_hashes)
    post: (__return__ is None) == (b == NULL_BLOCK)
    post: __return__ is None or __return__ == make_key(request.block_hashes[num_tokens // pool.hash_block_size - 1], group_id)
    post: __return__ is None or (pool.keys_of(b) == [__return__] and pool.hash_num_tokens[b] == num_tokens)
    post: __return__ is None or not pool.enable_kv_cache_events or pool.events[-1] == partial_stored_event(pool, request, num_tokens, group_id)
    post: __return__ is None or len(pool.events) == len(__old__.pool.events) + (len(__old__.pool.keys_of(b)) + 1 if pool.enable_kv_cache_events else 0)
    post: __return__ is not None or pool.events == __old__.pool.events
    """  # noqa: E501 - a PEP 316 condition is one line
    if b == NULL_BLOCK:
        return None
    key = make_key(request.block_hashes[num_tokens // pool.hash_block_size - 1], group_id)
    pool._evict(b)
    pool.insert_key(b, key, num_tokens)
    if pool.enable_kv_cache_events:
        pool.events.append(partial_stored_event(pool, request, num_tokens, group_id))
    return key
