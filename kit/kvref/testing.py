"""Helpers for worked examples that run on any adapter.

:func:`make_kv` builds an adapter for a target (``spec``, ``impl``, ``vllm`` or
``module:factory``) and wraps it so that every method call is followed by the
adapter's ``check_invariants()`` when it has one; :class:`KV` adds the few
scheduler moves an example needs (admit with the prefix hit, one decode step).
The pytest plugin's ``kvref_target`` fixture names the target chosen with
``--kvref-target``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

from kvref.adapters import KVCacheAdapter, load_factory
from kvspec.config import AttentionKind, KVCacheConfig
from kvspec.request import Request, RequestBlockHasher, RequestStatus
from kvspec.view import BlockIds


class _Checked:
    """Forwards to an adapter; runs its ``check_invariants()`` (if it has one)
    after every method call."""

    def __init__(self, adapter: KVCacheAdapter) -> None:
        self._adapter = adapter
        self._check: Callable[[], None] | None = getattr(adapter, "check_invariants", None)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._adapter, name)
        if not callable(attr) or self._check is None:
            return attr
        check = self._check

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            check()
            return result

        return call


@dataclass(frozen=True)
class KV:
    """An adapter under test, its target name, config and request builder."""

    a: KVCacheAdapter
    target: str
    config: KVCacheConfig
    hasher: RequestBlockHasher

    @property
    def is_vllm(self) -> bool:
        """Whether this is real vLLM (which keeps its known divergences)."""
        return self.target == "vllm"

    def req(self, rid: str, prompt: list[int] | range) -> Request:
        """A new WAITING request with ``prompt``."""
        return self.hasher.new_request(rid, list(prompt))

    def out(self, request: Request, *tokens: int) -> Request:
        """``request`` with sampled output tokens appended."""
        return self.hasher.with_output_tokens(request, tokens)

    def admit(self, request: Request, num_new_tokens: int | None = None, **kw: Any) -> BlockIds | None:
        """Look up the prefix hit, then allocate the rest of the prompt (or
        ``num_new_tokens``) with it, like the scheduler does for a waiting request."""
        hits, n = self.a.get_computed_blocks(request)
        new = request.num_tokens - n if num_new_tokens is None else num_new_tokens
        return self.a.allocate_slots(request, new, n, hits, **kw)

    def decode(self, request: Request, token: int, **kw: Any) -> tuple[Request, BlockIds | None]:
        """One decode step: every token of ``request`` is computed, ``token`` is
        sampled, and a slot is allocated for it. Returns the advanced request."""
        nxt = computed(self.out(request, token), request.num_tokens)
        return nxt, self.a.allocate_slots(nxt, 1, **kw)

    def table(self, rid: str) -> BlockIds:
        """The request's block ids per group."""
        return self.a.get_block_ids(rid)

    def hashed(self) -> set[int]:
        """Ids of the blocks currently in the prefix cache."""
        return {b for _, ids in self.a.to_view().cached for b in ids}

    @property
    def workaround(self) -> str | None:
        """The vLLM adapter's construction workaround, None elsewhere."""
        value = getattr(self.a, "construction_workaround", None)
        return None if value is None else str(value)


def make_kv(target: str, *groups: AttentionKind, **kw: Any) -> KV:
    """A fresh adapter for ``groups`` (num_blocks 16, max_model_len 128 unless
    given; ``profile=`` a :class:`kvspec.profiles.SemanticsProfile`)."""
    kw.setdefault("num_blocks", 16)
    kw.setdefault("max_model_len", 128)
    config = KVCacheConfig(groups=groups, **kw)
    adapter = load_factory(target)(config)
    hasher = RequestBlockHasher.for_config(config)
    return KV(cast(KVCacheAdapter, _Checked(adapter)), target, config, hasher)


def computed(request: Request, n: int) -> Request:
    """``request`` running with ``n`` computed tokens."""
    return replace(request, num_computed_tokens=n, status=RequestStatus.RUNNING)
