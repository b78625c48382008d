"""Speculative decoding: the lookahead slots of EAGLE's draft tokens.

With EAGLE on, an admission and every running step ask for 0 to 2
lookahead slots besides their new tokens (``num_lookahead_tokens``), unless
this run's swarm left lookahead out.

NOTE: the place for what the async pipeline adds to speculative decoding
(draft tokens the next step rejects, rolled back before they are computed).
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvref.hypothesis_compat import integer
from kvref.machine.base import MachineBase
from kvref.scheduler_chunks import drafts_tokens


class SpeculativeRules(MachineBase):
    """How many lookahead slots a step asks for."""

    def _lookahead(self, data: st.DataObject) -> int:
        """Lookahead slots for a step: 0 to 2 under EAGLE (none otherwise, and
        none drawn), or 0 when this run's swarm turned lookahead off."""
        return self._swarmed("lookahead", integer(data, 0, 2) if drafts_tokens(self.cfg) else 0)
