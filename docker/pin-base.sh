#!/usr/bin/env bash
# Record the digest of the SGLang CUDA-13 base image in docker/base-image.lock. Run it on a machine
# that reaches Docker Hub; review the diff (the image must carry SGLang 0.5.23 and torch built for
# sm_120 -- the GPU build checks both and fails otherwise).
set -euo pipefail
tag=${1:-lmsysorg/sglang:v0.5.23-cu130}
docker pull "$tag" >/dev/null
digest=$(docker inspect --format '{{index .RepoDigests 0}}' "$tag")
echo "${tag}@${digest#*@}" > "$(dirname "$0")/base-image.lock"
cat "$(dirname "$0")/base-image.lock"
