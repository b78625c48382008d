"""Import direction between the packages, and no bare top-level names.

* ``kvspec`` (spec/kvspec) stands alone: it imports none of ``kvimpl``,
  ``kvref``, ``kvtools``, ``kvproofs``, ``torch`` or ``numpy``, so it stays a
  readable, dependency-light specification.
* ``kvimpl`` (impl/kvimpl) imports from ``kvspec`` only value types: the
  modules ``errors``, ``events``, ``view``, ``stats`` and ``request``; from
  ``config`` its classes and type aliases (not its functions or constants);
  ``BlockId`` and ``InvariantViolation`` by name; and from ``hashing`` its
  value types and the functions that the byte vectors of
  ``traces/vectors/hash-vectors.json`` pin down. Anything else would let the
  lockstep comparison partly compare the spec with itself (a shared helper
  is a shared bug). It imports neither the kit, the tooling nor the proofs.
* ``kvref`` (kit/kvref, the shipped kit) imports ``kvspec`` and itself, and
  ``kvimpl`` only in its impl adapter (``kvref/adapters/impl.py``) and its
  benchmarks (``kvref/bench.py``, ``kvref/bench_*.py``); never ``kvtools`` or ``kvproofs``.
* ``kvtools`` (tools/kvtools) may import ``kvref``, ``kvspec`` and
  ``kvimpl``; ``kvproofs`` (proofs/kvproofs) may import ``kvspec`` and
  ``kvimpl``.
* Nothing outside tests/ and tools/ imports ``kvtools``.
* No bare ``spec``, ``impl``, ``kit``, ``tools``, ``tests`` or ``proofs`` is
  importable from a neutral working directory: every source root holds one
  distinctively named package.

The checker reads the sources with :mod:`ast` (nothing is imported), so it
also sees imports under ``if TYPE_CHECKING:``, inside functions, and literal
``importlib.import_module(...)`` / ``__import__(...)`` calls.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from tempfile import TemporaryDirectory

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC_ROOT = ROOT / "spec"
IMPL_ROOT = ROOT / "impl"
KIT_ROOT = ROOT / "kit"
TOOLS_ROOT = ROOT / "tools"
PROOFS_ROOT = ROOT / "proofs"

FIRST_PARTY = frozenset({"kvspec", "kvimpl", "kvref", "kvtools", "kvproofs"})
SPEC_FORBIDDEN = frozenset({"kvimpl", "kvref", "kvtools", "kvproofs", "torch", "numpy"})
BARE_NAMES = ("spec", "impl", "kit", "tools", "tests", "proofs")

IMPL_KVSPEC_MODULES = frozenset({"kvspec.errors", "kvspec.events", "kvspec.view", "kvspec.stats", "kvspec.request"})
"""kvspec modules that hold only value types: kvimpl may import them whole or any name of them."""
HASHING_FUNCTIONS = frozenset(
    {
        "none_hash",
        "hash_block_tokens",
        "extend_block_hashes",
        "block_extra_keys",
        "lookahead_extra_keys",
        "lookahead_window_keys",
        "coarse_block_hashes",
        "make_key",
        "split_key",
        "external_block_hash",
    }
)
"""The chained block hash, its extra keys, the coarse hashes, the cache key and
the external hash form: pinned by the stored hash vectors (the look-ahead keys of
vLLM 0.33.0 on by the directed traces ``lookahead-hashes-*``, whose event hashes
real vLLM 0.33.0 and 0.34.0 reproduce), so sharing them shares no untested logic."""

Rule = Callable[[str, str], bool]
"""``rule(importing module, imported dotted name)``: whether the import is allowed."""


def value_types(path: Path) -> frozenset[str]:
    """The top-level classes, ``NewType`` s and type aliases of a module
    (``X = A | B``, ``X = Literal[...]``, ``X = Callable[...]``), by name."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            is_newtype = isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "NewType"
            is_union = isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitOr)
            if is_newtype or is_union or isinstance(value, ast.Subscript):
                names.add(node.targets[0].id)
    return frozenset(names)


IMPL_KVSPEC_NAMES: dict[str, frozenset[str]] = {
    "kvspec.config": value_types(SPEC_ROOT / "kvspec" / "config.py"),
    "kvspec.hashing": value_types(SPEC_ROOT / "kvspec" / "hashing.py") | HASHING_FUNCTIONS,
    "kvspec.block_pool": frozenset({"BlockId"}),
    "kvspec.invariants": frozenset({"InvariantViolation"}),
    # the profile value a configuration carries (kvimpl follows its switches; the
    # profile logic, features_used and unsupported_reason, stays out of reach)
    "kvspec.profiles": frozenset({"SemanticsProfile"}),
}
"""kvspec modules that also hold logic: kvimpl may import only these names of them."""


def _top(name: str) -> str:
    return name.partition(".")[0]


def spec_may_import(module: str, name: str) -> bool:
    """Whether the ``kvspec`` module ``module`` may import ``name``."""
    return _top(name) not in SPEC_FORBIDDEN


def impl_may_import(module: str, name: str) -> bool:
    """Whether the ``kvimpl`` module ``module`` may import ``name``."""
    top = _top(name)
    if top in FIRST_PARTY - {"kvspec", "kvimpl"}:
        return False
    if top != "kvspec":
        return True
    if any(name == m or name.startswith(m + ".") for m in IMPL_KVSPEC_MODULES):
        return True
    owner, _, attr = name.rpartition(".")
    return attr in IMPL_KVSPEC_NAMES.get(owner, frozenset())


def kit_may_import(module: str, name: str) -> bool:
    """Whether the ``kvref`` module ``module`` may import ``name``."""
    top = _top(name)
    if top == "kvimpl":
        return module == "kvref.adapters.impl" or re.fullmatch(r"kvref\.bench(_\w+)?", module) is not None
    return top not in {"kvtools", "kvproofs"}


def tools_may_import(module: str, name: str) -> bool:
    """Whether the ``kvtools`` module ``module`` may import ``name``."""
    return _top(name) != "kvproofs"


def proofs_may_import(module: str, name: str) -> bool:
    """Whether the ``kvproofs`` module ``module`` may import ``name``."""
    return _top(name) not in {"kvref", "kvtools"}


def not_kvtools(module: str, name: str) -> bool:
    """Outside tests/ and tools/, nothing imports ``kvtools``."""
    return _top(name) != "kvtools"


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
    return [
        f"line {line}: {name}" for line, name in imported_names(source, module, is_package) if not rule(module, name)
    ]


def python_files(root: Path, skip: frozenset[str] = frozenset()) -> list[Path]:
    """Every ``.py`` file under ``root``, without hidden directories, virtual
    environments, ``__pycache__`` and the top-level directories in ``skip``."""
    found: list[Path] = []
    for here, dirs, files in os.walk(root):
        base = Path(here)
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".")
            and d != "__pycache__"
            and not (base / d / "pyvenv.cfg").exists()
            and not (base == root and d in skip)
        )
        found += [base / f for f in sorted(files) if f.endswith(".py")]
    return found


def _check_file(path: Path, source_root: Path, rule: Rule) -> list[str]:
    parts = list(path.relative_to(source_root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return violations(path.read_text(encoding="utf-8"), ".".join(parts), rule, is_package)


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


SPEC_FILES = python_files(SPEC_ROOT / "kvspec")
IMPL_FILES = python_files(IMPL_ROOT / "kvimpl")
KIT_FILES = python_files(KIT_ROOT / "kvref")
TOOLS_FILES = python_files(TOOLS_ROOT / "kvtools")
PROOFS_FILES = python_files(PROOFS_ROOT / "kvproofs")
NON_TOOLING_FILES = python_files(ROOT, skip=frozenset({"tests", "tools"}))


def test_source_trees_are_found() -> None:
    # Guards against the file tests below passing vacuously after a move.
    for root, package, files in (
        (SPEC_ROOT, "kvspec", SPEC_FILES),
        (IMPL_ROOT, "kvimpl", IMPL_FILES),
        (KIT_ROOT, "kvref", KIT_FILES),
        (TOOLS_ROOT, "kvtools", TOOLS_FILES),
        (PROOFS_ROOT, "kvproofs", PROOFS_FILES),
    ):
        assert (root / package / "__init__.py") in files, f"no {package} package under {root}"
    assert (SPEC_ROOT / "kvspec" / "__init__.py") in NON_TOOLING_FILES
    assert not any(p.relative_to(ROOT).parts[0] in {"tests", "tools"} for p in NON_TOOLING_FILES)
    assert (KIT_ROOT / "kvref" / "adapters" / "impl.py") in KIT_FILES
    assert {"config.py", "hashing.py"} <= {p.name for p in SPEC_FILES}
    assert {"KVCacheConfig", "SlidingWindow", "AttentionKind"} <= IMPL_KVSPEC_NAMES["kvspec.config"]
    assert {"BlockHash", "BlockHashWithGroupId"} <= IMPL_KVSPEC_NAMES["kvspec.hashing"]


@pytest.mark.parametrize("path", SPEC_FILES, ids=_ids(SPEC_FILES))
def test_spec_imports_no_impl_kit_tools_proofs_torch_or_numpy(path: Path) -> None:
    bad = _check_file(path, SPEC_ROOT, spec_may_import)
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(SPEC_FORBIDDEN)}: {bad}"


@pytest.mark.parametrize("path", IMPL_FILES, ids=_ids(IMPL_FILES))
def test_impl_imports_only_spec_value_types(path: Path) -> None:
    bad = _check_file(path, IMPL_ROOT, impl_may_import)
    assert not bad, (
        f"{path.relative_to(ROOT)} imports spec logic (or the kit, tooling or proofs): {bad}; kvimpl may import "
        f"the kvspec modules {sorted(IMPL_KVSPEC_MODULES)} and, by name, "
        f"{ {m: sorted(n) for m, n in IMPL_KVSPEC_NAMES.items()} }"
    )


@pytest.mark.parametrize("path", KIT_FILES, ids=_ids(KIT_FILES))
def test_kit_imports_impl_only_in_its_adapter_and_benchmarks(path: Path) -> None:
    bad = _check_file(path, KIT_ROOT, kit_may_import)
    assert not bad, (
        f"{path.relative_to(ROOT)}: {bad}; the kit imports kvimpl only in kvref/adapters/impl.py and "
        "kvref/bench.py / kvref/bench_*.py, and never kvtools or kvproofs"
    )


@pytest.mark.parametrize("path", TOOLS_FILES, ids=_ids(TOOLS_FILES))
def test_tools_import_no_proofs(path: Path) -> None:
    bad = _check_file(path, TOOLS_ROOT, tools_may_import)
    assert not bad, f"{path.relative_to(ROOT)} imports kvproofs: {bad}"


@pytest.mark.parametrize("path", PROOFS_FILES, ids=_ids(PROOFS_FILES))
def test_proofs_import_only_spec_and_impl(path: Path) -> None:
    bad = _check_file(path, PROOFS_ROOT, proofs_may_import)
    assert not bad, f"{path.relative_to(ROOT)} imports the kit or the tooling: {bad}"


def test_nothing_outside_tests_and_tools_imports_kvtools() -> None:
    bad = {
        str(p.relative_to(ROOT)): v
        for p in NON_TOOLING_FILES
        if (v := violations(p.read_text(encoding="utf-8"), "x", not_kvtools))
    }
    assert not bad, f"kvtools is project tooling; only tests/ and tools/ may import it: {bad}"


def importable_bare_names(env: dict[str, str] | None = None) -> dict[str, str]:
    """Which of :data:`BARE_NAMES` this interpreter can import from an empty
    working directory, with where they come from."""
    probe = (
        "import importlib.util, json, sys\n"
        "found = {}\n"
        "for name in sys.argv[1:]:\n"
        "    spec = importlib.util.find_spec(name)\n"
        "    if spec is not None:\n"
        "        found[name] = str(spec.origin or list(spec.submodule_search_locations or []))\n"
        "print(json.dumps(found))\n"
    )
    if env is None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with TemporaryDirectory(prefix="kvref-layout-") as cwd:
        out = subprocess.run(
            [sys.executable, "-c", probe, *BARE_NAMES], cwd=cwd, env=env, capture_output=True, text=True, check=True
        )
    found: dict[str, str] = json.loads(out.stdout)
    return found


def test_no_bare_top_level_names() -> None:
    found = importable_bare_names()
    assert not found, (
        f"importable from a neutral directory with {sys.executable}: {found}; each source root must hold one "
        "distinctively named package (hatchling dev-mode-dirs and pytest pythonpath name the roots, never '.')"
    )


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
        "import kvtools.zoo",
        "from kvproofs.bounded import check",
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
        # config: classes only, not its functions or constants, and not the module itself
        "from kvspec.config import admission_cap",
        "from kvspec.config import KVCacheConfig, kind_name",
        "from kvspec.config import FULL_TYPE_KINDS",
        "from kvspec.config import *",
        "import kvspec.config",
        "from kvspec import config",
        # block_pool and invariants: the one value type each, nothing else
        "from kvspec.block_pool import BlockPool",
        "from kvspec.block_pool import NULL_BLOCK",
        "from kvspec.invariants import require",
        "from kvspec.invariants import inv_hash_lifetime",
        # hashing: not the hash-function lookup, not the module as a whole
        "from kvspec.hashing import get_hash_fn_by_name",
        "import kvspec.hashing",
        # never the kit, the tooling or the proofs
        "from kvref.ops import Op",
        "import kvtools",
        "from kvproofs.diff import kinds",
    ],
)
def test_checker_flags_bad_impl_source(source: str) -> None:
    assert violations(source, "kvimpl.manager", impl_may_import)


def test_checker_accepts_good_impl_source() -> None:
    source = (
        "import numpy\n"
        "import kvspec.errors\n"
        "from kvspec import events, view\n"
        "from kvspec.config import AttentionKind, KVCacheConfig, SlidingWindow\n"
        "from kvspec.errors import KVCacheError\n"
        "from kvspec.events import BlockStored\n"
        "from kvspec.request import Request\n"
        "from kvspec.stats import PrefixCacheStats\n"
        "from kvspec.block_pool import BlockId\n"
        "from kvspec.invariants import InvariantViolation\n"
        "from kvspec.hashing import BlockHash, coarse_block_hashes, external_block_hash, make_key, split_key\n"
        "from . import pool\n"
    )
    assert violations(source, "kvimpl.manager", impl_may_import) == []


def test_value_types_are_classes_newtypes_and_aliases(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import Literal, NewType\n"
        "class A: ...\n"
        "B = NewType('B', int)\n"
        "C = A | int\n"
        "D = Literal['x']\n"
        "E = (A, int)\n"
        "F = 3\n"
        "def g() -> None: ...\n"
    )
    assert value_types(module) == {"A", "B", "C", "D"}


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("kvref.ops", "from kvimpl.kv_cache_manager import KVCacheManager"),
        ("kvref.adapters.spec", "import kvimpl"),
        ("kvref.adapters.impl_extra", "import kvimpl"),
        ("kvref.benchmarks_helper", "import kvimpl"),
        ("kvref.cli.bench", "def f() -> None:\n    from kvimpl import KVCacheManager\n"),
        ("kvref.adapters.impl", "import kvtools.zoo"),
        ("kvref.bench", "from kvproofs import run"),
    ],
)
def test_checker_flags_bad_kit_source(module: str, source: str) -> None:
    assert violations(source, module, kit_may_import)


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("kvref.adapters.impl", "from kvimpl.kv_cache_manager import KVCacheManager"),
        ("kvref.bench", "from kvimpl.kv_cache_manager import KVCacheManager"),
        ("kvref.bench_decode", "import kvimpl"),
        ("kvref.ops", "from kvspec.kv_cache_manager import KVCacheManager\nfrom kvref.shapes import SHAPES"),
    ],
)
def test_checker_accepts_good_kit_source(module: str, source: str) -> None:
    assert violations(source, module, kit_may_import) == []


def test_checker_flags_tools_and_proofs_sources() -> None:
    assert violations("from kvproofs.run import main", "kvtools.zoo", tools_may_import)
    assert not violations("import kvref, kvspec, kvimpl\nfrom kvtools import zoo", "kvtools.x", tools_may_import)
    assert violations("from kvref.ops import Op", "kvproofs.diff.x", proofs_may_import)
    assert violations("import kvtools", "kvproofs.diff.x", proofs_may_import)
    assert not violations("import kvspec, kvimpl\nfrom kvproofs import run", "kvproofs.x", proofs_may_import)


def test_checker_finds_a_planted_kvtools_import(tmp_path: Path) -> None:
    (tmp_path / "kit" / "pkg").mkdir(parents=True)
    (tmp_path / "tools" / "kvtools").mkdir(parents=True)
    (tmp_path / ".venv" / "lib").mkdir(parents=True)
    (tmp_path / "kit" / "pkg" / "bad.py").write_text("def f() -> None:\n    from kvtools.zoo import ZOO\n")
    (tmp_path / "tools" / "kvtools" / "ok.py").write_text("import kvtools.zoo\n")
    (tmp_path / ".venv" / "lib" / "ok.py").write_text("import kvtools\n")
    files = python_files(tmp_path, skip=frozenset({"tests", "tools"}))
    assert files == [tmp_path / "kit" / "pkg" / "bad.py"]
    assert violations(files[0].read_text(), "x", not_kvtools) == ["line 2: kvtools.zoo.ZOO"]


def test_probe_finds_planted_bare_names() -> None:
    # The repository root on the path makes every bare name importable: the probe must see it.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    found = importable_bare_names(env)
    assert set(found) == set(BARE_NAMES), found


def test_checker_resolves_relative_imports() -> None:
    # In kvimpl/__init__.py, "from . import x" is kvimpl.x; in kvimpl/a/b.py,
    # "from .. import c" is kvimpl.c. Neither is kvspec.
    assert list(imported_names("from . import x", "kvimpl", is_package=True)) == [(1, "kvimpl.x")]
    assert list(imported_names("from .. import c", "kvimpl.a.b")) == [(1, "kvimpl.c")]
    assert list(imported_names("from .v import K", "kvspec.m")) == [(1, "kvspec.v.K")]
