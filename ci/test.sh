#!/usr/bin/env bash
# Lint, type-check and test. Run ci/setup.sh (--with-vllm, --with-vllm-newest) first.
set -euo pipefail
# shellcheck source=ci/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
total_start=$SECONDS
BASELINE="vllm-$(vllm_release baseline)"
NEWEST="vllm-$(vllm_release newest)"
NEWEST_VENV="$KVREF_ROOT/.venv-vllm-newest"

bash ci/lint.sh
bash ci/typecheck.sh
timed "pytest (HYPOTHESIS_PROFILE=$HYPOTHESIS_PROFILE)" pytest -q

vllm_in() {  # vllm_in PYTHON: whether that interpreter imports a supported vLLM
    "$1" -c "from kvref.adapters.vllm import vllm_available as a; raise SystemExit(0 if a() else 1)" 2>/dev/null
}

# ---------------------------------------------------------------------------
# Lockstep (>= 20,000 steps each with the ci profile): the spec against real
# vLLM of each installed release, under that release's profile; without vLLM,
# the spec's self-check (invariants, error contract).
if vllm_in python; then
    timed "lockstep (spec vs vllm $BASELINE)" kvref check --target spec --against vllm --profile ci --seed 0
else
    timed "lockstep (spec self-check)" kvref check --target spec --against none --profile ci --seed 0
fi
if [[ -x "$NEWEST_VENV/bin/kvref" ]] && vllm_in "$NEWEST_VENV/bin/python"; then
    timed "lockstep (spec vs vllm $NEWEST)" "$NEWEST_VENV/bin/kvref" check --target spec --against vllm \
        --profile ci --seed 0
else
    echo "==> lockstep against vLLM $NEWEST: skipped (no $NEWEST_VENV; bash ci/setup.sh --with-vllm-newest)"
    timed "lockstep (spec self-check, $NEWEST)" kvref check --target spec --against none --profile ci --seed 0 \
        --semantics "$NEWEST"
fi

# The production scheduler paths: vLLM's asynchronous scheduling (steps in
# flight, output placeholders, rejected drafts, fenced frees): the spec against
# the newest real vLLM, then kvimpl (both builds) against the spec with the
# safety oracles after the comparison (--level all; registered vLLM safety
# defects are named, anything else fails).
if [[ -x "$NEWEST_VENV/bin/kvref" ]] && vllm_in "$NEWEST_VENV/bin/python"; then
    timed "lockstep (spec vs vllm $NEWEST, asynchronous scheduling)" "$NEWEST_VENV/bin/kvref" check --target spec \
        --against vllm --profile ci --seed 0 --async-scheduling
fi
timed "lockstep (impl vs spec, $NEWEST, asynchronous scheduling, conformance and safety)" kvref check \
    --target impl --against spec --profile ci --seed 0 --semantics "$NEWEST" --async-scheduling --level all
KVREF_NATIVE=0 timed "lockstep (impl vs spec, $NEWEST, pure Python, asynchronous scheduling, conformance and safety)" \
    kvref check --target impl --against spec --profile ci --seed 0 --semantics "$NEWEST" --async-scheduling --level all

# kvimpl against kvspec: identical outputs and views at every step, under
# every profile kvimpl follows (--target impl: the native core where it
# implements the configuration; releases that share their switches run once,
# under the newest of them), the pure-Python build (KVREF_NATIVE=0) under
# the baseline profile, and under the newest kvimpl's own mutable requests
# (--target impl-mutable) and its batched step API with device tables on the
# pure-Python manager and on the native core (--target impl-batch,
# impl-batch-native), two short runs of one shape each: `wide` (65 groups,
# kvimpl's pure-Python fallback past the native core's 64) and a cached Mamba
# group under context parallelism, and runs of a few shapes each for
# situations the full runs meet at some seeds only or not at all (one of them
# with asynchronous scheduling; tools/kvtools/coverage.py):
# `python -m kvtools coverage --ci-runs` lists them (profile, target, build,
# shapes, step goal, scheduling).
# Each run also writes its branch coverage of kvspec and kvimpl; the gate
# merges them (an outcome is taken if any run took it) and fails on a gap not
# in tools/kvtools/coverage_gaps.toml, on a listed gap now taken, and on a
# stale entry of either list (docs/reports/coverage.md).
echo "==> kvimpl build: $(python -c 'from kvimpl.native import build_description as d; print(d())')"
COVERAGE_DIR="$(mktemp -d)"
trap 'rm -rf "$COVERAGE_DIR"' EXIT
CI_RUNS="$(python -m kvtools coverage --ci-runs)"
run=0
while read -r profile target build shapes steps scheduling; do
    env_prefix=(env)
    label="$target vs spec, $profile"
    extra=()
    if [[ "$build" == pure-python ]]; then
        env_prefix=(env KVREF_NATIVE=0)
        label+=", pure Python"
    fi
    if [[ "$shapes" != - ]]; then
        extra+=(--shapes "$shapes")
        label+=", shapes $shapes"
    fi
    if [[ "$steps" != - ]]; then
        extra+=(--min-steps "$steps")
    fi
    if [[ "$scheduling" == async ]]; then
        extra+=(--async-scheduling)
        label+=", asynchronous scheduling"
    fi
    timed "lockstep ($label)" "${env_prefix[@]}" kvref check --target "$target" --against spec --profile ci \
        --seed 0 --semantics "$profile" "${extra[@]}" \
        --coverage-json "$COVERAGE_DIR/$profile-$target-$build-$((++run)).json" </dev/null
done <<<"$CI_RUNS"
timed "branch-coverage gate (the runs above, merged)" python -m kvtools coverage --merge "$COVERAGE_DIR"/*.json --check

# Replay of the stored traces (traces/README.md): the golden and directed
# corpora must pass everywhere; a known-divergence trace must pass on the spec
# and, on real vLLM of its release, differ exactly at its divergence_step.
# Each trace runs under the profile its header names. Only failures and the
# summaries print.
replay() {  # replay KVREF GLOB TARGET
    # shellcheck disable=SC2086  # GLOB is expanded here, not in the log line
    "$1" replay $2 --target "$3" | grep -v -e ': ok (' -e ': known divergence .* confirmed'
}
BASE_CORPUS="traces/$BASELINE/*/*.jsonl"
NEW_CORPUS="traces/$NEWEST/*/*.jsonl"
timed "replay $BASELINE corpus (spec)" replay kvref "$BASE_CORPUS" spec
timed "replay $BASELINE corpus (impl)" replay kvref "$BASE_CORPUS" impl
KVREF_NATIVE=0 timed "replay $BASELINE corpus (impl pure Python)" replay kvref "$BASE_CORPUS" impl
timed "replay $NEWEST corpus (spec)" replay kvref "$NEW_CORPUS" spec
if python -c "from kvref.adapters.impl import IMPL_PROFILES as p; raise SystemExit(0 if '$NEWEST' in p else 1)"; then
    timed "replay $NEWEST corpus (impl)" replay kvref "$NEW_CORPUS" impl
    KVREF_NATIVE=0 timed "replay $NEWEST corpus (impl pure Python)" replay kvref "$NEW_CORPUS" impl
fi
# The corpora of the other releases (vllm-0.16.0, the fine-grained-hit ones of
# 0.26.0-0.29.0, ...): on the spec and on kvimpl, which reports a configuration
# it refuses as skipped. CI installs no vLLM of those releases, so their vLLM
# replay is run by hand (traces/README.md).
OTHER_CORPORA=""
for dir in traces/vllm-*/; do
    release="$(basename "$dir")"
    if [[ "$release" != "$BASELINE" && "$release" != "$NEWEST" ]]; then
        OTHER_CORPORA+=" $dir*/*.jsonl"
    fi
done
if [[ -n "$OTHER_CORPORA" ]]; then
    timed "replay other releases' corpora (spec)" replay kvref "$OTHER_CORPORA" spec
    timed "replay other releases' corpora (impl)" replay kvref "$OTHER_CORPORA" impl
fi
if vllm_in python; then
    timed "replay $BASELINE corpus (vllm)" replay kvref "$BASE_CORPUS" vllm
    # vLLM's own scheduler recorded again and compared with the stored scheduler traces:
    # catches a recorder that no longer records what is stored (or cannot record at all).
    timed "scheduler traces of vLLM $BASELINE re-recorded (--check)" python -m kvtools scheduler-traces --check
fi
if [[ -x "$NEWEST_VENV/bin/kvref" ]] && vllm_in "$NEWEST_VENV/bin/python"; then
    timed "replay $NEWEST corpus (vllm)" replay "$NEWEST_VENV/bin/kvref" "$NEW_CORPUS" vllm
    timed "scheduler traces of vLLM $NEWEST re-recorded (--check)" \
        "$NEWEST_VENV/bin/python" -m kvtools scheduler-traces --check
    # kvimpl's device tables against the newest release's own worker tables (pytest runs
    # tests/conformance/test_worker_tables.py against the baseline release), where its worker
    # still has the v1 InputBatch (up to vLLM 0.33.0; 0.34.0's model runner keeps another layout).
    if "$NEWEST_VENV/bin/python" -c "from kvtools.worker_tables import has_v1_worker as h; raise SystemExit(not h())"; then
        timed "device tables vs vLLM $NEWEST worker tables" "$NEWEST_VENV/bin/python" -m kvtools worker-tables
    else
        echo "==> device tables vs vLLM $NEWEST worker tables: skipped (no v1 worker InputBatch in $NEWEST)"
    fi
fi
# ---------------------------------------------------------------------------

# Reliability: a short soak on the spec (newest profile) and on kvimpl (no
# leaked block, flat memory), and the unit and reliability tests under python -O.
bash ci/soak.sh --target spec
bash ci/soak.sh --target impl --semantics "$BASELINE"
bash ci/test-O.sh

# CrossHair: the spec's contracts and harnesses hold; every mutant is killed.
bash ci/proofs.sh

echo "==> test: all checks passed in $((SECONDS - total_start))s"
