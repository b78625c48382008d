"""Caller errors shared by the specification and every implementation.

Every public operation validates its arguments *before* it changes anything,
so a raised :class:`KVCacheError` always leaves the state exactly as it was.

Where vLLM 0.25.1 raises a builtin exception for the same caller error
(``ValueError`` for a bad token count or an unknown hash function), the
matching class here also derives from that builtin, so code written against
vLLM keeps working.
"""

from __future__ import annotations


class KVCacheError(Exception):
    """Base class of every error raised for a caller mistake."""


class ConfigError(KVCacheError, ValueError):
    """The configuration cannot describe a working KV cache (e.g. block size 0)."""


class UnsupportedByProfileError(ConfigError):
    """The configuration needs behaviour of its semantics profile's release
    that kvspec does not model yet (see ``kvspec.profiles.unsupported_reason``).

    It is not a caller error of the release itself: the lockstep counts such
    configurations as unsupported instead of checking them.
    """


class UnsupportedOperationError(KVCacheError):
    """The operation does not exist in the release the profile models (for
    example ``record_prefix_cache_stats`` before vLLM 0.27.0)."""


class UnknownHashFunctionError(ConfigError):
    """The hash function name is not one of vLLM's four names."""


class InvalidRequestError(KVCacheError, ValueError):
    """A request value is malformed (e.g. an empty prompt, a LoRA id below 1)."""


class InvalidTokenCountError(KVCacheError, ValueError):
    """A token count is negative, or zero where a positive one is required."""


class ExceedsMaxModelLenError(KVCacheError, ValueError):
    """The request would compute more tokens than ``max_model_len`` allows."""


class UnexpectedPrefixHitError(KVCacheError):
    """Prefix-cache hits were passed for a request that already holds blocks.

    vLLM only accepts hits on a request's first allocation; for a running
    request it trips an assertion after it has already freed skipped blocks.
    """


class StaleHitError(KVCacheError):
    """A hit block is no longer cached under the hash the request expects,
    or is one ``get_computed_blocks`` can never return.

    Hits are not pinned by ``get_computed_blocks``; anything that evicts them
    before ``allocate_slots`` makes the hit invalid. No hit is valid with
    prefix caching off, and the null block is never part of a full-attention
    hit (only leading, skipped positions of sliding-window, chunked-local and
    Mamba hits are null).
    """


class GroupCountError(KVCacheError, ValueError):
    """A per-group value has a different number of groups than the config, or
    a group id names a group the config does not have."""


class InvalidBlockIdError(KVCacheError, ValueError):
    """A block id is outside ``0 .. num_gpu_blocks - 1``."""


class DoubleFreeError(KVCacheError):
    """A block would be freed more often than it was allocated or popped."""


class UnknownRequestError(KVCacheError, KeyError):
    """The operation needs a request that currently holds blocks."""


class CacheBeyondAllocationError(KVCacheError, ValueError):
    """``cache_blocks`` asked to cache tokens that have no block or no hash."""


class PoolExhaustedError(KVCacheError, ValueError):
    """More blocks were requested from the pool than are free."""


class ContextParallelLookupError(KVCacheError):
    """A prefix-cache lookup of a kind that refuses decode/prefill context
    parallelism (sliding window, chunked local, Mamba with a DCP or PCP size
    above 1; vLLM asserts at ``find_longest_cache_hit``). Nothing changes."""


class EagleAlignmentLookupError(KVCacheError):
    """A prefix-cache lookup vLLM 0.16.0 fails: in a cached hybrid under EAGLE,
    a sliding-window group whose block size is not the scheduler block size
    finds a hit (0.16.0's sliding-window search asserts that the two sizes are
    equal before it drops the EAGLE block; profile switch
    ``hybrid_eagle_lookahead`` off). Nothing changes."""
