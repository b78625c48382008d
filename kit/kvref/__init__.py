"""kvref: the conformance kit for paged KV-cache managers.

Adapters (:mod:`kvref.adapters`) put an implementation behind vLLM's
facade; the lockstep state machines (:mod:`kvref.stateful`) drive several of
them through scheduler-like histories and compare every output and view;
traces (:mod:`kvref.traces`) replay such histories in any language; the CLI
(``kvref check``) runs it all.

The names an adapter author needs are importable from here
(:data:`__all__`; docs/writing-an-adapter.md). Everything else is internal
and may change; the example adapters import only these names (a test checks it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvref.adapters import (
        PROTOCOL_VERSION,
        AdapterFactory,
        DeclaredSemantics,
        KVCacheAdapter,
        load_factory,
        protocol_version,
        semantics_of,
    )
    from kvref.adapters.vllm.eras import VllmApi
    from kvref.adapters.vllm.lineage import ERA_NAMES, VllmLineage
    from kvref.capabilities import Unsupported, declare
    from kvref.divergences import Divergence
    from kvref.layers.pool import BlockPoolAdapter

_PUBLIC = {
    "ERA_NAMES": "kvref.adapters.vllm.lineage",
    "AdapterFactory": "kvref.adapters",
    "BlockPoolAdapter": "kvref.layers.pool",
    "DeclaredSemantics": "kvref.adapters",
    "Divergence": "kvref.divergences",
    "KVCacheAdapter": "kvref.adapters",
    "PROTOCOL_VERSION": "kvref.adapters",
    "Unsupported": "kvref.capabilities",
    "VllmApi": "kvref.adapters.vllm.eras",
    "VllmLineage": "kvref.adapters.vllm.lineage",
    "declare": "kvref.capabilities",
    "load_factory": "kvref.adapters",
    "protocol_version": "kvref.adapters",
    "semantics_of": "kvref.adapters",
}

__all__ = [
    "ERA_NAMES",
    "PROTOCOL_VERSION",
    "AdapterFactory",
    "BlockPoolAdapter",
    "DeclaredSemantics",
    "Divergence",
    "KVCacheAdapter",
    "Unsupported",
    "VllmApi",
    "VllmLineage",
    "declare",
    "load_factory",
    "protocol_version",
    "semantics_of",
]
"""The public API: what adapters and their authors may import (from ``kvref``)."""


def __getattr__(name: str) -> Any:
    """Import a public name on first use (``import kvref`` stays cheap)."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'kvref' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
