"""No module of the scheduler machine, the scheduler model or the safety monitor grows past 400 lines.

The machine (``kit/kvref/stateful.py``) is a thin composition of rule
families, each a module of ``kit/kvref/machine/``; the scheduler model is
``kit/kvref/scheduler.py``, and a scheduler feature that adds state goes in a
module of its own beside it, ``kit/kvref/scheduler_<feature>.py``; the safety
monitor (``kit/kvref/safety.py``) is a stack of layers, ``kit/kvref/safety_<layer>.py``.
A family, a model module or a layer that outgrows the limit is split in two, not extended.
"""

from __future__ import annotations

from pathlib import Path

import pytest

KIT = Path(__file__).resolve().parents[1] / "kit" / "kvref"
LIMIT = 400
"""Lines a module of the machine or the scheduler model may have at most."""


def generator_modules() -> list[Path]:
    """The machine's modules, the scheduler model's and the safety monitor's, sorted."""
    found = [KIT / "stateful.py", *KIT.glob("machine/**/*.py"), *KIT.glob("scheduler*.py"), *KIT.glob("safety*.py")]
    return sorted(found)


def test_the_modules_are_found() -> None:
    """The walk sees the composition, every family module and the scheduler model."""
    names = {str(p.relative_to(KIT)) for p in generator_modules()}
    expected = {"stateful.py", "scheduler.py", "machine/base.py", "machine/admission.py", "machine/running.py",
                "safety.py", "safety_base.py"}  # fmt: skip
    assert expected <= names, f"missing {sorted(expected - names)} among {sorted(names)}"


@pytest.mark.parametrize("path", generator_modules(), ids=lambda p: str(p.relative_to(KIT)))
def test_the_module_is_at_most_400_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= LIMIT, (
        f"{path.relative_to(KIT.parent.parent)} has {lines} lines, more than {LIMIT}: split its rule family "
        "(or its scheduler feature) into a module of its own"
    )
