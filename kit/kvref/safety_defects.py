"""Registered vLLM safety defects: a real release that violates a safety oracle.

The registry is ``safety_defects.toml`` beside this module, kept like the
known divergences (:mod:`kvref.divergences`): each entry names the releases
that show the defect (``introduced``, and ``fixed`` when a later release no
longer does), the upstream issue or pull request, the oracles it violates and
a minimal trace. kvspec keeps modelling every release faithfully, so under an
affected release's profile kvspec and kvimpl show the defect as vLLM does.

The safety monitor attributes a violation to a defect by that defect's own
rule, never by a message: for :data:`EARLY_FREE`, the block involved is one
the allocation freed below the window on the computed tokens while a step in
flight still read it (:attr:`kvref.safety.SafetyMonitor.early`); for
:data:`UNFENCED_FREE`, a block a connector load fills that was freed with its
request, without a deferred free, while a step in flight still used it
(:attr:`kvref.safety.SafetyMonitor.unfenced`); for
:data:`LOAD_ZEROING`, a block ``take_new_block_ids`` lists while a connector
load fills it, where the release's scheduler does not leave the loads out; for
:data:`FAILED_LOAD_WINDOW`, a null entry of an attention group a step reads that
was already null when the request's connector load failed part-way; for
:data:`MAMBA_FAILED_LOAD`, the same in a Mamba group (the state a step starts
from), or a Mamba block that such a load was to fill a state into, read
(by a step or a hit) before anything wrote it again; for
:data:`MAMBA_ALIGN_MIDBLOCK`, a Mamba ``align`` block that a chunk starting inside
it left behind (holding the state at the chunk's start), read before anything
wrote it again, under a release whose scheduler does not stop such chunks; for
:data:`WITHDRAWN_STEP`, a slot a step taken back out of its scheduling pass was
to write, read before anything wrote it or handed its block out anew; for
:data:`CHECKPOINT_SCRATCH`, a Mamba block that was a speculative block of a
step without draft tokens, read as a state before anything wrote it or handed
it out anew; for :data:`CHECKPOINT_REKEYED`, a Mamba block a prefill
checkpoint wrote the state at a position below the block's end into, served
as the state at the block's end before anything wrote it or handed it out
anew; for :data:`MAMBA_REJECTED_NULL`, a Mamba state written into a null
entry below the running entry of the furthest step the request was
allocated for, once drafts of it were rejected
(:attr:`kvref.safety.SafetyMonitor.rolled_back`); for
:data:`SWA_EAGLE_WINDOW_LOST`, a null entry a step reads that the request's
latest hit returned null inside the window of its end
(:attr:`kvref.safety.SafetyMonitor.windowless`).
:func:`registered` then checks that the entry applies to the run's release;
the lockstep counts the run as meeting a known defect and stops it
(``kvref check`` lists it among the known divergences as ``safety defect
<id>``), where any other violation fails.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kvref.divergences import release_key

EARLY_FREE = "swa-inflight-free"
"""vLLM#47728: blocks below a sliding or chunked window freed while a step in flight reads them."""
UNFENCED_FREE = "unfenced-free"
"""vLLM#45357: under asynchronous scheduling, a finished or preempted request's blocks go back to the pool at
once while a step in flight still writes or reads them; a connector load (on a stream of its own, not
ordered against the steps) may fill them for another request first (:attr:`kvref.safety.SafetyMonitor.unfenced`).
vLLM 0.24.0 defers the free until the step's output is processed (``pop_blocks_for_free``)."""
LOAD_ZEROING = "load-zeroing"
"""vLLM#47373: a connector load's destinations listed for zeroing (the monitor's rule for a scheduler
before vLLM 0.26.0, :attr:`kvref.safety.SafetyMonitor.skip_load_zeroing`)."""
FAILED_LOAD_WINDOW = "swa-failed-load"
"""A connector load that fails part-way in a one-group model with a sliding or chunked window: the
recomputation from the valid prefix reads window blocks the admission skipped for the load's end
(:attr:`kvref.safety.SafetyMonitor.failed_skips`). Not reported upstream when found."""
MAMBA_FAILED_LOAD = "mamba-failed-load"
"""A connector load that fails part-way in a one-group Mamba model (``align`` or ``all`` mode): the
recomputation from the valid prefix starts from the state in a table entry the admission skipped (the
null block), and the block the load was to fill its state into is later served as that state
(:attr:`kvref.safety.SafetyMonitor.failed_skips`, :attr:`kvref.safety.SafetyMonitor.failed_states`).
Not reported upstream when found."""
MAMBA_ALIGN_MIDBLOCK = "mamba-align-midblock"
"""A Mamba ``align`` chunk that starts inside a block (after a connector load that ended there) and runs
past its end: the block keeps the state at the chunk's start, and the manager caches it as the state at
its end, which a later hit is served (:attr:`kvref.safety.SafetyMonitor.behind`). vLLM 0.26.0's scheduler
stops such a chunk at the block's end. Not reported upstream when found."""
CHECKPOINT_SCRATCH = "checkpoint-scratch-block"
"""With Mamba prefill checkpoints and speculative blocks (vLLM 0.30.0 and 0.31.0): a prefill chunk's
speculative (scratch) block, which a step without draft tokens never writes, stays in the table below
the next chunk's checkpoint; the full-block caching keys it as the state at its end, which a later hit
is served (:attr:`kvref.safety.SafetyMonitor.scratch`). vLLM 0.32.0 moves the scratch block into the
checkpoint slot. Not reported upstream when found."""
CHECKPOINT_REKEYED = "checkpoint-rekeyed"
"""With Mamba prefill checkpoints under look-ahead block hashes (vLLM 0.33.0 on): a checkpoint is written
into the block below the running one at a position below that block's end (the position must leave room
for the look-ahead tokens); once the request has the look-ahead tokens past the block's end, the caching
(the asynchronous scheduler's ``cache_blocks`` on the processed tokens) keys the block as the state at its
end, which a later hit is served (:attr:`kvref.safety.SafetyMonitor.checkpoints`). Not reported upstream
when found."""
MAMBA_REJECTED_NULL = "mamba-rejected-draft-null"
"""Under asynchronous scheduling with speculative decoding, a Mamba ``align`` group: a step allocated
while the request's previous step with draft tokens was in flight counts those drafts as computed, so the
allocation drops the block below the new running one; the drafts are rejected, the step runs that many
positions lower, and its running state falls in the dropped entry, the null block (which every null
entry shares). Not reported upstream when found."""
SWA_EAGLE_WINDOW_LOST = "swa-eagle-window-lost"
"""vLLM 0.19.1 only (the known divergence of the same name, docs/divergences.md): a sliding-window group's
hit under EAGLE keeps its length but loses a block inside the window of its end, which is null in the hit;
the step that continues the request reads the null block as that position's KV
(:attr:`kvref.safety.SafetyMonitor.windowless`). kvspec returns the window's blocks, so only vLLM 0.19.1's
own hit (or a trace that hands it to an engine) shows it."""
WITHDRAWN_STEP = "withdrawn-step-cached"
"""vLLM#43569 (an open pull request): ``allocate_slots`` caches the full blocks of the tokens the step is
to compute before the step runs; under priority scheduling a request scheduled earlier in a pass is taken
back out of it when a later allocation fails, and its blocks go back to the pool still cached although no
step computes them, so a later hit (the request's own readmission first) is served KV never written
(:attr:`kvref.safety.SafetyMonitor.withdrawn`)."""
REGISTRY = Path(__file__).with_name("safety_defects.toml")


@dataclass(frozen=True)
class SafetyDefect:
    """One registry entry."""

    id: str
    title: str
    upstream: str
    oracles: tuple[str, ...]
    trace: str
    introduced: str
    fixed: str | None = None

    def applies_to(self, release: str) -> bool:
        """Whether vLLM ``release`` shows this defect."""
        after = release_key(release) >= release_key(self.introduced)
        return after and (self.fixed is None or release_key(release) < release_key(self.fixed))


@lru_cache(maxsize=1)
def load_defects() -> tuple[SafetyDefect, ...]:
    """Every registered defect, in the registry's order."""
    data = tomllib.loads(REGISTRY.read_text(encoding="utf-8"))
    return tuple(
        SafetyDefect(
            id=e["id"], title=e["title"], upstream=e["upstream"], oracles=tuple(e["oracles"]), trace=e["trace"],
            introduced=e["introduced"], fixed=e.get("fixed"),
        )
        for e in data["defect"]
    )  # fmt: skip


def registered(defect: str | None, oracle: str, release: str) -> SafetyDefect | None:
    """The entry ``defect`` if it applies to ``release`` and covers ``oracle``, else None."""
    for entry in load_defects():
        if entry.id == defect and oracle in entry.oracles and entry.applies_to(release):
            return entry
    return None
