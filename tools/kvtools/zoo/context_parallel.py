"""Zoo entries under decode/prefill context parallelism.

kvimpl refuses context parallelism, but for one full-attention (or MLA) group
the scaled rules are exactly a plain configuration whose block size is the
scaled one (no lookup refusal, no mask, no admission cap applies to those
kinds). So the mutant runs kvimpl on that equivalent configuration and plants
its one fault on the caller side, as :mod:`kvtools.zoo.hashing` does.
"""

from __future__ import annotations

from dataclasses import replace

from kvref.adapters.impl import ImplAdapter
from kvref.capabilities import declare
from kvspec.config import FULL_TYPE_KINDS, KVCacheConfig, SinkFullAttention
from kvspec.errors import UnsupportedByProfileError
from kvspec.hashing import get_hash_fn_by_name, none_hash
from kvtools.zoo.base import entry, mutant
from kvtools.zoo.hashing import _RehashingAdapter


@entry(
    "vllm#26296",
    "under decode context parallelism the request hasher uses the engine's unscaled block size while the "
    "managers cache and look up blocks of the DCP-scaled size, so block i is keyed by the hash of its first "
    "block_size tokens instead of its own",
    "view diff (cache keys) once a block of a full@dcp or mla@dcp shape is cached",
)
@declare(features=("context-parallelism",))  # else the lockstep refuses every configuration it is planted in
def dcp_unscaled_request_hashes(config: KVCacheConfig) -> ImplAdapter:
    """Request hashes at the unscaled block size under DCP (plain kvimpl otherwise)."""
    if config.dcp_world_size * config.pcp_world_size == 1:
        return mutant(config, "dcp_unscaled_request_hashes")
    kind = config.groups[0]
    if len(config.groups) > 1 or not isinstance(kind, FULL_TYPE_KINDS) or isinstance(kind, SinkFullAttention):
        raise UnsupportedByProfileError(
            "dcp_unscaled_request_hashes: only one full-attention or MLA group under context parallelism"
        )
    plain = replace(config, groups=config.manager_groups(), dcp_world_size=1, pcp_world_size=1)
    fn = get_hash_fn_by_name(config.hash_function)
    adapter = _RehashingAdapter(plain, "dcp_unscaled_request_hashes", fn, none_hash(fn, config.hash_seed))
    adapter._hbs = kind.block_size  # the planted fault: hashes at the engine's unscaled block size
    return adapter
