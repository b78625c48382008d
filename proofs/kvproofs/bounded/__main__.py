"""``python -m kvproofs.bounded [--mutant NAME] [module.check ...]``.

Runs the named checks (default: all), each over its whole domain, and prints
one line per check in CrossHair's message format, which ``proofs/run.py``
parses: ``path:line: info: Confirmed over all N cases.`` or
``path:line: error: <condition>`` for each refuted one (its first failing
case on the next line). A contract check (``contract:module.function``,
:mod:`kvproofs.bounded.pep316`) prints one such line per ``post:`` line of
the spec function, at that line of the spec file.
With ``--mutant NAME``, ``proofs/mutants/NAME.py``'s function first replaces
the spec function or method it copies (its ``TARGET``).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
import time

from kvproofs.bounded import CHECKS, MODULES, run_check
from kvproofs.bounded.pep316 import DOMAINS, PREFIX, messages, run_contract


def install_mutant(name: str) -> None:
    """Put the mutant's function in place of the spec object it copies."""
    from kvproofs.run import load_mutants, mutant_target  # noqa: PLC0415 - only with --mutant

    mutant = next(m for m in load_mutants() if m.name == name)
    owner, attr = mutant_target(mutant)
    setattr(owner, attr, getattr(mutant.module, mutant.function))


def main(argv: list[str] | None = None) -> int:
    """Run the checks; exit status 1 if any property fails."""
    parser = argparse.ArgumentParser(prog="python -m kvproofs.bounded")
    parser.add_argument("checks", nargs="*")
    parser.add_argument("--mutant")
    args = parser.parse_args(argv)
    for module in MODULES:
        importlib.import_module(f"kvproofs.bounded.{module}")
    if args.mutant:
        install_mutant(args.mutant)
    failed = False
    contracts = [PREFIX + q.removeprefix("kvspec.") for q in DOMAINS]
    for name in args.checks or [*CHECKS, *contracts]:
        if name.startswith(PREFIX):
            start = time.process_time()
            report = run_contract("kvspec." + name.removeprefix(PREFIX))
            lines = messages(report)
            failed = failed or any(": error: " in line for line in lines)
            print(
                "\n".join(lines),
                f"    ({name}: {report.cases} cases, {time.process_time() - start:.1f}s CPU)",
                sep="\n",
            )
            continue
        fn = CHECKS[name]
        path = inspect.getsourcefile(fn)
        source, first = inspect.getsourcelines(fn)
        line = first + next(i for i, text in enumerate(source) if text.lstrip().startswith("def "))
        start = time.process_time()
        n, seen, refuted = run_check(fn)
        for condition, case in refuted.items():
            failed = True
            print(f"{path}:{line}: error: {condition}")
            print(f"    first case: {case}")
        for condition, cases in seen.items():
            if condition not in refuted:
                print(f"{path}:{line}: info: Confirmed over all {cases} cases [{condition}].")
        print(f"    ({name}: {n} cases, {time.process_time() - start:.1f}s CPU)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
