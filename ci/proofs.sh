#!/usr/bin/env bash
# CrossHair proofs of kvspec's contracts and bounded checks of its classes
# (proofs/README.md), in three steps:
#   proofs     KVREF_PROOFS=1 pytest tests/proofs/test_proofs.py: holds (every
#              contract of kvspec, by CrossHair or over an enumerated domain under
#              every semantics profile, the proofs/kvproofs/holds harnesses and the
#              proofs/kvproofs/bounded checks: each obligation exhausted or confirmed
#              within its stated bound, none refuted or left "not refuted"), mutants
#              (refuted exactly as proofs/kvproofs/mutants/expected.txt says), diff
#              (crosshair diffbehavior of spec/kvimpl pairs ends as expected)
#   coverage   python -m kvproofs.coverage: the proof-coverage report (public
#              functions with contracts, obligations per module and per release)
#              of the holds run; fails on a function without a checked contract
#              or reason, or an obligation not exhausted
#   crosshair  the pure-function property tests (tests/spec/test_formulas.py) on
#              the hypothesis-crosshair backend (HYPOTHESIS_PROFILE=crosshair)
# Budgets are path counts and finite domains, so results do not depend on the
# machine's speed; each CrossHair condition also has a per-condition CPU timeout
# (proofs/kvproofs/run.py), a safety net no condition reaches. The wall-clock caps
# (one hour per step) are hang guards only, far above the measured time, never a
# budget.
# Both steps run even if the first fails. Usage: bash ci/proofs.sh [--jobs N]
set -uo pipefail
# shellcheck source=ci/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

export PYTHONPATH="$KVREF_ROOT/spec:$KVREF_ROOT/impl:$KVREF_ROOT/kit:$KVREF_ROOT/proofs${PYTHONPATH:+:$PYTHONPATH}"
if [[ "${1:-}" == "--jobs" && -n "${2:-}" ]]; then
    export KVREF_PROOFS_JOBS="$2"
fi

# Like common.sh's timed, but returns the step's exit status.
step() {
    local name="$1" start=$SECONDS rc
    shift
    echo "==> proofs $name: $*"
    "$@"
    rc=$?
    ((rc == 124)) && echo "==> proofs $name: wall-clock cap reached"
    echo "==> proofs $name: exit $rc in $((SECONDS - start))s"
    return "$rc"
}

total_start=$SECONDS
failed=()
step proofs env KVREF_PROOFS=1 timeout 3600 pytest -q -s -p no:cacheprovider --durations=0 \
    tests/proofs/test_proofs.py || failed+=(proofs)
step coverage timeout 600 python -m kvproofs.coverage --out "$KVREF_ROOT/build/proofs/coverage.md" || failed+=(coverage)
# Without the provider the profile silently falls back to random testing; refuse that.
if python -c "import hypothesis_crosshair_provider" 2>/dev/null; then
    step crosshair env HYPOTHESIS_PROFILE=crosshair timeout 3600 pytest -q -p no:cacheprovider --durations=5 \
        tests/spec/test_formulas.py || failed+=(crosshair)
else
    echo "==> proofs crosshair: hypothesis-crosshair is not installed (pip install -e '.[dev]')"
    failed+=(crosshair)
fi

if ((${#failed[@]})); then
    echo "==> proofs: FAILED (${failed[*]}) in $((SECONDS - total_start))s"
    exit 1
fi
echo "==> proofs: all checks passed in $((SECONDS - total_start))s"
