#!/usr/bin/env bash
# The example and reliability tests under `python -O`:
# asserts vanish, so nothing may depend on `assert` in library code (kvspec
# checks its invariants with require(), which raises InvariantViolation
# regardless of -O).
set -euo pipefail
# shellcheck source=ci/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

timed "pytest -O" python -O -m pytest -q -x tests/spec tests/impl tests/conformance tests/reliability "$@"
