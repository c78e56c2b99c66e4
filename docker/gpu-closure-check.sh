#!/usr/bin/env bash
# CI's part of the GPU image (runs on a machine without GPU or registry): download the closure in
# requirements/gpu.lock for the image's platform (CPython 3.12, manylinux x86_64) with pip
# --require-hashes (pip refuses any file whose sha256 is not in the lock), then check that the CUDA
# libraries of the torch, sglang-kernel and flashinfer wheels carry sm_120 code (docker/cuda_archs.py).
#   docker/gpu-closure-check.sh [--download-only] [PIP] [DIR]
#       PIP: the pip command (default "python3 -m pip"); DIR: default .cache/gpu-wheels (several GB).
#       --download-only: stop after the download (make test's set-up; the check re-verifies each file's
#       hash against the lock and skips the download).
set -euo pipefail
cd "$(dirname "$0")/.."
download_only=0
[ "${1:-}" != --download-only ] || { download_only=1; shift; }
read -r -a PIP <<< "${1:-python3 -m pip}"
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
# A download of this very lock that completed (the marker holds the lock's sha256) is re-checked here
# file by file against the lock's hashes; pip would spend minutes re-reading the index to skip it.
lock_sha=$(sha256sum requirements/gpu.lock | cut -d' ' -f1)
if [ "$(cat "$DIR/.downloaded" 2>/dev/null)" = "$lock_sha" ]; then
  python3 - "$DIR" <<'PY'
import hashlib, pathlib, re, sys
lock = pathlib.Path("requirements/gpu.lock").read_text()
allowed, packages = set(re.findall(r"--hash=sha256:([0-9a-f]{64})", lock)), len(re.findall(r"^\S+==", lock, re.M))
files = sorted(p for p in pathlib.Path(sys.argv[1]).iterdir() if p.suffix == ".whl")
bad = [p.name for p in files if hashlib.file_digest(p.open("rb"), "sha256").hexdigest() not in allowed]
sys.exit(f"not in requirements/gpu.lock: {bad}" if bad else None if len(files) == packages
         else f"{len(files)} wheels for the lock's {packages} packages")
PY
else
  PIP_CONFIG_FILE=/dev/null "${PIP[@]}" --isolated download -q --no-cache-dir --disable-pip-version-check "${cert[@]}" \
    --require-hashes --no-deps --only-binary=:all: --implementation cp --python-version 3.12 "${platforms[@]}" \
    -d "$DIR" -r requirements/gpu.lock
  echo "$lock_sha" > "$DIR/.downloaded"
fi
t1=$(date +%s)
echo "closure: $(ls "$DIR" | wc -l) files, $(du -sh "$DIR" | cut -f1), downloaded and hash-checked in $((t1 - t0)) s"
[ "$download_only" = 0 ] || exit 0
python3 docker/cuda_archs.py check-wheels "$DIR"
echo "SM120 scan: $(( $(date +%s) - t1 )) s"
