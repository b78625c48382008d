"""``python -m kvtools <task> [options]``: the project's tooling tasks.

Tasks:
    zoo                 hunt every bug-zoo fault with the lockstep (docs/reports/bug-zoo.md)
    zoo-seeds           the zoo's kill rate per seed from several kill tables (docs/reports/zoo-seeds.md)
    coverage            branch coverage of kvspec and kvimpl under the ci lockstep (docs/reports/coverage.md)
    mutants             generic mutants of kvimpl (mutmut) against the kill test (docs/reports/mutants.md)
    cmutants            C mutants of kvimpl's native core against its tests and the lockstep (docs/reports/cmutants.md)
    directed            re-record the directed trace corpus on kvspec (--check: compare only)
    divergence-traces   re-record the known-divergence traces (--check: compare only)
    hash-vectors        regenerate traces/vectors/hash-vectors.json from real vLLM
    check-cuda          run kvimpl's device-table exercise on a CUDA device
    worker-tables       kvimpl's device tables against the installed vLLM's worker tables
    scheduler-traces    record vLLM's real scheduler's calls to its KV-cache manager as traces
    loc                 count code lines per module
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

TASKS: dict[str, tuple[str, str]] = {
    "zoo": ("kvtools.zoo.cli", "main"),
    "zoo-seeds": ("kvtools.zoo.seeds", "main"),
    "coverage": ("kvtools.coverage", "main"),
    "mutants": ("kvtools.mutants.runner", "main"),
    "cmutants": ("kvtools.cmutants.runner", "main"),
    "directed": ("kvtools.directed.record", "main"),
    "divergence-traces": ("kvtools.divergence_traces", "main"),
    "hash-vectors": ("kvtools.hash_vectors", "main"),
    "check-cuda": ("kvtools.check_cuda", "main"),
    "worker-tables": ("kvtools.worker_tables", "main"),
    "scheduler-traces": ("kvtools.scheduler_traces", "main"),
    "loc": ("kvtools.loc", "main"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``argv[0]`` to its task's ``main(rest)``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or args[0] not in TASKS:
        print(__doc__, file=sys.stderr if args and args[0] not in ("-h", "--help") else sys.stdout)
        return 0 if args and args[0] in ("-h", "--help") else 2
    module, attr = TASKS[args[0]]
    task: Callable[[list[str]], int | None] = getattr(importlib.import_module(module), attr)
    return int(task(args[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
