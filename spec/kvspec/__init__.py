"""kvspec: an executable specification of vLLM 0.25.1's paged KV-cache manager.

Plain Python over plain data: block ids are ints, tables are lists, the free
queue is a list in eviction order, recency is list position. Every stateful
class has ``check_invariants()``; every caller error raises a
:mod:`kvspec.errors` class before anything changes.

Layers (bottom up): :mod:`kvspec.hashing`, :mod:`kvspec.block_pool`,
:mod:`kvspec.single_type_kv_cache_manager`, :mod:`kvspec.kv_cache_coordinator`,
:mod:`kvspec.kv_cache_manager`.
"""

from kvspec.config import (
    MLA,
    AttentionKind,
    ChunkedLocal,
    CrossAttention,
    FullAttention,
    KVCacheConfig,
    Mamba,
    SinkFullAttention,
    SlidingWindow,
)
from kvspec.kv_cache_manager import KVCacheManager
from kvspec.request import Request, RequestBlockHasher, RequestStatus
from kvspec.view import BlockIds, KVView

SEMANTICS_VERSION = "vllm-0.25.1"
"""The vLLM release whose observable behaviour this package specifies."""

__all__ = [
    "MLA",
    "SEMANTICS_VERSION",
    "AttentionKind",
    "BlockIds",
    "ChunkedLocal",
    "CrossAttention",
    "FullAttention",
    "KVCacheConfig",
    "KVCacheManager",
    "KVView",
    "Mamba",
    "Request",
    "RequestBlockHasher",
    "RequestStatus",
    "SinkFullAttention",
    "SlidingWindow",
]
