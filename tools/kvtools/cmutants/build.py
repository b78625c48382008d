"""Build mutants of kvimpl's native core into a staging copy of kvimpl.

The compiler, flags and link step are those of ``hatch_build.py``'s
``compile_extension`` (the interpreter's ``CC``, ``CFLAGS``, ``CCSHARED``,
``LDSHARED``, the Python headers, then ``-O2 -std=c11
-Wno-unused-parameter``): :func:`compile_command` and :func:`link_command`
spell them per object, and a test checks them against the commands
``compile_extension`` itself runs. The unmutated objects are compiled once;
a mutant recompiles only its file and relinks.

:class:`Stage` is a work folder: ``objects/`` (the unmutated objects),
``mutant/`` (the mutated source and object of the mutant being built) and
``stage/kvimpl`` (a copy of ``impl/kvimpl`` without its compiled extension,
where the mutant's ``_kvnative`` goes). Putting ``stage/`` first on
``PYTHONPATH`` makes ``import kvimpl`` load the mutant; the checkout's own
extension is never read or written. A stage may add flags to every compile
and to the link (the memcheck tier's sanitizers:
:mod:`kvtools.cmutants.memcheck`).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvtools.cmutants.generate import Mutant

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "impl" / "kvimpl"
SOURCES = PACKAGE / "_native"
MODULE = "_kvnative"


def extension_name() -> str:
    """``_kvnative`` plus this interpreter's extension suffix (as hatch_build.extension_path)."""
    return MODULE + str(sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def compile_command(source: Path, obj: Path, sources: Path = SOURCES) -> list[str]:
    """The command hatch_build.compile_extension runs to compile ``source`` into ``obj``."""
    cfg = sysconfig.get_config_vars()
    cc = shlex.split(os.environ.get("CC") or str(cfg.get("CC") or "cc"))
    cflags = shlex.split(str(cfg.get("CFLAGS") or "")) + shlex.split(str(cfg.get("CCSHARED") or "-fPIC"))
    include = ["-I", sysconfig.get_paths()["include"], "-I", str(sources)]
    extra = ["-O2", "-std=c11", "-Wno-unused-parameter"]
    return [*cc, *cflags, *extra, *include, "-c", str(source), "-o", str(obj)]


def link_command(objects: Sequence[Path], out: Path) -> list[str]:
    """The command hatch_build.compile_extension runs to link ``objects`` into ``out``."""
    cfg = sysconfig.get_config_vars()
    ldshared = shlex.split(os.environ.get("LDSHARED") or str(cfg.get("LDSHARED") or "cc -shared"))
    return [*ldshared, *(str(o) for o in objects), "-o", str(out)]


def sources_digest(sources: Path = SOURCES) -> str:
    """sha256 of every C source and header (the unmutated core a campaign applies to), first 16 hex digits."""
    digest = hashlib.sha256()
    for path in sorted(p for p in sources.iterdir() if p.suffix in (".c", ".h")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class BuildResult:
    """A build of one mutant: whether it compiled and linked, and the compiler's last words if not."""

    ok: bool
    seconds: float
    error: str = ""


class Stage:
    """The work folder of a campaign (see the module docstring)."""

    def __init__(
        self,
        work: Path,
        sources: Path = SOURCES,
        package: Path = PACKAGE,
        cflags: Sequence[str] = (),
        ldflags: Sequence[str] = (),
    ) -> None:
        self.work, self.sources, self.package = work, sources, package
        self.cflags, self.ldflags = list(cflags), list(ldflags)
        self.objects = work / "objects"
        self.mutant_dir = work / "mutant"
        self.root = work / "stage"
        self.extension = self.root / "kvimpl" / extension_name()

    def prepare(self) -> None:
        """Copy kvimpl (without its extension) and compile every unmutated object.

        Raises:
            subprocess.CalledProcessError: If the unmutated sources do not compile.
        """
        self.prepare_package()
        self.objects.mkdir(parents=True, exist_ok=True)
        self.mutant_dir.mkdir(parents=True, exist_ok=True)
        for src in self.c_files():
            obj = self.objects / (src.stem + ".o")
            subprocess.run([*compile_command(src, obj, self.sources), *self.cflags], check=True, capture_output=True)

    def prepare_package(self) -> None:
        """Copy kvimpl, without its compiled extension, to ``stage/kvimpl``."""
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.copytree(
            self.package,
            self.root / "kvimpl",
            ignore=shutil.ignore_patterns(
                "__pycache__", "*.pyc", f"{MODULE}*.so", f"{MODULE}*.so.tmp", f"{MODULE}*.pyd"
            ),
        )

    def c_files(self) -> list[Path]:
        """The C sources, sorted (the link order of hatch_build)."""
        return sorted(self.sources.glob("*.c"))

    def build(self, mutant: Mutant | None) -> BuildResult:
        """Build the extension with ``mutant`` planted (None: unmutated) into the staging package."""
        import time  # noqa: PLC0415 - only here

        start = time.monotonic()
        objects = [self.objects / (src.stem + ".o") for src in self.c_files()]
        if mutant is not None:
            src = self.sources / mutant.file
            mutated = self.mutant_dir / mutant.file
            mutated.write_text(mutant.apply(src.read_text()))
            obj = self.mutant_dir / (src.stem + ".o")
            obj.unlink(missing_ok=True)
            proc = subprocess.run(
                [*compile_command(mutated, obj, self.sources), *self.cflags],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                return BuildResult(False, time.monotonic() - start, _last_error(proc.stderr))
            objects = [obj if o.stem == src.stem else o for o in objects]
        partial = self.extension.with_name(self.extension.name + ".tmp")
        proc = subprocess.run(
            [*link_command(objects, partial), *self.ldflags], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            return BuildResult(False, time.monotonic() - start, _last_error(proc.stderr))
        partial.replace(self.extension)
        return BuildResult(True, time.monotonic() - start)


def _last_error(stderr: str) -> str:
    errors = [ln for ln in stderr.splitlines() if "error" in ln]
    return (errors or stderr.splitlines() or ["(no output)"])[0][-300:]
