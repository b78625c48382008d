"""The safety monitor's records and state (:mod:`kvref.safety` composes the monitor).

:class:`MonitorState` holds what :class:`kvref.safety.SafetyMonitor` keeps
about blocks, steps, loads and the registered defects' marks; the layers
built on it, one module each, add the checks: :mod:`kvref.safety_causes`
(which registered defect explains a wrong slot), :mod:`kvref.safety_loads`
(connector loads and zeroing), :mod:`kvref.safety_steps` (what a step does
on the device) and :mod:`kvref.safety` (what the lockstep tells).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvref.content import BlockContents, PrefixIds, RequestPrefixes, checked_kind
from kvref.content_states import checkpoint_write, mamba_checked, positional_checkpoint_write, state_writes
from kvref.ops import RequestBook
from kvspec.config import CrossAttention, KVCacheConfig, Mamba
from kvspec.partial_hits import partial_hash_hits_enabled

Json = Any
COMPARED = {"KV": "slots compared", "state": "states compared", "encoder KV": "encoder slots compared"}
"""The run's count of each kind of slot :meth:`kvref.safety_causes.MonitorCauses._compare` compares."""
Tables = tuple[tuple[int, ...], ...]


class SafetyViolation(Exception):
    """A safety oracle failed.

    Attributes:
        oracle: ``content`` or ``inflight``.
        defect: The registered vLLM safety defect that explains it
            (:mod:`kvref.safety_defects`), or None.
    """

    def __init__(self, oracle: str, message: str, defect: str | None = None) -> None:
        """Remember which oracle failed."""
        super().__init__(message)
        self.oracle = oracle
        self.defect = defect


@dataclass
class StepEntry:
    """One request's part of a step: the positions it computes (``start`` to
    ``end``), with the table the worker got when the step was scheduled."""

    rid: str
    start: int
    end: int
    tables: Tables
    drafts: tuple[int, ...] = ()
    """Draft tokens of the positions past the request's tokens (speculative decoding)."""
    failed_skips: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    """The request's null entries its failed connector load left when the step was scheduled:
    (group, table index) -> (the load's end, the valid prefix); see ``SafetyMonitor.failed_skips``."""
    load: Load | None = None
    """A synchronous connector load that runs in this step, kept here once its request was freed
    while the step was in flight (the request may be admitted again, with a load of its own)."""
    encoder: int = 0
    """Encoder positions the step reads in each cross-attention group."""
    encoder_write: bool = False
    """Whether the step writes them first (the first step after the blocks were handed out)."""
    table: int = 0
    """Which of the request's tables (0 for its first) the step was allocated in: a request freed
    and given a new table while the step was in flight has a later one by the time it runs."""


@dataclass
class Step:
    """A scheduler step: its entries, and the blocks they use (known once dispatched)."""

    number: int
    entries: list[StepEntry] = field(default_factory=list)
    uses: dict[int, str] = field(default_factory=dict)
    """Block -> what the step does with it, e.g. ``r2 reads position 5``."""
    zeros: list[int] = field(default_factory=list)
    """Blocks the step zeroes before it runs (listed by ``take_new_block_ids`` while it was open)."""
    copies: list[tuple[int, int]] = field(default_factory=list)
    """Copy-on-write copies (source, destination) the step makes before it runs."""


@dataclass
class Withdrawal:
    """A step taken back out of its scheduling pass: ``rid``'s positions ``start`` to ``end``."""

    rid: str
    start: int
    end: int
    clock: int
    """The contents' clock as of which nothing wrote the step's blocks (what was written later was not the step)."""
    after: int
    """The last step in flight at the withdrawal (0 once it has run: the steps dispatched before the
    withdrawal write first, so :attr:`clock` moves past their writes then)."""
    entry: StepEntry | None = None
    """The withdrawn step, while the steps in flight at the withdrawal have not run: the Mamba block
    it leaves behind (:meth:`kvref.safety_causes.MonitorCauses._stale`) is known once they have."""


@dataclass
class Load:
    """A connector load in progress: ``rid``'s positions ``start`` to ``end``."""

    rid: str
    start: int
    end: int
    tables: Tables
    synchronous: bool = True
    """Whether the step that issues it waits for it (else the request waits: ``delay_cache_blocks``)."""
    blocks: dict[int, int] = field(default_factory=dict)
    """Destination block -> group."""
    read: set[int] = field(default_factory=set)
    """The destinations that hold a loaded position the request still reads from the load's end on
    (a sliding or chunked window drops the others: zeroing them wipes KV nothing reads)."""
    starts: tuple[int, ...] = ()
    """Per group, where the load starts when a connector's lookup left some groups' hits behind
    the reported one (empty: ``start`` in every group); see :meth:`start_of`."""

    def start_of(self, g: int) -> int:
        """Where the load starts in group ``g``: a lagging group's own hit, which the
        connector fills on from (vLLM's NIXL connector loads every block of the request
        that holds no cached hit), else :attr:`start`."""
        return self.starts[g] if self.starts else self.start


class MonitorState:
    """What the safety monitor keeps (:class:`kvref.safety.SafetyMonitor`, which
    composes the layers above it) and the lookups every layer makes.

    Args:
        config: The configuration the adapter runs.
        book: The lockstep's request values (read, never changed).
        zeroing: Whether blocks ``take_new_block_ids`` lists are zeroed (vLLM
            zeroes them when the model needs it: a Mamba group).
        skip_load_zeroing: Whether the scheduler leaves the destinations of
            connector loads out of the zeroing (vLLM's scheduler from 0.26.0 on).
            The ids ``get_zeroing_block_ids_in_range`` answers (0.26.0 to
            0.31.0) are left out of the next drained list in any case.

            The state machine clears it where its scheduler model drains the
            list every pass and asks for the skips as the release's scheduler
            does (``Scheduler.drain_zeroing``, ``Scheduler.zeroing_skip``): the
            monitor then zeroes what the list holds, and a load's destination
            on it is a violation whatever the release.
    """

    def __init__(
        self,
        config: KVCacheConfig,
        book: RequestBook,
        zeroing: bool | None = None,
        skip_load_zeroing: bool = True,
        counts: Counter[str] | None = None,
    ) -> None:
        """Nothing written yet."""
        self.config = config
        self.book = book
        self.kinds = config.manager_groups()
        self.checked = tuple(g for g, k in enumerate(self.kinds) if checked_kind(k))
        self.mamba = tuple(g for g, k in enumerate(self.kinds) if mamba_checked(k))
        """Mamba groups whose states the content oracle checks."""
        self.cross = tuple(g for g, k in enumerate(self.kinds) if isinstance(k, CrossAttention))
        """Cross-attention groups (their encoder positions are checked)."""
        self.encoders: dict[str, list[int]] = {}
        """Requests whose cross-attention blocks are handed out: rid -> [encoder positions,
        whether a step that writes them was scheduled]."""
        self.drafted: set[str] = set()
        """Requests a step with draft tokens ran for since their table was new, in a Mamba group
        without a speculative block per draft (no release runs that): their Mamba states are not
        checked (:meth:`_run_states`)."""
        self.tables_given: dict[str, int] = {}
        """How many tables each request had before its current one (:attr:`StepEntry.table`)."""
        self.worker_rows: dict[tuple[str, int, int], tuple[int, int]] = {}
        """The worker's place of each request's state in a Mamba ``align`` group with speculative
        blocks, as of its latest step: (request, group, table) -> (the running block's table index,
        the accepted drafts past it whose state the next step reads). A new table starts with no
        place (the worker forgets a finished or preempted request's place); a step of the old one
        still in flight keeps to the old one's."""
        self.scratch: dict[int, tuple[int, str, int, int]] = {}
        """Speculative blocks of Mamba ``align`` steps without draft tokens, which such a step never
        writes: block -> (group, request, the step's end, the clock then). Read as a state before
        anything writes it or hands it out anew, it meets
        :data:`kvref.safety_defects.CHECKPOINT_SCRATCH` (:meth:`_attributed`)."""
        self.checkpoints: dict[int, tuple[int, str, int, int, int]] = {}
        """Mamba blocks a prefill checkpoint wrote the state at a position below the block's end into:
        block -> (group, request, the position, the block's end, the clock then). Served as the state at
        the block's end before anything writes it or hands it out anew, it meets
        :data:`kvref.safety_defects.CHECKPOINT_REKEYED` (:meth:`_attributed`)."""
        self.furthest: dict[str, int] = {}
        """The furthest end any step of each request was allocated for since its table is new (draft
        tokens counted, as the scheduler counts them while they are in flight)."""
        self.rolled_back: set[str] = set()
        """Requests whose drafts were rejected since their table is new: their later steps run below
        positions their allocations already counted computed (:data:`kvref.safety_defects.MAMBA_REJECTED_NULL`)."""
        self.rejected: dict[str, int] = {}
        """The draft tokens the step being processed rejected, per request (:meth:`processed`)."""
        self.fine_hits = partial_hash_hits_enabled(config)
        """Hits may end inside a block, served by copy-on-write: any allocation may leave copies."""
        self.zeroing = any(isinstance(k, Mamba) for k in config.groups) if zeroing is None else zeroing
        self.skip_load_zeroing = skip_load_zeroing
        self.range_skip: set[int] = set()
        """Block ids ``get_zeroing_block_ids_in_range`` answered since the last ``take_new_block_ids``:
        vLLM's scheduler (0.26.0 to 0.31.0) leaves them out of the zeroing list it drains next."""
        self.behind: dict[int, tuple[str, int, int, int]] = {}
        """Mamba ``align`` blocks a chunk starting inside them left behind (they keep the state at the
        chunk's start while the manager caches them as the state at their end), under a release that
        schedules such chunks: block -> (request, the chunk's start, its end, the clock then). Read by a
        step or a hit before anything writes it again, it meets
        :data:`kvref.safety_defects.MAMBA_ALIGN_MIDBLOCK` (:meth:`_attributed`)."""
        self.contents = BlockContents(config)
        self.prefixes = RequestPrefixes(PrefixIds())
        self.writers: dict[int, str] = {}
        self.loads: dict[str, Load] = {}
        self.pipelined = False
        """Whether steps wait for :meth:`dispatch` and :meth:`processed` (the async pipeline)."""
        self.open = Step(1)
        self.in_flight: list[Step] = []
        self.counts: Counter[str] = Counter() if counts is None else counts
        """What the oracles did: ``slots compared``, ``steps run``, ``hits checked``,
        ``loads``, ``blocks zeroed``, ``groups not checked`` (shared with the run's statistics)."""
        self.counts["groups not checked"] += len(self.kinds) - len(self.checked) - len(self.mamba) - len(self.cross)
        self.early: dict[tuple[str, int, int], tuple[int, int]] = {}
        """Blocks the release freed below a window while a step in flight still read them
        (a release before vLLM 0.26.0 frees on the computed tokens, steps in flight included):
        (request, group, table index) -> (block, the step that freed it), kept until that
        step's output is processed. See :mod:`kvref.safety_defects`."""
        self.failed_skips: dict[str, dict[tuple[int, int], tuple[int, int]]] = {}
        """Null table entries of a request whose connector load failed part-way, as the failure
        left them: request -> (group, table index) -> (the load's end, the valid prefix). The
        admission skipped them for the window of the load's end; a step that recomputes from the
        valid prefix and reads one meets :data:`kvref.safety_defects.FAILED_LOAD_WINDOW` (an attention
        group) or :data:`kvref.safety_defects.MAMBA_FAILED_LOAD` (the state a Mamba group starts from)."""
        self.failed_states: dict[int, tuple[str, int, int]] = {}
        """Mamba blocks a connector load that failed part-way was to fill a state into (past the
        valid prefix), holding :data:`kvref.content.GARBAGE` since: block -> (request, the valid
        prefix, the clock of that mark). Read by a step or a hit before anything writes it again,
        it meets :data:`kvref.safety_defects.MAMBA_FAILED_LOAD` (:meth:`_failed_state`)."""
        self.freed: set[str] = set()
        """Requests freed since their latest allocation: the next one starts a new table."""
        self.windowless: dict[tuple[str, int, int], int] = {}
        """Null entries a request's latest hit returned inside the window of its end: (request, group,
        table index) -> the hit's length. A step that reads one meets
        :data:`kvref.safety_defects.SWA_EAGLE_WINDOW_LOST`."""
        self.unfenced: dict[int, int] = {}
        """Blocks of a request freed at once (``free``, no deferred free) while a step in flight still
        used them: block -> the last such step, kept until its output is processed. A connector load
        into one meets :data:`kvref.safety_defects.UNFENCED_FREE`."""
        self.withdrawn: dict[int, Withdrawal] = {}
        """Blocks a step taken back out of its scheduling pass was to write (its allocation had
        already cached the full ones). Read by a step or a hit before anything writes it again,
        it meets :data:`kvref.safety_defects.WITHDRAWN_STEP` (:meth:`_withdrawn_cause`)."""
        self.withdrawals: list[Withdrawal] = []
        """Withdrawals made while steps were in flight: their clock moves past those steps'
        writes once the last of them has run (:meth:`processed`)."""
        self.last_tables: dict[str, Tables] = {}
        """Each request's tables after its latest allocation."""
        self.deferred = False
        """Without the pipeline: whether the open step waits for the copies of its
        copy-on-write hits (:meth:`_copies_may_follow`) before it runs."""

    def _loading(self, block: int, what: str) -> None:
        for load in self.loads.values():
            if block in load.blocks:
                raise SafetyViolation(
                    "inflight", f"block {block} is still being filled by the connector load of request "
                    f"{load.rid} (positions {load.start}-{load.end - 1}), and {what}",
                )

    def _mamba(self, g: int) -> Mamba:
        """The kind of the Mamba group ``g``."""
        kind = self.kinds[g]
        assert isinstance(kind, Mamba), f"group {g} is {kind!r}, not a Mamba group"
        return kind

    def _state_blocks(
        self, kind: Mamba, table: Sequence[int], start: int, end: int, step: bool = False
    ) -> list[tuple[int, int]]:
        """The non-null blocks of ``table`` that computing (or loading) ``[start,
        end)`` writes states into, each with the length whose state it gets
        (``step``: a step computes it, so a prefill checkpoint is written too:
        :func:`kvref.content_states.checkpoint_write`)."""
        if end <= start:
            return []
        writes = state_writes(kind, start, end)
        checkpoint = self._checkpoint(kind, start, end) if step else None
        writes += [checkpoint] if checkpoint else []
        return [(table[i], n) for i, n in writes if i < len(table) and table[i]]

    def _checkpoint(self, kind: Mamba, start: int, end: int) -> tuple[int, int] | None:
        """The prefill checkpoint a step computing ``[start, end)`` writes under the
        run's release (:func:`kvref.content_states.checkpoint_write`,
        :func:`~kvref.content_states.positional_checkpoint_write`), or None."""
        found = checkpoint_write(kind, self.config.profile.prefill_checkpoints, start, end)
        return found or positional_checkpoint_write(kind, self.config, start, end)

    def _current(self, entry: StepEntry) -> bool:
        """Whether ``entry`` was allocated in its request's current table."""
        return entry.table == self.tables_given.get(entry.rid, 0)

    def _untouched(self, b: int, since: int) -> bool:
        """Whether nothing wrote ``b`` (zeroing aside) or handed it out after the clock ``since``."""
        return self.contents.written_at.get(b, [0])[0] <= since and self.contents.handed.get(b, 0) <= since
