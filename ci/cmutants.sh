#!/usr/bin/env bash
# Mutants of kvimpl's native core (the C sources in impl/kvimpl/_native), hunted by the
# native unit tests, the same tests under AddressSanitizer and UBSan (the memcheck tier; it needs
# the compiler's libasan, --no-memcheck leaves it out) and the lockstep (kvref check against kvspec); writes
# docs/reports/cmutants.md and docs/reports/cmutants.json. Not run by CI: 30 s of CPU per mutant
# on 2 loaded cores (more than a day for all 3,970); CI runs the tool's tests (tests/tools/test_cmutants_*.py).
# The figure in docs/status.md: 100% (76 of 76; 95% interval 95.2-100%) on a stratified sample of 100 mutants (seed 0), not every mutant.
#
#   ci/cmutants.sh --list | wc -l                        # how many mutants the sources give
#   ci/cmutants.sh --sample 100 --seed 0 --semantics vllm-0.33.0  # that sample (results reused)
#   ci/cmutants.sh --sample 200 --seed 0 --semantics vllm-0.33.0   # a larger sample (contains the smaller)
#   ci/cmutants.sh --files slots.c,events.c              # every mutant of some files
#   ci/cmutants.sh slots.c:91:25:or_to_and               # exactly these mutants
#   ci/cmutants.sh --sample 100 --seed 0 --report-only   # re-render that sample (e.g. after editing the triage)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python
exec "$PY" -m kvtools cmutants "$@"
