#!/usr/bin/env bash
# Run kvref check against every mutant of the upstream bug zoo (tools/kvtools/zoo/), then (if vLLM
# is installed) against the faults planted into real vLLM (tools/kvtools/zoo/vllm.py), and write
# docs/reports/bug-zoo.md (kill table) and docs/reports/zoo.json.
#
#   ci/mutation.sh                      # every entry, 60 s budget each (hunt + shrink), seed 0
#   ci/mutation.sh touch_before_capacity_check   # only the named entries (kvimpl rows; others kept)
#   BUDGET=20 ci/mutation.sh            # shorter hunt per mutant
#   ZOO_NOTE="..." ci/mutation.sh       # a paragraph for the report's preamble (e.g. the machine)
#   SEEDS="1 2 3 4" ci/mutation.sh      # also hunt every entry at these seeds (docs/reports/zoo-seed<N>.json)
#                                       # and summarise all seeds in docs/reports/zoo-seeds.md
# CI runs seed 0 only: one seed of the whole zoo takes about 10 min of the 60 s budgets on a quiet
# machine (24 min on a loaded 2-core one), far above the 3 min that further seeds may cost.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python
args=(--budget "${BUDGET:-60}" --seed "${SEED:-0}" --profile "${PROFILE:-ci}"
      --json "${ZOO_JSON:-docs/reports/zoo.json}" --markdown "${ZOO_MD:-docs/reports/bug-zoo.md}")
[ -n "${ZOO_NOTE:-}" ] && args+=(--note "$ZOO_NOTE")
if [ "$#" -gt 0 ]; then
    exec "$PY" -m kvtools zoo "${args[@]}" --update "$@"
fi
"$PY" -m kvtools zoo "${args[@]}"
if "$PY" -c "import vllm" 2>/dev/null; then
    "$PY" -m kvtools zoo "${args[@]}" --vllm --update
fi
if [ -n "${SEEDS:-}" ]; then
    tables=("${SEED:-0}=${ZOO_JSON:-docs/reports/zoo.json}")
    for seed in $SEEDS; do
        out="docs/reports/zoo-seed$seed"
        seed_args=(--budget "${BUDGET:-60}" --seed "$seed" --profile "${PROFILE:-ci}" --json "$out.json" --markdown "$out.md")
        "$PY" -m kvtools zoo "${seed_args[@]}"
        if "$PY" -c "import vllm" 2>/dev/null; then
            "$PY" -m kvtools zoo "${seed_args[@]}" --vllm --update
        fi
        tables+=("$seed=$out.json")
    done
    "$PY" -m kvtools zoo-seeds "${tables[@]}" --markdown docs/reports/zoo-seeds.md
fi
