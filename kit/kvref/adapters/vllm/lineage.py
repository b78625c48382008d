"""A public base for adapters of vLLM-derived engines.

A fork that renamed vLLM's package (``aphrodite`` for ``vllm``), a plugin
whose ``KVCacheManager`` subclasses vLLM's, or vLLM itself at another
release: describe the engine as a :class:`VllmLineage` and use its
:meth:`~VllmLineage.make` as the factory::

    from kvref import VllmLineage

    APHRODITE = VllmLineage(package="aphrodite", env_prefix="APHRODITE_", upstream="0.29.0")
    make = APHRODITE.make            # kvref check --target mymod:make --against spec
    make_pool = APHRODITE.make_pool  # kvref check --layer pool --target mymod:make_pool

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
from dataclasses import dataclass
from typing import Any

from kvref.adapters import DeclaredSemantics, load_callable
from kvref.divergences import Divergence
from kvspec.config import KVCacheConfig

from .adapter import VllmAdapter
from .eras import ERAS, EnvNames, VllmApi, era_for, quiet_logs
from .errors import VllmUnavailable
from .pool import VllmPoolAdapter

_APIS: dict[VllmLineage, VllmApi] = {}


@dataclass(frozen=True)
class VllmLineage:
    """A vLLM-derived engine and how to reach its internals.

    Attributes:
        package: Import name of the engine's package (``vllm`` for vLLM itself).
        upstream: The vLLM release it derives from, e.g. ``"0.29.0"``: picks the
            API era and the declared profile ``vllm-<upstream>``.
        env_prefix: Prefix replacing ``VLLM_`` in the environment variables it reads.
        era: An API era name (``"0.29"``, ``"0.30"``, ...) when the engine's
            internals match another era than its upstream's.
        name: The adapter's name (default: ``package``).
        manager_class: ``module:Class`` of the engine's ``KVCacheManager``
            when it is not ``<package>.v1.core.kv_cache_manager.KVCacheManager``
            (a plugin's subclass); it is constructed like vLLM's.
        known: Known differences it declares (registry ids or
            :class:`kvref.divergences.Divergence` values).
        era_class: An era subclass of the engine's own
            (:class:`kvref.adapters.vllm.VllmApi`), for an internal it changed.
    """

    package: str = "vllm"
    upstream: str = ""
    env_prefix: str = "VLLM_"
    era: str | None = None
    name: str | None = None
    manager_class: str | None = None
    known: tuple[str | Divergence, ...] = ()
    era_class: type[VllmApi] | None = None

    def make(self, config: KVCacheConfig) -> VllmAdapter:
        """The factory: an adapter around a fresh manager of the engine.

        Raises:
            VllmUnavailable: If the engine cannot be imported.
            Unsupported: If ``config`` needs a parameter its era lacks.
        """
        adapter = VllmAdapter(config, self.api())
        adapter.name = self.adapter_name
        adapter.semantics = self.semantics
        return adapter

    def make_pool(self, config: KVCacheConfig) -> VllmPoolAdapter:
        """The pool factory (``kvref check --layer pool``)."""
        adapter = VllmPoolAdapter(config, self.api(), self.adapter_name)
        adapter.semantics = self.semantics
        return adapter

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
