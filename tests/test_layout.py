"""Import direction between the three packages.

* ``kvspec`` (spec/kvspec) stands alone: it must not import ``kvimpl``,
  ``kvref``, ``torch`` or ``numpy`` in any form, so it stays a readable,
  dependency-light specification.
* ``kvimpl`` (impl/kvimpl) may import from ``kvspec`` only its value types
  (errors, config, request, hashing, events, view, stats), never its
  algorithms; otherwise checking the implementation against the specification
  would partly compare the specification with itself.

The checker reads the sources with :mod:`ast` (nothing is imported), so it
also sees imports under ``if TYPE_CHECKING:``, inside functions, and literal
``importlib.import_module(...)`` / ``__import__(...)`` calls.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC_ROOT = ROOT / "spec"
IMPL_ROOT = ROOT / "impl"

SPEC_FORBIDDEN = frozenset({"kvimpl", "kvref", "torch", "numpy"})
IMPL_ALLOWED_KVSPEC = frozenset(
    {
        "kvspec.errors",
        "kvspec.config",
        "kvspec.request",
        "kvspec.hashing",
        "kvspec.events",
        "kvspec.view",
        "kvspec.stats",
    }
)

Rule = Callable[[str], bool]


def spec_may_import(name: str) -> bool:
    """Whether a ``kvspec`` module may import the module ``name``."""
    return name.partition(".")[0] not in SPEC_FORBIDDEN


def impl_may_import(name: str) -> bool:
    """Whether a ``kvimpl`` module may import the module ``name``."""
    if name.partition(".")[0] != "kvspec":
        return True
    return any(name == m or name.startswith(m + ".") for m in IMPL_ALLOWED_KVSPEC)


def imported_names(source: str, module: str, is_package: bool = False) -> Iterator[tuple[int, str]]:
    """Yield ``(line, absolute dotted name)`` for every import in ``source``.

    ``import a.b`` yields ``a.b``; ``from a import b`` yields ``a.b`` (``b``
    may be a submodule or an attribute; ``*`` yields ``a.*``). Relative
    imports are resolved against ``module`` (the dotted name of the file;
    ``is_package`` for an ``__init__.py``).
    """
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:
                keep = len(package) - (node.level - 1)
                if keep <= 0:
                    continue  # beyond the top-level package: fails at import time anyway
                base = ".".join([*package[:keep], *([node.module] if node.module else [])])
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and not first.value.startswith("."):
                yield node.lineno, first.value


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in {"__import__", "import_module"}
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def violations(source: str, module: str, rule: Rule, is_package: bool = False) -> list[str]:
    """Each import in ``source`` that ``rule`` rejects, as ``"line N: name"``."""
    return [f"line {line}: {name}" for line, name in imported_names(source, module, is_package) if not rule(name)]


def _sources(source_root: Path, package: str) -> list[Path]:
    return sorted((source_root / package).rglob("*.py"))


def _check_file(path: Path, source_root: Path, rule: Rule) -> list[str]:
    parts = list(path.relative_to(source_root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return violations(path.read_text(encoding="utf-8"), ".".join(parts), rule, is_package)


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


SPEC_FILES = _sources(SPEC_ROOT, "kvspec")
IMPL_FILES = _sources(IMPL_ROOT, "kvimpl")


def test_source_trees_are_found() -> None:
    # Guards against the file tests below passing vacuously after a move.
    assert SPEC_FILES, f"no .py files under {SPEC_ROOT / 'kvspec'}"
    assert (IMPL_ROOT / "kvimpl" / "__init__.py") in IMPL_FILES


@pytest.mark.parametrize("path", SPEC_FILES, ids=_ids(SPEC_FILES))
def test_spec_imports_no_impl_kit_torch_or_numpy(path: Path) -> None:
    bad = _check_file(path, SPEC_ROOT, spec_may_import)
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(SPEC_FORBIDDEN)}: {bad}"


@pytest.mark.parametrize("path", IMPL_FILES, ids=_ids(IMPL_FILES))
def test_impl_imports_only_spec_value_types(path: Path) -> None:
    bad = _check_file(path, IMPL_ROOT, impl_may_import)
    assert not bad, f"{path.relative_to(ROOT)} imports kvspec modules other than {sorted(IMPL_ALLOWED_KVSPEC)}: {bad}"


# --- self-tests of the checker ------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "import torch",
        "import numpy as np",
        "import os, torch.nn",
        "import kvimpl",
        "from kvimpl import manager",
        "from kvref.adapters import load_factory",
        "from numpy.typing import NDArray",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import numpy\n",
        "def f() -> None:\n    import kvref.cli\n",
        "import importlib\nimportlib.import_module('torch')",
        "from importlib import import_module\nimport_module('kvimpl.pool')",
        "__import__('numpy')",
    ],
)
def test_checker_flags_bad_spec_source(source: str) -> None:
    assert violations(source, "kvspec.manager", spec_may_import)


def test_checker_accepts_good_spec_source() -> None:
    source = (
        "import os\n"
        "import torchvision_like\n"  # a prefix of a name is not the name
        "from kvspec.errors import KVCacheError\n"
        "from . import hashing\n"
        "from .view import KVView\n"
    )
    assert violations(source, "kvspec.manager", spec_may_import) == []


@pytest.mark.parametrize(
    "source",
    [
        "import kvspec",
        "import kvspec.manager",
        "from kvspec import manager",
        "from kvspec import errors, block_pool",
        "from kvspec import *",
        "from kvspec.manager import KVCacheManager",
        "from kvspec.errorsx import X",
        "import importlib\nimportlib.import_module('kvspec.block_pool')",
    ],
)
def test_checker_flags_bad_impl_source(source: str) -> None:
    assert violations(source, "kvimpl.manager", impl_may_import)


def test_checker_accepts_good_impl_source() -> None:
    source = (
        "import numpy\n"
        "import kvspec.hashing\n"
        "from kvspec import config, view\n"
        "from kvspec.errors import KVCacheError\n"
        "from kvspec.events import BlockStored\n"
        "from kvspec.request import Request\n"
        "from kvspec.stats import PrefixCacheStats\n"
        "from . import pool\n"
    )
    assert violations(source, "kvimpl.manager", impl_may_import) == []


def test_checker_resolves_relative_imports() -> None:
    # In kvimpl/__init__.py, "from . import x" is kvimpl.x; in kvimpl/a/b.py,
    # "from .. import c" is kvimpl.c. Neither is kvspec.
    assert list(imported_names("from . import x", "kvimpl", is_package=True)) == [(1, "kvimpl.x")]
    assert list(imported_names("from .. import c", "kvimpl.a.b")) == [(1, "kvimpl.c")]
    assert list(imported_names("from .v import K", "kvspec.m")) == [(1, "kvspec.v.K")]
