"""A vLLM fork with a renamed package, for the third walk-through of docs/writing-an-adapter.md.

Importing this module makes ``vllmfork`` the installed vLLM (0.25.1) under
another name, as a fork that renamed its package is, and ``vllmfork_planted``
the same fork with a one-line fault planted in its prefix lookup: the hit is
capped at all of the request's tokens instead of all but the last, so a
prompt whose every block is cached is a hit of every token. The adapters are
one :class:`kvref.VllmLineage` each::

    kvref check --target renamed_fork:make --against spec            # the fork: agrees
    kvref check --target renamed_fork:make_planted --against spec    # the planted fault: found

Nothing is copied to disk: an import hook serves every ``vllmfork*`` module
from ``vllm``'s, and the planted fork's ``kv_cache_manager`` from vLLM's
source with that one line changed.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

from kvref import VllmLineage

CAPPED = "max_cache_hit_length = request.num_tokens - 1"
"""The line of vLLM 0.25.1's ``KVCacheManager.get_computed_blocks`` that the planted fork changes."""
PLANTED = "max_cache_hit_length = request.num_tokens"


class _Renamed(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``vllmfork.X`` and ``vllmfork_planted.X`` as ``vllm.X``; the
    planted fork's ``kv_cache_manager`` from vLLM's source with :data:`PLANTED`."""

    def find_spec(self, name: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name.partition(".")[0] in ("vllmfork", "vllmfork_planted"):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        package, _, rest = spec.name.partition(".")
        original = "vllm" + (f".{rest}" if rest else "")
        if package == "vllmfork_planted" and rest == "v1.core.kv_cache_manager":
            return _planted(spec.name, original)
        return importlib.import_module(original)

    def exec_module(self, module: ModuleType) -> None:
        pass


def _planted(name: str, original: str) -> ModuleType:
    # NOTE: the file of vLLM's module, not its __spec__: serving a module under a second name gives the
    # module object that name's spec
    path = importlib.import_module(original).__file__
    assert path is not None
    with open(path, encoding="utf-8") as source:
        text = source.read()
    assert text.count(CAPPED) == 1, f"vLLM's {original} no longer has the line the fault is planted in"
    module = ModuleType(name)
    module.__file__ = path
    sys.modules[name] = module
    exec(compile(text.replace(CAPPED, PLANTED), path, "exec"), module.__dict__)
    return module


if not any(isinstance(finder, _Renamed) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Renamed())

FORK = VllmLineage(package="vllmfork", upstream="0.25.1", name="fork")
make = FORK.make
PLANTED_FORK = VllmLineage(package="vllmfork_planted", upstream="0.25.1", name="fork-planted")
make_planted = PLANTED_FORK.make
