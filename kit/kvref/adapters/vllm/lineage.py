"""A public base for adapters of vLLM-derived engines.

A fork that renamed vLLM's package (``aphrodite`` for ``vllm``), a plugin
whose ``KVCacheManager`` subclasses vLLM's, or vLLM itself at another
release: describe the engine as a :class:`VllmLineage` and use its
:meth:`~VllmLineage.make` as the factory::

    from kvref import VllmLineage

    APHRODITE = VllmLineage(package="aphrodite", env_prefix="APHRODITE_", upstream="0.29.0")
    make = APHRODITE.make            # kvref check --target mymod:make --against spec
    make_pool = APHRODITE.make_pool  # kvref check --layer pool --target mymod:make_pool

``make`` and ``make_pool`` are factories that carry the lineage's
declarations (``features``: the opt-in ``context-parallelism``;
``unsupported``; ``supports``), as :func:`kvref.declare` attaches them to a
function; ``declare`` also takes them (it wraps what cannot carry attributes).

The adapter is kvref's real-vLLM adapter (:mod:`kvref.adapters.vllm`) driving
the engine through the API era of its upstream release, with every module
path under ``package`` and every ``VLLM_`` environment variable under
``env_prefix``. It declares ``vllm-<upstream>`` semantics with
``upstream=True`` (the release's known divergences explain differences from
kvspec), plus the lineage's own ``known`` differences. Against its own
upstream (``--against vllm`` with that release installed) every difference is
the fork's.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, TypeVar

from kvref.adapters import DeclaredSemantics, load_callable
from kvref.capabilities import declare
from kvref.divergences import Divergence
from kvspec.config import KVCacheConfig

from .adapter import VllmAdapter
from .eras import ERAS, EnvNames, VllmApi, era_for, quiet_logs
from .errors import VllmUnavailable
from .pool import VllmPoolAdapter

_APIS: dict[VllmLineage, VllmApi] = {}
T = TypeVar("T")

ERA_NAMES = tuple(era.era for era in ERAS)
"""The API eras :attr:`VllmLineage.era` accepts (``"0.16"``, ``"0.25"``, ... ``"0.33"``)."""


@dataclass(frozen=True)
class VllmLineage:
    """A vLLM-derived engine and how to reach its internals.

    Attributes:
        package: Import name of the engine's package (``vllm`` for vLLM itself).
        upstream: The vLLM release it derives from, e.g. ``"0.29.0"``: picks the
            API era and the declared profile ``vllm-<upstream>``.
        env_prefix: Prefix replacing ``VLLM_`` in the environment variables it reads.
        era: An API era name (:data:`ERA_NAMES`: ``"0.29"``, ``"0.30"``, ...)
            when the engine's internals match another era than its upstream's.
        name: The adapter's name (default: ``package``).
        manager_class: ``module:Class`` of the engine's ``KVCacheManager``
            when it is not ``<package>.v1.core.kv_cache_manager.KVCacheManager``
            (a plugin's subclass); it is constructed like vLLM's.
        known: Known differences it declares (registry ids or
            :class:`kvref.divergences.Divergence` values).
        era_class: An era subclass of the engine's own, for an internal it
            changed: subclass :meth:`base_era` (a :class:`kvref.VllmApi`).
        features: Opt-in features it runs (``kvref.capabilities.OPT_IN_FEATURES``:
            ``"context-parallelism"`` for ``dcp_world_size`` or
            ``pcp_world_size`` above 1, which kvref's vLLM adapter drives).
        unsupported: Features it lacks (as :func:`kvref.declare` takes them).
        supports: ``supports(config) -> reason or None``, as :func:`kvref.declare` takes it.
    """

    package: str = "vllm"
    upstream: str = ""
    env_prefix: str = "VLLM_"
    era: str | None = None
    name: str | None = None
    manager_class: str | None = None
    known: tuple[str | Divergence, ...] = ()
    era_class: type[VllmApi] | None = None
    features: AbstractSet[str] = frozenset()
    unsupported: AbstractSet[str] = frozenset()
    supports: Callable[[KVCacheConfig], str | None] | None = None

    def __post_init__(self) -> None:
        """Check the declarations now, where the lineage is written.

        Raises:
            ValueError: For a feature that is not opt-in or not a feature (as :func:`kvref.declare`).
        """
        object.__setattr__(self, "features", frozenset(self.features))
        object.__setattr__(self, "unsupported", frozenset(self.unsupported))
        self._declared(self.build)

    @property
    def make(self) -> Callable[[KVCacheConfig], VllmAdapter]:
        """The factory (an adapter around a fresh manager of the engine), with
        the lineage's declarations.

        The adapter it builds raises VllmUnavailable if the engine cannot be
        imported, and :class:`kvref.Unsupported` if a configuration needs a
        parameter its era lacks.
        """
        return self._declared(self.build)

    @property
    def make_pool(self) -> Callable[[KVCacheConfig], VllmPoolAdapter]:
        """The pool factory (``kvref check --layer pool``), with the lineage's declarations."""
        return self._declared(self.build_pool)

    def build(self, config: KVCacheConfig) -> VllmAdapter:
        """An adapter around a fresh manager of the engine (what :attr:`make` calls).

        Raises:
            VllmUnavailable: If the engine cannot be imported.
            Unsupported: If ``config`` needs a parameter its era lacks.
        """
        adapter = VllmAdapter(config, self.api())
        adapter.name = self.adapter_name
        adapter.semantics = self.semantics
        return adapter

    def build_pool(self, config: KVCacheConfig) -> VllmPoolAdapter:
        """A pool adapter around a fresh block pool of the engine (what :attr:`make_pool` calls)."""
        adapter = VllmPoolAdapter(config, self.api(), self.adapter_name)
        adapter.semantics = self.semantics
        return adapter

    def base_era(self) -> type[VllmApi]:
        """The era class the lineage drives the engine through (its ``era``, else
        its upstream's): the class an ``era_class`` subclasses.

        Raises:
            VllmUnavailable: For an unknown era or a lineage without ``upstream``.
        """
        return self._era()

    def _declared(self, method: Callable[[KVCacheConfig], T]) -> Callable[[KVCacheConfig], T]:
        attach = declare(supports=self.supports, unsupported=self.unsupported, features=self.features)
        factory = attach(method)
        factory.__name__ = f"{self.adapter_name}.{method.__name__.replace('build', 'make')}"
        return factory

    @property
    def adapter_name(self) -> str:
        """``name``, else ``package``."""
        return self.name or self.package

    @property
    def semantics(self) -> DeclaredSemantics:
        """``vllm-<upstream>``, upstream, with the lineage's known differences."""
        return DeclaredSemantics(f"vllm-{self.api().version}", upstream=True, known=self.known)

    def api(self) -> VllmApi:
        """The engine's era object (imported once per process).

        Raises:
            VllmUnavailable: If a module of the engine fails to import.
        """
        if self not in _APIS:
            _APIS[self] = self._load()
        return _APIS[self]

    def _load(self) -> VllmApi:
        base = self.era_class or self._era()
        prefix = self.env_prefix
        env = base.env
        renamed = EnvNames(
            int_block_hashes=_rename(env.int_block_hashes, prefix),
            hash_seed=env.hash_seed,
            retention_interval=None if env.retention_interval is None else _rename(env.retention_interval, prefix),
            logging_level=_rename(env.logging_level, prefix),
        )
        modules = {key: _repackage(path, self.package) for key, path in base.modules.items()}
        members: dict[str, Any] = {"modules": modules, "env": renamed}
        if self.manager_class is not None:
            members["new_manager"] = _constructor(load_callable(self.manager_class, f"manager_class of {self}"))
        era: type[VllmApi] = type(f"{base.__name__}_{self.package}", (base,), members)
        quiet = quiet_logs(renamed.logging_level)
        loaded = {}
        for key, path in modules.items():
            try:
                loaded[key] = importlib.import_module(path)
            except Exception as exc:  # ImportError, or anything the engine raises on import
                raise VllmUnavailable(f"{self.package}: importing {path} failed: {exc!r}") from exc
        quiet(self.package)
        version = self.upstream or era.verified[-1]
        api: VllmApi = era(version, loaded)
        return api

    def _era(self) -> type[VllmApi]:
        if self.era is not None:
            for era in ERAS:
                if era.era == self.era:
                    return era
            raise VllmUnavailable(f"no API era {self.era!r}; known: {', '.join(e.era for e in ERAS)}")
        if not self.upstream:
            raise VllmUnavailable(f"{self.package}: name the vLLM release it derives from (upstream=...)")
        return era_for(self.upstream)


def _rename(variable: str, prefix: str) -> str:
    return prefix + variable.removeprefix("VLLM_") if variable.startswith("VLLM_") else variable


def _repackage(path: str, package: str) -> str:
    return package + path.removeprefix("vllm") if path == "vllm" or path.startswith("vllm.") else path


def _constructor(cls: Callable[..., Any]) -> Callable[[VllmApi, Any, Mapping[str, Any]], Any]:
    def new_manager(self: VllmApi, kv_cache_config: Any, kwargs: Mapping[str, Any]) -> Any:
        return cls(kv_cache_config, **kwargs)

    return new_manager
