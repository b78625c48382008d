"""Directed: a Mamba tail boundary reached again after its keyed state block was lost.

From vLLM 0.32.0 a Mamba ``align`` group keys its state block at the prompt's
tail boundary (``mamba_tail_entries``; one hash unit lower where the
release's EAGLE rule says so: :func:`kvref.scheduler_chunks.tail_eagle`). Random
search reaches that boundary, but almost never reaches it *again* after the
state block kept there was evicted (a connector's loss): held states were
evicted four times in 197,000 steps, and each time the machine then advanced
the request by one token, past the boundary. ``tail_relost`` lines it up:
request A, prefilled to its tail boundary (keying its state), loses that
state block; then B, A's prompt again, is admitted (its lookup cannot use
the lost state) and prefilled to the same boundary, keying a state there
once more; A and B go on by a token each. The configurations are the drawn
ones, so EAGLE with and without the Mamba group among the flagged EAGLE
groups both come up.

The family takes part in the runs whose configuration has a cached Mamba
``align`` group under a release with tail entries; other runs draw as before.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvref.hypothesis_compat import choose
from kvref.machine.base import Action, Family, MachineBase
from kvref.machine.configuration import draw_tokens
from kvref.machine.scripted import ScriptedMoves
from kvref.scheduler_chunks import tail_eagle
from kvspec.config import Mamba
from kvspec.mamba_tail import mamba_tail_boundary

ACTIONS: tuple[Action, ...] = (("tail_relost", lambda m: len(m.reqs) < 9),)
"""The family's one action and when it is ready."""


def _takes_part(m: MachineBase) -> bool:
    cfg = m.cfg
    align = any(isinstance(k, Mamba) and k.mode == "align" for k in cfg.groups)
    return bool(cfg.enable_caching and align and cfg.profile.mamba_tail_entries and m._allowed("evict_blocks"))


FAMILY = Family("mamba_relost", ACTIONS, _takes_part)
"""Joins the runs with a cached Mamba align group under a release with tail entries."""


class MambaRelostRules(ScriptedMoves):
    """A tail boundary reached again after a lost state."""

    def tail_relost(self, data: st.DataObject) -> None:
        """See the module docstring."""
        assert self.lock is not None
        cfg = self.cfg
        g = next(i for i, k in enumerate(cfg.groups) if isinstance(k, Mamba) and k.mode == "align")
        hbs, bs = cfg.resolved_hash_block_size(), cfg.groups[g].block_size
        eagle, entries, ahead = tail_eagle(cfg), cfg.profile.mamba_tail_entries, cfg.num_hash_lookahead_tokens
        lengths = tuple(
            n for n in range(2, self._prompt_limit() + 1) if 0 < mamba_tail_boundary(n, hbs, eagle, entries, ahead) < n
        )
        if not lengths:
            return
        n = choose(data, lengths)
        tail = mamba_tail_boundary(n, hbs, eagle, entries, ahead)
        prompt = draw_tokens(data, n, n)  # not a shared prefix: A's lookup must not already cover its tail
        a = self._add({"prompt": prompt}, reusable=True)
        if not self._admit_now(data, a, connector=False, upto=tail) or not self._prefill(data, a, tail):
            return
        if self.reqs[a].computed != tail:
            return
        self._call({"op": "new_step_starts"})
        table = self.lock.adapters[0].get_block_ids(a)[g]
        index = -(-tail // bs) - 1
        if not (index < len(table) and table[index]):
            return
        self._call({"op": "evict_blocks", "block_ids": [table[index]]})
        self._call({"op": "new_step_starts"})
        b: str | None = self._add({"prompt": prompt}, reusable=True)
        assert b is not None
        if self._admit_now(data, b, connector=False, upto=tail):
            self._prefill(data, b, tail)
        else:
            b = None
        for rid in (a, b):
            if rid is not None and rid in self.running:
                self._prefill(data, rid, self.reqs[rid].computed + 1)
