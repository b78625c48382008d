"""The scheduler-visible surface of a vLLM release, read from its source files.

``kvref drift`` compares behaviour (a lockstep run) and *surface*: the names
a scheduler calls and reads. A surface is a flat, sorted mapping from an
entry name to a one-line description:

* ``KVCacheManager.get_computed_blocks`` -> ``"(request: Request, max_cache_hit_length: int | None = None)"``:
  a public method (and ``__init__``) of the manager facade
  (``vllm/v1/core/kv_cache_manager.py``: ``KVCacheManager``, ``KVCacheBlocks``),
  the block pool (``vllm/v1/core/block_pool.py``: ``BlockPool``) and the
  request (``vllm/v1/request.py``: ``Request``), with every parameter's
  annotation and default; a property reads ``"property"``;
* ``Request.prefix_cache_hit_limit`` -> ``"attribute"``: an attribute the
  request's ``__init__`` sets (with its annotation, and the class it is made
  from when the value is a call of one, e.g. ``"attribute = TokenBuffer(...)"``),
  and ``RequestStatus.WAITING`` -> ``"member"``;
* ``MambaSpec`` -> ``"class(KVCacheSpec)"`` and ``MambaSpec.mamba_cache_mode``
  -> ``"field: str = 'none'"``: every KV-cache spec class
  (``vllm/v1/kv_cache_interface.py``: the ``KVCacheSpec`` family,
  ``KVCacheGroupSpec``, ``KVCacheConfig``) with its dataclass fields;
* ``BlockStored.group_idx`` -> ``"field: int | None = None"``: the fields of the
  KV-cache events (``vllm/distributed/kv_events.py``).

Private names (one leading underscore) are left out: a release may change
them without any change a scheduler sees.

The files are parsed (:mod:`ast`), never imported, so reading a surface
needs neither torch nor vLLM's dependencies: :func:`read_surface` reads an
installed release, a wheel or an unpacked source tree alike. Each semantics
profile's *declared* surface is the one recorded from its release
(``kvref/surfaces/vllm-<release>.json``, :func:`declared_surface`).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Surface = dict[str, str]
"""Entry name -> description (see the module docstring)."""

SURFACES = Path(__file__).resolve().parent / "surfaces"
"""The recorded surface of each profile's release (``vllm-<release>.json``)."""

FACADE_FILES: dict[str, tuple[str, ...]] = {
    "vllm/v1/core/kv_cache_manager.py": ("KVCacheManager", "KVCacheBlocks"),
    "vllm/v1/core/block_pool.py": ("BlockPool",),
    "vllm/v1/request.py": ("Request",),
}
"""Source file -> the classes whose public methods (and ``__init__``) are read."""
REQUEST_FILE = "vllm/v1/request.py"
SPEC_FILE = "vllm/v1/kv_cache_interface.py"
EVENTS_FILE = "vllm/distributed/kv_events.py"
SPEC_ROOTS = ("KVCacheSpec", "KVCacheGroupSpec", "KVCacheConfig")
"""The classes read from the spec file, with every subclass of the first."""
EVENT_ROOT = "KVCacheEvent"

ChangeKind = Literal["new", "removed", "changed"]


@dataclass(frozen=True, slots=True)
class SurfaceChange:
    """One entry that differs between two surfaces."""

    kind: ChangeKind
    entry: str
    before: str | None
    after: str | None

    def describe(self) -> str:
        """``"new KVCacheManager.get_num_cached_tokens (request: Request)"`` and the like."""
        if self.kind == "new":
            return f"new {self.entry} {self.after}"
        if self.kind == "removed":
            return f"removed {self.entry} {self.before}"
        return f"changed {self.entry}: {self.detail()}"

    def detail(self) -> str:
        """What changed: for two signatures, parameter by parameter
        (``new parameter block_hashes: ... = None``), else ``before -> after``."""
        before, after = self.before or "", self.after or ""
        old, new = _parameters(before), _parameters(after)
        if old is None or new is None:
            return f"{before} -> {after}"
        parts = [f"removed parameter {p}" for n, p in old.items() if n not in new]
        parts += [f"parameter {old[n]} -> {p}" for n, p in new.items() if n in old and old[n] != p]
        parts += [f"new parameter {p}" for n, p in new.items() if n not in old]
        if list(n for n in old if n in new) != list(n for n in new if n in old):
            parts.append("parameters reordered")
        return "; ".join(parts) or f"{before} -> {after}"


def read_surface(source: Path | None = None) -> Surface:
    """The surface of the vLLM sources at ``source``: a wheel, a directory
    holding ``vllm/``, or None for the installed ``vllm`` package (found
    without importing it).

    Raises:
        FileNotFoundError: No vLLM sources there (or none installed).
    """
    files = _SourceFiles(source)
    surface: Surface = {}
    for path, classes in FACADE_FILES.items():
        tree = files.parse(path)
        for name in classes:
            node = _class(tree, name)
            if node is not None:
                surface.update(_methods(name, node))
    request = _class(files.parse(REQUEST_FILE), "Request")
    if request is not None:
        surface.update(_attributes(request))
    status = _class(files.parse(REQUEST_FILE), "RequestStatus")
    if status is not None:
        surface.update(_members("RequestStatus", status))
    surface.update(_field_classes(files.parse(SPEC_FILE), SPEC_ROOTS))
    surface.update(_field_classes(files.parse(EVENTS_FILE), (EVENT_ROOT,)))
    return dict(sorted(surface.items()))


def compare(declared: Surface, installed: Surface) -> list[SurfaceChange]:
    """Every entry new in, removed from or changed in ``installed``, by name."""
    changes: list[SurfaceChange] = []
    for entry in sorted(declared.keys() | installed.keys()):
        before, after = declared.get(entry), installed.get(entry)
        if before == after:
            continue
        kind: ChangeKind = "new" if before is None else "removed" if after is None else "changed"
        changes.append(SurfaceChange(kind, entry, before, after))
    return changes


def declared_surface(release: str) -> Surface | None:
    """The recorded surface of vLLM ``release`` (None when none is recorded)."""
    path = SURFACES / f"vllm-{release}.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    surface: Surface = data["surface"]
    return surface


def write_surface(surface: Surface, release: str, path: Path) -> None:
    """Store ``surface`` as the recorded surface of ``release`` at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"release": release, "surface": surface}, indent=1, sort_keys=True) + "\n")


def installed_root() -> Path:
    """The directory holding the installed ``vllm`` package (not imported).

    Raises:
        FileNotFoundError: vLLM is not installed.
    """
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("vLLM is not installed")
    return Path(spec.origin).resolve().parent.parent


# -- internals ------------------------------------------------------------------------


class _SourceFiles:
    """Source files of one vLLM release (a wheel, a tree, or the installed one)."""

    def __init__(self, source: Path | None) -> None:
        root = installed_root() if source is None else source
        self.wheel = zipfile.ZipFile(root) if root.is_file() else None
        self.root = root

    def parse(self, path: str) -> ast.Module:
        """The parsed file (an empty module when the release lacks it)."""
        if self.wheel is not None:
            try:
                text = self.wheel.read(path).decode()
            except KeyError:
                return ast.Module(body=[], type_ignores=[])
        else:
            file = self.root / path
            if not file.is_file():
                return ast.Module(body=[], type_ignores=[])
            text = file.read_text()
        return ast.parse(text)


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _public(name: str) -> bool:
    return not name.startswith("_") or name == "__init__"


def _methods(owner: str, node: ast.ClassDef) -> Iterator[tuple[str, str]]:
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and _public(item.name):
            decorators = {ast.unparse(d) for d in item.decorator_list}
            if "property" in decorators or "cached_property" in decorators:
                yield f"{owner}.{item.name}", "property"
            else:
                kind = next((f"{d} " for d in ("classmethod", "staticmethod") if d in decorators), "")
                yield f"{owner}.{item.name}", kind + _signature(item.args)


def _signature(args: ast.arguments) -> str:
    """``(a: int, b: str = 'x', *, c=None)`` without ``self``/``cls``."""
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    parts = [_param(a, d) for a, d in zip(positional, defaults, strict=True)]
    if parts and positional[0].arg in ("self", "cls"):
        parts = parts[1:]
    if args.vararg is not None:
        parts.append("*" + _param(args.vararg, None))
    elif args.kwonlyargs:
        parts.append("*")
    parts += [_param(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    if args.kwarg is not None:
        parts.append("**" + _param(args.kwarg, None))
    return "(" + ", ".join(parts) + ")"


def _param(arg: ast.arg, default: ast.expr | None) -> str:
    text = arg.arg
    if arg.annotation is not None:
        text += f": {_annotation(arg.annotation)}"
    if default is not None:
        text += f" = {ast.unparse(default)}"
    return text


def _annotation(node: ast.expr) -> str:
    """An annotation's text, a string annotation unquoted (``"Request"`` and
    ``Request`` read alike)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return ast.unparse(node)


def _attributes(node: ast.ClassDef) -> Iterator[tuple[str, str]]:
    """``Request.<name>`` for each public ``self.<name>`` the ``__init__`` sets."""
    init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is None:
        return
    seen: set[str] = set()
    for stmt in ast.walk(init):
        targets: list[ast.expr] = []
        annotation: ast.expr | None = None
        value: ast.expr | None = None
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign):
            targets, annotation, value = [stmt.target], stmt.annotation, stmt.value
        for target in targets:
            if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)):
                continue
            if target.value.id != "self" or not _public(target.attr) or target.attr == "__init__":
                continue
            if target.attr in seen:
                continue
            seen.add(target.attr)
            text = "attribute"
            if annotation is not None:
                text += f": {_annotation(annotation)}"
            made = _made_from(value)
            if made is not None:
                text += f" = {made}(...)"
            yield f"Request.{target.attr}", text


def _made_from(value: ast.expr | None) -> str | None:
    """The class a value is made from, when it is a call of a capitalised name
    (either branch of a conditional), else None."""
    if isinstance(value, ast.IfExp):
        return _made_from(value.body) or _made_from(value.orelse)
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name[:1].isupper():
            return name
    return None


def _members(owner: str, node: ast.ClassDef) -> Iterator[tuple[str, str]]:
    for item in node.body:
        if isinstance(item, ast.Assign):
            for target in item.targets:
                if isinstance(target, ast.Name) and _public(target.id):
                    yield f"{owner}.{target.id}", "member"


def _field_classes(tree: ast.Module, roots: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    """Each class of ``tree`` that is one of ``roots`` or derives from the
    first, with its annotated class-level fields."""
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    bases = {name: [_base_name(b) for b in node.bases] for name, node in classes.items()}

    def derives(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name == roots[0]:
            return True
        return any(b in classes and b not in seen and derives(b, seen | {name}) for b in bases.get(name, ()))

    for name, node in classes.items():
        if name not in roots and not derives(name):
            continue
        yield name, f"class({', '.join(bases[name])})"
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and _public(item.target.id):
                text = f"field: {_annotation(item.annotation)}"
                if item.value is not None:
                    text += f" = {ast.unparse(item.value)}"
                yield f"{name}.{item.target.id}", text


def _parameters(signature: str) -> dict[str, str] | None:
    """A signature's parameters by name (``{"request": "request: Request"}``),
    or None for a description that is not a signature."""
    text = signature.removeprefix("classmethod ").removeprefix("staticmethod ")
    if not (text.startswith("(") and text.endswith(")")):
        return None
    params: dict[str, str] = {}
    depth, start, body = 0, 0, text[1:-1]
    for i, char in enumerate(body + ","):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            part = body[start:i].strip()
            if part and part != "*":
                params[part.split(":")[0].split("=")[0].strip()] = part
            start = i + 1
    return params


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Subscript):
        node = node.value
    return node.attr if isinstance(node, ast.Attribute) else ast.unparse(node)
