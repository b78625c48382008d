"""Swarm configuration of the scheduler machine: per run, some optional choices are off.

Swarm testing (Groce et al., "Swarm testing", ISSTA 2012) turns a random subset
of a generator's features off for each test case: a feature that is always
available crowds out the situations that need its absence (a run whose every
admission may load connector tokens rarely reaches a long chain of plain
prefix hits), and two features that mask each other are then seen apart.

Hypothesis already does this for the machine's *rules*: each run draws a
probability and disables every rule with it (its ``FeatureFlags``, used by
``RuleBasedStateMachine``), so a run without ``finish`` or ``new_step`` is
common. :class:`Swarm` does the same for the choices *inside* the rules, the
optional features of a scheduler step (:data:`SWARM_FEATURES`). It is drawn
once per run in the machine's ``@initialize``, from the run's own choice
sequence, so a seeded run is reproducible and a shrunk failure shrinks its
swarm too (towards everything on).

NOTE: off by default. With the swarm drawn, every seeded run draws different
choices from the same seed, so the seeded step counts of the bug zoo and the
coverage report move; ``KVREF_SWARM=1`` turns it on for a ``kvref check``
(docs/reports/bug-zoo-fresh.md compares the two at the same seed and budget).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hypothesis import strategies as st

SWARM_FEATURES = (
    "reuse",
    "extra_keys",
    "skip_reading",
    "connector",
    "delay",
    "lookahead",
    "reserve",
    "full_sequence",
    "deferred_free",
    "cache_loss",
    "priority_preempt",
    "remove_skipped",
)
"""The optional choices a swarm may turn off for a run: reusing an earlier
prompt, extra hash keys, skipping the prefix cache, connector tokens, their
delayed caching, EAGLE lookahead slots, reserved blocks, the full-sequence
admission gate, popping blocks for a deferred free, cache loss at a step
(``evict_blocks``, ``reset_prefix_cache``), priority preemption, and the
explicit ``remove_skipped_blocks`` before a finish."""

LEVELS = 8
"""A run's swarm probability is ``k / LEVELS`` for a drawn ``k`` in ``0 .. LEVELS - 1``."""


@dataclass(frozen=True, slots=True)
class Swarm:
    """The choices one run leaves out (all on by default)."""

    off: frozenset[str] = frozenset()

    def on(self, feature: str) -> bool:
        """Whether ``feature`` (one of :data:`SWARM_FEATURES`) may be chosen in this run."""
        return feature not in self.off


ALL_ON = Swarm()
"""No swarm: every feature on (what a run without a drawn swarm uses)."""


@st.composite
def swarms(draw: st.DrawFn) -> Swarm:
    """A swarm: a probability ``k / LEVELS``, then each feature off with it.

    Both draws shrink towards everything on (``k == 0``, and a feature is off
    only for a high draw), as Hypothesis's rule flags shrink towards every
    rule enabled.
    """
    k = draw(st.integers(0, LEVELS - 1))
    if k == 0:
        return ALL_ON
    return Swarm(frozenset(f for f in SWARM_FEATURES if draw(st.integers(0, LEVELS - 1)) >= LEVELS - k))


def swarm_default() -> bool:
    """Whether machine runs draw a swarm unless told otherwise (``KVREF_SWARM=1``)."""
    return os.environ.get("KVREF_SWARM", "") == "1"


@st.composite
def action_swarms(draw: st.DrawFn, names: tuple[str, ...], always_on: tuple[str, ...] = ()) -> frozenset[str]:
    """The machine actions one run leaves out, as Hypothesis's rule feature
    flags do for the rules of a state machine: a probability ``k / LEVELS``,
    then each action (but those in ``always_on``) off with it.

    Drawn once per run (Hypothesis asks its flags again at every step, each
    time a choice). Shrinks towards every action on, as its flags do.
    """
    k = draw(st.integers(0, LEVELS - 1))
    if k == 0:
        return frozenset()
    return frozenset(n for n in names if n not in always_on and draw(st.integers(0, LEVELS - 1)) >= LEVELS - k)
