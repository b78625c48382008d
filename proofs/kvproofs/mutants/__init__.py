"""Deliberately wrong variants of kvspec's pure functions.

Each module defines one mutated function under the spec's name, carrying the
spec's docstring contract verbatim, plus two constants read by
``proofs/run.py``:

``OWN_CONTRACT``
    Whether CrossHair can check the function's own (spec) contract directly.
``HARNESSES``
    ``module.function`` targets in ``kvproofs.holds`` to re-run with the
    mutant bound in place of the spec function.

``expected.txt`` lists, per mutant, every condition CrossHair refutes.
"""
