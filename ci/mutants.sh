#!/usr/bin/env bash
# Generic mutants of kvimpl (mutmut 3.8.1) against the lockstep kill test
# (tests/tools/mutation); writes docs/reports/mutants.md and docs/reports/mutants.json.
#
#   ci/mutants.sh                                  # the four core modules, 1 worker, cached results reused
#   ci/mutants.sh --fresh                          # drop mutmut's cache first (a full run)
#   ci/mutants.sh --modules block_pool             # one module
#   ci/mutants.sh --report-only                    # re-render the reports (e.g. after editing the triage file)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python
exec "$PY" -m kvtools mutants "$@"
