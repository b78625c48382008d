"""Known divergences from vLLM and the matchers that recognise them.

The registry is ``divergences.toml`` beside this module. Each entry names the
releases it applies to (``introduced``, and ``fixed`` when a later release no
longer shows it); only entries that apply to the configuration's semantics
profile can explain a difference. A matcher receives the configuration, the
operation, vLLM's output and the spec-semantics output and returns True only
if the difference is exactly the documented one.

Adapters declare further known differences (``DeclaredSemantics.known``), and
``kvref check --known FILE`` reads more entries in the same TOML format. Such
an entry either names a Python matcher (``matcher = "module:function"``, the
signature of :data:`Matcher`, its own output first) or a divergence class
(``aspect``: ``output``, ``view:<field>``, ``crash``, ``events``, ...; with
``operation`` it names the class ``<operation>/<aspect>`` that ``kvref check
--keep-going`` prints). docs/writing-an-adapter.md has examples.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from kvref.exits import InputError
from kvref.targets import load_callable
from kvspec.config import FULL_TYPE_KINDS, ChunkedLocal, CrossAttention, KVCacheConfig, Mamba, SlidingWindow
from kvspec.partial_hits import partial_hash_hits_enabled
from kvspec.prefill_checkpoints import positional_checkpoints
from kvspec.view import KVView

Json = Any
Matcher = Callable[[KVCacheConfig, Json, Json, Json, bool], bool]
"""``matcher(config, op, own_output, other_output, pending_frees) -> bool``:
whether the difference is exactly the documented one (``own_output`` is the
output of the side the divergence belongs to: vLLM for the registry)."""


@dataclass(frozen=True)
class Divergence:
    """One registry entry."""

    id: str
    title: str
    operation: str
    invariant: str
    trace: str
    halts: bool
    """Whether the two states differ afterwards (the lockstep run stops)."""
    introduced: str = "0.25.1"
    """First vLLM release (of those kvref has profiles for) that shows it."""
    fixed: str | None = None
    """First release that no longer shows it (None: still present)."""
    aspect: str | None = None
    """With :attr:`operation`, the divergence class it explains (``output``,
    ``view:<field>``, ...; ``*`` for any); None when a matcher decides."""
    matcher: Matcher | None = None
    """Its own matcher (None: the built-in one of its id, or the class)."""

    def applies_to(self, release: str) -> bool:
        """Whether vLLM ``release`` shows this divergence."""
        after = release_key(release) >= release_key(self.introduced)
        return after and (self.fixed is None or release_key(release) < release_key(self.fixed))

    def trace_for(self, release: str) -> str:
        """The repository path of this divergence's minimal trace under ``release``'s profile."""
        return f"traces/vllm-{release}/divergences/{self.id}.jsonl"

    def explains(self, cfg: KVCacheConfig, op: Json, own: Json, other: Json, pending: bool) -> bool:
        """Whether this entry explains an output difference at ``op``."""
        if self.operation not in (op["op"], "*"):
            return False
        matcher = self.matcher or MATCHERS.get(self.id)
        if matcher is not None:
            return matcher(cfg, op, own, other, pending)
        return self.aspect in ("output", "*")

    def explains_class(self, op_name: str, aspect: str) -> bool:
        """Whether this entry names the divergence class ``op_name/aspect``."""
        if self.aspect is None or self.operation not in (op_name, "*"):
            return False
        return self.aspect in (aspect, "*") or (self.aspect == "view" and aspect.startswith("view:"))


def release_key(release: str) -> tuple[int, ...]:
    """``"0.27.1"`` -> ``(0, 27, 1)``, for ordering releases."""
    return tuple(int(part) for part in release.split("."))


def load_registry() -> dict[str, Divergence]:
    """Every entry of ``divergences.toml`` by id.

    NOTE: parsed once per version of the file (its size and modification
    time): the lockstep resolves the registry for every machine run, and
    parsing it each time was 4% of a ci run (cProfile).
    """
    path = Path(__file__).parent / "divergences.toml"
    stat = path.stat()
    return dict(_parsed_registry(str(path), stat.st_mtime_ns, stat.st_size))


@lru_cache(maxsize=4)
def _parsed_registry(path: str, _mtime_ns: int, _size: int) -> tuple[tuple[str, Divergence], ...]:
    data = tomllib.loads(Path(path).read_text())
    return tuple(
        (d["id"], Divergence(
            d["id"], d["title"], d["operation"], d["invariant"], d["trace"], d["halts"],
            d.get("introduced", "0.25.1"), d.get("fixed"),
        ))
        for d in data["divergence"]
    )  # fmt: skip


def load_known_file(path: Path) -> list[Divergence]:
    """The entries of a known-differences file (``kvref check --known``).

    Same format as ``divergences.toml``; ``title`` and ``operation`` are
    required, and each entry needs ``matcher`` or ``aspect``.

    Raises:
        InputError: For an unreadable file, bad TOML or an incomplete entry.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the known-differences file ({type(exc).__name__})") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not TOML ({exc})") from None
    entries = data.get("divergence")
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{path}: no [[divergence]] entries")
    return [_entry(path, i, d) for i, d in enumerate(entries, start=1)]


def _entry(path: Path, number: int, d: Json) -> Divergence:
    where = f"{path}: entry {number} ({d.get('id', 'no id')})"
    missing = [k for k in ("id", "title", "operation") if not isinstance(d.get(k), str)]
    if missing:
        raise InputError(f"{where}: missing {', '.join(missing)}")
    if "matcher" not in d and "aspect" not in d:
        raise InputError(f"{where}: needs a matcher (module:function) or an aspect (output, view:<field>, ...)")
    matcher = None
    if "matcher" in d:
        matcher = load_callable(str(d["matcher"]), f"matcher of {where}")
    aspect = d.get("aspect")
    return Divergence(
        d["id"], d["title"], d["operation"], d.get("invariant", ""), d.get("trace", ""),
        bool(d.get("halts", aspect not in (None, "output"))), d.get("introduced", "0.25.1"), d.get("fixed"),
        None if aspect is None else str(aspect), matcher,
    )  # fmt: skip


def resolve(known: Iterable[str | Divergence]) -> list[Divergence]:
    """Declared known differences as entries (ids looked up in the registry).

    Raises:
        InputError: For an id the registry does not have.
    """
    registry = load_registry()
    out = []
    for item in known:
        if isinstance(item, Divergence):
            out.append(item)
        elif item in registry:
            out.append(registry[item])
        else:
            raise InputError(f"declared known difference {item!r} is not in the divergence registry")
    return out


def explain(
    cfg: KVCacheConfig, op: Json, vllm_out: Json, spec_out: Json, pending: bool, release: str | None = None
) -> str | None:
    """The id of the known divergence of ``release`` (default: ``cfg.profile``'s)
    that explains ``vllm_out != spec_out``, or None.

    The lockstep passes the release the vLLM side declares: under ``kvref
    drift`` it differs from the profile kvspec runs, and a defect that
    release fixed must not explain a difference any more.
    """
    registry = load_registry()
    release = release or cfg.profile.release
    for div_id, matcher in MATCHERS.items():
        if registry[div_id].applies_to(release) and matcher(cfg, op, vllm_out, spec_out, pending):
            return div_id
    return None


def _hit_lengths(cfg: KVCacheConfig, out: Json) -> list[int]:
    return [len(blocks) * kind.block_size for kind, blocks in zip(cfg.groups, out["blocks"], strict=True)]


def _eagle_mamba(cfg: KVCacheConfig, op: Json, vllm_out: Json, spec_out: Json, pending: bool) -> bool:
    eagle = cfg.eagle_group_ids()
    if not any(isinstance(k, Mamba) and g in eagle for g, k in enumerate(cfg.groups)):
        return False
    if op["op"] == "get_prefix_hint":
        # The Mamba look-ahead reaches further than the hit, so vLLM's longest
        # single-kind hit, and with it the hint, is longer (the hit itself agreed).
        return isinstance(vllm_out, int) and isinstance(spec_out, int) and vllm_out > spec_out
    if op["op"] != "get_computed_blocks" or "blocks" not in vllm_out:
        return False
    # Some group's list does not cover the hit: a full-attention list shorter
    # than the hit (the look-ahead raised the hit after full attention was
    # trimmed), or a list longer than a hit that an earlier pass cut.
    n = vllm_out["num_tokens"]
    if any(length != n for length in _hit_lengths(cfg, vllm_out)):
        return True
    # Or a longer hit whose lists agree: the Mamba look-ahead raised the candidate after
    # a window group's drop had cut it, and the next pass took the window group's drop as
    # verified (its look-ahead block is not cached). The hit then ends on the state block
    # an EAGLE Mamba group found.
    longer = isinstance(spec_out, dict) and isinstance(spec_out.get("num_tokens"), int) and n > spec_out["num_tokens"]
    return longer and any(
        isinstance(k, Mamba) and g in eagle and vllm_out["blocks"][g] and vllm_out["blocks"][g][-1] != 0
        and len(vllm_out["blocks"][g]) * k.block_size == n
        for g, k in enumerate(cfg.manager_groups())
    )  # fmt: skip


def _answered(spec_out: Json) -> bool:
    """Whether kvspec answered a lookup (its blocks, or 0.34.0's cached-token count), or there is
    no kvspec side: the safety level runs a target alone and asks about its crash with None."""
    return spec_out is None or isinstance(spec_out, int) or (isinstance(spec_out, dict) and "blocks" in spec_out)


def _connector_bound_crash(cfg: KVCacheConfig, op: Json, vllm_out: Json, spec_out: Json, pending: bool) -> bool:
    """vLLM 0.33.0's sliding-window, chunked-local or Mamba finder raising IndexError under a bound
    where kvspec answers (both read the request's hashes up to the bound): in a connector's lookup
    (each group is looked up alone with the bound), or in a plain lookup of a model with no
    full-attention-type group (no full-attention finder cuts the length to the hashed tokens first)."""
    plain = op["op"] == "get_computed_blocks" and not any(isinstance(k, FULL_TYPE_KINDS) for k in cfg.groups)
    return (
        (op["op"] == "get_computed_blocks_for_connector" or plain) and "max_cache_hit_length" in op
        and vllm_out == {"crash": "IndexError"} and _answered(spec_out)
        and any(isinstance(k, Mamba | SlidingWindow | ChunkedLocal) for k in cfg.groups)
    )  # fmt: skip


def _lookahead_lookup_crash(cfg: KVCacheConfig, op: Json, vllm_out: Json, spec_out: Json, pending: bool) -> bool:
    """vLLM 0.33.0 on: a lookup under look-ahead hashes of two or more tokens raising IndexError
    where kvspec answers: the request's hashes end ``L`` tokens before its tokens, its limit
    ``num_tokens - 1`` does not, and the window, chunk or Mamba finder reads hashes up to the
    limit. A plain lookup (``get_computed_blocks``, or from 0.34.0 ``get_num_cached_tokens``,
    which runs the same finders) meets it in a model with no full-attention-type group (that
    finder would cut the length first); a KV connector's lookup, which looks each group up
    alone, also in a hybrid with a Mamba group (measured on 0.33.0 and 0.34.0: a hybrid's window
    or chunk group does not meet it there)."""
    no_full = not any(isinstance(k, FULL_TYPE_KINDS) for k in cfg.groups)
    lagging = any(isinstance(k, Mamba | SlidingWindow | ChunkedLocal) for k in cfg.groups)
    plain = op["op"] in ("get_computed_blocks", "get_num_cached_tokens") and no_full and lagging
    connector = op["op"] == "get_computed_blocks_for_connector" and (
        any(isinstance(k, Mamba) for k in cfg.groups) or (no_full and lagging)
    )
    return (
        cfg.num_hash_lookahead_tokens >= 2 and (plain or connector) and vllm_out == {"crash": "IndexError"}
        and _answered(spec_out)
    )


def _checkpoint_past_hashes_crash(
    cfg: KVCacheConfig, op: Json, vllm_out: Json, spec_out: Json, pending: bool
) -> bool:
    """vLLM 0.30.0 on: ``allocate_slots`` (or a ``cache_blocks`` that follows it) raising
    AssertionError in a model with positional Mamba prefill checkpoints where kvspec answers. A
    step with draft tokens ends past the request's tokens; the manager's checkpoint for it sits
    at the last hash boundary below the step's end, past the request's hashes, and the caching
    that re-keys the checkpoint block asks the pool for a hash the request does not have."""
    positional = any(isinstance(k, Mamba) and positional_checkpoints(k, cfg.profile) for k in cfg.groups)
    answered = spec_out is None or isinstance(spec_out, list)
    crashed = vllm_out == {"crash": "AssertionError"}
    return positional and op["op"] in ("allocate_slots", "cache_blocks") and crashed and answered


def _report_mode_cp_crash(cfg: KVCacheConfig, op: Json, vllm_out: Json, spec_out: Json, pending: bool) -> bool:
    """vLLM 0.26.0 on: a lookup raising AssertionError under context parallelism with events on
    where kvspec answers with a hit (or there is no kvspec side): the announcement of a report-mode
    "full" request's hit resolves the request's hashes at the group's configured block size, a
    fraction of the scaled hash block, and asserts that it is a multiple of it (measured on 0.34.0:
    FullAttention(4) under DCP 2)."""
    lookup = op["op"] in ("get_computed_blocks", "get_computed_blocks_for_connector")
    hit = spec_out is None or (isinstance(spec_out, dict) and bool(spec_out.get("num_tokens")))
    return (
        cfg.dcp_world_size * cfg.pcp_world_size > 1 and cfg.enable_kv_cache_events and lookup
        and vllm_out == {"crash": "AssertionError"} and _answered(spec_out) and hit
    )  # fmt: skip


def _report_mode_partial_hit_crash(
    cfg: KVCacheConfig, op: Json, vllm_out: Json, spec_out: Json, pending: bool
) -> bool:
    """vLLM 0.26.0 on: a lookup raising IndexError with events on under fine-grained hits
    (``kvspec.partial_hits.partial_hash_hits_enabled``), where kvspec answered with a hit that ends inside a block
    of a group with hit blocks (that group's list then has a block more than the request's
    hashed blocks at its size can name, once the prompt ends before that block does: the
    announcement of a report-mode "full" request reads past them; measured on 0.27.1 and
    0.29.0). At the safety level (no kvspec side) the configuration and the call alone."""
    lookup = op["op"] in ("get_computed_blocks", "get_computed_blocks_for_connector")
    fine = cfg.enable_kv_cache_events and partial_hash_hits_enabled(cfg)
    if not (lookup and fine and vllm_out == {"crash": "IndexError"} and _answered(spec_out)):
        return False
    if spec_out is None:
        return True
    n = spec_out.get("num_tokens") or 0
    blocks = spec_out.get("blocks") or []
    return any(ids and n % k.block_size for ids, k in zip(blocks, cfg.groups, strict=False))


def _second_full(cfg: KVCacheConfig, op: Json, vllm_out: Json, spec_out: Json, pending: bool) -> bool:
    """A full-attention-type group's list longer than the hit, in a lookup or (vLLM 0.27.x and
    0.28.x) a KV connector's lookup, which trims the same way (its lagging lists are only ever
    shorter than the hit)."""
    if op["op"] not in ("get_computed_blocks", "get_computed_blocks_for_connector") or "blocks" not in vllm_out:
        return False
    if len({k for k in cfg.groups if isinstance(k, FULL_TYPE_KINDS)}) < 2:
        return False
    lengths = _hit_lengths(cfg, vllm_out)
    n = vllm_out["num_tokens"]
    return any(isinstance(k, FULL_TYPE_KINDS) and lengths[g] > n for g, k in enumerate(cfg.groups))


def _swa_eagle(cfg: KVCacheConfig, op: Json, vllm_out: Json, spec_out: Json, pending: bool) -> bool:
    """A shorter hit from vLLM's sliding-window finder under EAGLE: in a lookup, (vLLM 0.34.0 on)
    in ``get_num_cached_tokens``, which runs the same finder and answers its length, or (vLLM
    0.27.0 on) in a connector's lookup, where only such a group's own list is shorter (each
    group is looked up alone; the flag of a lagging group follows)."""
    eagle, sched = cfg.eagle_group_ids(), cfg.scheduler_block_size
    swa_eagle_groups = {
        g for g, k in enumerate(cfg.groups) if isinstance(k, SlidingWindow) and g in eagle and k.block_size != sched
    }
    if op["op"] == "get_computed_blocks_for_connector":
        if not (isinstance(vllm_out, dict) and isinstance(spec_out, dict)):
            return False
        mine_lists, spec_lists = vllm_out.get("blocks"), spec_out.get("blocks")
        if not (isinstance(mine_lists, list) and isinstance(spec_lists, list)) or len(mine_lists) != len(spec_lists):
            return False
        mine, spec = vllm_out.get("num_tokens", -1), spec_out.get("num_tokens", -1)
        if not (_is_count(mine) and _is_count(spec) and swa_eagle_groups):
            return False
        if not (vllm_out.get("hit_diverged") or spec_out.get("hit_diverged")) and spec > mine:
            return True  # both reconciled (a group reached past full attention): the lookup's shorter hit
        differ = [g for g, (a, b) in enumerate(zip(mine_lists, spec_lists, strict=True)) if a != b]
        shorter = all(g in swa_eagle_groups and len(mine_lists[g]) < len(spec_lists[g]) for g in differ)
        return bool(differ) and shorter and mine == spec
    if op["op"] == "get_num_cached_tokens":
        if not (_is_count(vllm_out) and _is_count(spec_out)):
            return False
        mine, spec = vllm_out, spec_out
    elif op["op"] == "get_computed_blocks" and "blocks" in vllm_out and "blocks" in spec_out:
        mine, spec = vllm_out["num_tokens"], spec_out["num_tokens"]
    else:
        return False
    return bool(swa_eagle_groups) and spec > mine


def _is_count(out: Json) -> bool:
    return isinstance(out, int) and not isinstance(out, bool)


def _swa_eagle_window(cfg: KVCacheConfig, op: Json, vllm_out: Json, spec_out: Json, pending: bool) -> bool:
    """vLLM 0.19.1 aligns a sliding-window EAGLE run before it drops the EAGLE
    block and aligns again after: a hit of the same length whose window blocks
    are null (kvspec aligns after the drop and keeps them)."""
    if op["op"] != "get_computed_blocks" or "blocks" not in vllm_out or "blocks" not in spec_out:
        return False
    tokens = spec_out["num_tokens"]
    if vllm_out["num_tokens"] != tokens or len(vllm_out["blocks"]) != len(cfg.groups):
        return False
    eagle, sched = cfg.eagle_group_ids(), cfg.scheduler_block_size
    lost = False
    for g, kind in enumerate(cfg.groups):
        mine, spec = vllm_out["blocks"][g], spec_out["blocks"][g]
        if mine == spec:
            continue
        if not (isinstance(kind, SlidingWindow) and g in eagle and kind.block_size != sched) or len(mine) != len(spec):
            return False
        needed = _skipped_tokens(kind, tokens) // kind.block_size
        for i, (v, s) in enumerate(zip(mine, spec, strict=True)):
            if v != s and not (v == 0 and s != 0 and i >= needed):
                return False
        lost = True
    return lost


def _common_prefix(cfg: KVCacheConfig, op: Json, vllm_out: Json, spec_out: Json, pending: bool) -> bool:
    return op["op"] == "get_num_common_prefix_blocks" and pending


def _mamba_external(cfg: KVCacheConfig, op: Json, vllm_out: Json, spec_out: Json, pending: bool) -> bool:
    if op["op"] != "allocate_slots" or op.get("num_external_computed_tokens", 0) <= 0 or spec_out is not None:
        return False
    if not any(isinstance(k, Mamba) and k.mode == "align" for k in cfg.groups):
        return False
    # vLLM under-counted by the external block: it either ran out of blocks
    # half-way (ValueError from get_new_blocks) or dipped into the watermark /
    # reserved blocks the spec keeps free.
    return vllm_out == {"crash": "ValueError"} or isinstance(vllm_out, list)


def _mamba_recompute_crash(cfg: KVCacheConfig, op: Json, vllm_out: Json, spec_out: Json, pending: bool) -> bool:
    """vLLM 0.16.0 to 0.22.x: an ``allocate_slots`` without connector tokens raising AssertionError in a
    model with a Mamba ``align`` group where kvspec gives that group no new block (or there is no kvspec
    side): the request's table is longer than the tokens need (a connector load that failed part-way
    left it so), and the release asserts that an ``align`` table only grows."""
    align = [g for g, k in enumerate(cfg.groups) if isinstance(k, Mamba) and k.mode == "align"]
    if op["op"] != "allocate_slots" or op.get("num_external_computed_tokens", 0) or not align:
        return False
    nothing_new = spec_out is None or (
        isinstance(spec_out, list) and len(spec_out) == len(cfg.groups) and all(not spec_out[g] for g in align)
    )
    return vllm_out == {"crash": "AssertionError"} and nothing_new


def _mamba_cow_owner(cfg: KVCacheConfig, op: Json, vllm_out: Json, spec_out: Json, pending: bool) -> bool:
    if op["op"] != "allocate_slots" or not isinstance(vllm_out, list) or not isinstance(spec_out, list):
        return False
    hbs = cfg.resolved_hash_block_size()
    coarse = {g for g, k in enumerate(cfg.groups) if isinstance(k, Mamba) and k.mode == "align" and k.block_size > hbs}
    if not coarse or len(vllm_out) != len(spec_out):
        return False
    # The owner of a Mamba tail entry copied its block into a fresh one that vLLM puts into the
    # table (and returns first); kvspec moves the entry to the fresh block and returns nothing
    # more. Every other group agrees.
    rewritten = [
        g
        for g, (v, s) in enumerate(zip(vllm_out, spec_out, strict=True))
        if v != s and g in coarse and len(v) == len(s) + 1 and v[1:] == s and v[0] not in s
    ]
    differing = [g for g, (v, s) in enumerate(zip(vllm_out, spec_out, strict=True)) if v != s]
    return bool(rewritten) and rewritten == differing


def _hits_touched_per_group(cfg: KVCacheConfig, op: Json, before: KVView, num_computed: int) -> bool:
    """Before vLLM 0.25.1 each group touches its hits and then takes its
    blocks for connector tokens before the next group touches its own (kvspec
    touches every group's hits first; vLLM issue #33775). Whether, at this
    ``allocate_slots`` from state ``before``, an earlier group's connector
    blocks would include a later group's hit that is still in the free queue:
    exactly when the two orders differ."""
    external = op.get("num_external_computed_tokens", 0)
    hits = op.get("new_computed_blocks") or []
    if op["op"] != "allocate_slots" or external <= 0 or len(cfg.groups) < 2 or len(hits) != len(cfg.groups):
        return False
    total = num_computed + op.get("num_new_computed_tokens", 0) + external
    kinds = cfg.manager_groups()
    skipped = [_skipped_tokens(kind, total) // kind.block_size for kind in kinds]
    kept = [set(ids[n:]) for ids, n in zip(hits, skipped, strict=True)]
    queue = list(before.free_queue)
    for g, kind in enumerate(kinds):
        queue = [b for b in queue if b not in kept[g]]
        if isinstance(kind, CrossAttention):
            continue
        need = max(0, -(-total // kind.block_size) - max(skipped[g], len(hits[g])))
        popped, queue = set(queue[:need]), queue[need:]
        if any(popped & later for later in kept[g + 1 :]):
            return True
    return False


def _skipped_tokens(kind: object, total: int) -> int:
    """Leading tokens a group's attention no longer reads after ``total``
    computed tokens (0.16.0's ``get_num_skipped_tokens``)."""
    if isinstance(kind, SlidingWindow):
        return max(0, total - kind.window + 1)
    if isinstance(kind, ChunkedLocal):
        return total // kind.chunk * kind.chunk
    if isinstance(kind, Mamba):
        return max(0, total - 1)
    return 0


StateTrigger = Callable[[KVCacheConfig, Json, KVView, int], bool]
"""``trigger(config, op, view_before, num_computed_tokens) -> bool``: whether
``op``, run from the state ``view_before`` (for a request with that many
computed tokens), meets the documented situation. For divergences that show
in the state rather than the output: the lockstep asks, on any difference at
``op``, whether the trigger holds; the two behaviours agree whenever it does
not, so nothing else is explained away."""

TRIGGERS: dict[str, StateTrigger] = {
    "hits-touched-per-group": _hits_touched_per_group,
}


def explain_state(
    cfg: KVCacheConfig, op: Json, before: KVView, num_computed: int, release: str | None = None
) -> str | None:
    """The id of the known divergence of ``release`` (default: the profile's)
    whose trigger holds for ``op`` from state ``before``, or None."""
    registry = load_registry()
    release = release or cfg.profile.release
    for div_id, trigger in TRIGGERS.items():
        if registry[div_id].applies_to(release) and trigger(cfg, op, before, num_computed):
            return div_id
    return None


MATCHERS: dict[str, Callable[[KVCacheConfig, Json, Json, Json, bool], bool]] = {
    "eagle-mamba-hit": _eagle_mamba,
    "second-full-group": _second_full,
    "swa-eagle-fallback": _swa_eagle,
    "connector-lookup-bound-crash": _connector_bound_crash,
    "lookahead-lookup-crash": _lookahead_lookup_crash,
    "report-mode-cp-crash": _report_mode_cp_crash,
    "checkpoint-past-hashes-crash": _checkpoint_past_hashes_crash,
    "report-mode-partial-hit-crash": _report_mode_partial_hit_crash,
    "swa-eagle-window-lost": _swa_eagle_window,
    "common-prefix-pending": _common_prefix,
    "mamba-align-external-estimate": _mamba_external,
    "mamba-align-recompute-crash": _mamba_recompute_crash,
    "mamba-cow-owner": _mamba_cow_owner,
}
