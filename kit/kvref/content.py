"""What KV each block holds: the model behind the content oracle.

The KV of one position is a function of the request's inputs up to and
including that position (its tokens, and what replaces or conditions them:
multimodal embeddings, prompt embeddings, a LoRA adapter). Two positions hold
the same KV exactly when those input prefixes are equal, so a position's KV is
named here by an integer, the *prefix id* of its input prefix
(:class:`PrefixIds`, interned, so that equal prefixes and only they get equal
ids: no hash, no collision). A block holds one value per slot
(:class:`BlockContents`): a prefix id written by a step that computed it or a
connector load that filled it, or one of the markers :data:`UNWRITTEN`,
:data:`ZERO`, :data:`GARBAGE`.

Which positions a step reads, per attention kind (:func:`read_span`): full
attention, MLA and SinkFull read every earlier position; a sliding window of
``w`` reads the last ``w`` positions of each token it computes; chunked-local
attention of chunk ``c`` reads from the chunk's start.

A cross-attention group holds the KV of the encoder's output, ``E`` positions
sized by the encoder input: the first step a request runs after its
cross-attention blocks are handed out writes all of them (the encoder runs in
that step), and every step of the request reads all of them. These blocks are
never cached, so an encoder position's KV is named by the request itself (its
id and prompt, :meth:`RequestPrefixes.encoder`): no other request's encoder KV
is the right KV. The ring kinds are not checked (:func:`checked_kind`): which
positions a step reads from its ring follows the compression ratio of the
model's compressor (vLLM's ``CircularBufferSpec`` holds the raw keys of the
token group being compressed), and a cache configuration does not carry it.

A Mamba group's block holds no per-position KV but one recurrent state: the
state after a prefix of the request's inputs, named by the prefix id of that
prefix (its first slot holds it; the markers mean the same); where steps and
hits read and write states is :mod:`kvref.content_states`.

NOTE: a cache salt changes the block hash but not the KV (the model never
sees it), so it is not part of a prefix id: an engine that serves KV across
salts serves the right KV, and isolating tenants is a property of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvspec.config import (
    MLA,
    AttentionKind,
    ChunkedLocal,
    FullAttention,
    KVCacheConfig,
    SinkFullAttention,
    SlidingWindow,
)
from kvspec.request import Request

UNWRITTEN = -1
"""A slot no step and no load has written since the pool was built."""
ZERO = -2
"""A slot zeroed (a block listed for zeroing by ``take_new_block_ids``)."""
GARBAGE = -3
"""A slot, or a Mamba state, that a connector load failing part-way was to fill and left in an unknown state."""
FOREIGN = -4
"""A slot of a block another KV-cache group wrote last (its bytes are another layer's KV)."""
STALE = -5
"""A Mamba state the oracle does not check: left behind a boundary (a step or
load of an ``align`` group started inside the block and ended past it, so
the block holds the state at that start while its tokens fill the block,
:func:`kvref.content_states.stale_index`) by a chunk the release's scheduler never schedules
(vLLM 0.26.0 on)."""
MARKERS = {
    UNWRITTEN: "never written", ZERO: "zeroed", GARBAGE: "left by a failed load", FOREIGN: "another group's KV",
    STALE: "a state not checked (left behind a boundary)",
}


def checked_kind(kind: AttentionKind) -> bool:
    """Whether the content oracle checks a group of ``kind`` position by
    position (cross attention is checked over its encoder positions, Mamba
    by its states: :func:`kvref.content_states.mamba_checked`)."""
    return isinstance(kind, FullAttention | MLA | SinkFullAttention | SlidingWindow | ChunkedLocal)








def read_span(kind: AttentionKind, start: int, end: int) -> range:
    """Positions a step computing ``[start, end)`` reads in a group of ``kind``
    (its own new positions included).

    pre: 0 <= start <= end
    """
    if isinstance(kind, SlidingWindow):
        return range(max(0, start - kind.window + 1), end)
    if isinstance(kind, ChunkedLocal):
        return range(start // kind.chunk * kind.chunk, end)
    return range(0, end)


class PrefixIds:
    """Interned input prefixes: ``child(parent, input)`` is the id of the
    prefix ``parent`` followed by ``input``; equal prefixes get equal ids."""

    def __init__(self) -> None:
        """Only the empty prefixes (one per LoRA root) so far."""
        self._ids: dict[tuple[int, Any], int] = {}

    def child(self, parent: int, key: Any) -> int:
        """The id of ``parent`` followed by the input ``key``."""
        found = self._ids.get((parent, key))
        if found is None:
            found = self._ids[(parent, key)] = len(self._ids) + 1
        return found

    def root(self, request: Request) -> int:
        """The empty prefix of ``request``'s model: a LoRA adapter conditions every position."""
        lora = request.extra.lora
        return 0 if lora is None else self.child(0, ("lora", lora.name, lora.adapter_id))


def input_key(request: Request, position: int, drafts: Sequence[int] = ()) -> Any:
    """What the model sees at ``position`` of ``request``: a multimodal
    embedding's place, a prompt embedding's row, else the token (past the
    request's tokens: the draft token there; past the drafts, a token the
    scheduler never learnt, which no other input equals)."""
    extra = request.extra
    if position < request.num_prompt_tokens:
        for f in extra.mm_features:
            if f.offset <= position < f.offset + f.length:
                return ("mm", f.identifier, position - f.offset)
        if extra.prompt_embeds is not None:
            return ("embeds", extra.prompt_embeds[position])
    if position < request.num_tokens:
        return request.all_token_ids[position]
    if position - request.num_tokens < len(drafts):
        return drafts[position - request.num_tokens]
    # a step in flight computes a token the scheduler never learns (its output was dropped)
    return ("unknown", position)


class RequestPrefixes:
    """Prefix ids of each request's positions, extended as its tokens grow."""

    def __init__(self, ids: PrefixIds) -> None:
        """No request yet."""
        self.ids = ids
        self._known: dict[str, tuple[Request, list[int]]] = {}

    def of(self, request: Request, end: int, drafts: Sequence[int] = ()) -> list[int]:
        """Prefix ids of positions ``0 .. end - 1`` (positions past the
        request's tokens take ``drafts``; those are not remembered)."""
        old = self._known.get(request.request_id)
        ids = old[1] if old is not None and _same_inputs(old[0], request) else []
        known = (request, ids)
        real = min(end, request.num_tokens)
        parent = ids[-1] if ids else self.ids.root(request)
        for p in range(len(ids), real):
            parent = self.ids.child(parent, input_key(request, p))
            ids.append(parent)
        self._known[request.request_id] = known
        if end <= len(ids):
            return ids[:end]
        out = list(ids)
        for p in range(len(ids), end):
            parent = self.ids.child(parent, input_key(request, p, drafts))
            out.append(parent)
        return out

    def encoder(self, request: Request, num_encoder_tokens: int) -> list[int]:
        """Ids of the KV of ``request``'s encoder positions ``0 .. num_encoder_tokens - 1``
        (its cross-attention blocks' content), named after its id and prompt."""
        prompt = self.of(request, request.num_prompt_tokens)
        parent = prompt[-1] if prompt else self.ids.root(request)
        return [self.ids.child(parent, ("encoder", request.request_id, e)) for e in range(num_encoder_tokens)]

    def forget(self, request_id: str) -> None:
        """Drop what is remembered of ``request_id``."""
        self._known.pop(request_id, None)


def _same_inputs(old: Request, new: Request) -> bool:
    """Whether ``new`` continues ``old`` (same id reused for the same inputs)."""
    n = old.num_tokens
    return (
        old.extra == new.extra
        and old.num_prompt_tokens == new.num_prompt_tokens
        and new.all_token_ids[:n] == old.all_token_ids
    )


class BlockContents:
    """The value of every slot of every block, and which group wrote it last."""

    def __init__(self, config: KVCacheConfig) -> None:
        """Every block unwritten."""
        self.config = config
        self.kinds = config.manager_groups()
        self.slots: dict[int, list[int]] = {}
        self.owner: dict[int, int] = {}
        self.writes = 0
        """Slot writes so far (a logical clock)."""
        self.written_at: dict[int, list[int]] = {}
        """Per block, the clock of each slot's last write (0: before the block was last handed out)."""
        self.handed: dict[int, int] = {}
        """Per block, the clock when it was last handed out as a new block."""
        self.drained = 0
        """The clock of the last ``take_new_block_ids`` (:meth:`listed_for_zeroing`)."""
        self.listed: dict[int, int] = {}
        """Per block, the clock as of which its zeroing wipes it (:meth:`listed_for_zeroing`)."""
        self.relisting = 0
        """The clock of the last ``record_blocks_for_zeroing`` (:meth:`relisted`)."""

    def block_size(self, group: int) -> int:
        """Slots per block of ``group``."""
        return self.kinds[group].block_size

    def value(self, block: int, group: int, slot: int) -> int:
        """What ``slot`` of ``block`` holds for a reader of ``group``."""
        if block not in self.slots:
            return UNWRITTEN
        if self.owner[block] != group:
            return FOREIGN
        return self.slots[block][slot]

    def write(self, block: int, group: int, slot: int, value: int) -> None:
        """``value`` into ``slot`` of ``block`` (written by ``group``)."""
        if self.owner.get(block) != group:
            size = self.block_size(group)
            self.slots[block] = [FOREIGN if block in self.slots else UNWRITTEN] * size
            self.written_at[block] = [0] * size
            self.owner[block] = group
        self.writes += 1
        self.slots[block][slot] = value
        self.written_at[block][slot] = self.writes

    def handed_out(self, block: int) -> None:
        """``block`` was just handed out as a new block."""
        self.writes += 1
        self.handed[block] = self.writes

    def listed_for_zeroing(self, blocks: list[int]) -> None:
        """``take_new_block_ids`` listed ``blocks``: note as of when each one's
        zeroing counts, then mark the drain.

        A block handed out since the last drain was listed when it was handed
        out (a manager lists the blocks it allocates), so its zeroing runs
        before every write since then. A block handed out earlier had its own
        listing drained already: it was listed again later (an adopted prefix
        hit, blocks a failed load left unwritten), at the earliest right after
        that drain, so every slot written before the drain is wiped (cached KV
        that a hit serves included), or, after a ``record_blocks_for_zeroing``
        since that drain, every slot written before that call: it re-lists
        blocks a failed connector load wrote in part, and the load's writes
        came before the failure it answers (:meth:`relisted`)."""
        for block in blocks:
            handed = self.handed.get(block, 0)
            self.listed[block] = handed if handed > self.drained else max(self.drained, self.relisting)
        self.writes += 1
        self.drained = self.writes

    def relisted(self) -> None:
        """``record_blocks_for_zeroing`` ran: what it lists is zeroed after every write so far."""
        self.writes += 1
        self.relisting = self.writes

    def zero(self, block: int) -> None:
        """Zero ``block`` as of the moment it was listed for zeroing
        (:meth:`listed_for_zeroing`; else as of its handing out): the slots
        written since then keep their values (the zeroing ran before those
        writes)."""
        since = self.listed.get(block, self.handed.get(block, 0))
        if block not in self.slots:
            return
        marks = self.written_at[block]
        for slot, when in enumerate(marks):
            if when <= since:
                self.slots[block][slot] = ZERO

    def copy(self, source: int, dest: int) -> None:
        """A device copy of ``source`` into ``dest`` (copy-on-write)."""
        if source not in self.slots:
            self.slots.pop(dest, None)
            self.owner.pop(dest, None)
            return
        self.writes += 1
        self.slots[dest] = list(self.slots[source])
        self.owner[dest] = self.owner[source]
        self.written_at[dest] = [self.writes] * len(self.slots[source])


def describe(value: int, writers: dict[int, str], of: str = "KV") -> str:
    """What a slot holds, in words (``writers``: who wrote each prefix id;
    ``of``: what a prefix id names there, ``KV`` or a Mamba ``state``)."""
    if value in MARKERS:
        return MARKERS[value]
    return f"the {of} of another prefix (written for {writers.get(value, 'an unknown request')})"
