#!/usr/bin/env bash
# CI's part of the GPU image (runs on a machine without GPU or registry): download the closure in
# requirements/gpu.lock for the image's platform (CPython 3.12, manylinux x86_64) with pip
# --require-hashes (pip refuses any file whose sha256 is not in the lock), then check that the CUDA
# libraries of the torch, sglang-kernel and flashinfer wheels carry sm_120 code (docker/cuda_archs.py).
#   docker/gpu-closure-check.sh [PIP] [DIR]     (default .venv/bin/pip, .cache/gpu-wheels; several GB)
set -euo pipefail
cd "$(dirname "$0")/.."
PIP=${1:-.venv/bin/pip}
DIR=${2:-.cache/gpu-wheels}
grep -q -- '--hash=sha256:' requirements/gpu.lock || { echo "requirements/gpu.lock holds no hashes: run make gpu-lock" >&2; exit 1; }
platforms=(--platform manylinux2014_x86_64)
for m in $(seq 17 39); do platforms+=(--platform "manylinux_2_${m}_x86_64"); done
mkdir -p "$DIR"
t0=$(date +%s)
# The host's pip configuration (find-links, constraints, extra indexes) plays no part: no config file,
# no PIP_* variables.
cert=()
[ -z "${PIP_CERT:-}" ] || cert=(--cert "$PIP_CERT")
unset $(env | sed -n 's/^\(PIP_[A-Z_]*\)=.*/\1/p')
PIP_CONFIG_FILE=/dev/null "$PIP" --isolated download -q --no-cache-dir --disable-pip-version-check "${cert[@]}" \
  --require-hashes --no-deps --only-binary=:all: --implementation cp --python-version 3.12 "${platforms[@]}" \
  -d "$DIR" -r requirements/gpu.lock
t1=$(date +%s)
echo "closure: $(ls "$DIR" | wc -l) files, $(du -sh "$DIR" | cut -f1), downloaded and hash-checked in $((t1 - t0)) s"
python3 docker/cuda_archs.py check-wheels "$DIR"
echo "SM120 scan: $(( $(date +%s) - t1 )) s"
