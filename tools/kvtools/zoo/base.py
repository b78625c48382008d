"""What every zoo entry is made of: the registry record and the planting helpers.

A mutant is kvimpl's ``KVCacheManager`` adapter with *one* method replaced on
one instance (impl/ is never edited): :func:`mutant` builds the adapter under
the entry's name, :func:`patch` plants the fault, and :func:`entry` registers
the factory with its upstream number, the fault and what should catch it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvref.adapters.impl import ImplAdapter
from kvspec.config import KVCacheConfig

Factory = Callable[[KVCacheConfig], ImplAdapter]


@dataclass(frozen=True)
class ZooEntry:
    """One re-planted upstream fault."""

    name: str
    upstream: str
    description: str
    factory: Factory
    catch: str
    """Which comparison is expected to see it (or why it survives)."""
    unreachable: bool = False
    """True when the fault cannot be reached through the public API (argued in ``catch``)."""
    level: str = "conformance"
    """How it is hunted: ``conformance`` (in lockstep with kvspec) or ``safety`` (alone, under the safety
    oracles of :mod:`kvref.safety`, with no reference to compare with)."""
    semantics: str | None = None
    """The semantics profile it is hunted under when ``--semantics`` names none (None: the zoo's
    default, vLLM 0.25.1): a fault in an operation that release lacks needs a later one."""


ENTRIES: dict[str, ZooEntry] = {}
"""Every registered entry by name, in import order (:data:`kvtools.zoo.ZOO` orders them)."""


def entry(
    upstream: str,
    description: str,
    catch: str,
    unreachable: bool = False,
    level: str = "conformance",
    semantics: str | None = None,
) -> Callable[[Factory], Factory]:
    """Register the decorated factory as the zoo entry of its own name."""

    def register(factory: Factory) -> Factory:
        ENTRIES[factory.__name__] = ZooEntry(
            factory.__name__, upstream, description, factory, catch, unreachable, level, semantics
        )
        return factory

    return register


def mutant(config: KVCacheConfig, name: str) -> ImplAdapter:
    """A fresh kvimpl adapter for ``config`` that reports itself as ``name``."""
    adapter = ImplAdapter(config)
    adapter.name = name
    return adapter


def patch(obj: object, attr: str, fn: object) -> None:
    """Replace one method on one instance (the single planted fault)."""
    setattr(obj, attr, fn)


def bound_args(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``fn``'s arguments by name, defaults filled in, as one call would bind them."""
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)
