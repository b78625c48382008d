"""Directed traces: hand-written scheduler scripts for states the random
machine rarely or never reaches.

Each scenario is a short script over the facade (a configuration and a
sequence of operations) written to pin down one rule: a capacity estimate at
the exact free-block boundary, a hybrid hit search that comes back to an
EAGLE group, a caller error on a boundary value, a default argument. The
script is run on kvspec (:mod:`kvtools.directed.script`), which records every
output and view digest, and the result is written to
``traces/vllm-0.25.1/directed/<name>.jsonl`` as an ordinary version-1 trace
(``docs/traces.md``), so every adapter replays it like a golden trace, real
vLLM 0.25.1 included (``ci/test.sh`` does).

The scenarios live by theme: :mod:`~kvtools.directed.allocation`
(``allocate_slots``'s gates), :mod:`~kvtools.directed.arguments` (caller
errors and defaults), :mod:`~kvtools.directed.hits` (prefix hits and the hit
search) and :mod:`~kvtools.directed.boundary` (capacity at the free-block
boundary). Regenerate with ``python -m kvtools directed`` (``--check`` only
compares; :mod:`kvtools.directed.record`); ``tests/kit/test_corpus.py`` fails
when a committed file differs from a fresh recording. The mutation kill test
(``tests/tools/mutation/test_kill.py``) replays them first: most scenarios
were written for a generic mutant of kvimpl that the random runs did not
detect (the reason is in each scenario's ``why``).
"""

from __future__ import annotations

from kvtools.directed.record import DIRECTED_DIR, main, scenarios, write_all
from kvtools.directed.script import Scenario, Script

__all__ = ["DIRECTED_DIR", "Scenario", "Script", "main", "scenarios", "write_all"]
