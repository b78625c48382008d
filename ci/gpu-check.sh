#!/usr/bin/env bash
# The device-table checks and benchmark on a CUDA machine (never part of CI, which has no GPU).
# Run from the repository root on a machine whose python3 has a CUDA build of torch and Triton:
#
#   bash ci/gpu-check.sh
#
# It needs kvref's light dependencies (cbor2, xxhash, hypothesis, rich, pytest) importable by
# python3; where the machine cannot fetch them, carry wheels and put them on PYTHONPATH first.
# Steps: build kvimpl's native core for this interpreter; the device-table tests on CUDA (the
# exercises of both builds with the device copy kept apart, the Triton slot kernel against the
# vectorized path); python -m kvtools check-cuda; the steady-decode device benchmark at 256
# running requests (full, full+swa). Every step prints its own verdict; the script stops at the
# first failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="spec:impl:kit:tools${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

"$PY" -c 'import torch, triton; assert torch.cuda.is_available(), "no CUDA device"; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
"$PY" hatch_build.py
"$PY" -c 'from kvimpl.native import build_description as d; print("kvimpl:", d())'
"$PY" -m pytest -q -p no:cacheprovider -p no:kvref tests/impl/test_device_kernels.py tests/impl/test_block_table.py
"$PY" -m kvtools check-cuda
for mix in full full+swa; do
    "$PY" -m kvref bench --steady-decode 256 --device cuda --mix "$mix" --repeats 3 --steps 128
done
