"""Admission: new requests arrive and waiting ones are scheduled.

``add_request`` makes a request from the prefix universe (a shared prefix, a
fresh suffix, extra hash keys) or from an earlier request's tokens;
``admit`` schedules a waiting request: its prefix lookup, then
``allocate_slots`` with the hit, connector tokens
(:class:`kvref.machine.connectors.ConnectorRules`), lookahead slots
(:class:`kvref.machine.speculative.SpeculativeRules`) and a chunk of the rest.

NOTE: the place for new ways a request arrives: as draws of a family of
their own (:class:`kvref.machine.base.Family`), so that runs without them
draw as before, as :mod:`kvref.machine.hit_limits` makes requests under
reused ids, changes skip flags after construction, sends token ids beyond
32 bits and prompt-logprob requests.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kvref.hypothesis_compat import boolean, choose, integer
from kvref.machine.base import Action
from kvref.machine.configuration import draw_tokens
from kvref.machine.connectors import ConnectorRules
from kvref.machine.speculative import SpeculativeRules
from kvspec.config import ChunkedLocal, SlidingWindow

Json = Any
ACTIONS: tuple[Action, ...] = (
    ("add_request", lambda m: len(m.reqs) < 10),
    ("admit", lambda m: bool(m.waiting)),
)
"""The family's actions and when each is ready (their place in the step table: :data:`kvref.stateful.ORDER`)."""
REUSE = ("", "", "repeat", "extend", "aligned")
"""How a new request reuses an earlier one's tokens ("" = a fresh prompt; first, so it shrinks there)."""
_EXTRA_FEATURES = {"salt": "cache_salt", "lora": "lora", "mm": "mm", "embeds": "prompt_embeds"}
"""The feature of each extra-key choice of a fresh prompt."""


class AdmissionRules(ConnectorRules, SpeculativeRules):
    """New requests, and the admission of waiting ones."""

    def add_request(self, data: st.DataObject) -> None:
        """A new request: a shared prefix and a fresh suffix, or an earlier
        request's tokens again (repeated, extended, or cut to whole blocks)."""
        assert self.lock is not None
        self.counter += 1
        rid = f"r{self.counter}"
        reuse = choose(data, REUSE) if self.past else ""
        if not self._on("reuse"):
            reuse = ""
        if reuse:
            op, reusable = self._reused_prompt(data, rid, reuse), True
        else:
            op, reusable = self._fresh_prompt(data, rid)
        # One request in ten skips the prefix cache; False is first, so that a
        # shrunk history reads the cache (``integers(0, 9) == 0`` came out
        # true for most requests: Hypothesis favours 0).
        skip = choose(data, (False,) * 9 + (True,))
        if skip and self._allowed("skip_reading_prefix_cache") and self._on("skip_reading"):
            op["skip_reading_prefix_cache"] = True
        # One request in three asks for report mode "full" in runs whose release announces hits
        # again (vLLM 0.26.0 on) with events on; drawn only there, so other runs draw as before.
        if self._reports_drawable() and choose(data, (False, False, True)) and self._allowed("report_mode_full"):
            op["kv_cache_report_mode"] = "full"
        # encoder tokens for cross attention; 0 is a request without encoder input (no cross-attention block)
        enc = integer(data, 0, 12) if self.cross else 0
        self._sched.add(op, enc, reusable)
        if reusable:
            self._remember(op["prompt"], op.get("extra"))

    def _reports_drawable(self) -> bool:
        """Whether requests of this run draw a report mode: events and caching on,
        and a release that announces hits again (under context parallelism vLLM
        then asserts: the registered divergence ``report-mode-cp-crash``)."""
        cfg = self.cfg
        return cfg.enable_kv_cache_events and cfg.enable_caching and cfg.profile.report_mode_full

    def _fresh_prompt(self, data: st.DataObject, rid: str) -> tuple[Json, bool]:
        """A prompt from the prefix universe, with extra keys drawn; returns
        the operation and whether later requests may reuse its tokens."""
        prefix = choose(data, self.prefixes)
        suffix = draw_tokens(data, 1, 12)
        prompt = (prefix + suffix)[: self._prompt_limit()] or [0]
        op: Json = {"op": "add_request", "rid": rid, "prompt": prompt}
        extra = choose(data, ["", "", "", "salt", "lora", "mm", "embeds"])
        if extra and not (self._allowed(_EXTRA_FEATURES[extra]) and self._on("extra_keys")):
            extra = ""
        if extra == "salt":
            op["extra"] = {"cache_salt": "s"}
        elif extra == "lora":
            op["extra"] = {"lora": {"name": "l", "adapter_id": 1, "path": "/adapters/l"}}
        elif extra == "mm":
            off = integer(data, 0, len(prompt) - 1)
            length = integer(data, 1, len(prompt) - off)
            features = [{"identifier": choose(data, "ab"), "offset": off, "length": length}]
            if off + length < len(prompt) and boolean(data):  # a second input after the first, as vLLM orders them
                off2 = integer(data, off + length, len(prompt) - 1)
                length2 = integer(data, 1, len(prompt) - off2)
                features.append({"identifier": choose(data, "ab"), "offset": off2, "length": length2})
            op["extra"] = {"mm_features": features}
        elif extra == "embeds":
            rows = [bytes([t, 0, 0, 60]).hex() for t in prompt]
            op["prompt"], op["extra"] = [0] * len(prompt), {"prompt_embeds": rows}
        return op, extra not in ("mm", "embeds")

    def _reused_prompt(self, data: st.DataObject, rid: str, how: str) -> Json:
        """An earlier request's tokens (prompt, or prompt and output once it
        finished) and extra keys: as they were, extended by a few tokens (the
        next turn of a chat), or cut to whole scheduler blocks (a fully cached
        prompt: its last block is recomputed, so one hash gets two blocks)."""
        tokens, extra = choose(data, self.past)
        limit = self._prompt_limit()
        sched = self.cfg.scheduler_block_size
        if how == "extend":
            tokens = tokens + draw_tokens(data, 1, 2 * sched)
        elif how == "aligned":
            tokens = tokens[: min(len(tokens), limit) // sched * sched] or tokens
        op: Json = {"op": "add_request", "rid": rid, "prompt": tokens[:limit] or [0]}
        if extra is not None:
            op["extra"] = extra
        return op

    def admit(self, data: st.DataObject) -> None:
        """Schedule a waiting request (usually the first; a later one when the
        scheduler skips a request that does not fit): prefix lookup, then allocate."""
        self._admit(data, self.waiting[integer(data, 0, len(self.waiting) - 1)])

    def _admit(self, data: st.DataObject, rid: str) -> None:
        """Schedule the waiting request ``rid`` (:meth:`admit`). A lookup that
        hits every token (vLLM 0.33.0 takes a ``max_cache_hit_length`` as
        given, :mod:`kvref.machine.hit_limits`) leaves nothing to schedule:
        the request stays waiting. In runs of the ``connector_lookup`` family
        the lookup is a KV connector's and the hit is settled against what
        the connector matches
        (:meth:`kvref.machine.connectors.ConnectorRules._settle_connector_hit`)."""
        st_ = self.reqs[rid]
        op: Json = {"op": "allocate_slots", "rid": rid}
        hit = external = 0
        total = self._num_tokens(rid)
        looked_up = st_.computed == 0
        connector = looked_up and self.family_on("connector_lookup")
        if looked_up:
            found, diverged = self._local_lookup(rid)
            if found is None:
                return  # the release fails this lookup (nothing changed); the request stays waiting
            hit, blocks = found["num_tokens"], found["blocks"]
            if hit >= total:
                return  # only a bounded lookup hits whole (unbounded ones stop at num_tokens - 1)
            if connector:
                blocks, hit, external = self._settle_connector_hit(data, rid, found, diverged, total)
                if blocks is None or hit >= total:
                    return
            assert self.lock is not None
            if hit:
                self.lock.stats.prefix_hits += 1
            # NOTE: the hint can only be non-zero for a cached hybrid (one
            # coordinator computes it); elsewhere reading it would lengthen
            # every history and its shrunk traces for a constant 0.
            if len(self.cfg.groups) > 1 and self.cfg.enable_caching and self.cfg.profile.prefix_hint_op:
                if self._sched.read_hint(rid):
                    self.lock.stats.prefix_hints += 1
                self.lock.stats.prefix_hint_reads += 1
            if any(blocks):
                op["new_computed_blocks"] = self._maybe_null_window_hits(data, blocks)
            op["num_new_computed_tokens"] = hit
        if connector:
            delay = external > 0 and boolean(data) and self._allowed("delay_cache_blocks") and self._on("delay")
        else:
            external, delay = self._connector_tokens(data, st_.computed, hit, total)
        new = 0 if delay else self._chunk(data, st_, st_.computed + hit + external, looked_up)
        op.update(
            num_new_tokens=new, num_external_computed_tokens=external, delay_cache_blocks=delay,
            num_lookahead_tokens=self._lookahead(data),
            num_encoder_tokens=st_.encoder_tokens if st_.computed == 0 else 0,
            full_sequence_must_fit=bool(self._swarmed("full_sequence", boolean(data))),
            reserved_blocks=self._swarmed("reserve", choose(data, [0, 0, 0, 1, 2])),
            has_scheduled_reqs=bool(self.running),
        )  # fmt: skip
        if self._sched.admit(op, hit, external, delay, looked_up) and not delay and st_.computed == total:
            self._sample_token(data, rid)

    def connector_twin(self, data: st.DataObject) -> None:
        """Directed (the ``connector_lookup`` family): an earlier prompt again,
        extended, admitted at once through a connector's lookup. Hits, and hits
        on which the groups disagree (a Mamba state evicted or never cached
        where full attention's blocks stay), are rare for fresh prompts."""
        tokens, extra = choose(data, self.past)
        prompt = (tokens + draw_tokens(data, 1, 2 * self.cfg.scheduler_block_size))[: self._prompt_limit()]
        fields: Json = {"prompt": prompt} if extra is None else {"prompt": prompt, "extra": extra}
        self._admit(data, self._add(fields, True))

    def _maybe_null_window_hits(self, data: st.DataObject, blocks: Json) -> Json:
        """The hit as found, or, in one admission in ten, with every
        sliding-window and chunked-local group's hit blocks replaced by the
        null block: a hit list no lookup returns that every side accepts
        (vLLM's ``touch`` skips the null block; kvspec's hit validation checks
        the keys of real blocks only), so it is sent and compared like any
        admission instead of being refused."""
        if not choose(data, (False,) * 9 + (True,)) or self.SETUP.safety:
            return blocks  # at the safety level only hit lists a lookup returns: a null in the window is read
        return [
            [0] * len(ids) if isinstance(kind, SlidingWindow | ChunkedLocal) else ids
            for kind, ids in zip(self.cfg.groups, blocks, strict=True)
        ]
