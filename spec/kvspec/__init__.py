"""kvspec: an executable specification of vLLM's paged KV-cache manager.

The behaviour of each supported vLLM release is a semantics profile
(:mod:`kvspec.profiles`); a configuration names its profile, the newest
supported release by default.

Plain Python over plain data: block ids are ints, tables are lists, the free
queue is a list in eviction order, recency is list position. Every stateful
class has ``check_invariants()``; every caller error raises a
:mod:`kvspec.errors` class before anything changes.

Layers (bottom up): :mod:`kvspec.hashing`, :mod:`kvspec.block_pool`,
:mod:`kvspec.single_type_kv_cache_manager`, :mod:`kvspec.kv_cache_coordinator`,
:mod:`kvspec.kv_cache_manager`.
"""

from kvspec.config import MLA as MLA
from kvspec.config import ChunkedLocal as ChunkedLocal
from kvspec.config import CrossAttention as CrossAttention
from kvspec.config import FullAttention as FullAttention
from kvspec.config import KVCacheConfig as KVCacheConfig
from kvspec.config import Mamba as Mamba
from kvspec.config import SinkFullAttention as SinkFullAttention
from kvspec.config import SlidingWindow as SlidingWindow
from kvspec.kv_cache_manager import KVCacheManager as KVCacheManager
from kvspec.profiles import NEWEST as NEWEST
from kvspec.profiles import PROFILES as PROFILES
from kvspec.profiles import SemanticsProfile as SemanticsProfile
from kvspec.request import RequestBlockHasher as RequestBlockHasher
from kvspec.request import RequestStatus as RequestStatus
