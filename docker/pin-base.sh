#!/usr/bin/env bash
# Record the digest of the GPU image's base, an NVIDIA CUDA 13 runtime image, in docker/base-image.lock.
# Run it on a machine that reaches the registry and review the diff; `make image` refuses a lock that
# holds no digest. (The Python side -- SGLang, sglang-kernel, flashinfer, torch cu130 -- is pinned by
# hash in requirements/gpu.lock; the build checks SGLang 0.5.23 and sm_120 code.)
set -euo pipefail
tag=${1:-nvidia/cuda:13.0.2-runtime-ubuntu24.04}
docker pull "$tag" >/dev/null
digest=$(docker inspect --format '{{index .RepoDigests 0}}' "$tag")
echo "${tag}@${digest#*@}" > "$(dirname "$0")/base-image.lock"
cat "$(dirname "$0")/base-image.lock"
