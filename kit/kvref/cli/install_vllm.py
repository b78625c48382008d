"""``kvref install-vllm``: install a vLLM release's KV-cache core on CPU.

kvref drives only vLLM's block bookkeeping, so it needs vLLM's Python
package and the light dependencies of its import path, not a GPU build:
a plain ``pip install vllm`` would resolve a CUDA torch and gigabytes of
kernels. The installer (``kvref/scripts/install-vllm.sh``, shipped in the
package; its header lists every step) installs the CPU torch, vLLM with
``--no-deps`` and the light dependencies that release's own metadata lists,
refuses anything that would pull a CUDA package, and checks that every module
the adapter imports imports. Any release the package index has is
installed, one newer than kvref's newest semantics profile included (``kvref
check`` then runs it under the newest profile and says so).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from kvref.exits import InputError
from kvspec.profiles import NEWEST, PROFILES, release_key

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "install-vllm.sh"


def add_parser(sub: Any) -> None:
    """Register ``install-vllm`` on the subcommand parser ``sub``."""
    releases = [p.release for p in PROFILES.values()]
    cmd = sub.add_parser(
        "install-vllm",
        help="install a vLLM release's KV-cache core (CPU only) into a virtual environment",
        description=(__doc__ or "").split("\n\n")[1].replace("\n", " "),
        epilog=f"releases with a semantics profile: {', '.join(releases)}; any other is installed too",
    )
    cmd.add_argument("version", nargs="?", default=NEWEST.release, help=f"vLLM release (default {NEWEST.release})")
    cmd.add_argument(
        "--venv", type=Path, default=None, help="target virtual environment (default: the one kvref runs in)"
    )
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the installer; its exit status is the command's.

    Raises:
        InputError: For a version that is not a release number, or when kvref
            does not run in a virtual environment and no ``--venv`` is given.
    """
    try:
        release_key(args.version)
    except KeyError as exc:
        raise InputError(f"install-vllm: {exc.args[0]}") from None
    venv = args.venv if args.venv is not None else _running_venv()
    return subprocess.call(["bash", str(SCRIPT), args.version, str(venv)], env={**os.environ, "PYTHON": sys.executable})


def _running_venv() -> Path:
    if sys.prefix == sys.base_prefix:
        raise InputError("kvref does not run in a virtual environment: pass --venv DIR")
    return Path(sys.prefix)
