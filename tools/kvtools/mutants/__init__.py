"""Generic mutants of kvimpl (mutmut), killed by kvref's lockstep kill test.

:mod:`kvtools.mutants.runner` stages kvimpl and the kill test
(``tests/tools/mutation``, whose lockstep stage is :mod:`kvtools.killtest`)
for mutmut, runs it and shrinks the lockstep kills;
:mod:`kvtools.mutants.report` triages the results
(``tools/kvtools/mutants_triage.toml``) and writes ``docs/reports/mutants.md``
and ``docs/reports/mutants.json``. Run it as ``python -m kvtools mutants``
(or ``ci/mutants.sh``).
"""
