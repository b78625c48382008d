"""Build hook: compile kvimpl's native core (the C extension ``kvimpl._kvnative``).

Hatchling runs :class:`NativeBuildHook` for every wheel, editable installs
included. It compiles ``impl/kvimpl/_native/*.c`` with the compiler and flags
this interpreter was built with (``sysconfig``: ``CC``, ``CFLAGS``,
``CCSHARED``, ``LDSHARED``; the Python headers), so nothing but gcc (or the
platform's compiler) and the headers is needed: no setuptools, no torch, no
toolchain download. An editable install builds the extension in place, next
to the sources the ``.pth`` file points at (``impl/kvimpl/``); a wheel gets it
as a platform-specific file. If compiling fails, the build goes on without
it and kvimpl falls back to its pure-Python manager (``kvimpl.native``
prints a one-line notice).

NOTE: a hatchling hook rather than a setuptools backend: the project's three
shipped source roots (``spec``, ``impl``, ``kit``) and its editable layout
(``dev-mode-dirs``) stay exactly as they are; setuptools would need a
``package-dir`` remap, which breaks static analysis of editable installs.

Run directly (``python hatch_build.py``) it rebuilds the in-place extension
of a checkout when a C source is newer than it (``--force``: always).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # run as a script: no hatchling needed
    BuildHookInterface = object  # type: ignore[assignment,misc]  # stand-in base class outside a build

ROOT = Path(__file__).resolve().parent
SOURCES = ROOT / "impl" / "kvimpl" / "_native"
PACKAGE = ROOT / "impl" / "kvimpl"
MODULE = "_kvnative"


def extension_path(folder: Path = PACKAGE) -> Path:
    """Where the compiled module goes: ``_kvnative`` plus this interpreter's suffix."""
    return folder / (MODULE + str(sysconfig.get_config_var("EXT_SUFFIX") or ".so"))


def compile_extension(out: Path) -> None:
    """Compile every C source into the shared library ``out``.

    Raises:
        subprocess.CalledProcessError: If the compiler or linker fails.
    """
    cfg = sysconfig.get_config_vars()
    cc = shlex.split(os.environ.get("CC") or str(cfg.get("CC") or "cc"))
    cflags = shlex.split(str(cfg.get("CFLAGS") or "")) + shlex.split(str(cfg.get("CCSHARED") or "-fPIC"))
    ldshared = shlex.split(os.environ.get("LDSHARED") or str(cfg.get("LDSHARED") or "cc -shared"))
    include = ["-I", sysconfig.get_paths()["include"], "-I", str(SOURCES)]
    extra = ["-O2", "-std=c11", "-Wno-unused-parameter"]
    sources = sorted(SOURCES.glob("*.c"))
    with tempfile.TemporaryDirectory() as tmp:
        objects = []
        for src in sources:
            obj = Path(tmp) / (src.stem + ".o")
            subprocess.run([*cc, *cflags, *extra, *include, "-c", str(src), "-o", str(obj)], check=True)
            objects.append(str(obj))
        partial = out.with_name(out.name + ".tmp")
        subprocess.run([*ldshared, *objects, "-o", str(partial)], check=True)
        partial.replace(out)  # atomic: a running interpreter keeps its mapping of the old file


def stale(out: Path) -> bool:
    """Whether ``out`` is missing or older than a C source or header."""
    if not out.exists():
        return True
    built = out.stat().st_mtime
    return any(p.stat().st_mtime > built for p in SOURCES.iterdir() if p.suffix in (".c", ".h"))


class NativeBuildHook(BuildHookInterface):  # type: ignore[misc,valid-type]  # hatchling's base (untyped)
    """Hatchling build hook compiling ``kvimpl._kvnative``."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        """Compile the extension (in place for an editable install) and add it to the wheel."""
        if self.target_name != "wheel":
            return
        try:
            if version == "editable":
                out = extension_path()
                compile_extension(out)
                return
            out = extension_path(Path(self.directory) / "native-build")
            out.parent.mkdir(parents=True, exist_ok=True)
            compile_extension(out)
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"kvref build: the native core was not built ({exc}); kvimpl will use its Python manager",
                  file=sys.stderr)  # fmt: skip
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        build_data["force_include"][str(out)] = f"kvimpl/{out.name}"


def main() -> int:
    """Rebuild the in-place extension of this checkout if a source changed
    (a failed build prints the one-line notice and is not an error)."""
    out = extension_path()
    if "--force" in sys.argv[1:] or stale(out):
        try:
            compile_extension(out)
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"kvref build: the native core was not built ({exc}); kvimpl will use its Python manager")
            return 0
        print(f"built {out.relative_to(ROOT)}")
    else:
        print(f"{out.relative_to(ROOT)} is up to date")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
