"""kvimpl: an optimized implementation of vLLM 0.25.1's paged KV-cache manager.

Observably identical to the executable specification :mod:`kvspec` (same
block ids in the same order, same events, same errors raised before any
state change, same :class:`kvspec.view.KVView`), as checked in lockstep by
the conformance kit (``kvref check --target impl --against spec``). Module
for module it mirrors the spec with the same public names and signatures;
the bookkeeping sits in flat per-block lists (an intrusive doubly linked
free queue, ref counts, block hashes, per-group holder counts) instead of
the spec's O(n) list operations.

It imports from ``kvspec`` only value types (the configuration classes,
errors, events, view, stats, request types, ``BlockId`` and
``InvariantViolation``) and the hashing functions backed by the stored hash
vectors, never its logic: kvimpl keeps its own copies of the rules it needs
(:mod:`kvimpl.config_rules`), because a shared helper is a shared bug.

Layers (bottom up): :mod:`kvimpl.block_pool`,
:mod:`kvimpl.single_type_kv_cache_manager`, :mod:`kvimpl.kv_cache_coordinator`,
:mod:`kvimpl.kv_cache_manager` (the facade, method for method the spec's).
What the manager offers beyond the spec's facade lives in its base class
:class:`kvimpl.step_api.StepAPI`: a batched step (``allocate_slots_batch``,
``free_batch``), the running-step fast path and, when built with a
``device``, per-group device block tables (:mod:`kvimpl.block_table`, the only
module that imports torch, lazily).
"""

from kvimpl.kv_cache_manager import KVCacheManager as KVCacheManager

SEMANTICS_VERSION = "vllm-0.25.1"
"""The vLLM release whose observable behaviour this package implements."""
