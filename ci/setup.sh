#!/usr/bin/env bash
# Create .venv (if missing) and install kvref editable with the dev extra.
# Usage: ci/setup.sh [--with-vllm] [--with-vllm-newest]
#   --with-vllm         also install the CPU torch and vLLM 0.25.1 into .venv
#   --with-vllm-newest  also create .venv-vllm-newest with kvref and the newest
#                       supported vLLM (spec/kvspec/profiles.py: NEWEST)
# Idempotent: re-running skips what is already in place.
set -euo pipefail

# shellcheck source=ci/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

WITH_VLLM=0
WITH_NEWEST=0
for arg in "$@"; do
    case "$arg" in
        --with-vllm) WITH_VLLM=1 ;;
        --with-vllm-newest) WITH_NEWEST=1 ;;
        -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
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
    timed "vllm $(vllm_release baseline)" bash "$KVREF_ROOT/ci/install-vllm.sh" "$(vllm_release baseline)" "$VENV"
fi

# The editable install is redone only when pyproject.toml changed (or was
# never done); the stamp lives inside .venv so deleting .venv resets it.
install_kvref() {  # install_kvref VENV EXTRA
    local venv="$1" extra="$2" stamp want
    stamp="$venv/.kvref-install-stamp"
    want="$("$venv/bin/python" -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' pyproject.toml)$extra"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] \
        && "$venv/bin/python" -c "import kvspec, kvimpl, kvref" >/dev/null 2>&1; then
        echo "==> kvref: editable install in $venv up to date, skipped"
    else
        timed "kvref ($venv)" "$venv/bin/python" -m pip install -e ".$extra"
        echo "$want" >"$stamp"
    fi
}
install_kvref "$VENV" "[dev,fuzz]"
# redis-server, for the campaign test (tests/kit/test_campaign.py: workers sharing
# a Redis example database); it skips without it, so a failed install only says so.
if ! command -v redis-server >/dev/null 2>&1; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        apt_redis=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server)
        # the package lists may be missing on a fresh image: update them only when the install fails
        timed "redis-server" "${apt_redis[@]}" \
            || { timed "apt-get update" apt-get update -q && timed "redis-server" "${apt_redis[@]}"; } \
            || echo "==> redis-server: apt-get install failed; tests/kit/test_campaign.py will skip"
    else
        echo "==> redis-server: not installed and apt-get is not usable as root; tests/kit/test_campaign.py will skip"
    fi
fi
# upstream nano-vllm's block manager, for the example adapter the safety tests drive
# (tests/kit/examples/nanovllm_adapter.py); --no-deps: only its two engine modules are loaded
timed "nano-vllm-npu" "$VENV/bin/python" -m pip install --quiet --no-deps nano-vllm-npu==0.0.2
# kvimpl's native core: the editable install compiled it in place; rebuild it
# when a C source changed since (a failed build prints a notice, not an error).
timed "kvimpl native core" "$VENV/bin/python" hatch_build.py

if [[ "$WITH_NEWEST" == 1 ]]; then
    NEWEST_VENV="$KVREF_ROOT/.venv-vllm-newest"
    timed "vllm $(vllm_release newest)" bash "$KVREF_ROOT/ci/install-vllm.sh" "$(vllm_release newest)" "$NEWEST_VENV"
    # the fuzz extra: the campaign test runs a HypoFuzz worker in this venv too
    install_kvref "$NEWEST_VENV" "[fuzz]"
fi

echo "==> setup: finished in $((SECONDS - total_start))s"
