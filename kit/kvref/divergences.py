"""Known divergences from vLLM and the matchers that recognise them.

The registry is ``divergences.toml`` beside this module. Each entry names the
releases it applies to (``introduced``, and ``fixed`` when a later release no
longer shows it); only entries that apply to the configuration's semantics
profile can explain a difference. A matcher receives the configuration, the
operation, vLLM's output and the spec-semantics output and returns True only
if the difference is exactly the documented one.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvspec.config import FULL_TYPE_KINDS, KVCacheConfig, Mamba, SlidingWindow

Json = Any


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

    def applies_to(self, release: str) -> bool:
        """Whether vLLM ``release`` shows this divergence."""
        after = release_key(release) >= release_key(self.introduced)
        return after and (self.fixed is None or release_key(release) < release_key(self.fixed))

    def trace_for(self, release: str) -> str:
        """The repository path of this divergence's minimal trace under ``release``'s profile."""
        return f"traces/vllm-{release}/divergences/{self.id}.jsonl"


def release_key(release: str) -> tuple[int, ...]:
    """``"0.27.1"`` -> ``(0, 27, 1)``, for ordering releases."""
    return tuple(int(part) for part in release.split("."))


def load_registry() -> dict[str, Divergence]:
    """Every entry of ``divergences.toml`` by id."""
    data = tomllib.loads((Path(__file__).parent / "divergences.toml").read_text())
    return {
        d["id"]: Divergence(
            d["id"], d["title"], d["operation"], d["invariant"], d["trace"], d["halts"],
            d.get("introduced", "0.25.1"), d.get("fixed"),
        )
        for d in data["divergence"]
    }  # fmt: skip


def explain(cfg: KVCacheConfig, op: Json, vllm_out: Json, spec_out: Json, pending: bool) -> str | None:
    """The id of the known divergence of ``cfg.profile``'s release that
    explains ``vllm_out != spec_out``, or None."""
    registry = load_registry()
    for div_id, matcher in MATCHERS.items():
        if registry[div_id].applies_to(cfg.profile.release) and matcher(cfg, op, vllm_out, spec_out, pending):
            return div_id
    return None


def _hit_lengths(cfg: KVCacheConfig, out: Json) -> list[int]:
    return [len(blocks) * kind.block_size for kind, blocks in zip(cfg.groups, out["blocks"], strict=True)]


def _eagle_mamba(cfg: KVCacheConfig, op: Json, vllm_out: Json, spec_out: Json, pending: bool) -> bool:
    if op["op"] != "get_computed_blocks" or "blocks" not in vllm_out:
        return False
    eagle = cfg.eagle_group_ids()
    if not any(isinstance(k, Mamba) and g in eagle for g, k in enumerate(cfg.groups)):
        return False
    # Some group's list does not cover the hit: a full-attention list shorter
    # than the hit (the look-ahead raised the hit after full attention was
    # trimmed), or a list longer than a hit that an earlier pass cut.
    n = vllm_out["num_tokens"]
    return any(length != n for length in _hit_lengths(cfg, vllm_out))


def _second_full(cfg: KVCacheConfig, op: Json, vllm_out: Json, spec_out: Json, pending: bool) -> bool:
    if op["op"] != "get_computed_blocks" or "blocks" not in vllm_out:
        return False
    if len({k for k in cfg.groups if isinstance(k, FULL_TYPE_KINDS)}) < 2:
        return False
    lengths = _hit_lengths(cfg, vllm_out)
    n = vllm_out["num_tokens"]
    return any(isinstance(k, FULL_TYPE_KINDS) and lengths[g] > n for g, k in enumerate(cfg.groups))


def _swa_eagle(cfg: KVCacheConfig, op: Json, vllm_out: Json, spec_out: Json, pending: bool) -> bool:
    if op["op"] != "get_computed_blocks" or "blocks" not in vllm_out or "blocks" not in spec_out:
        return False
    eagle, sched = cfg.eagle_group_ids(), cfg.scheduler_block_size
    swa_eagle = any(
        isinstance(k, SlidingWindow) and g in eagle and k.block_size != sched for g, k in enumerate(cfg.groups)
    )
    return swa_eagle and spec_out["num_tokens"] > vllm_out["num_tokens"]


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


MATCHERS: dict[str, Callable[[KVCacheConfig, Json, Json, Json, bool], bool]] = {
    "eagle-mamba-hit": _eagle_mamba,
    "second-full-group": _second_full,
    "swa-eagle-fallback": _swa_eagle,
    "common-prefix-pending": _common_prefix,
    "mamba-align-external-estimate": _mamba_external,
}
