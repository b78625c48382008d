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

# The vLLM release of a semantics profile, read from the one place that lists
# them (spec/kvspec/profiles.py), without importing kvspec:
#   vllm_release baseline   -> 0.25.1 (the release kvspec started from)
#   vllm_release newest     -> the newest supported release
vllm_release() {
    "${PYTHON:-python3}" - "$1" "$KVREF_ROOT/spec/kvspec/profiles.py" <<'PYEOF'
import importlib.util
import sys

spec = importlib.util.spec_from_file_location("profiles", sys.argv[2])
profiles = importlib.util.module_from_spec(spec)
sys.modules["profiles"] = profiles
spec.loader.exec_module(profiles)
print({"baseline": profiles.VLLM_0_25_1, "newest": profiles.NEWEST}[sys.argv[1]].release)
PYEOF
}
