"""``kvref install-vllm``: install a vLLM release's KV-cache core on CPU.

kvref drives only vLLM's block bookkeeping, so it needs vLLM's Python
package and the light dependencies of its import path, not a GPU build:
a plain ``pip install vllm`` would resolve a CUDA torch and gigabytes of
kernels. The installer (``kvref/scripts/install-vllm.sh``, shipped in the
package; its header lists every step) installs the CPU torch, vLLM with
``--no-deps`` and the pure-Python dependencies of that release, refuses
anything that would pull a CUDA package, and checks that every module the
adapter imports imports.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from kvref.exits import InputError
from kvspec.profiles import NEWEST, PROFILES

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "install-vllm.sh"


def add_parser(sub: Any) -> None:
    """Register ``install-vllm`` on the subcommand parser ``sub``."""
    releases = [p.release for p in PROFILES.values()]  # each has an installer recipe and an adapter era
    cmd = sub.add_parser(
        "install-vllm",
        help="install a vLLM release's KV-cache core (CPU only) into a virtual environment",
        description=(__doc__ or "").split("\n\n")[1].replace("\n", " "),
        epilog=f"releases: {', '.join(releases)}",
    )
    cmd.add_argument("version", nargs="?", default=NEWEST.release, help=f"vLLM release (default {NEWEST.release})")
    cmd.add_argument(
        "--venv", type=Path, default=None, help="target virtual environment (default: the one kvref runs in)"
    )
    cmd.set_defaults(run=run, releases=releases)


def run(args: argparse.Namespace) -> int:
    """Run the installer; its exit status is the command's.

    Raises:
        InputError: For an unsupported release or when kvref does not run in a
            virtual environment and no ``--venv`` is given.
    """
    if args.version not in args.releases:
        raise InputError(f"vLLM {args.version} is not supported; supported: {', '.join(args.releases)}")
    venv = args.venv if args.venv is not None else _running_venv()
    return subprocess.call(["bash", str(SCRIPT), args.version, str(venv)], env={**os.environ, "PYTHON": sys.executable})


def _running_venv() -> Path:
    if sys.prefix == sys.base_prefix:
        raise InputError("kvref does not run in a virtual environment: pass --venv DIR")
    return Path(sys.prefix)
