"""The memcheck tier: the fast tier's tests on a build under AddressSanitizer and UBSan.

Some faults of a C core change nothing the Python side observes: a write one
entry past an array lands in allocator padding or in a neighbour's field that
is rewritten before it is read. No behavioural tier can kill such a mutant;
a memory checker can. This tier compiles the mutant with :data:`CFLAGS`
(AddressSanitizer for out-of-bounds and use-after-free accesses, UBSan for
undefined behaviour such as a null pointer passed to ``memcpy``; both fatal
at the first report) into a staging package of its own and runs the fast
tier's tests on it in a child whose environment (:func:`environment`)
preloads the sanitizer runtime. A report kills the mutant; its reason is the
report's first line (:func:`first_report`).

NOTE: the details that make this work under CPython, each found by a run:

- The interpreter is not built with ASan, so its runtime must be the first
  library loaded: ``LD_PRELOAD`` of ``libasan.so`` (the compiler says where,
  :func:`runtime`). libstdc++ is preloaded with it: torch (the device-table
  tests) throws C++ exceptions, and ASan's ``__cxa_throw`` interceptor fails
  a CHECK when libstdc++ arrives later by ``dlopen``.
- ``detect_leaks=0``: CPython does not free everything at exit.
- ``PYTHONMALLOC=malloc``: pymalloc serves small blocks (up to 512 bytes) from
  its own arenas, where ASan sees no bounds; with ``malloc`` every
  ``PyMem_Malloc`` of the core is a heap block ASan guards.
- Reports go to the child's stderr (the log): ASan's and UBSan's
  ``log_path`` are not honoured by the standalone UBSan runtime here, and
  pytest runs with ``--capture=sys`` so that its file-descriptor capture does
  not swallow a report written just before the process exits.
- Both runtimes exit with :data:`EXIT` on a report, a code neither pytest nor
  the child uses, so that a report the parser misses still kills.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sysconfig
from collections.abc import Mapping, Sequence
from pathlib import Path

CFLAGS = ("-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=all")
"""Added after the build's own flags (the last ``-O`` wins) to every object of the memcheck build."""
LDFLAGS = ("-fsanitize=address,undefined",)
"""Added to the link of the memcheck build (it then needs libasan and libubsan)."""
EXIT = 86
"""The exit code both sanitizer runtimes use on a report."""
PYTEST_FLAGS = ("--capture=sys",)
"""Added to the fast tier's pytest flags (see the module's NOTE)."""


class RuntimeMissing(RuntimeError):
    """The compiler has no AddressSanitizer runtime: the memcheck tier cannot run."""


def compiler() -> list[str]:
    """The build's C compiler (``CC`` or the interpreter's), as build.compile_command uses it."""
    return shlex.split(os.environ.get("CC") or str(sysconfig.get_config_var("CC") or "cc"))


def runtime(cc: Sequence[str] | None = None) -> list[Path]:
    """The libraries to preload: ASan's runtime, then libstdc++ where the compiler has one.

    Raises:
        RuntimeMissing: If the compiler does not find ``libasan.so`` (it then prints the bare
            name back) or is not there at all.
    """
    cc = list(cc or compiler())
    asan = _print_file_name(cc, "libasan.so")
    if asan is None:
        raise RuntimeMissing(
            f"the memcheck tier needs AddressSanitizer's runtime, and `{' '.join(cc)} -print-file-name=libasan.so` "
            "does not find it (Debian and Ubuntu: the libasan package of the compiler's version, e.g. libasan8 for "
            "gcc 12; clang: a gcc-compatible CC); or hunt without the tier (--no-memcheck)"
        )
    cxx = _print_file_name(cc, "libstdc++.so")
    return [asan, *([cxx] if cxx is not None else [])]


def _print_file_name(cc: Sequence[str], name: str) -> Path | None:
    try:
        proc = subprocess.run([*cc, f"-print-file-name={name}"], capture_output=True, text=True, check=False)
    except OSError:
        return None
    found = Path(proc.stdout.strip())
    return found.resolve() if proc.returncode == 0 and found.is_absolute() and found.exists() else None


def environment(preload: Sequence[Path], base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with the sanitizer runtime preloaded and its options set (see the module's NOTE)."""
    env = dict(base)
    env["LD_PRELOAD"] = " ".join([*(str(p) for p in preload), *filter(None, [base.get("LD_PRELOAD", "")])])
    env["ASAN_OPTIONS"] = f"detect_leaks=0:exitcode={EXIT}:abort_on_error=0:print_summary=1"
    env["UBSAN_OPTIONS"] = f"halt_on_error=1:exitcode={EXIT}:print_stacktrace=1"
    env["PYTHONMALLOC"] = "malloc"
    return env


_ASAN = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer): (\S+)(.*)")
_UBSAN = re.compile(r"(\S+?):(\d+):(\d+): runtime error: (.*)")
_FRAME = re.compile(r"#0 0x[0-9a-f]+ in (\S+) (\S+)")
_ACCESS = re.compile(r"^(READ|WRITE) of size (\d+)")


def first_report(output: str) -> str | None:
    """The first sanitizer report in ``output``, in one line without addresses (None: no report).

    An ASan report reads ``AddressSanitizer: heap-buffer-overflow: WRITE of size 4 in
    host_row_sync (hosttab.c:123)``; a UBSan report ``UBSan: hit.c:181:17: null pointer passed
    as argument 1, ...`` (file names without their folders: the staging folder is temporary).
    """
    lines = output.splitlines()
    for i, line in enumerate(lines):
        asan = _ASAN.search(line)
        if asan:
            tool, kind = asan.group(1), asan.group(2)
            access = next((m for ln in lines[i + 1 : i + 4] if (m := _ACCESS.match(ln.strip()))), None)
            frame = next((m for ln in lines[i + 1 : i + 12] if (m := _FRAME.search(ln))), None)
            text = f"{tool}: {kind}"
            if access:
                text += f": {access.group(1)} of size {access.group(2)}"
            if frame:
                text += f" in {frame.group(1)} ({Path(frame.group(2)).name})"
            return text
        ubsan = _UBSAN.search(line)
        if ubsan:
            return f"UBSan: {Path(ubsan.group(1)).name}:{ubsan.group(2)}:{ubsan.group(3)}: {ubsan.group(4)}"[:240]
    return None
