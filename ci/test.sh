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
# TODO(lead): conformance checks go here: lockstep runs of the spec against
# real vLLM and replay of the stored traces in traces/, e.g.
#   timed "lockstep" kvref check ...
#   timed "replay" kvref replay ...
# ---------------------------------------------------------------------------

echo "==> test: all checks passed in $((SECONDS - total_start))s"
