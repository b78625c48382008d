"""Read-only calls the scheduler and its connectors make between steps.

Cascade attention's common prefix (``get_num_common_prefix_blocks``), a
request's block ids (``get_block_ids``), a connector's blocks up to a token
count (``get_block_ids_for_computed_tokens``) and the cached-token estimate
(``estimate_cached_tokens``): each changes nothing, and every side must
answer alike.

NOTE: the place for further read-only lookups.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvref.hypothesis_compat import boolean, choose, integer
from kvref.machine.base import Action, MachineBase

ACTIONS: tuple[Action, ...] = (
    ("common_prefix", lambda m: bool(m.running)),
    ("read_tables", lambda m: bool(m.reqs)),
    ("read_computed_tables", lambda m: bool(m.reqs) and m.cfg.profile.computed_block_ids_op),
    ("estimate_cached", lambda m: bool(m.reqs) and m.cfg.profile.estimate_cached_tokens_op),
)
"""The family's actions and when each is ready (their place in the step table: :data:`kvref.stateful.ORDER`)."""


class ReadRules(MachineBase):
    """Read-only calls, compared like every other."""

    def common_prefix(self, data: st.DataObject) -> None:
        """Cascade attention asks for the common prefix of a running request."""
        self._call({"op": "get_num_common_prefix_blocks", "rid": choose(data, tuple(self.running))})

    def read_tables(self, data: st.DataObject) -> None:
        """Read a request's block ids."""
        self._call({"op": "get_block_ids", "rid": choose(data, tuple(sorted(self.reqs)))})

    def read_computed_tables(self, data: st.DataObject) -> None:
        """A KV connector asks for a request's blocks up to a token count
        (``get_block_ids_for_computed_tokens``, where the profile's release
        has it, as the scheduler of that release calls it): mostly its
        computed tokens, as vLLM's scheduler passes, else any count up to a
        block past its tokens (a cut inside, at or beyond the tables), or -1,
        which every side must refuse."""
        rid = choose(data, tuple(sorted(self.reqs)))
        computed = self.reqs[rid].computed
        bound = self._num_tokens(rid) + max(k.block_size for k in self.cfg.groups)
        n = integer(data, -1, bound) if boolean(data) else computed
        self._call({"op": "get_block_ids_for_computed_tokens", "rid": rid, "num_computed_tokens": n}, True)

    def estimate_cached(self, data: st.DataObject) -> None:
        """The scheduler asks how many of a request's tokens its cached blocks
        stand for (``estimate_cached_tokens``, reported when a prefill ends;
        only where the profile's release has it, as its scheduler calls it
        only there: a profile without the operation would otherwise end every
        run against a newer release at this rule)."""
        rid = choose(data, tuple(sorted(self.reqs)))
        self._call({"op": "estimate_cached_tokens", "rid": rid}, True)
