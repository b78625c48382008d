#!/usr/bin/env bash
# Type-check with mypy --strict (configuration: [tool.mypy] in pyproject.toml,
# which names the packages kvspec, kvimpl, kvref and the tests/ directory).
set -euo pipefail
# shellcheck source=ci/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

timed "mypy" mypy "$@"
