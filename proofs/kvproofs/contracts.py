"""kvspec's public functions, their PEP 316 contracts, and how each is checked.

Every public top-level function of kvspec is in exactly one of three places:

* :data:`CROSSHAIR`: CrossHair checks the function's own docstring contract,
  either directly (no bound: a condition counts only once CrossHair has
  explored every path) or through a generated wrapper that adds a stated
  bound on the input sizes as one more ``pre:`` line (the contract lines are
  copied from the spec's docstring at run time, never restated by hand).
  Kinds and profiles are built by :mod:`kvproofs.plugin` (every release).
* an enumerated check of ``proofs/kvproofs/bounded`` (:func:`kvproofs.bounded.pep316.contract`):
  the function's own docstring contract evaluated on every case of a finite
  domain driven through the spec's real classes and every semantics profile.
  For functions that read a pool, a manager, a coordinator or a configuration,
  which CrossHair cannot build (proofs/README.md, "CrossHair pitfalls").
* :data:`EXEMPT`, with the reason it carries no contract.

:func:`gaps` lists whatever breaks that rule; ``tests/proofs/test_contract_coverage.py``
fails on any, so a function added to kvspec without a contract (or with one
nobody checks) shows up at once, and ``python -m kvproofs.coverage`` counts
them per module.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "spec" / "kvspec"

_CONDITION = re.compile(r"^(?P<kind>pre|post|raises)(\[[^\]]*\])?:\s*(?P<text>.+)$")


@dataclass(frozen=True)
class Condition:
    """One contract line of a docstring: ``pre:``, ``post:`` (or
    ``post[...]:``) or ``raises:``, with its line in the file."""

    kind: str
    text: str
    line: int

    @property
    def source(self) -> str:
        """The line as written (``post: ...``), as CrossHair's messages quote it."""
        return f"{self.kind}: {self.text}"


@dataclass(frozen=True)
class SpecFunction:
    """A public top-level function of kvspec and its contract."""

    module: str
    name: str
    path: Path
    line: int
    conditions: tuple[Condition, ...]
    params: tuple[str, ...] = ()
    """Its positional parameter names, as the spec's source declares them."""

    @property
    def qualname(self) -> str:
        """``kvspec.module.function``."""
        return f"{self.module}.{self.name}"

    @property
    def short(self) -> str:
        """``module.function`` without ``kvspec.``."""
        return self.qualname.removeprefix("kvspec.")

    @property
    def posts(self) -> tuple[Condition, ...]:
        """The ``post:`` lines: one proof obligation each."""
        return tuple(c for c in self.conditions if c.kind == "post")

    @property
    def pres(self) -> tuple[Condition, ...]:
        """The ``pre:`` lines."""
        return tuple(c for c in self.conditions if c.kind == "pre")

    @property
    def raises(self) -> tuple[str, ...]:
        """Exception class names of the ``raises:`` lines."""
        return tuple(n.strip() for c in self.conditions if c.kind == "raises" for n in c.text.split(","))

    @property
    def has_contract(self) -> bool:
        """Whether the docstring states at least one ``post:`` line."""
        return bool(self.posts)


def conditions_of(node: ast.FunctionDef) -> tuple[Condition, ...]:
    """The contract lines of a function's docstring, with their file lines."""
    if not (node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)):
        return ()
    doc = node.body[0].value
    if not isinstance(doc.value, str):
        return ()
    out = []
    for i, raw in enumerate(doc.value.splitlines()):
        m = _CONDITION.match(raw.strip())
        if m:
            out.append(Condition(m["kind"], m["text"].strip(), doc.lineno + i))
    return tuple(out)


@cache
def spec_functions() -> tuple[SpecFunction, ...]:
    """Every public top-level function of kvspec, module by module."""
    out = []
    for path in sorted(SPEC.glob("*.py")):
        tree = ast.parse(path.read_text())
        module = f"kvspec.{path.stem}" if path.stem != "__init__" else "kvspec"
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                params = tuple(a.arg for a in (*node.args.posonlyargs, *node.args.args))
                out.append(SpecFunction(module, node.name, path, node.lineno, conditions_of(node), params))
    return tuple(out)


def spec_function(qualname: str) -> SpecFunction:
    """The :class:`SpecFunction` called ``qualname`` (``kvspec.module.function``)."""
    for fn in spec_functions():
        if fn.qualname == qualname:
            return fn
    raise KeyError(f"no public top-level function {qualname} in spec/kvspec")


@dataclass(frozen=True)
class Bound:
    """How CrossHair checks one spec function's own contract.

    ``bound``: an extra ``pre:`` expression over the function's parameters
    that keeps the domain finite (None: the unbounded contract, which must be
    exhausted as it stands). ``iterations``: the path budget (a wrapper's
    ``max_iterations`` directive; for an unbounded check CrossHair's
    ``--max_uninteresting_iterations``). A condition that is not exhausted
    within the budget ends "not refuted", which fails the run.
    """

    bound: str | None = None
    iterations: int = 1000


STM = "kvspec.single_type_kv_cache_manager"

CROSSHAIR: dict[str, Bound] = {
    # single_type_kv_cache_manager
    f"{STM}.cdiv": Bound(),
    f"{STM}.contiguous_blocks_for_hit": Bound(),
    f"{STM}.align_down": Bound("num_blocks <= 12 and block_size <= 4 and alignment <= 8"),
    f"{STM}.full_attention_hit": Bound("len(present) <= 5 and block_size <= 3 and alignment <= 6"),
    f"{STM}.sliding_window_hit": Bound("len(present) <= 4 and contiguous <= 3 and block_size <= 2 and alignment <= 4"),
    f"{STM}.chunked_local_hit": Bound("max_length <= 12 and chunk <= 6 and block_size <= 3"),
    f"{STM}.mamba_hit": Bound("len(present) <= 5 and block_size <= 3 and alignment <= 6"),
    f"{STM}.blocks_to_allocate": Bound("required <= 5 and have <= 3 and len(hit_free) <= 3 and skipped <= 4"),
    f"{STM}.num_skipped_tokens": Bound(),
    f"{STM}.reachable_block_mask": Bound("end <= 6 and alignment <= 8 and kind.block_size <= 4"),
    f"{STM}.common_prefix_length": Bound("len(table) <= 3 and len(tables) <= 2 and all(len(t) <= 3 for t in tables)"),
    f"{STM}.trim_null_head": Bound("len(table) <= 4"),
    f"{STM}.mamba_align_new_blocks": Bound(),
    f"{STM}.records_new_block_ids": Bound(),
    # block_pool
    "kvspec.block_pool.requeue": Bound("len(free_queue) <= 3 and len(released) <= 3"),
    "kvspec.block_pool.event_fields": Bound(),
    # hashing
    "kvspec.hashing.make_key": Bound("len(block_hash) <= 8"),
    "kvspec.hashing.split_key": Bound("len(key) <= 12"),
    "kvspec.hashing.external_block_hash": Bound("len(block_hash) <= 12"),
    # config
    "kvspec.config.prefix_cacheable": Bound(),
    "kvspec.config.speculative_blocks": Bound(),
    "kvspec.config.cacheable_blocks": Bound(),
    "kvspec.config.kind_name": Bound(),
    "kvspec.config.event_sliding_window": Bound(),
    "kvspec.config.tracks_new_block_ids": Bound(),
    "kvspec.config.admission_cap": Bound(),
    "kvspec.config.validate_ring_kind": Bound("where == ''"),
    "kvspec.config.scales_by_dcp": Bound(),
    # kv_cache_coordinator
    "kvspec.kv_cache_coordinator.eagle_search_limit": Bound(),
    # kv_cache_manager
    "kvspec.kv_cache_manager.prefix_hint": Bound(),
    "kvspec.kv_cache_manager.require_operation": Bound(),
    "kvspec.kv_cache_manager.allocation_without_tokens": Bound(),
    "kvspec.kv_cache_manager.skip_basis": Bound(),
    # features
    "kvspec.mamba_tail.registers_mamba_tail": Bound(),
    "kvspec.mamba_tail.mamba_tail_boundary": Bound(),
    "kvspec.mamba_tail.mamba_tail_index": Bound(),
    "kvspec.partial_tail.registers_partial_tail": Bound(),
    "kvspec.partial_tail.fa_tail_boundary": Bound(),
    "kvspec.partial_tail.partial_tail_index": Bound(),
    "kvspec.partial_hits.blocks_fine_hits": Bound(),
    "kvspec.partial_hits.fine_grained": Bound(),
    "kvspec.partial_hits.eagle_margin": Bound(),
    "kvspec.partial_hits.has_partial_local_hit": Bound("len(hits) <= 2"),
    # request
    "kvspec.request.key_forms": Bound(),
    "kvspec.request.token_id_limit": Bound(),
    "kvspec.request.construction_hit_limit": Bound(),
    # invariants
    "kvspec.invariants.require": Bound("message == ''"),
}
"""Spec functions whose own contracts CrossHair checks, and the bound of each
(see :class:`Bound`)."""


_PREDICATE = (
    "an invariant predicate over {}: it is the property itself, which check_invariants raises on and the "
    "lockstep evaluates after every step; a contract would restate its body"
)

EXEMPT: dict[str, str] = {
    "kvspec.block_pool.inv_null_block_inert": _PREDICATE.format("a pool"),
    "kvspec.block_pool.inv_free_queue_membership": _PREDICATE.format("a pool"),
    "kvspec.block_pool.inv_block_conservation": _PREDICATE.format("a pool"),
    "kvspec.block_pool.inv_hash_map_consistent": _PREDICATE.format("a pool"),
    "kvspec.kv_cache_manager.inv_ref_cnt_counts_holders": _PREDICATE.format("a KVCacheManager"),
    "kvspec.kv_cache_manager.inv_group_exclusive": _PREDICATE.format("a KVCacheManager"),
    "kvspec.kv_cache_manager.inv_hash_content": _PREDICATE.format("a KVCacheManager"),
    "kvspec.kv_cache_manager.inv_events_replay_to_cache": _PREDICATE.format("a KVCacheManager"),
    "kvspec.kv_cache_manager.tables_cover_slots": (
        "a postcondition predicate of allocate_slots over a KVCacheManager (allocate_slots requires it after "
        "every allocation; proofs/kvproofs/bounded/alloc.py checks the same cover on real managers)"
    ),
    "kvspec.single_type_kv_cache_manager.inv_uncached_tail": _PREDICATE.format("a single-type manager"),
    "kvspec.single_type_kv_cache_manager.inv_null_shape": _PREDICATE.format("a single-type manager"),
}
"""Public functions without a contract, each with the reason: the invariant
predicates over state objects, which are properties, not rules."""


F = TypeVar("F", bound=Callable[..., Any])

ALL_RELEASES = "all"
"""``about(..., releases=ALL_RELEASES)``: the check runs under every profile."""


def about(*subjects: Callable[..., Any], releases: str | tuple[str, ...] | None = None) -> Callable[[F], F]:
    """Mark a harness (``proofs/kvproofs/holds``) or a bounded check
    (``proofs/kvproofs/bounded``) as proving properties of the spec functions
    ``subjects``; ``releases`` names the releases whose profiles it feeds in
    (:data:`ALL_RELEASES`, a tuple such as ``("0.16.0",)``, or None for rules
    that read no profile switch). The coverage report counts its conditions
    for the subjects' modules and those releases."""

    def mark(fn: F) -> F:
        fn.__kvproofs_about__ = (tuple(f"{s.__module__}.{s.__name__}" for s in subjects), releases)  # type: ignore[attr-defined]  # a marker read by kvproofs.report
        return fn

    return mark


def about_of(fn: Callable[..., Any]) -> tuple[tuple[str, ...], str | tuple[str, ...] | None]:
    """The subjects and releases :func:`about` gave ``fn`` (none: ``((), None)``)."""
    marked: tuple[tuple[str, ...], str | tuple[str, ...] | None] = getattr(fn, "__kvproofs_about__", ((), None))
    return marked
