"""The ``kvref`` console script and ``python -m kvref``.

Ctrl-C is caught from the first moment the command runs: the handler of
:func:`kvref.exits.interruptible` is installed before the subcommands (and
the engines they import) are loaded, so an interrupt during start-up ends
with exit code 130 and one line, like one during a run (which prints the
summary so far), instead of a traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from kvref.exits import INTERRUPTED, interruptible


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kvref`` command (exit codes: :mod:`kvref.exits`)."""
    with interruptible():
        try:
            from kvref.cli import main as run  # noqa: PLC0415 - loaded under the Ctrl-C handler

            code = run(argv)
        except KeyboardInterrupt:
            print("kvref: interrupted during start-up; nothing ran", file=sys.stderr)
            code = INTERRUPTED
    if code == INTERRUPTED:
        _exit_interrupted()
    return code


def _exit_interrupted() -> None:
    """Leave with 130 now that the interrupt was handled.

    NOTE: CPython remembers a ``KeyboardInterrupt`` that escaped code run by
    ``PyRun_*`` (as some extension modules do while being imported) even when
    a caller handled it, and then ends the process by re-sending itself
    SIGINT (exit status -2 instead of 130). Every trace was written and
    closed before this point, so the streams are flushed and the process
    ends without that finalisation step.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(INTERRUPTED)
