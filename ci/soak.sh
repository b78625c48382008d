#!/usr/bin/env bash
# Soak: a short scripted run (300,000 facade operations by
# default) on one target; fails on a leak, a caller error or RSS growth.
# Usage: ci/soak.sh [--target spec|impl|vllm|module:factory] [--ops N] [--seed S]
# The full-length run is `kvref soak --ops 1000000 --target spec`.
set -euo pipefail
# shellcheck source=ci/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

timed "soak" kvref soak --ops 300000 --check-every 30000 "$@"
