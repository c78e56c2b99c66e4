# eaglebox: the patched SGLang that captures, trains and serves -- one image, GPU or CPU.
#
#   GPU (default, SM120-capable CUDA 13 SGLang image; the digest is pinned in docker/base-image.lock):
#     DOCKER_BUILDKIT=1 docker build --build-arg BASE_IMAGE=$(cat docker/base-image.lock) -t eaglebox:gpu .
#   CPU (tests, and trying the loop without a GPU; wheels from `make wheels` in .cache/wheels):
#     DOCKER_BUILDKIT=1 docker build --build-arg VARIANT=cpu --build-arg CPU_BASE_IMAGE=local/debian:bookworm \
#       -t eaglebox:cpu .
# BuildKit builds only the variant asked for. No token or secret is baked in: pass HF_TOKEN at run time.
ARG BASE_IMAGE=lmsysorg/sglang:v0.5.23-cu130
ARG CPU_BASE_IMAGE=debian:bookworm-slim
ARG VARIANT=gpu

# --- GPU runtime: SGLang, torch and the CUDA kernels come with the base image; check they serve SM120.
FROM ${BASE_IMAGE} AS runtime-gpu
RUN python3 -c "import sglang, torch, sys; \
v = sglang.__version__; a = torch.cuda.get_arch_list(); print('sglang', v, 'torch', torch.__version__, a); \
sys.exit(0 if v == '0.5.23' and 'sm_120' in a else 'base image must carry SGLang 0.5.23 and torch built for sm_120')"
ENV EAGLEBOX_VARIANT=gpu

# --- CPU runtime: SGLang's run-time list without CUDA-only packages, from local wheels (no network),
# and the sgl_kernel stand-in.
FROM ${CPU_BASE_IMAGE} AS runtime-cpu
# g++ and Python.h: SGLang's CPU speculative path compiles kernels with torch inductor at run time.
# hadolint ignore=DL3008
RUN if ! python3 -m venv --help >/dev/null 2>&1 || ! command -v g++ >/dev/null || [ ! -e "/usr/include/python3.11/Python.h" ]; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev g++ \
      && rm -rf /var/lib/apt/lists/* && python3 -m venv --help >/dev/null && command -v g++ >/dev/null; \
    fi
COPY requirements/ /tmp/requirements/
RUN --mount=type=bind,source=.cache/wheels,target=/wheels \
    python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheels \
      -r /tmp/requirements/sglang-0.5.23-runtime.txt -r /tmp/requirements/image.txt \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheels --no-deps sglang==0.5.23 \
 && rm -rf /tmp/requirements
ENV PATH=/opt/venv/bin:$PATH EAGLEBOX_VARIANT=cpu

# --- eaglebox on top of either; the capture hook must accept the SGLang version that is installed.
# hadolint ignore=DL3006
FROM runtime-${VARIANT} AS final
COPY pyproject.toml README.md /src/eaglebox/
COPY src/ /src/eaglebox/src/
RUN python3 -m pip install --no-cache-dir --no-deps --no-build-isolation /src/eaglebox \
 && rm -rf /src/eaglebox \
 && python3 -m eaglebox.engine.install --variant "${EAGLEBOX_VARIANT}" \
 && python3 -c "import importlib.metadata as m; from eaglebox.capture.hook import check_sglang_version; \
check_sglang_version(m.version('sglang')); print('capture hook accepts SGLang', m.version('sglang'))"
COPY entrypoints/eaglebox.sh /usr/local/bin/eaglebox-entrypoint
RUN useradd --create-home --uid 1000 eaglebox && mkdir -p /data && chown eaglebox /data
USER 1000
WORKDIR /home/eaglebox
VOLUME ["/data"]
ENTRYPOINT ["/usr/local/bin/eaglebox-entrypoint"]
