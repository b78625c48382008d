#!/usr/bin/env bash
# Install vLLM 0.25.1 on CPU into a virtual environment (default: .venv).
#
# A plain `pip install vllm` resolves a CUDA build of torch (gigabytes, and
# useless here), so this script installs the CPU torch first and then vLLM
# with --no-deps, followed by the pure-Python dependencies that the KV-cache
# manager import path needs. Usage: ci/install-vllm.sh [VENV_DIR]
set -euo pipefail

# shellcheck source=ci/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

VENV="${1:-$KVREF_ROOT/.venv}"
PY="$VENV/bin/python"
PIP=("$PY" -m pip)
TORCH_SPEC="${KVREF_TORCH_SPEC:-torch==2.13.0}"
VLLM_SPEC="${KVREF_VLLM_SPEC:-vllm==0.25.1}"

if [[ ! -x "$PY" ]]; then
    echo "install-vllm: no virtual environment at $VENV (run ci/setup.sh)" >&2
    exit 2
fi

if "$PY" -c "from vllm.v1.core.kv_cache_manager import KVCacheManager" >/dev/null 2>&1; then
    echo "install-vllm: vLLM already importable in $VENV, nothing to do"
    exit 0
fi

# 1. CPU torch, before anything else can resolve a CUDA one. Refuse to go on
#    if the resolver would pick a torch that is not a CPU build.
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    chosen="$("${PIP[@]}" install --dry-run --quiet --report - "$TORCH_SPEC" \
        | "$PY" -c 'import json,sys; r=json.load(sys.stdin); print(" ".join(i["metadata"]["name"]+"=="+i["metadata"]["version"] for i in r["install"]))')"
    echo "install-vllm: the resolver picks: $chosen"
    if [[ "$chosen" != *"torch=="*"+cpu"* && "${KVREF_ALLOW_NONCPU_TORCH:-0}" != 1 ]]; then
        echo "install-vllm: refusing to install a non-CPU torch ($chosen)." >&2
        echo "  Point pip at CPU wheels, e.g. PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu," >&2
        echo "  or set KVREF_ALLOW_NONCPU_TORCH=1 to override." >&2
        exit 1
    fi
    timed "torch" "${PIP[@]}" install "$TORCH_SPEC"
fi
"$PY" - <<'PYEOF'
import torch
if torch.version.cuda is not None:
    raise SystemExit(f"install-vllm: torch {torch.__version__} is a CUDA build; expected CPU")
print(f"install-vllm: torch {torch.__version__} (CPU)")
PYEOF

# 2. vLLM itself, without its (CUDA-pulling) dependency list.
timed "vllm" "${PIP[@]}" install --no-deps "$VLLM_SPEC"

# 3. The pure dependencies the import path needs.
timed "vllm deps" "${PIP[@]}" install \
    numpy packaging regex psutil 'pyzmq>=25.0.0' urllib3 msgspec 'pydantic>=2.12.0' cbor2 \
    'transformers>=5.5.3' 'aiohttp>=3.13.3' 'requests>=2.26.0' 'openai-harmony>=0.0.3' \
    'openai>=2.0.0' pillow pybase64 cachetools cloudpickle uvloop py-cpuinfo \
    'prometheus_client>=0.18.0' 'llguidance>=1.7.0,<1.8.0' apache-tvm-ffi xxhash
timed "xgrammar" "${PIP[@]}" install --no-deps 'xgrammar>=0.2.1,<1.0.0'

# 4. Check: still a CPU torch, and the KV-cache manager imports.
"$PY" - <<'PYEOF'
import torch
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: F401

assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build"
print(f"install-vllm: vLLM KVCacheManager imports (torch {torch.__version__})")
PYEOF
