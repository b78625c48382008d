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
#   4. install the light, pure-Python dependencies that the import path of
#      the KV-cache manager and of vllm.v1.request needs (the per-version
#      `case` block below), while a constraint file pins torch to the
#      installed CPU build and every install is dry-run first and refused if
#      it would bring in torch, triton or any nvidia-*/cuda-* package;
#   5. install the packages that must come without their dependencies
#      (xgrammar: it depends on torch), and check their requirements by hand;
#   6. check: torch is a CPU build, no nvidia/cuda/triton package is
#      installed, and the ten modules kvref's adapter imports all import.
#
# Supported releases: 0.16.x and 0.25.x to 0.33.x (the semantics profiles of
# spec/kvspec/profiles.py, plus 0.16 for its adapter era).
#
# Environment knobs:
#   TORCH_SPEC       torch requirement (default torch==2.13.0)
#   VLLM_WHEEL_DIR   folder with one sub-folder per version holding the wheel
#                    (ignored when unset or absent)
#   VLLM_LOCK        optional `pip freeze` file of a known-good venv; its pins
#                    become constraints of the dependency step (torch and vllm
#                    lines are ignored), for a reproducible install
#   ALLOW_NONCPU_TORCH=1   skip the CPU-torch refusal (do not use)
#
# Exit status: 0 ok (or already installed), 1 refused/failed check,
# 2 usage/unknown version.
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
# Per-version dependency lists.
#
#   DEPS     installed with dependencies (pure Python or CPU-only wheels)
#   NODEPS   installed with --no-deps (they declare torch as a dependency)
#
# COMMON is what every release from 0.16 to 0.33 needs to import
# vllm.v1.core.*, vllm.v1.request and friends. Version pins follow each
# release's own Requires-Dist (wheel METADATA) for the packages we install.
# ---------------------------------------------------------------------------
COMMON=(
    numpy packaging regex psutil 'pyzmq>=25.0.0' urllib3 msgspec
    'pydantic>=2.12.0' cbor2 pybase64 cachetools cloudpickle py-cpuinfo
    'prometheus_client>=0.18.0' xxhash
)
# The 0.25.x .. 0.29.x baseline (what 0.25.1 needs).
BASE_025=(
    'transformers>=5.5.3' 'aiohttp>=3.13.3' 'requests>=2.26.0'
    'openai-harmony>=0.0.3' 'openai>=2.0.0' pillow uvloop
    'llguidance>=1.7.0,<1.8.0'
)
# From 0.30 on, vllm.v1.request -> vllm.v1.structured_output -> vllm.parser ->
# vllm.entrypoints.serve imports fastapi (and the parsers partial_json_parser).
SERVING=('fastapi[standard]>=0.133.0,<0.137.0' partial-json-parser)
DEPS=()
NODEPS=()

case "$VERSION" in
    0.16.*)
        # Older line (the known-good 0.16 recipe): transformers 4.x, plus gguf,
        # mistral_common and diskcache; llguidance 1.3, xgrammar 0.1; no uvloop
        # or requests.
        DEPS=("${COMMON[@]}"
            'transformers>=4.56.0,<5' 'aiohttp>=3.13.3' 'openai-harmony>=0.0.3'
            'openai>=1.99.1' pillow 'gguf>=0.17.0' 'mistral_common[image]>=1.9.0'
            'diskcache==5.6.3' 'llguidance>=1.3.0,<1.4.0' apache-tvm-ffi)
        NODEPS=('xgrammar==0.1.29')
        ;;
    0.25.*)
        # The recipe kvref used for 0.25.1 from the start.
        DEPS=("${COMMON[@]}" "${BASE_025[@]}" apache-tvm-ffi)
        NODEPS=('xgrammar>=0.2.1,<1.0.0')
        ;;
    0.26.*)
        # vLLM pins apache-tvm-ffi==0.1.10; xgrammar >= 0.2.8 needs >= 0.1.11
        # (TypeError: load_lib_module() got an unexpected keyword argument
        # 'extra_lib_paths' on import), so cap xgrammar at 0.2.7.
        DEPS=("${COMMON[@]}" "${BASE_025[@]}" 'apache-tvm-ffi==0.1.10')
        NODEPS=('xgrammar>=0.2.1,<0.2.8')
        ;;
    0.27.*)
        DEPS=("${COMMON[@]}" "${BASE_025[@]}" 'apache-tvm-ffi==0.1.11')
        NODEPS=('xgrammar>=0.2.1,<0.2.10')
        ;;
    0.28.*)
        DEPS=("${COMMON[@]}" "${BASE_025[@]}" 'apache-tvm-ffi==0.1.11'
            'huggingface_hub>=1.27.0')
        NODEPS=('xgrammar>=0.2.1,<0.2.10')
        ;;
    0.29.*)
        DEPS=("${COMMON[@]}" "${BASE_025[@]/transformers>=5.5.3/transformers>=5.10.4}"
            'apache-tvm-ffi==0.1.11' 'huggingface_hub>=1.28.0')
        NODEPS=('xgrammar>=0.2.1,<0.2.10')
        ;;
    0.30.*)
        DEPS=("${COMMON[@]}"
            'transformers>=5.10.4' 'aiohttp>=3.13.3' 'requests>=2.26.0'
            'openai-harmony>=0.0.3' 'openai>=2.25.0' pillow uvloop
            'llguidance>=1.7.0,<1.8.0' 'apache-tvm-ffi==0.1.11'
            'huggingface_hub>=1.31.0' "${SERVING[@]}")
        NODEPS=('xgrammar>=0.2.1,<0.2.10')
        ;;
    0.31.*)
        # openai-harmony -> oss-harmony; transformers capped; xgrammar pinned.
        DEPS=("${COMMON[@]}"
            'transformers>=5.10.4,<5.18' 'aiohttp>=3.13.3' 'requests>=2.26.0'
            'oss-harmony>=0.0.11' 'openai>=2.25.0' pillow uvloop
            'llguidance>=1.7.0,<1.8.0' 'apache-tvm-ffi==0.1.11'
            'huggingface_hub>=1.31.0' "${SERVING[@]}")
        NODEPS=('xgrammar==0.2.7')
        ;;
    0.32.*)
        DEPS=("${COMMON[@]}"
            'transformers>=5.16.1,<5.20' 'aiohttp>=3.14.3' 'requests>=2.33.0'
            'oss-harmony>=0.0.11' 'openai>=2.25.0' 'pillow>=12.3.0' uvloop
            'llguidance>=1.7.0,<1.8.0' 'apache-tvm-ffi==0.1.11'
            'huggingface_hub>=1.31.0' 'tokenizers>=0.23.2' "${SERVING[@]}")
        NODEPS=('xgrammar==0.2.8')
        ;;
    0.33.*)
        # orjson is new (>=3.11.6); serving code as since 0.30.
        DEPS=("${COMMON[@]}"
            'transformers>=5.16.1,<5.21' 'aiohttp>=3.14.4' 'requests>=2.33.0'
            'oss-harmony>=0.0.11' 'openai>=2.25.0' 'pillow>=13.0.0' uvloop
            'llguidance>=1.7.0,<1.8.0' 'apache-tvm-ffi==0.1.11'
            'huggingface_hub>=1.31.0' 'tokenizers>=0.23.2' 'orjson>=3.11.6'
            "${SERVING[@]}")
        NODEPS=('xgrammar==0.2.8')
        ;;
    *)
        echo "install-vllm: no recipe for vLLM $VERSION (known: 0.16.x, 0.25.x .. 0.33.x)" >&2
        exit 2
        ;;
esac

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

# Refuse any install set that contains torch (other than the CPU build already
# installed), triton, or an nvidia-*/cuda-* package. Usage: guarded NAME ARGS...
FORBIDDEN_RE='^(torch|triton|torchvision|torchaudio|nvidia-.*|cuda-.*|cupy.*)$'
guarded() {
    local label="$1"; shift
    local picks
    picks="$("${PIP[@]}" install --dry-run --quiet --report - "$@" | "$PY" -c '
import json, sys
r = json.load(sys.stdin)
print(" ".join(i["metadata"]["name"].lower() + "==" + i["metadata"]["version"] for i in r["install"]))
')"
    local bad=""
    for p in $picks; do
        if [[ "${p%%==*}" =~ $FORBIDDEN_RE ]]; then bad+=" $p"; fi
    done
    if [[ -n "$bad" ]]; then
        die "refusing '$label': the resolver would install:$bad"
    fi
    timed "$label" "${PIP[@]}" install "$@"
}

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
    wheel="$(ls "$VLLM_WHEEL_DIR/$VERSION"/vllm-"$VERSION"-*.whl 2>/dev/null | head -1 || true)"
fi
if [[ -n "$wheel" ]]; then
    VLLM_SRC=("$wheel")
    log "using local wheel $wheel"
fi
timed "vllm $VERSION (--no-deps)" "${PIP[@]}" install --no-deps "${VLLM_SRC[@]}"

# ---------------------------------------------------------------------------
# 4./5. The light dependencies.
# ---------------------------------------------------------------------------
guarded "vllm deps" "${DEPS[@]}"
if [[ ${#NODEPS[@]} -gt 0 ]]; then
    timed "no-deps extras (${NODEPS[*]})" "${PIP[@]}" install --no-deps "${NODEPS[@]}"
    # --no-deps skips the resolver: check by hand that what those packages
    # require (torch aside) is installed in a matching version.
    "$PY" - "${NODEPS[@]}" <<'PYEOF' || die "a --no-deps package's requirements are not met (see above)"
import sys
from importlib.metadata import PackageNotFoundError, requires, version

from packaging.requirements import Requirement

bad = []
for spec in sys.argv[1:]:
    name = Requirement(spec).name
    for line in requires(name) or []:
        req = Requirement(line)
        if req.name.lower() in {"torch", "triton"}:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = version(req.name)
        except PackageNotFoundError:
            have = None
        if have is None or not req.specifier.contains(have, prereleases=True):
            bad.append(f"{name} requires {req} but {req.name} is {have or 'not installed'}")
for b in bad:
    print("install-vllm: " + b, file=sys.stderr)
sys.exit(1 if bad else 0)
PYEOF
fi

# ---------------------------------------------------------------------------
# 6. Checks.
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
