"""The child process of a hunt: load the staged mutant, then run one tier.

``python -m kvtools.cmutants.child STAGE fast PYTEST-ARGS...`` or
``... STAGE lockstep KVREF-ARGS...``. It first imports kvimpl and its native
extension and checks that both come from ``STAGE`` (the runner puts it first
on ``PYTHONPATH``): a mutant whose extension does not import would otherwise
go unseen, as kvimpl falls back to its pure-Python manager and the native
tests skip. Then it runs pytest or ``kvref`` in this process, so that a crash
of the mutant (a signal) ends the child and the runner sees it.

Exit codes: the tier's own (pytest's, ``kvref``'s), or :data:`NOT_LOADED`
when the extension does not import (a kill: the build is unusable), or
:data:`WRONG_STAGE` when kvimpl came from elsewhere (a fault of the runner,
never a verdict on the mutant).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

NOT_LOADED = 90
WRONG_STAGE = 91


def main(argv: Sequence[str] | None = None) -> int:
    """Check the staged build, then run the tier (see the module docstring)."""
    stage, tier, *rest = list(sys.argv[1:] if argv is None else argv)
    import kvimpl  # noqa: PLC0415 - must come from the staging folder, checked below
    from kvimpl import native  # noqa: PLC0415

    root = Path(stage).resolve()
    if not Path(kvimpl.__file__ or "").resolve().is_relative_to(root):
        print(f"cmutants child: kvimpl was imported from {kvimpl.__file__}, not from {root}", file=sys.stderr)
        return WRONG_STAGE
    module = native.native_module()
    if module is None:
        print(f"cmutants child: the mutant extension does not import: {native._import_error}", file=sys.stderr)
        return NOT_LOADED
    if not Path(module.__file__ or "").resolve().is_relative_to(root):
        print(f"cmutants child: the extension was loaded from {module.__file__}, not from {root}", file=sys.stderr)
        return WRONG_STAGE
    sys.stdout.flush()
    if tier == "fast":
        import pytest  # noqa: PLC0415 - only this tier needs it

        return int(pytest.main(rest))
    if tier == "lockstep":
        from kvref.cli import main as kvref_main  # noqa: PLC0415

        return kvref_main(rest)
    print(f"cmutants child: unknown tier {tier!r} (fast, lockstep)", file=sys.stderr)
    return WRONG_STAGE


if __name__ == "__main__":
    sys.exit(main())
