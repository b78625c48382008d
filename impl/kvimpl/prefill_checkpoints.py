"""Mamba prefill checkpoints (vLLM 0.29.0 on; profile switch ``prefill_checkpoints``).

kvimpl's copy of :mod:`kvspec.prefill_checkpoints` (duplicated on purpose: a
shared helper is a shared bug). An align-mode Mamba table is indexed by
position: slot ``i`` holds the state after ``(i + 1) * block_size`` tokens,
and a chunk ending at ``end`` writes its running state into slot
``cdiv(end, block_size) - 1``, with nulls below it where no step wrote. A
group whose ``num_prefill_checkpoint_blocks`` is above 0 lets a prefill
chunk keep one block more, the slot just below its running state, into which
the model writes an earlier state of the chunk: its *checkpoint*, which a
later request can resume from.

* ``block-aligned`` (vLLM 0.29.0, :func:`num_checkpoint_blocks`): a chunk
  that starts on a block boundary and ends inside a block keeps the slot
  when the table does not hold it yet (past its end, or null). The slot
  takes a fresh block whose state is the block boundary below the chunk
  end, so the ordinary full-block caching keys it; nothing else is kept.
* the positional forms (vLLM 0.30.0 on, :func:`chunk_checkpoint`): the
  checkpoint sits at a *position*, :func:`checkpoint_position` of the chunk
  end, possibly inside a block. The chunk must be able to export it
  (:func:`checkpoint_valid`), and the slot must be free or, for a request
  allocated before, one of its speculative scratch blocks. The manager keeps
  ``(position, slot)`` per request until its next estimate, and after the
  full-block caching keys the slot's block at the position and nowhere else
  (:func:`rekey_checkpoint_block`), or, when :func:`checkpoint_kept` calls
  the checkpoint transient, strips the block of every key. A chunk with a
  checkpoint registers no Mamba tail entry (:mod:`kvimpl.mamba_tail`).

  - ``chunk-position`` (0.30.0): every chunk that can export a checkpoint
    gets one; a transient one is any checkpoint cached, with a retention
    interval of 0, by a call that covers less than the prompt; the estimate
    of an allocated request's checkpoint chunk is its whole shortfall;
    scratch blocks stay in place in a checkpoint chunk.
  - ``prompt-end`` (0.31.0): with a retention interval of 0 only a chunk
    reaching the prefill end (:func:`checkpoint_prefill_end`) gets one, and
    the prompt's own checkpoint is never transient; estimates are capped.
  - ``reachable`` (0.32.0): positions are multiples of the hit alignment
    (:func:`checkpoint_granularity`), EAGLE's step back starts at the chunk
    end itself; a checkpoint other than the prompt's or the junction's stays
    cached only on a block boundary the retention mask keeps; scratch
    blocks move, except the one in the checkpoint's slot.
  - ``hash-lookahead`` (0.33.0 on): without EAGLE the position steps back
    over the pool's look-ahead hash tokens.

The native core does not model checkpoints: a configuration with them runs
on the pure-Python manager (:func:`kvimpl.config_rules.features_needed`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvimpl.block_pool import NULL_BLOCK, TailBlockPool
from kvimpl.partial_tail import partial_stored_event
from kvspec.block_pool import BlockId
from kvspec.config import Mamba
from kvspec.hashing import BlockHashWithGroupId, make_key
from kvspec.profiles import SemanticsProfile
from kvspec.request import Request

FORMS: tuple[str, ...] = ("none", "block-aligned", "chunk-position", "prompt-end", "reachable", "hash-lookahead")
"""The values of the profile switch ``prefill_checkpoints``, in release order."""

POSITIONAL_FORMS: frozenset[str] = frozenset(FORMS[2:])
"""The forms whose checkpoint has a position of its own (vLLM 0.30.0 on)."""


@dataclass(frozen=True, slots=True)
class CheckpointGeometry:
    """The group's facts a checkpoint position depends on, besides the chunk
    (kvimpl's copy of kvspec's value type of the same name)."""

    hash_block_size: int
    """A chunk with a checkpoint starts on a multiple of it, and its position lies at least this far past the start."""
    granularity: int
    """Positions are multiples of it (:func:`checkpoint_granularity`)."""
    drop_eagle: bool
    """The model uses EAGLE: the position is one granularity unit lower."""
    lookahead: int
    """The pool's look-ahead hash tokens (vLLM 0.33.0 on steps back over them)."""


def checkpoint_enabled(kind: Mamba, form: str) -> bool:
    """Whether a group of ``kind`` can take checkpoints under the release's
    form ``form`` of the switch: align mode, a positive count, and a release
    that has checkpoints (any form but ``"none"``).

    post: not __return__ or (kind.mode == "align" and kind.num_prefill_checkpoint_blocks > 0 and form != "none")
    """
    return kind.mode == "align" and kind.num_prefill_checkpoint_blocks > 0 and form in FORMS[1:]


def positional_checkpoints(kind: Mamba, profile: SemanticsProfile) -> bool:
    """Whether a group of ``kind`` takes checkpoints with a position of their
    own (vLLM 0.30.0 on): :func:`checkpoint_enabled` under a positional form.

    post: __return__ == (checkpoint_enabled(kind, profile.prefill_checkpoints) and profile.prefill_checkpoints in POSITIONAL_FORMS)
    """  # noqa: E501 - a PEP 316 condition is one line
    form = profile.prefill_checkpoints
    return form in POSITIONAL_FORMS and checkpoint_enabled(kind, form)


def num_checkpoint_blocks(block_size: int, table: Sequence[int], num_tokens: int, num_computed_tokens: int) -> int:
    """vLLM 0.29.0's rule: 1 when a chunk from ``num_computed_tokens`` to
    ``num_tokens`` of a request whose table is ``table`` (before this step's
    hits) keeps a checkpoint slot, else 0 (in a group where
    :func:`checkpoint_enabled` under the ``block-aligned`` form).

    pre: block_size >= 1 and num_tokens >= 0 and num_computed_tokens >= 0
    post: __return__ in (0, 1)
    """
    if num_tokens % block_size == 0 or num_computed_tokens % block_size != 0:
        return 0
    slot = (num_tokens + block_size - 1) // block_size - 2
    if slot < 0:
        return 0
    return 1 if slot >= len(table) or table[slot] == NULL_BLOCK else 0


def checkpoint_granularity(profile: SemanticsProfile, hash_block_size: int, hit_alignment: int) -> int:
    """The step between checkpoint positions: the hash block, or from vLLM
    0.32.0 on the coordinator's hit alignment (hits end only on its
    multiples, so a checkpoint elsewhere could not be resumed from).

    pre: hash_block_size >= 1 and hit_alignment >= 1
    post: __return__ in (hash_block_size, hit_alignment)
    """
    return hit_alignment if _at_least(profile, "reachable") else hash_block_size


def checkpoint_position(
    profile: SemanticsProfile, num_tokens: int, granularity: int, drop_eagle: bool, lookahead: int
) -> int:
    """Where the checkpoint of a chunk (or prompt) ending at ``num_tokens``
    lies: the largest multiple of ``granularity`` not above a cap, and never
    below 0. The cap is one token short of the end (a resend recomputes the
    last token), from vLLM 0.33.0 on ``max(1, lookahead)`` tokens short (the
    hash there needs the look-ahead tokens). Under EAGLE the result is one
    ``granularity`` lower, counted from one token short of the end before
    0.32.0 and from the end itself after.

    pre: num_tokens >= 0 and granularity >= 1 and lookahead >= 0
    post: __return__ >= 0 and __return__ % granularity == 0
    post: __return__ < num_tokens or __return__ == 0
    """
    if drop_eagle:
        cap = num_tokens if _at_least(profile, "reachable") else num_tokens - 1
        position = cap - cap % granularity - granularity
    else:
        short = max(1, lookahead) if _at_least(profile, "hash-lookahead") else 1
        cap = num_tokens - short
        position = cap - cap % granularity
    return position if position > 0 else 0


def checkpoint_valid(
    num_computed_tokens: int,
    num_tokens: int,
    position: int,
    hash_block_size: int,
    block_size: int,
    alignment: int | None,
) -> bool:
    """Whether the chunk ``[num_computed_tokens, num_tokens)`` can export the
    state at ``position`` (vLLM 0.30.0 on). It needs an ``alignment`` (None:
    the group takes no positional checkpoints); the chunk starts on a hash
    boundary; the position lies inside the chunk, at least one hash block
    past its start and a multiple of ``alignment`` tokens past it; and the
    checkpoint slot, the one below the running state, lies above the slot of
    the state the chunk resumes from.

    pre: num_computed_tokens >= 0 and num_tokens >= 0 and position >= 0
    pre: hash_block_size >= 1 and block_size >= 1 and (alignment is None or alignment >= 1)
    post: not __return__ or (alignment is not None and num_computed_tokens < position < num_tokens)
    post: not __return__ or (-(-num_tokens // block_size) - 2 >= 0)
    """
    if alignment is None or num_computed_tokens % hash_block_size:
        return False
    offset = position - num_computed_tokens
    if offset < hash_block_size or offset <= 0 or position >= num_tokens or offset % alignment:
        return False
    slot = (num_tokens + block_size - 1) // block_size - 2
    return slot > (num_computed_tokens - 1) // block_size


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
    """The ``(position, slot)`` of the checkpoint a chunk of an align-mode
    group takes under a positional form (vLLM 0.30.0 on), or None. The chunk
    covers ``[num_computed_tokens, num_tokens)``; ``table`` is the request's
    table before this step's hits and ``allocated`` whether it was allocated
    before; ``prefill_end`` (0 for none) is the end a chunk must reach from
    vLLM 0.31.0 on (:func:`checkpoint_prefill_end`). The position is
    :func:`checkpoint_position` of the chunk end and must pass
    :func:`checkpoint_valid`; the slot is ``cdiv(num_tokens, block_size) -
    2`` and must be past the table, null, or (an allocated request) among
    its ``num_speculative_blocks`` last entries, a scratch block.

    pre: kind.block_size >= 1 and num_tokens >= 0 and num_computed_tokens >= 0 and prefill_end >= 0
    pre: geometry.hash_block_size >= 1 and geometry.granularity >= 1 and geometry.lookahead >= 0
    pre: kind.prefill_checkpoint_alignment is None or kind.prefill_checkpoint_alignment >= 1
    post: __return__ is None or (kind.mode == "align" and kind.num_prefill_checkpoint_blocks > 0)
    post: __return__ is None or profile.prefill_checkpoints in POSITIONAL_FORMS
    post: __return__ is None or __return__[1] == -(-num_tokens // kind.block_size) - 2 >= 0
    """
    if kind.mode != "align" or kind.num_prefill_checkpoint_blocks <= 0:
        return None
    if profile.prefill_checkpoints not in POSITIONAL_FORMS:
        return None
    if num_tokens < prefill_end and _at_least(profile, "prompt-end"):
        return None
    g, bs = geometry, kind.block_size
    position = checkpoint_position(profile, num_tokens, g.granularity, g.drop_eagle, g.lookahead)
    alignment = kind.prefill_checkpoint_alignment
    if not checkpoint_valid(num_computed_tokens, num_tokens, position, g.hash_block_size, bs, alignment):
        return None
    slot = (num_tokens + bs - 1) // bs - 2
    held = slot < len(table) and table[slot] != NULL_BLOCK
    if held and not (allocated and slot >= len(table) - kind.num_speculative_blocks):
        return None
    return position, slot


def checkpoint_prefill_end(
    profile: SemanticsProfile, retention: int | None, num_prompt_tokens: int, num_tokens: int
) -> int:
    """The end a chunk must reach to take a checkpoint (0: any chunk may):
    from vLLM 0.31.0 on, with a retention interval of exactly 0, the larger
    of the prompt and all tokens but the last (a resumed request replays
    its outputs too); otherwise 0.

    pre: num_prompt_tokens >= 0 and num_tokens >= 0
    post: __return__ == 0 or __return__ == max(num_prompt_tokens, num_tokens - 1)
    post: __return__ == 0 or retention == 0
    """
    if retention != 0 or not _at_least(profile, "prompt-end"):
        return 0
    return num_prompt_tokens if num_prompt_tokens > num_tokens - 1 else num_tokens - 1


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
    """Whether a checkpoint at ``position`` keeps its key after a
    ``cache_blocks`` call up to ``num_tokens``; a checkpoint that does not is
    *transient* and its block loses every key. ``prompt_position`` is where
    the prompt's own checkpoint lies, ``junction`` the request's
    shared-prefix boundary (0: none), ``retention`` the retention interval.
    The junction's checkpoint is always kept. Otherwise: vLLM 0.30.0 drops
    one when the interval is 0 and the call covers less than the prompt;
    0.31.0 the same except for the prompt's own; from 0.32.0 on only the
    prompt's own and block boundaries the retention mask keeps survive
    (every boundary without an interval, none with 0, a multiple of the
    interval's blocks otherwise).

    pre: block_size >= 1 and position >= 0 and prompt_position >= 0 and junction >= 0
    pre: retention is None or retention >= 0
    post: profile.prefill_checkpoints in POSITIONAL_FORMS or __return__
    post: position != junction or __return__
    """
    form = profile.prefill_checkpoints
    if form not in POSITIONAL_FORMS or position == junction:
        return True
    short_of_prompt = retention == 0 and num_tokens < num_prompt_tokens
    if form == "chunk-position":
        return not short_of_prompt
    if position == prompt_position:
        return True
    if form == "prompt-end":
        return not short_of_prompt
    if position % block_size != 0:
        return False
    if retention is None:
        return True
    every = retention // block_size
    return retention > 0 and (every <= 1 or (position // block_size) % every == 0)


def rekey_checkpoint_block(
    pool: TailBlockPool, request: Request, b: BlockId, num_tokens: int, group_id: int
) -> BlockHashWithGroupId | None:
    """Key block ``b`` at the request's hash after ``num_tokens`` tokens and
    at nothing else: its contents are now the checkpoint's state. Every key
    it had goes first (one BlockRemoved each, primary first), then the new
    key becomes its primary key with one BlockStored of one hash unit
    (:func:`kvimpl.partial_tail.partial_stored_event`), even when it was
    among the keys just removed. Returns the key; the null block is left
    alone (None).

    pre: num_tokens > 0 and num_tokens % pool.hash_block_size == 0
    pre: num_tokens // pool.hash_block_size <= len(request.block_hashes)
    post: (__return__ is None) == (b == NULL_BLOCK)
    post: __return__ is None or (pool.keys_of(b) == [__return__] and pool.hash_num_tokens[b] == num_tokens)
    """
    if b == NULL_BLOCK:
        return None
    key = make_key(request.block_hashes[num_tokens // pool.hash_block_size - 1], group_id)
    pool._evict(b)
    pool.insert_key(b, key, num_tokens)
    if pool.enable_kv_cache_events:
        pool.events.append(partial_stored_event(pool, request, num_tokens, group_id))
    return key


def _at_least(profile: SemanticsProfile, form: str) -> bool:
    """The profile's form is ``form`` or one of a later release."""
    return FORMS.index(profile.prefill_checkpoints) >= FORMS.index(form)
