#!/usr/bin/env bash
# Lint, type-check and test. Run ci/setup.sh (--with-vllm for real vLLM) first.
set -euo pipefail
# shellcheck source=ci/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
total_start=$SECONDS

bash ci/lint.sh
bash ci/typecheck.sh
timed "pytest (HYPOTHESIS_PROFILE=$HYPOTHESIS_PROFILE)" pytest -q

# ---------------------------------------------------------------------------
# Lockstep: the spec against real vLLM 0.25.1 (>= 20,000 steps with the ci
# profile); without vLLM, the spec's self-check (invariants, error contract).
if python -c "from kvref.adapters.vllm import vllm_available as a; raise SystemExit(0 if a() else 1)"; then
    timed "lockstep (spec vs vllm)" kvref check --target spec --against vllm --profile ci --seed 0
else
    timed "lockstep (spec self-check)" kvref check --target spec --profile ci --seed 0
fi

# kvimpl against kvspec: identical outputs and views at every step.
timed "lockstep (impl vs spec)" kvref check --target impl --against spec --profile ci --seed 0

# Replay of the stored traces (traces/README.md): the golden corpus must pass
# everywhere; a known-divergence trace must pass on the spec and, on real vLLM,
# differ exactly at its divergence_step. Only failures and the summary print.
replay() {  # replay GLOB TARGET
    # shellcheck disable=SC2086  # GLOB is expanded here, not in the log line
    kvref replay $1 --target "$2" | grep -v -e ': ok (' -e ': known divergence .* confirmed'
}
timed "replay golden (spec)" replay 'traces/golden/*.jsonl' spec
timed "replay divergences (spec)" replay 'traces/divergences/*.jsonl' spec
timed "replay directed (spec)" replay 'traces/directed/*.jsonl' spec
timed "replay golden (impl)" replay 'traces/golden/*.jsonl' impl
timed "replay directed (impl)" replay 'traces/directed/*.jsonl' impl
timed "replay divergences (impl)" replay 'traces/divergences/*.jsonl' impl
if python -c "from kvref.adapters.vllm import vllm_available as a; raise SystemExit(0 if a() else 1)"; then
    timed "replay golden (vllm)" replay 'traces/golden/*.jsonl' vllm
    timed "replay divergences (vllm)" replay 'traces/divergences/*.jsonl' vllm
    timed "replay directed (vllm)" replay 'traces/directed/*.jsonl' vllm
else
    echo "==> replay against vllm: skipped (vLLM 0.25.1 is not installed)"
fi
# ---------------------------------------------------------------------------

# Reliability: a short soak on the spec and on kvimpl (no leaked block, flat
# memory), and the unit and reliability tests under python -O.
bash ci/soak.sh --target spec
bash ci/soak.sh --target impl
bash ci/test-O.sh

# CrossHair: the spec's contracts and harnesses hold; every mutant is killed.
bash ci/proofs.sh

echo "==> test: all checks passed in $((SECONDS - total_start))s"
