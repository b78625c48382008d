"""Template: your engine's KV-cache manager behind kvref's facade.

Copy this file next to your code, replace ``Engine`` (a stand-in: kvspec's
own manager) with your engine, and run::

    kvref check --target my_adapter:make --against spec

Rules (docs/writing-an-adapter.md): block ids per group with 0 the null block;
caller errors raise :mod:`kvspec.errors` classes before any change (section 4
of the guide lists them, in kvspec's order), unless the engine trusts its
caller (``declare(trusts_caller=True)``: invalid calls are then never sent);
what the engine cannot do is declared (``supports``, ``unsupported``, the
capabilities ``whole_prompts`` and ``one_token_decode``) or raised as
``kvref.Unsupported(message, feature)``, and kvref skips it. Known policy
differences go in a ``--known`` file (section 5).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvref import Unsupported, declare
from kvspec.config import FullAttention, KVCacheConfig
from kvspec.events import KVCacheEvent
from kvspec.kv_cache_manager import KVCacheManager as Engine
from kvspec.request import Request
from kvspec.stats import PrefixCacheStats
from kvspec.view import BlockIds, KVView


def supports(config: KVCacheConfig) -> str | None:
    """None when the engine runs ``config``, else why not (a skip, counted)."""
    if any(type(kind) is not FullAttention for kind in config.groups):
        return "only full attention so far"
    return None


# Context parallelism is opt-in: add features={"context-parallelism"} once the engine scales its
# block sizes by dcp_world_size / pcp_world_size. An engine whose scheduler admits whole prompts, decodes
# one token a step and never makes an invalid call adds whole_prompts=True, one_token_decode=True,
# trusts_caller=True (docs/writing-an-adapter.md, section 3).
@declare(
    supports=supports,
    unsupported={
        "op:record_prefix_cache_stats",
        "op:get_prefix_hint",
        "op:get_block_ids_for_computed_tokens",
        "op:estimate_cached_tokens",
        "op:record_blocks_for_zeroing",
        "op:get_zeroing_block_ids_in_range",
        "skip_zeroing_group_ids",
        "op:get_computed_blocks_for_connector",
        "op:truncate_computed_blocks",
        "mtp",  # num_prefill_lookahead and a window's extra_retained_tokens: the MTP shapes run without them
        "lookahead_hashes",  # num_hash_lookahead_tokens (vLLM 0.33.0 on): EAGLE runs keep the trailing-block drop
        "retention",  # prefix_cache_retention_interval (vLLM 0.23.0 on): runs cache densely
        "prefill_checkpoints",  # a Mamba group's num_prefill_checkpoint_blocks (vLLM 0.29.0 on): runs keep 0
        "report_mode_full",  # kv_cache_report_mode "full" (vLLM 0.26.0 on): hits are not announced again
    },
)
def make(config: KVCacheConfig) -> MyAdapter:
    """The factory kvref calls once per drawn configuration."""
    return MyAdapter(config)


class MyAdapter:
    """Protocol 2: ``free`` and ``pop_blocks_for_free`` get the request."""

    name = "mine"
    protocol_version = 2

    def __init__(self, config: KVCacheConfig) -> None:
        self.engine = Engine(config)

    def get_computed_blocks(self, request: Request) -> tuple[BlockIds, int]:
        return self.engine.get_computed_blocks(request)

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: BlockIds | None = None, num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0, delay_cache_blocks: bool = False,
                       num_encoder_tokens: int = 0, full_sequence_must_fit: bool = False,
                       reserved_blocks: int = 0, has_scheduled_reqs: bool = True) -> BlockIds | None:  # fmt: skip
        if num_encoder_tokens:
            raise Unsupported("no encoder blocks yet", "encoder")
        return self.engine.allocate_slots(
            request, num_new_tokens, num_new_computed_tokens, new_computed_blocks, num_lookahead_tokens,
            num_external_computed_tokens, delay_cache_blocks, num_encoder_tokens, full_sequence_must_fit,
            reserved_blocks, has_scheduled_reqs,
        )  # fmt: skip

    def free(self, request: Request) -> None:
        self.engine.free(request.request_id)

    def pop_blocks_for_free(self, request: Request) -> tuple[int, ...]:
        return tuple(self.engine.pop_blocks_for_free(request.request_id))

    def free_blocks(self, block_ids: Sequence[int]) -> None:
        self.engine.free_blocks(block_ids)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:  # fmt: skip
        self.engine.remove_skipped_blocks(request_id, total_computed_tokens, num_prompt_tokens)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        self.engine.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.engine.reset_prefix_cache()

    def get_num_common_prefix_blocks(self, request_id: str) -> tuple[int, ...]:
        return self.engine.get_num_common_prefix_blocks(request_id)

    def take_events(self) -> list[KVCacheEvent]:
        return self.engine.take_events()

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        self.engine.cache_blocks(request, num_computed_tokens)

    def take_new_block_ids(self) -> list[int]:
        return list(self.engine.take_new_block_ids())

    def new_step_starts(self) -> None:
        self.engine.new_step_starts()

    def get_block_ids(self, request_id: str) -> BlockIds:
        return self.engine.get_block_ids(request_id)

    @property
    def usage(self) -> float:
        return self.engine.usage

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        return self.engine.make_prefix_cache_stats()

    def to_view(self) -> KVView:
        """Free queue (head first), ref counts > 0 (no null block), cache map
        (key = hash || group id as 4 bytes), tables, usage: kvref's ids."""
        return self.engine.to_view()
