#!/usr/bin/env bash
# CrossHair proofs of kvspec's pure functions (proofs/README.md):
#   holds    the spec's own contracts and the proofs/holds harnesses: nothing refuted
#   mutants  every proofs/mutants variant refuted exactly as proofs/mutants/expected.txt says
#   diff     the crosshair diffbehavior demo of proofs/diffbehavior.md ends as documented
# Budgets are path counts, so results do not depend on the machine's speed;
# about 150 CPU seconds in all (~90s wall on 2 free cores). Every step runs
# even if an earlier one fails; extra arguments go to each step (--jobs N).
# Not part of ci/test.sh: the lead decides.
set -uo pipefail
# shellcheck source=ci/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

export PYTHONPATH="$KVREF_ROOT/spec:$KVREF_ROOT/impl:$KVREF_ROOT${PYTHONPATH:+:$PYTHONPATH}"

# Like common.sh's timed, but returns the step's exit status.
step() {
    local name="$1" start=$SECONDS rc
    shift
    echo "==> proofs $name: python -m proofs.run $name $*"
    python -m proofs.run "$name" "$@"
    rc=$?
    echo "==> proofs $name: exit $rc in $((SECONDS - start))s"
    return "$rc"
}

total_start=$SECONDS
failed=()
for name in holds mutants diff; do
    step "$name" "$@" || failed+=("$name")
done

if ((${#failed[@]})); then
    echo "==> proofs: FAILED (${failed[*]}) in $((SECONDS - total_start))s"
    exit 1
fi
echo "==> proofs: all checks passed in $((SECONDS - total_start))s"
