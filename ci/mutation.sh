#!/usr/bin/env bash
# Run kvref check against every mutant of the upstream bug zoo (kvref/zoo.py)
# and write docs/bug-zoo.md (kill table) and kvref-zoo.json.
#
#   ci/mutation.sh                      # every entry, 60 s budget each, seed 0
#   ci/mutation.sh touch_before_capacity_check   # only the named entries
#   BUDGET=20 ci/mutation.sh            # shorter hunt per mutant
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python
exec "$PY" -m kvref.zoo --budget "${BUDGET:-60}" --seed "${SEED:-0}" --profile "${PROFILE:-ci}" \
    --json "${ZOO_JSON:-kvref-zoo.json}" --markdown "${ZOO_MD:-docs/bug-zoo.md}" "$@"
