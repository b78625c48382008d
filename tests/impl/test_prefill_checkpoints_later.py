"""kvimpl's Mamba prefill checkpoints of vLLM 0.30.0 to 0.34.0 (the positional
forms of ``kvimpl.prefill_checkpoints``) against kvspec's.

The same script runs on kvspec's and on kvimpl's pure-Python manager: a
prompt admitted with a lookup and allocated in chunks (cached as it goes),
lookups of the same prompt and of a longer one while it runs, a second
request admitted on the longer prompt with its hit and allocated in chunks,
decode steps, a third request admitted with its hit and connector (external)
tokens, frees, and the lookups again. After every call the two sides
must agree on the result (new block ids per group, hits), the Mamba group's
estimates and kept checkpoint, the view (free order, reference counts, cache
map, tables) and the events; kvimpl's invariants must hold throughout.

The grid: every later release (and 0.29.0, which has no alignment) x
full-attention blocks of 16 and 32 tokens (Mamba 16) x EAGLE x 0 or 1
speculative block x prompts of 33, 48, 64, 70 and 100 tokens x five
chunkings, with the retention interval (None, 0, 32, 48), the checkpoint
alignment (None, 1, 3, 8) and, from 0.33.0 on, the look-ahead hash tokens
(0, 4, 8) rotated so that every prompt and chunking meets every interval and
every alignment, and every interval every alignment; under the ``nightly``
Hypothesis profile the whole product runs (about 24,000 cases, a few
minutes; every one agreed when this test was written).

The rules themselves are compared value by value over small domains, kvimpl's
own contract lines are evaluated, and the configurations of the measured
cases of ``tests/spec/test_prefill_checkpoints_later.py`` (their labels,
listed again here) are replayed on both sides by a loop of our own.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

import kvimpl.prefill_checkpoints as impl_rules
import kvspec.prefill_checkpoints as spec_rules
import kvspec.profiles
from kvimpl.block_pool import NULL_BLOCK, TailBlockPool
from kvimpl.config_rules import features_needed, unmodelled_features
from kvimpl.kv_cache_manager import KVCacheManager as ImplManager
from kvimpl.native import create_manager, native_unsupported
from kvimpl.single_type_kv_cache_manager import mamba_align_new_blocks as impl_new_blocks
from kvspec.config import FullAttention, KVCacheConfig, Mamba
from kvspec.errors import KVCacheError, UnsupportedByProfileError
from kvspec.events import BlockRemoved, BlockStored, KVCacheEvent
from kvspec.kv_cache_manager import KVCacheManager as SpecManager
from kvspec.profiles import (
    PROFILES,
    VLLM_0_29_0,
    VLLM_0_30_0,
    VLLM_0_31_0,
    VLLM_0_32_0,
    VLLM_0_33_0,
    VLLM_0_34_0,
    SemanticsProfile,
    profile_named,
)
from kvspec.request import Request, RequestBlockHasher, RequestStatus
from kvspec.single_type_kv_cache_manager import mamba_align_new_blocks as spec_new_blocks

LATER = (VLLM_0_30_0, VLLM_0_31_0, VLLM_0_32_0, VLLM_0_33_0, VLLM_0_34_0)
PROMPTS = (33, 48, 64, 70, 100)
FIRST_CHUNKS = (None, 32, 20, 48, 68)
"""The first chunk of a prompt (None: the whole prompt at once); the rest follows in one chunk."""
RETENTIONS = (None, 0, 32, 48)
ALIGNMENTS = (None, 1, 3, 8)
LOOKAHEADS = (0, 4, 8)
FULL_GRID = os.environ.get("HYPOTHESIS_PROFILE") == "nightly"
"""Run the whole product of the grid (the nightly profile), not its rotation."""

Observed = tuple[object, list[int], tuple[object, object], Any, list[KVCacheEvent]]
"""A call's result, the Mamba group's estimates in it, the checkpoints it
keeps for requests ``a`` and ``b``, the view after it and the events it emitted."""


@dataclass(frozen=True)
class Case:
    """One configuration and prompt of the grid (one chunk, or two when ``first`` is below the prompt)."""

    profile: SemanticsProfile
    full_block: int
    prompt: int
    first: int | None
    retention: int | None
    alignment: int | None
    eagle: bool
    spare: int
    lookahead: int
    hash_block: int | None = None

    def __str__(self) -> str:
        first = "" if self.first is None else f" first={self.first}"
        return (
            f"{self.profile.name} FA{self.full_block}+M16 hbs={self.hash_block} P={self.prompt}{first} "
            f"ret={self.retention} align={self.alignment} eagle={self.eagle} spare={self.spare} "
            f"lookahead={self.lookahead}"
        )

    def config(self) -> KVCacheConfig:
        """Full attention and a Mamba align group of 16-token blocks with one checkpoint block."""
        return KVCacheConfig(
            num_blocks=48, groups=(FullAttention(self.full_block), Mamba(16, "align", self.spare, 1, self.alignment)),
            max_model_len=512, profile=self.profile, enable_kv_cache_events=True, use_eagle=self.eagle,
            prefix_cache_retention_interval=self.retention, num_hash_lookahead_tokens=self.lookahead,
            hash_block_size=self.hash_block,
        )  # fmt: skip

    def chunks(self) -> list[int]:
        """The prompt's chunks."""
        if self.first is None or self.first >= self.prompt:
            return [self.prompt]
        return [self.first, self.prompt - self.first]


def checkpoint_of(manager: Any, rid: str) -> object:
    """The ``(position, slot)`` a Mamba manager keeps for ``rid`` (kvspec's
    dict is ``checkpoints``, kvimpl's ``checkpoint_at``)."""
    kept = manager.checkpoint_at if isinstance(manager.checkpoints, bool) else manager.checkpoints
    return kept.get(rid)


class Recorder:
    """Drives one manager, noting after every call what the two sides must agree on."""

    def __init__(self, kv: Any, cfg: KVCacheConfig, check: bool) -> None:
        """Wrap the Mamba manager's estimate of ``kv`` (group 1) to record it."""
        self.kv, self.check = kv, check
        self.hasher = RequestBlockHasher.for_config(cfg)
        self.mamba = kv.coordinator.managers[1]
        self.estimates: list[int] = []
        self.seen: list[Observed] = []
        estimate = self.mamba.get_num_blocks_to_allocate

        def recorded(*args: Any, **kwargs: Any) -> int:
            n = int(estimate(*args, **kwargs))
            if not (args[5] if len(args) > 5 else kwargs.get("apply_admission_cap", False)):
                self.estimates.append(n)
            return n

        self.mamba.get_num_blocks_to_allocate = recorded

    def note(self, result: object) -> None:
        """Record ``result`` with the estimates, the checkpoints, the view and the events; check invariants."""
        if self.check:
            self.kv.check_invariants()
        kv = self.kv
        kept = (checkpoint_of(self.mamba, "a"), checkpoint_of(self.mamba, "b"))
        self.seen.append((result, list(self.estimates), kept, kv.to_view(), kv.take_events()))
        self.estimates.clear()

    def admit(self, req: Request, chunks: list[int]) -> Request:
        """Look ``req`` up, then allocate its prompt in ``chunks`` (the hit with the first)."""
        kv = self.kv
        hits, n = kv.get_computed_blocks(req)
        self.note((hits, n))
        for i, chunk in enumerate(chunks):
            hit = n if i == 0 else 0
            c = min(chunk, req.num_prompt_tokens - req.num_computed_tokens - hit)
            if c <= 0:
                break
            got = kv.allocate_slots(req, c, hit, hits if hit else None)
            self.note(got)
            if got is None:
                break
            req = replace(req, num_computed_tokens=req.num_computed_tokens + hit + c, status=RequestStatus.RUNNING)
            kv.new_step_starts()
        return req

    def decode(self, req: Request, steps: int, width: int, token: int, spare: int) -> Request:
        """``steps`` steps of ``width`` sampled tokens each, with ``spare`` look-ahead slots."""
        for k in range(steps):
            req = self.hasher.with_output_tokens(req, [token + k * width + j for j in range(width)])
            got = self.kv.allocate_slots(req, width, num_lookahead_tokens=spare)
            self.note(got)
            if got is None:
                break
            req = replace(req, num_computed_tokens=req.num_tokens)
            self.kv.new_step_starts()
        return req

    def admit_external(self, req: Request, external: int, chunk: int) -> None:
        """Look ``req`` up, then allocate ``chunk`` tokens after its hit and
        ``external`` connector tokens; a refusal is noted by its type."""
        kv = self.kv
        hits, n = kv.get_computed_blocks(req)
        self.note((hits, n))
        c = min(chunk, req.num_prompt_tokens - n - external)
        try:
            got: object = kv.allocate_slots(req, c, n, hits if n else None, num_external_computed_tokens=external)
        except KVCacheError as exc:
            got = type(exc).__name__
        self.note(got)

    def lookups(self, tag: str, *prompts: list[int]) -> None:
        """Look each prompt up as a new request."""
        for i, tokens in enumerate(prompts):
            self.note(self.kv.get_computed_blocks(self.hasher.new_request(f"{tag}-{i}", tokens)))


def script(kv: Any, cfg: KVCacheConfig, case: Case, check: bool) -> list[Observed]:
    """The scripted calls of ``case`` on ``kv``; with ``check`` its invariants after each."""
    r = Recorder(kv, cfg, check)
    prompt = list(range(1000, 1000 + case.prompt))
    longer = [*prompt, *range(5000, 5040)]
    a = r.admit(r.hasher.new_request("a", prompt), case.chunks())
    r.lookups("running", prompt, longer)
    b = r.admit(r.hasher.new_request("b", longer), [32, 100])
    if a.num_computed_tokens == case.prompt:
        r.decode(a, 5, 4, 7000, case.spare)
    if b.num_computed_tokens == len(longer):
        r.decode(b, 2, 1, 8000, case.spare)
    r.admit_external(r.hasher.new_request("c", [*prompt, *range(6000, 6040)]), 16, 20)
    r.note(kv.free("a"))
    r.lookups("freed", prompt, longer)
    r.note(kv.free("b"))
    r.note(kv.free("c"))
    r.lookups("empty", prompt)
    return r.seen


def build(cfg: KVCacheConfig) -> tuple[Any, Any]:
    """Both managers, or in place of each the name of the exception it raised."""
    sides: list[Any] = []
    for make in (SpecManager, ImplManager):
        try:
            sides.append(make(cfg))
        except KVCacheError as exc:
            sides.append(type(exc).__name__)
    return sides[0], sides[1]


def agree(want: list[Observed], got: list[Observed], what: object) -> None:
    """The two sides observed the same at every call."""
    assert len(want) == len(got), f"{what}: kvspec made {len(want)} calls, kvimpl {len(got)}"
    parts = ("result", "estimates", "checkpoints", "view", "events")
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        for name, wp, gp in zip(parts, w, g, strict=True):
            assert gp == wp, f"{what}: call {i}: {name}: kvimpl {gp} != kvspec {wp}"


def compare(case: Case, run: Callable[[Any, KVCacheConfig, Case, bool], list[Observed]] = script) -> str:
    """Run ``case`` on both sides: ``"refused"`` (by both, alike), else
    ``"checkpoint"`` or ``"plain"`` (whether kvspec kept a checkpoint)."""
    try:
        cfg = case.config()
    except KVCacheError:
        return "refused"  # kvspec's own configuration check: one object for both sides
    spec, impl = build(cfg)
    if isinstance(spec, str) or isinstance(impl, str):
        assert spec == impl, f"{case}: kvspec {spec!r}, kvimpl {impl!r}"
        return "refused"
    want = run(spec, cfg, case, False)
    agree(want, run(impl, cfg, case, True), case)
    return "checkpoint" if any(ck != (None, None) for _, _, ck, _, _ in want) else "plain"


def grid(profile: SemanticsProfile, full_block: int) -> list[Case]:
    """The cases of one release and block shape: every prompt and chunking
    under EAGLE on and off and 0 or 1 speculative block, the interval, the
    alignment and the look-ahead rotating (the whole product under ``nightly``)."""
    lookaheads = LOOKAHEADS if profile.lookahead_block_hashes else (0,)
    alignments = ALIGNMENTS if profile.prefill_checkpoints in impl_rules.POSITIONAL_FORMS else (None,)
    shapes = [(p, f) for p, f in itertools.product(PROMPTS, FIRST_CHUNKS) if f is None or f < p]
    if FULL_GRID:
        return [
            Case(profile, full_block, p, f, ret, al, eagle, spare, la)
            for (p, f), ret, al, eagle, spare, la in itertools.product(
                shapes, RETENTIONS, alignments, (False, True), (0, 1), lookaheads
            )
        ]
    out = []
    for (k, (p, f)), eagle, spare in itertools.product(enumerate(shapes), (False, True), (0, 1)):
        j = 2 * eagle + spare
        ret, al = RETENTIONS[(k + j) % 4], alignments[(k // 2 + k + j) % len(alignments)]
        out.append(Case(profile, full_block, p, f, ret, al, eagle, spare, lookaheads[(k + 2 * j) % len(lookaheads)]))
    return out


@pytest.mark.parametrize("full_block", [16, 32])
@pytest.mark.parametrize("profile", [VLLM_0_29_0, *LATER], ids=lambda p: p.name)
def test_impl_agrees_with_spec_call_for_call(profile: SemanticsProfile, full_block: int) -> None:
    """The script on kvspec and kvimpl: equal results, estimates, checkpoints,
    views and events after every call, kvimpl's invariants holding, for
    every case of the grid; at least ten cases keep a checkpoint (0.29.0's
    block-aligned form, which has no alignment and keeps no position, runs
    the same script)."""
    outcomes = [compare(case) for case in grid(profile, full_block)]
    kept = "plain" if profile is VLLM_0_29_0 else "checkpoint"  # 0.29.0 remembers no (position, slot)
    assert outcomes.count(kept) >= 10, {o: outcomes.count(o) for o in set(outcomes)}


def test_the_rotation_covers_the_grid() -> None:
    """In each release's grid every prompt and chunking meets every interval
    and every alignment, EAGLE and the speculative block every interval and
    every alignment, every interval every alignment, and (0.33.0 on) every
    look-ahead every interval and every alignment."""
    shapes = {(p, f) for p, f in itertools.product(PROMPTS, FIRST_CHUNKS) if f is None or f < p}
    for profile in (VLLM_0_30_0, VLLM_0_33_0):
        cases = grid(profile, 16)
        assert {(c.prompt, c.first, c.retention) for c in cases} == {(*s, r) for s in shapes for r in RETENTIONS}
        assert {(c.prompt, c.first, c.alignment) for c in cases} == {(*s, a) for s in shapes for a in ALIGNMENTS}
        modes = set(itertools.product((False, True), (0, 1)))
        assert {(c.eagle, c.spare, c.retention) for c in cases} == {(*m, r) for m in modes for r in RETENTIONS}
        assert {(c.eagle, c.spare, c.alignment) for c in cases} == {(*m, a) for m in modes for a in ALIGNMENTS}
        assert {(c.retention, c.alignment) for c in cases} == set(itertools.product(RETENTIONS, ALIGNMENTS))
    looks = grid(VLLM_0_33_0, 16)
    assert {(c.lookahead, c.retention) for c in looks} == set(itertools.product(LOOKAHEADS, RETENTIONS))
    assert {(c.lookahead, c.alignment) for c in looks} == set(itertools.product(LOOKAHEADS, ALIGNMENTS))


# -- the measured configurations ------------------------------------------------------------------

MEASURED_CONFIGS: tuple[tuple[tuple[str, ...], Case], ...] = tuple(
    (releases, Case(VLLM_0_30_0, 16, plen, first, ret, al, eagle, spare, la, hbs))
    for releases, hbs, al, ret, plen, first, la, eagle, spare in (
        (("0.30.0",), None, 1, None, 70, None, 0, False, 0),
        (("0.30.0",), None, 1, 48, 70, None, 0, False, 0),
        (("0.30.0", "0.31.0"), None, 1, 0, 70, None, 0, False, 0),
        (("0.30.0", "0.32.0", "0.33.0", "0.34.0"), None, 1, None, 70, 32, 0, False, 0),
        (("0.30.0", "0.31.0", "0.34.0"), None, 1, 0, 70, 32, 0, False, 0),
        (("0.30.0", "0.31.0", "0.32.0"), None, 1, 48, 70, 32, 0, False, 0),
        (("0.30.0",), None, 3, None, 70, 32, 0, False, 0),
        (("0.30.0",), None, None, None, 70, 32, 0, False, 0),
        (("0.30.0",), None, 8, None, 70, None, 0, False, 0),
        (("0.30.0",), None, 1, 0, 64, None, 0, False, 0),
        (("0.30.0",), None, 1, None, 64, None, 0, False, 0),
        (("0.30.0", "0.31.0"), None, 1, None, 100, 32, 0, False, 0),
        (("0.30.0",), None, 1, None, 70, None, 0, True, 0),
        (("0.30.0", "0.31.0", "0.32.0"), None, 1, None, 64, None, 0, True, 0),
        (("0.30.0", "0.32.0"), None, 1, None, 70, 32, 0, True, 0),
        (("0.30.0",), None, 1, None, 100, None, 0, True, 0),
        (("0.31.0", "0.32.0"), None, 1, 32, 70, 32, 0, False, 0),
        (("0.31.0",), None, 1, 0, 70, 48, 0, False, 0),
        (("0.32.0",), None, 1, 48, 70, 20, 0, False, 0),
        (("0.33.0",), None, 1, None, 70, None, 4, False, 0),
        (("0.33.0", "0.34.0"), None, 1, None, 70, None, 8, False, 0),
        (("0.30.0", "0.32.0"), 4, 1, None, 70, 32, 0, False, 0),
        (("0.30.0",), 4, 1, None, 70, 68, 0, False, 0),
        (("0.30.0", "0.31.0"), 4, 1, 0, 70, 68, 0, False, 0),
        (("0.32.0",), 4, 1, None, 70, 64, 0, False, 0),
        (("0.33.0",), 4, 1, None, 70, None, 0, False, 0),
        (("0.33.0",), 4, 1, None, 70, None, 8, False, 0),
        (("0.30.0", "0.31.0", "0.32.0"), None, 1, None, 70, 32, 0, False, 1),
    )
)
"""The configurations of kvspec's measured cases (``tests/spec/test_prefill_checkpoints_later.py``):
full attention and Mamba of 16-token blocks, one checkpoint block, with the releases each was measured on."""


def measured_script(kv: Any, cfg: KVCacheConfig, case: Case, check: bool) -> list[Observed]:
    """The measured cases' calls: the prompt allocated in its chunks (no lookup
    first), the same and a 40-token longer prompt looked up while it runs,
    ``free``, the lookups again."""
    r = Recorder(kv, cfg, check)
    prompt = list(range(1000, 1000 + case.prompt))
    req, done = r.hasher.new_request("a", prompt), 0
    for n in case.chunks():
        r.note(kv.allocate_slots(req, n))
        done += n
        req = replace(req, num_computed_tokens=done)
        kv.new_step_starts()
    longer = [*prompt, *range(5000, 5040)]
    r.lookups("running", prompt, longer)
    r.note(kv.free("a"))
    r.lookups("freed", prompt, longer)
    return r.seen


@pytest.mark.parametrize(
    ("release", "case"),
    [(rel, replace(case, profile=profile_named(rel))) for releases, case in MEASURED_CONFIGS for rel in releases],
    ids=str,
)
def test_measured_configuration(release: str, case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    """kvimpl replays each measured configuration as kvspec does (kvspec's own
    test pins kvspec to the measurements). A hash block finer than the Mamba
    block is refused by both (fine-grained hits, not checked for these
    releases); the refusal is lifted for the replay, as kvspec's test does."""
    if case.hash_block is not None:
        with pytest.raises(UnsupportedByProfileError, match="fine-grained hits"):
            case.config()
        lifted = kvspec.profiles.PARTIAL_HASH_HITS_CHECKED | {case.profile.name}
        monkeypatch.setattr(kvspec.profiles, "PARTIAL_HASH_HITS_CHECKED", lifted)
    assert compare(case, measured_script) in ("checkpoint", "plain")


# -- the rules as values ----------------------------------------------------------------------------


def test_positions_validity_and_granularity_agree() -> None:
    """kvimpl's ``checkpoint_position``, ``checkpoint_valid``,
    ``checkpoint_granularity`` and ``checkpoint_prefill_end`` are kvspec's on
    small domains, every release from 0.29.0 on."""
    profiles = [VLLM_0_29_0, *LATER]
    for profile, n, g, eagle, la in itertools.product(profiles, range(40), (1, 2, 4, 16), (False, True), (0, 1, 5)):
        assert impl_rules.checkpoint_position(profile, n, g, eagle, la) == spec_rules.checkpoint_position(
            profile, n, g, eagle, la
        ), (profile.name, n, g, eagle, la)
    for start, end, pos, hbs, bs, al in itertools.product(
        range(0, 14, 2), range(15), range(15), (1, 2, 4), (2, 4), (None, 1, 2, 3)
    ):
        args = (start, end, pos, hbs, bs, al)
        assert impl_rules.checkpoint_valid(*args) == spec_rules.checkpoint_valid(*args), args
    for profile, hbs, align in itertools.product(profiles, (1, 4, 16), (1, 4, 16, 32)):
        assert impl_rules.checkpoint_granularity(profile, hbs, align) == spec_rules.checkpoint_granularity(
            profile, hbs, align
        )
    for profile, ret, plen, n in itertools.product(profiles, (None, 0, 16), (0, 1, 5, 9), range(13)):
        assert impl_rules.checkpoint_prefill_end(profile, ret, plen, n) == spec_rules.checkpoint_prefill_end(
            profile, ret, plen, n
        )


def test_chunk_checkpoint_and_kept_agree() -> None:
    """kvimpl's ``chunk_checkpoint`` and ``checkpoint_kept`` are kvspec's on small domains."""
    profiles = [VLLM_0_29_0, *LATER]
    kinds = (
        Mamba(4, "none", 0, 1, 1), Mamba(4, "align", 0, 0, 1), Mamba(4, "align", 0, 1, 1), Mamba(4, "align", 0, 1, 2),
        Mamba(4, "align", 1, 1, 1), Mamba(4, "align", 0, 1, None),
    )  # fmt: skip
    shapes = ((2, 2, False, 0), (2, 2, True, 0), (1, 4, False, 3), (4, 4, False, 0))
    for kind, profile, shape, table, end, start, allocated, prefill_end in itertools.product(
        kinds, profiles, shapes, ((), (0, 5), (0, 0, 7)), range(14), (0, 2, 4, 8), (False, True), (0, 10)
    ):
        want = spec_rules.chunk_checkpoint(
            kind, profile, spec_rules.CheckpointGeometry(*shape), table, end, start, allocated, prefill_end
        )
        got = impl_rules.chunk_checkpoint(
            kind, profile, impl_rules.CheckpointGeometry(*shape), table, end, start, allocated, prefill_end
        )
        assert got == want, (kind, profile.name, shape, table, end, start, allocated, prefill_end)
    for args in itertools.product(
        profiles, (2, 4), range(13), (4, 6, 8), (0, 4), (None, 0, 4, 8, 16), (6, 9, 12), (9, 12)
    ):
        assert impl_rules.checkpoint_kept(*args) == spec_rules.checkpoint_kept(*args), (args[0].name, *args[1:])


def test_align_estimate_agrees() -> None:
    """kvimpl's ``mamba_align_new_blocks`` with the checkpoint flags is kvspec's."""
    for args in itertools.product(
        range(-2, 6), (False, True), (0, 1, 2), (False, True), (False, True), (0, 1), (False, True), (False, True)
    ):
        assert impl_new_blocks(*args) == spec_new_blocks(*args), args


def test_rekey_emits_removed_then_one_hash_stored() -> None:
    """``rekey_checkpoint_block`` on kvimpl's pool: every key of the block
    removed (one BlockRemoved each), then one BlockStored of one hash unit;
    the block keyed at the position alone."""
    cfg = Case(VLLM_0_32_0, 16, 70, None, None, 1, False, 0, 0).config()
    kv = ImplManager(cfg)
    pool = kv.block_pool
    assert isinstance(pool, TailBlockPool)
    hasher = RequestBlockHasher.for_config(cfg)
    req = hasher.new_request("a", list(range(70)))
    assert kv.allocate_slots(req, 70) is not None
    kv.take_events()
    b = kv.coordinator.managers[1].req_to_blocks["a"][3]
    assert pool.hash_num_tokens[b] == 64
    key = impl_rules.rekey_checkpoint_block(pool, req, b, 48, 1)
    events = kv.take_events()
    assert [type(e) for e in events] == [BlockRemoved, BlockStored]
    stored = events[1]
    assert isinstance(stored, BlockStored) and len(stored.block_hashes) == 1 and stored.block_size == 16
    assert pool.keys_of(b) == [key] and pool.hash_num_tokens[b] == 48
    assert impl_rules.rekey_checkpoint_block(pool, req, NULL_BLOCK, 48, 1) is None
    kv.check_invariants()


# -- configuration ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "profile", [p for p in PROFILES.values() if p.prefill_checkpoints != "none"], ids=lambda p: p.name
)
def test_every_form_runs_on_the_python_manager(profile: SemanticsProfile) -> None:
    """A configuration with checkpoints needs the feature ``prefill-checkpoints``
    under every form, which the pure-Python manager models and the native core
    declines (``create_manager`` hands it to the pure-Python manager); a
    positional form takes the pool with per-block prefix lengths."""
    alignment = None if profile.prefill_checkpoints == "block-aligned" else 1
    cfg = KVCacheConfig(
        num_blocks=48, groups=(FullAttention(16), Mamba(16, "align", 0, 1, alignment)), max_model_len=256,
        profile=profile,
    )  # fmt: skip
    assert "prefill-checkpoints" in features_needed(cfg)
    assert unmodelled_features(cfg) == []
    reason = native_unsupported(cfg)
    assert reason is not None
    assert type(create_manager(cfg)) is ImplManager
    pool = ImplManager(cfg).block_pool
    positional = profile.prefill_checkpoints in impl_rules.POSITIONAL_FORMS
    assert isinstance(pool, TailBlockPool) or not positional
    off = replace(cfg, groups=(FullAttention(16), Mamba(16, "align", 0, 0, alignment)))
    assert "prefill-checkpoints" not in features_needed(off)


@pytest.mark.parametrize("profile", LATER, ids=lambda p: p.name)
@pytest.mark.parametrize("ncp", [0, 1])
def test_fine_hash_blocks_are_refused_alike(profile: SemanticsProfile, ncp: int) -> None:
    """A hash block finer than the Mamba block (fine-grained hits, not checked
    for these releases) is refused, with or without checkpoints, before
    either manager is built: the same refusal for both sides."""
    with pytest.raises(UnsupportedByProfileError, match="fine-grained hits"):
        KVCacheConfig(
            num_blocks=48, groups=(FullAttention(16), Mamba(16, "align", 0, ncp, 1)), max_model_len=256,
            profile=profile, hash_block_size=4,
        )  # fmt: skip


def test_forms_agree_with_kvspec() -> None:
    """kvimpl's list of forms is kvspec's, in the same order."""
    assert impl_rules.FORMS == spec_rules.FORMS
    assert impl_rules.POSITIONAL_FORMS == spec_rules.POSITIONAL_FORMS


# -- kvimpl's own contracts -------------------------------------------------------------------------


def holds(fn: Callable[..., object], cases: Any) -> int:
    """Evaluate ``fn``'s PEP 316 lines on every case whose ``pre:`` lines hold
    (in its module's namespace, ``__return__`` bound); the cases checked."""
    lines = [line.strip() for line in (fn.__doc__ or "").splitlines()]
    pre = [compile(x[4:].strip(), fn.__name__, "eval") for x in lines if x.startswith("pre:")]
    post = [(x, compile(x[5:].strip(), fn.__name__, "eval")) for x in lines if x.startswith("post:")]
    assert post, f"{fn.__name__} states no post: line"
    names = list(fn.__code__.co_varnames[: fn.__code__.co_argcount])
    module = vars(__import__(fn.__module__, fromlist=["_"]))
    checked = 0
    for args in cases:
        env = {**module, **dict(zip(names, args, strict=True))}
        if not all(eval(c, env) for c in pre):
            continue
        env["__return__"] = fn(*args)
        for text, code in post:
            assert eval(code, env), f"{fn.__name__}{args}: {text}"
        checked += 1
    return checked


def test_kvimpl_contracts_hold() -> None:
    """The ``post:`` lines of kvimpl's checkpoint rules hold on small domains."""
    profiles = [VLLM_0_29_0, *LATER]
    kinds = (Mamba(4, "none", 0, 1, 1), Mamba(4, "align", 0, 1, 1), Mamba(4, "align", 1, 2, 2))
    shapes = [impl_rules.CheckpointGeometry(*g) for g in ((2, 2, False, 0), (2, 2, True, 0), (1, 4, False, 3))]
    r = impl_rules
    assert holds(r.checkpoint_enabled, itertools.product(kinds, r.FORMS))
    assert holds(r.positional_checkpoints, itertools.product(kinds, profiles))
    assert holds(r.num_checkpoint_blocks, itertools.product((1, 4), ((), (0, 5), (0, 0, 7)), range(14), range(9)))
    assert holds(r.checkpoint_granularity, itertools.product(profiles, (1, 4), (1, 4, 8)))
    assert holds(r.checkpoint_position, itertools.product(profiles, range(21), (1, 3, 4), (False, True), (0, 1, 5)))
    assert holds(
        r.checkpoint_valid, itertools.product(range(0, 9, 2), range(15), range(15), (1, 2, 4), (2, 4), (None, 1, 3))
    )
    assert holds(
        r.chunk_checkpoint,
        itertools.product(kinds, profiles, shapes, ((), (0, 5)), range(14), (0, 2, 4), (False, True), (0, 10)),
    )
    assert holds(r.checkpoint_prefill_end, itertools.product(profiles, (None, 0, 16), (0, 5, 9), range(13)))
    assert holds(
        r.checkpoint_kept,
        itertools.product(profiles, (2, 4), range(13), (4, 8), (0, 4), (None, 0, 4, 16), (6, 12), (9, 12)),
    )
    assert holds(
        impl_new_blocks,
        itertools.product(
            range(-2, 6), (False, True), (0, 2), (False, True), (False, True), (0, 1), *[(False, True)] * 2
        ),
    )
