# Sourced by the ci/*.sh scripts: cd to the repository root and prefer the
# tools of the project's virtual environment (.venv/bin) when it exists.
# shellcheck shell=bash

KVREF_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$KVREF_ROOT"

if [[ -d "$KVREF_ROOT/.venv/bin" ]]; then
    export VIRTUAL_ENV="$KVREF_ROOT/.venv"
    export PATH="$KVREF_ROOT/.venv/bin:$PATH"
fi

# Run a command, then print how long it took.
timed() {
    local label="$1"
    shift
    local start=$SECONDS
    echo "==> $label: $*"
    "$@"
    echo "==> $label: done in $((SECONDS - start))s"
}
