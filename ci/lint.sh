#!/usr/bin/env bash
# Lint with ruff (configuration: [tool.ruff] in pyproject.toml).
set -euo pipefail
# shellcheck source=ci/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

timed "ruff" ruff check . "$@"
