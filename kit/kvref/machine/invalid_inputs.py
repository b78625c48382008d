"""Broken configurations and requests: rejected before any manager sees them.

:func:`bad_config` breaks a configuration in one of the :data:`BAD_CONFIGS`
ways (each a :class:`kvspec.errors.ConfigError` under the profile it is
tried with); :meth:`InvalidInputs._bad_request` makes one of the
:data:`BAD_REQUESTS` caller errors of kvspec's request hasher (each an
:class:`kvspec.errors.InvalidRequestError`). ``invalid_other``
(:mod:`kvref.machine.invalid`) draws them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvref.machine.base import MachineBase
from kvspec.config import (
    ChunkedLocal,
    CircularBuffer,
    CrossAttention,
    FullAttention,
    KVCacheConfig,
    Mamba,
    SinkFullAttention,
    SlidingWindow,
)
from kvspec.errors import ConfigError, InvalidRequestError
from kvspec.hashing import ExtraKeySource, LoRA
from kvspec.profiles import VLLM_0_27_1, profile_named
from kvspec.request import RequestBlockHasher

BAD_CONFIGS = (
    "blocks", "block_size", "window", "watermark", "hash", "eagle_group", "sink", "profile", "no_groups",
    "max_model_len", "batched_tokens", "cp_size", "hash_block", "hash_block_coarse", "hash_block_unitary",
    "ring_only_hybrid", "equal_groups", "chunk", "chunked_eagle", "chunked_block_size", "mamba_mode",
    "mamba_spec_blocks", "cross_cached", "cp_sink", "cp_hybrid", "fine_hits_blocked", "cp_ring", "cp_cached_mamba",
    "foreign_kind", "old_release_watermark", "old_release_budget",
)  # fmt: skip
"""Broken configurations ``invalid_other`` tries (each must raise ConfigError; see :func:`bad_config`)."""
MTP_BAD_CONFIGS = ("lookahead", "retained", "lookahead_old_release", "lookahead_eagle")
"""Broken multi-module MTP inputs: a negative look-ahead, a negative retained count, the inputs
under a release before them, a look-ahead past the scheduler block under EAGLE. Under the MTP
shapes (:data:`kvref.shapes.MTP_SHAPES`) half the broken-config actions try all of them."""
HASH_LOOKAHEAD_BAD_CONFIGS = ("hash_lookahead", "hash_lookahead_old_release")
"""Broken look-ahead block hashes: a negative count, and look-ahead hashes under a release before
them (vLLM 0.32.0). In runs that draw look-ahead hashes half the broken-config actions try both."""
RETENTION_BAD_CONFIGS = (
    "retention_negative", "retention_type", "retention_unaligned", "retention_no_group", "retention_old_release",
)  # fmt: skip
"""Broken retention intervals: a negative one, one that is not an int, one that is not a multiple of
the scheduler block, one in a model without a group it acts on, one under a release before them
(vLLM 0.22.1). In runs that draw a retention interval half the broken-config actions try all of them."""
CHECKPOINT_BAD_CONFIGS = (
    "checkpoint_negative", "checkpoint_type", "checkpoint_alignment", "checkpoint_alignment_old_release",
    "checkpoint_old_release", "checkpoint_alignment_type",
)  # fmt: skip
"""Broken Mamba prefill checkpoints: a negative count, a count that is not an int, an alignment
below 1, an alignment under a release before it (vLLM 0.29.0), a count under a release before it
(0.28.0), an alignment that is not an int (0.30.0). In runs that draw checkpoints half the
broken-config actions try all of them."""
BAD_REQUESTS = (
    "request_id", "empty_prompt", "str_prompt", "negative_token", "lora_id", "lora_path", "append_str",
    "logprobs_flag", "logprob_start", "start_without_logprobs", "report_mode",
)  # fmt: skip
"""Caller errors of kvspec's request hasher (each must raise InvalidRequestError)."""


def bad_config(cfg: KVCacheConfig, kind: str) -> dict[str, Any] | None:
    """The fields that break ``cfg`` in the way ``kind`` names (a
    :data:`BAD_CONFIGS` entry), or None where that break does not apply to
    its release (each is a ConfigError under the profile it is tried with)."""
    first, p = cfg.groups[0], cfg.profile
    bs, sbs = first.block_size, cfg.scheduler_block_size
    cached = {"enable_caching": True, "dcp_world_size": 1, "pcp_world_size": 1, "use_eagle": False, "eagle_groups": ()}
    hybrid_cp = dict(cached, groups=(FullAttention(4), SlidingWindow(4, 8)), dcp_world_size=2)
    checkpointed = Mamba(bs, "align", num_prefill_checkpoint_blocks=1)
    table: dict[str, dict[str, Any] | None] = {
        "blocks": {"num_blocks": 0},
        "block_size": {"groups": (FullAttention(0),)},
        "window": {"groups": (SlidingWindow(bs, 0),)},
        "watermark": {"watermark": 1.0},
        "hash": {"hash_function": "md5"},
        "eagle_group": {"use_eagle": True, "eagle_groups": (len(cfg.groups),)},
        # a sink of a block and one token (a block of one token divides any sink: use two)
        "sink": {"groups": (SinkFullAttention(max(bs, 2), max(bs, 2) + 1),)},
        "profile": {"profile": p.name},
        "no_groups": {"groups": ()},
        "max_model_len": {"max_model_len": 0},
        "batched_tokens": {"max_num_batched_tokens": 0},
        "cp_size": {"dcp_world_size": 0},
        "hash_block": {"hash_block_size": sbs + 1},
        "hash_block_coarse": dict(cached, groups=(FullAttention(2), SlidingWindow(3, 4)), hash_block_size=3),
        "hash_block_unitary": dict(cached, groups=(FullAttention(4),), hash_block_size=2),
        "ring_only_hybrid": dict(cached, groups=(CircularBuffer(4), CircularBuffer(8))),
        "equal_groups": None if p.single_spec_group_hybrid else dict(cached, groups=(FullAttention(4),) * 2),
        "chunk": {"groups": (ChunkedLocal(bs, 0),)},
        "chunked_eagle": dict(cached, groups=(ChunkedLocal(4, 8),), use_eagle=True),
        "chunked_block_size": dict(cached, groups=(FullAttention(8), ChunkedLocal(4, 16))),
        "mamba_mode": {"groups": (Mamba(bs, "bogus"),)},  # type: ignore[arg-type]  # the broken argument
        "mamba_spec_blocks": {"groups": (Mamba(bs, "none", -1),)},
        "cross_cached": dict(cached, groups=(CrossAttention(bs),)),
        "cp_sink": dict(cached, groups=(SinkFullAttention(4, 4),), dcp_world_size=2),
        "cp_hybrid": hybrid_cp if p.cp_block_scaling == "dcp-pcp" else None,
        "foreign_kind": {"groups": (*cfg.groups, ForeignKind(bs))},
        "old_release_watermark": None if p.admission_controls else {"watermark": 0.1},
        "old_release_budget": None if p.admission_controls else {"max_num_batched_tokens": 8},
        # the last three: configurations the release fails on, or that kvspec does not model for it
        "fine_hits_blocked": dict(cached, groups=(FullAttention(4), Mamba(8, "align"), SlidingWindow(8, 4)))
        if p.partial_hash_hits and not p.partial_hits_gated
        else None,
        "cp_ring": dict(cached, groups=(CircularBuffer(4),), dcp_world_size=2) if p.circular_buffer_kind else None,
        "cp_cached_mamba": dict(cached, groups=(Mamba(4, "align"),), dcp_world_size=2)
        if p.cp_block_scaling == "dcp"
        else None,
        "lookahead": {"num_prefill_lookahead": -1},
        "retained": {"groups": (SlidingWindow(bs, 2, -1),)},
        "lookahead_old_release": {"profile": VLLM_0_27_1, "num_prefill_lookahead": 2},
        "lookahead_eagle": dict(cached, groups=(FullAttention(2),), use_eagle=True, num_prefill_lookahead=3),
        "hash_lookahead": {"num_hash_lookahead_tokens": -1},
        "hash_lookahead_old_release": {"profile": profile_named("vllm-0.32.0"), "num_hash_lookahead_tokens": 1},
        "retention_negative": {"prefix_cache_retention_interval": -sbs},
        "retention_type": {"prefix_cache_retention_interval": str(sbs)},
        "retention_unaligned": {"prefix_cache_retention_interval": sbs + 1},
        "retention_no_group": dict(cached, groups=(FullAttention(bs),), prefix_cache_retention_interval=sbs),
        "retention_old_release": {"profile": profile_named("vllm-0.22.1"), "prefix_cache_retention_interval": 0},
        "checkpoint_negative": {"groups": (FullAttention(bs), Mamba(bs, "align", num_prefill_checkpoint_blocks=-1))},
        "checkpoint_type": {"groups": (Mamba(bs, "align", num_prefill_checkpoint_blocks="1"),)},  # type: ignore[arg-type]  # the broken argument
        "checkpoint_alignment": {"groups": (Mamba(bs, "align", prefill_checkpoint_alignment=0),)},
        "checkpoint_alignment_old_release": {
            "profile": profile_named("vllm-0.29.0"),
            "groups": (Mamba(bs, "align", prefill_checkpoint_alignment=bs),),
        },
        "checkpoint_old_release": {"profile": profile_named("vllm-0.28.0"), "groups": (checkpointed,)},
        "checkpoint_alignment_type": {
            "profile": profile_named("vllm-0.30.0"),
            "groups": (Mamba(bs, "align", num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=2.0),),  # type: ignore[arg-type]  # the broken argument
        },
    }
    return table[kind]


class InvalidInputs(MachineBase):
    """Broken configurations and requests, tried against kvspec."""

    def _invalid_config(self, kind: str) -> None:
        """A broken configuration is rejected with ConfigError before any manager exists."""
        bad = bad_config(self.cfg, kind)
        if bad is None:
            return
        if kind == "profile":  # a release named by a trace header or --semantics that kvspec does not know
            try:
                profile_named(f"{self.cfg.profile.name}-unknown")
            except KeyError:
                pass
            else:
                raise AssertionError("kvspec knows a profile nobody defined")
        try:
            replace(self.cfg, **bad)
        except ConfigError:
            assert self.lock is not None
            self.lock.stats.invalid_configs += 1
            return
        raise AssertionError(f"config with {bad} was accepted")

    def _bad_request(self, kind: str) -> None:
        """A caller error of the request hasher is rejected with InvalidRequestError
        (kvimpl's own request API gets the same probes under ``--target impl-mutable``)."""
        hasher = RequestBlockHasher.for_config(self.cfg)
        calls: dict[str, Any] = {
            "request_id": lambda: hasher.new_request(7, [1]),  # type: ignore[arg-type]  # the broken argument
            "empty_prompt": lambda: hasher.new_request("bad", []),
            "str_prompt": lambda: hasher.new_request("bad", "12"),  # type: ignore[arg-type]  # the broken argument
            "negative_token": lambda: hasher.new_request("bad", [1, -1]),
            "lora_id": lambda: LoRA("bad", 0),
            "lora_path": lambda: hasher.new_request("bad", [1], ExtraKeySource(lora=LoRA("bad", 1))),
            "append_str": lambda: hasher.with_output_tokens(hasher.new_request("bad", [1]), "7"),  # type: ignore[arg-type]  # the broken argument
            "logprobs_flag": lambda: hasher.new_request("bad", [1], prompt_logprobs=1),  # type: ignore[arg-type]  # the broken argument
            "logprob_start": lambda: hasher.new_request("bad", [1], prompt_logprobs=True, prompt_logprob_start=-1),
            "start_without_logprobs": lambda: hasher.new_request("bad", [1], prompt_logprob_start=0),
            "report_mode": lambda: hasher.new_request("bad", [1], kv_cache_report_mode="all"),  # type: ignore[arg-type]  # the broken argument
        }
        if kind == "lora_path" and not self.cfg.profile.extra_keys_tagged:
            return  # untagged extra keys do not hash the path: a LoRA without one is valid
        try:
            calls[kind]()
        except InvalidRequestError:
            return
        raise AssertionError(f"kvspec's request hasher accepted the caller error {kind!r}")


@dataclass(frozen=True)
class ForeignKind:
    """A group object that is no attention kind (``bad_config``'s ``foreign_kind``)."""

    block_size: int
