#!/usr/bin/env bash
# Create .venv (if missing) and install kvref editable with the dev extra.
# Usage: ci/setup.sh [--with-vllm]
#   --with-vllm  also install the CPU torch and vLLM 0.25.1 (ci/install-vllm.sh)
# Idempotent: re-running skips what is already in place.
set -euo pipefail

# shellcheck source=ci/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

WITH_VLLM=0
for arg in "$@"; do
    case "$arg" in
        --with-vllm) WITH_VLLM=1 ;;
        -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
        *) echo "setup: unknown argument: $arg" >&2; exit 2 ;;
    esac
done

PYTHON="${PYTHON:-python3}"
VENV="$KVREF_ROOT/.venv"
total_start=$SECONDS

if [[ ! -x "$VENV/bin/python" ]]; then
    timed "venv" "$PYTHON" -m venv "$VENV"
else
    echo "==> venv: $VENV exists"
fi
# common.sh only put .venv/bin on PATH if it existed when sourced.
export VIRTUAL_ENV="$VENV"
export PATH="$VENV/bin:$PATH"
"$VENV/bin/python" -c 'import sys; assert sys.version_info >= (3, 11), sys.version' \
    || { echo "setup: kvref needs Python >= 3.11 (set PYTHON=...)" >&2; exit 1; }

if [[ "$WITH_VLLM" == 1 ]]; then
    if "$VENV/bin/python" -c "from vllm.v1.core.kv_cache_manager import KVCacheManager" \
        >/dev/null 2>&1; then
        echo "==> vllm: already importable, skipped"
    else
        timed "vllm (total)" bash "$KVREF_ROOT/ci/install-vllm.sh" "$VENV"
    fi
fi

# The editable install is redone only when pyproject.toml changed (or was
# never done); the stamp lives inside .venv so deleting .venv resets it.
stamp="$VENV/.kvref-install-stamp"
want="$("$VENV/bin/python" -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' pyproject.toml)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] \
    && "$VENV/bin/python" -c "import kvspec, kvimpl, kvref" >/dev/null 2>&1; then
    echo "==> kvref: editable install up to date, skipped"
else
    timed "kvref" "$VENV/bin/python" -m pip install -e '.[dev]'
    echo "$want" >"$stamp"
fi

echo "==> setup: finished in $((SECONDS - total_start))s"
