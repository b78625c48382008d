#!/usr/bin/env bash
# Install a vLLM release on CPU into a virtual environment, for kvref.
#
#   install-vllm.sh VERSION [VENV_DIR]   (VENV_DIR default: the active $VIRTUAL_ENV)
#
# It ships inside the kvref package; run it as `kvref install-vllm VERSION`
# (into the environment kvref runs in) or, in a checkout, as
# `ci/install-vllm.sh VERSION [VENV_DIR]` (default: the checkout's .venv).
#
# kvref only drives vLLM's KV-cache bookkeeping (vllm/v1/core/), so a full
# `pip install vllm` is neither needed nor wanted: it would resolve a CUDA
# torch plus gigabytes of GPU kernels. Instead:
#
#   1. create VENV_DIR (python3 -m venv) if it does not exist;
#   2. install the CPU torch (TORCH_SPEC, default torch==2.13.0) -- refused
#      unless the resolver picks a "+cpu" build; vLLM's own torch pin is
#      ignored on purpose (the bookkeeping does not care);
#   3. install vLLM itself with --no-deps (from VLLM_WHEEL_DIR/VERSION when a
#      wheel is there, else from the index);
#   4. install the light dependencies, read from the release's own metadata
#      (its Requires-Dist) by vllm_deps.py next to this script: the torch
#      family, Triton, CUDA/NVIDIA packages, GPU kernel libraries and Ray are
#      left out, xgrammar (it declares Triton) comes without its
#      dependencies at the newest version whose own requirements the
#      environment meets, every install is dry-run first with torch pinned
#      to the installed CPU build, and a requirement that would still bring
#      in torch, Triton or a CUDA package is left out with a notice;
#   5. check: torch is a CPU build, no nvidia/cuda/triton package is
#      installed, and the modules kvref's adapter imports all import.
#
# Any release the index has is installed this way, including one newer than
# kvref's newest semantics profile (kvref then checks it under that profile
# and says so).
#
# Environment knobs:
#   TORCH_SPEC       torch requirement (default torch==2.13.0)
#   VLLM_WHEEL_DIR   folder holding the wheel, directly or in a sub-folder
#                    named after the version (ignored when unset or absent)
#   VLLM_LOCK        optional `pip freeze` file of a known-good venv; its pins
#                    become constraints of the dependency step (torch and vllm
#                    lines are ignored), for a reproducible install
#   ALLOW_NONCPU_TORCH=1   skip the CPU-torch refusal (do not use)
#
# Exit status: 0 ok (or already installed), 1 refused/failed check, 2 usage.
set -euo pipefail

usage() {
    echo "usage: $0 VERSION [VENV_DIR]   (e.g. $0 0.33.0 .venv-vllm-0.33.0)" >&2
    exit 2
}
[[ $# -ge 1 && $# -le 2 ]] || usage
VERSION="$1"
VENV="${2:-${VIRTUAL_ENV:-}}"
[[ -n "$VENV" ]] || { echo "install-vllm: no VENV_DIR given and no virtual environment active" >&2; usage; }
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
VLLM_WHEEL_DIR="${VLLM_WHEEL_DIR:-}"
PYTHON="${PYTHON:-python3}"
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

log() { echo "install-vllm[$VERSION]: $*"; }
die() { echo "install-vllm[$VERSION]: ERROR: $*" >&2; exit 1; }
timed() {
    local label="$1"; shift
    local start=$SECONDS
    log "==> $label"
    "$@"
    log "==> $label: done in $((SECONDS - start))s"
}

# ---------------------------------------------------------------------------
# 1. The virtual environment.
# ---------------------------------------------------------------------------
TOTAL_START=$SECONDS
if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" - "$VERSION" >/dev/null 2>&1 <<'PYEOF'
import sys
from importlib.metadata import version

from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: F401

sys.exit(version("vllm") != sys.argv[1])
PYEOF
then
    log "vLLM $VERSION already importable in $VENV, nothing to do"
    exit 0
fi
if [[ ! -x "$VENV/bin/python" ]]; then
    timed "venv $VENV" "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --no-input)
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), sys.version' \
    || die "the venv's Python must be >= 3.11 (vLLM 0.32+ require it)"

# ---------------------------------------------------------------------------
# 2. CPU torch, before anything else can resolve a CUDA one.
# ---------------------------------------------------------------------------
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    chosen="$("${PIP[@]}" install --dry-run --quiet --report - "$TORCH_SPEC" | "$PY" -c '
import json, sys
r = json.load(sys.stdin)
print(" ".join(i["metadata"]["name"] + "==" + i["metadata"]["version"] for i in r["install"]))
')"
    log "the resolver picks for $TORCH_SPEC: $chosen"
    if [[ "$chosen" != *"torch=="*"+cpu"* && "${ALLOW_NONCPU_TORCH:-0}" != 1 ]]; then
        die "refusing to install a non-CPU torch ($chosen); point pip at CPU wheels (e.g. --find-links with a +cpu wheel or PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu)"
    fi
    if [[ "$chosen" == *nvidia-* || "$chosen" == *triton* ]]; then
        die "refusing: torch would bring CUDA packages ($chosen)"
    fi
    timed "torch ($TORCH_SPEC)" "${PIP[@]}" install "$TORCH_SPEC"
fi
TORCH_VERSION="$("$PY" -c 'import torch; print(torch.__version__)')"
"$PY" -c 'import torch, sys; sys.exit(torch.version.cuda is not None)' \
    || die "torch $TORCH_VERSION is a CUDA build; expected CPU"
log "torch $TORCH_VERSION (CPU)"

# From here on torch may not move: pin it in an extra constraint file.
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==$TORCH_VERSION" >"$CONSTRAINTS"
if [[ -n "${VLLM_LOCK:-}" ]]; then
    [[ -f "$VLLM_LOCK" ]] || die "VLLM_LOCK=$VLLM_LOCK: no such file"
    grep -v -i -E '^(torch|vllm|pip|setuptools|wheel)(==| @)' "$VLLM_LOCK" >>"$CONSTRAINTS"
    log "constraints from lock file $VLLM_LOCK"
fi
export PIP_CONSTRAINT="$CONSTRAINTS${PIP_CONSTRAINT:+ $PIP_CONSTRAINT}"
# pip's own config may already set a constraint (global.constraint); an env
# PIP_CONSTRAINT replaces it, which is what we want here (torch is pinned).

# ---------------------------------------------------------------------------
# 3. vLLM itself, without its (CUDA-pulling) dependency list.
# ---------------------------------------------------------------------------
VLLM_SRC=("vllm==$VERSION")
wheel=""
if [[ -n "$VLLM_WHEEL_DIR" ]]; then
    wheel="$(ls "$VLLM_WHEEL_DIR/$VERSION"/vllm-"$VERSION"-*.whl "$VLLM_WHEEL_DIR"/vllm-"$VERSION"-*.whl \
        2>/dev/null | head -1 || true)"
fi
if [[ -n "$wheel" ]]; then
    VLLM_SRC=("$wheel")
    log "using local wheel $wheel"
fi
timed "vllm $VERSION (--no-deps)" "${PIP[@]}" install --no-deps "${VLLM_SRC[@]}"

# ---------------------------------------------------------------------------
# 4. The light dependencies, from the release's own metadata.
# ---------------------------------------------------------------------------
timed "vllm deps (from its metadata)" "$PY" "$SCRIPT_DIR/vllm_deps.py"

# ---------------------------------------------------------------------------
# 5. Checks.
# ---------------------------------------------------------------------------
if "${PIP[@]}" list --format=freeze 2>/dev/null | grep -i -E '^(nvidia-|cuda-|triton=)'; then
    die "CUDA packages ended up in $VENV (listed above)"
fi
IMPORT_START=$SECONDS
VLLM_LOGGING_LEVEL=ERROR "$PY" - "$VERSION" <<'PYEOF'
import importlib, sys, time

import torch

want = sys.argv[1]
assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build"
mods = [
    "vllm.v1.kv_cache_interface",
    "vllm.v1.core.kv_cache_manager",
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.core.single_type_kv_cache_manager",
    "vllm.utils.hashing",
    "vllm.v1.request",
    "vllm.sampling_params",
    "vllm.lora.request",
    "vllm.multimodal.inputs",
    "vllm.distributed.kv_events",
]
import vllm

if vllm.__version__ != want:
    sys.exit(f"install-vllm: vllm.__version__ is {vllm.__version__}, expected {want}")
failed = []
for m in mods:
    t = time.monotonic()
    try:
        importlib.import_module(m)
    except Exception as exc:  # report every module, not only the first
        failed.append(f"{m}: {exc!r}")
        continue
    print(f"  ok {m} ({time.monotonic() - t:.1f}s)")
if failed:
    sys.exit("install-vllm: import check failed:\n  " + "\n  ".join(failed))
print(f"install-vllm: vLLM {vllm.__version__} KV core imports (torch {torch.__version__}, CPU)")
PYEOF
log "import check: $((SECONDS - IMPORT_START))s"
log "total: $((SECONDS - TOTAL_START))s, size: $(du -sh "$VENV" | cut -f1)"
