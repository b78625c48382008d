#!/usr/bin/env bash
# Install a vLLM release's KV-cache core on CPU:  ci/install-vllm.sh VERSION [VENV_DIR]
# (VENV_DIR default: this checkout's .venv). The installer itself ships in the
# package (kit/kvref/scripts/install-vllm.sh, also run by `kvref install-vllm`);
# its header documents every step and knob.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ $# -ge 1 && $# -le 2 ]] || { echo "usage: $0 VERSION [VENV_DIR]" >&2; exit 2; }
exec bash "$root/kit/kvref/scripts/install-vllm.sh" "$1" "${2:-$root/.venv}"
