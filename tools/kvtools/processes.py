"""Which processes are still alive: the tests of commands that start process trees
(``kvref fuzz``, ``kvref campaign``) check that nothing they started outlives them."""

from __future__ import annotations

import os
import time
from pathlib import Path


def processes_naming(folder: Path, settle_s: float = 10.0) -> list[str]:
    """The command lines of live processes (other than this one) that name
    ``folder``, read from Linux's ``/proc``, after up to ``settle_s`` seconds for
    processes already killed to go; [] where there is no ``/proc``."""
    proc_root = Path("/proc")
    if not proc_root.is_dir():
        return []
    deadline = time.monotonic() + settle_s
    while True:
        left = []
        for entry in proc_root.iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(folder) in cmdline:
                left.append(f"{entry.name}: {cmdline[:200]}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
