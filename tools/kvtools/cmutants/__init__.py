"""Mutants of kvimpl's native core (the C sources), hunted by the native tests and the lockstep.

:mod:`kvtools.cmutants.generate` plants operator-level mutants in
``impl/kvimpl/_native/*.c`` (with :mod:`kvtools.cmutants.lexer`, a C lexer that
keeps comments, literals and preprocessor lines out of reach);
:mod:`kvtools.cmutants.build` compiles each into a staging copy of kvimpl with
the build's own compiler and flags; :mod:`kvtools.cmutants.runner` hunts each
in child processes (:mod:`kvtools.cmutants.child`): the native unit tests, the
same tests on the mutant built with AddressSanitizer and UBSan
(:mod:`kvtools.cmutants.memcheck`), then ``kvref check`` on the targets whose
path holds the mutated function (:mod:`kvtools.cmutants.reach`, gcov); :mod:`kvtools.cmutants.report` triages
the survivors (``tools/kvtools/cmutants_triage.toml``) and writes
``docs/reports/cmutants.md``. Run it as ``python -m kvtools cmutants`` (or
``ci/cmutants.sh``); it is the C counterpart of ``python -m kvtools mutants``
(mutmut over the pure-Python build).
"""
