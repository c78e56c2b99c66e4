#!/usr/bin/env bash
# Write requirements/gpu.lock: the GPU image's whole Python closure (SGLang 0.5.23 with sglang-kernel,
# flashinfer, torch 2.14.1 built for CUDA 13.0, and eaglebox's declared run-time requirements),
# every package pinned with its sha256 from PyPI, for CPython 3.12 on manylinux x86_64 (the Ubuntu
# 24.04 CUDA runtime base). Resolution only, nothing is downloaded; `make gpu-closure-check` then
# downloads the closure with pip --require-hashes and checks SM120 code in its CUDA libraries.
#   docker/lock-gpu.sh [UV]      (UV: the uv binary; `make venv` installs it, UV_VERSION in the Makefile)
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${1:-uv}
in=$(mktemp)
trap 'rm -f "$in"' EXIT
{
  echo "sglang==0.5.23"
  echo "torch==2.14.1"
  # mooncake: train.online.transport mooncake (online training across hosts); its CPU build moves host bytes
  python3 docker/eaglebox-requirements.py --extra mooncake --without sglang --without torch
  echo "setuptools"        # eaglebox installs with --no-build-isolation
} > "$in"
# the current lock's pins are uv's preferences (it keeps them where they still resolve): adding a package does
# not move the rest of the closure
grep -v '^#' requirements/gpu.lock > requirements/gpu.lock.tmp
"$UV" pip compile "$in" --quiet --generate-hashes --no-header --emit-index-url --index-url https://pypi.org/simple \
  --python-version 3.12 --python-platform x86_64-manylinux_2_39 --no-annotate --index-strategy first-index \
  -o requirements/gpu.lock.tmp
{
  echo "# The GPU image's Python closure, hash-locked: written by docker/lock-gpu.sh (make gpu-lock); do not edit."
  echo "# CPython 3.12, manylinux_2_39 x86_64 (nvidia/cuda runtime, Ubuntu 24.04). Installed with pip --require-hashes."
  cat requirements/gpu.lock.tmp
} > requirements/gpu.lock
rm -f requirements/gpu.lock.tmp
echo "requirements/gpu.lock: $(grep -c '^[a-zA-Z]' requirements/gpu.lock) packages"
