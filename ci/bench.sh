#!/usr/bin/env bash
# Benchmark smoke check: one short `kvref bench` run (one
# mix, a small workload, one repeat) that fails if any engine allocates
# different block ids than the others. Not called from CI by default; the
# timings it prints are informational only.
# Usage: ci/bench.sh [extra kvref bench flags, e.g. --mix full+swa]
set -euo pipefail
# shellcheck source=ci/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

timed "bench" kvref bench --mix full --requests 60 --max-running 16 --blocks 1024 \
    --prompt-len 64:256 --decode-len 8:24 --repeats 1 "$@"
