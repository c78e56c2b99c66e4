# eaglebox: the patched SGLang that captures, trains and serves -- one image, GPU or CPU.
#
#   GPU (default; `make image`): an NVIDIA CUDA 13 runtime base pinned by digest (docker/base-image.lock,
#   written by docker/pin-base.sh where a registry is reachable) and SGLang 0.5.23, sglang-kernel,
#   flashinfer and torch 2.14.1 (cu130) from PyPI, every file hash-locked (requirements/gpu.lock,
#   written by docker/lock-gpu.sh):
#     DOCKER_BUILDKIT=1 docker build --build-arg BASE_IMAGE=$(cat docker/base-image.lock) -t eaglebox:gpu .
#   CPU (tests, and trying the loop without a GPU; wheels from `make wheels` in .cache/wheels):
#     DOCKER_BUILDKIT=1 docker build --build-arg VARIANT=cpu --build-arg CPU_BASE_IMAGE=local/debian:bookworm \
#       -t eaglebox:cpu .
# BuildKit builds only the variant asked for. No token or secret is baked in: pass HF_TOKEN at run time.
ARG BASE_IMAGE=nvidia/cuda:13.0.2-runtime-ubuntu24.04
ARG CPU_BASE_IMAGE=debian:bookworm-slim
ARG VARIANT=gpu

# --- GPU runtime: Python 3.12 (Ubuntu 24.04) and the hash-locked closure; then the build checks what
# the image promises: SGLang 0.5.23, torch built for sm_120, SM120 code in torch / sgl_kernel /
# flashinfer (read from the shared objects' fatbins, no GPU needed), flex attention importable, and
# Mooncake's store (train.online.transport: mooncake, online training across hosts), which loads
# libibverbs.so.1 at import. The CPU image has no Mooncake: its tests run the store from the venv.
FROM ${BASE_IMAGE} AS runtime-gpu
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev g++ libibverbs1 \
 && rm -rf /var/lib/apt/lists/* && python3 -m venv --help >/dev/null
COPY requirements/gpu.lock /tmp/gpu.lock
COPY docker/cuda_archs.py /opt/eaglebox/cuda_archs.py
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --require-hashes --no-deps -r /tmp/gpu.lock \
 && /opt/venv/bin/pip check \
 && rm /tmp/gpu.lock
ENV PATH=/opt/venv/bin:$PATH EAGLEBOX_VARIANT=gpu
RUN python3 -c "import sglang, torch, sys; \
v = sglang.__version__; a = torch.cuda.get_arch_list(); print('sglang', v, 'torch', torch.__version__, torch.version.cuda, a); \
sys.exit(0 if v == '0.5.23' and 'sm_120' in a else 'the image must carry SGLang 0.5.23 and torch built for sm_120')" \
 && python3 /opt/eaglebox/cuda_archs.py check-installed \
 && python3 -c "from torch.nn.attention.flex_attention import flex_attention, create_block_mask; print('flex attention imports')" \
 && python3 -c "from mooncake.store import MooncakeDistributedStore; print('Mooncake store imports')"

# --- CPU runtime: SGLang's run-time list without CUDA-only packages, from local wheels (no network),
# and the sgl_kernel stand-in.
FROM ${CPU_BASE_IMAGE} AS runtime-cpu
# g++ and Python.h: torch inductor, for SGLang's compiled CPU code where a user turns torch.compile back on
# (TORCHDYNAMO_DISABLE=0; the image sets 1 below).
# hadolint ignore=DL3008
RUN if ! python3 -m venv --help >/dev/null 2>&1 || ! command -v g++ >/dev/null || [ ! -e "/usr/include/python3.11/Python.h" ]; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev g++ \
      && rm -rf /var/lib/apt/lists/* && python3 -m venv --help >/dev/null && command -v g++ >/dev/null; \
    fi
# Then eaglebox's declared run-time requirements (from pyproject.toml, minus sglang/torch) and its
# `dev` extra (the tiny target), against the frozen list of what is installed: nothing is replaced.
COPY requirements/ /tmp/requirements/
COPY pyproject.toml docker/eaglebox-requirements.py /tmp/eaglebox/
RUN --mount=type=bind,source=.cache/wheels,target=/wheels \
    python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheels \
      -r /tmp/requirements/sglang-0.5.23-runtime.txt -r /tmp/requirements/image.txt \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheels --no-deps sglang==0.5.23 \
 && /opt/venv/bin/pip freeze > /tmp/constraints.txt \
 && python3 /tmp/eaglebox/eaglebox-requirements.py --extra dev --without sglang --without torch \
      /tmp/eaglebox/pyproject.toml > /tmp/eaglebox/requirements.txt \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheels \
      --constraint /tmp/constraints.txt -r /tmp/eaglebox/requirements.txt \
 && rm -rf /tmp/requirements /tmp/eaglebox /tmp/constraints.txt
# torch.compile runs eager: SGLang compiles sampling code, not the forward (apply_scaling_penalties: ~25 s a container).
ENV PATH=/opt/venv/bin:$PATH EAGLEBOX_VARIANT=cpu TORCHDYNAMO_DISABLE=1

# --- eaglebox on top of either, with its declared run-time requirements, offline, against the frozen
# list of what the runtime stage installed (pip --constraint): torch and SGLang are never replaced, and
# a requirement the runtime stage did not provide fails here. GPU: requirements/gpu.lock holds the
# whole closure, so the package installs with its dependencies. CPU: SGLang is installed --no-deps
# (CPU stand-ins replace its CUDA-only packages), so the runtime stage installed eaglebox's declared
# list itself and the package goes on with --no-deps.
# hadolint ignore=DL3006
FROM runtime-${VARIANT} AS final
COPY pyproject.toml README.md /src/eaglebox/
COPY src/ /src/eaglebox/src/
# hadolint ignore=SC2046
RUN python3 -m pip freeze > /tmp/constraints.txt \
 && python3 -m pip install --no-cache-dir --no-index --no-build-isolation --constraint /tmp/constraints.txt \
      $([ "${EAGLEBOX_VARIANT}" = cpu ] && echo --no-deps) /src/eaglebox \
 && rm -rf /src/eaglebox /tmp/constraints.txt \
 && python3 -m eaglebox.engine.install --variant "${EAGLEBOX_VARIANT}" \
 && python3 -c "import importlib.metadata as m; from eaglebox.capture.hook import check_sglang_version; \
check_sglang_version(m.version('sglang')); import eaglebox.capture.hook, eaglebox.capture.sink; \
print('capture hook accepts SGLang', m.version('sglang'))"
COPY entrypoints/eaglebox.sh /usr/local/bin/eaglebox-entrypoint
RUN useradd --create-home --uid 1000 eaglebox && mkdir -p /data && chown eaglebox /data
USER 1000
WORKDIR /home/eaglebox
VOLUME ["/data"]
ENTRYPOINT ["/usr/local/bin/eaglebox-entrypoint"]
