"""Every public function of kvspec has a checked contract or a stated reason
not to (``proofs/kvproofs/contracts.py``), read from the sources in well
under a second, so a function added without one fails the ordinary test run
and not only ``ci/proofs.sh``."""

from __future__ import annotations

from kvproofs.contracts import CROSSHAIR, EXEMPT, spec_functions
from kvproofs.report import gaps


def test_every_public_function_has_a_checked_contract_or_a_reason() -> None:
    problems = gaps()
    assert not problems, "kvspec functions outside the contract rule:\n" + "\n".join(problems)


def test_the_rule_covers_functions_and_is_not_vacuous() -> None:
    fns = spec_functions()
    assert len(fns) > 100
    assert sum(f.has_contract for f in fns) + len(EXEMPT) == len(fns)
    assert all(not any(c.kind == "post" for c in fn.conditions) for fn in fns if fn.qualname in EXEMPT)
    assert {f.qualname for f in fns} >= set(CROSSHAIR)
