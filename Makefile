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
TINY   := .cache/tiny/target/eaglebox-tiny.json
WHEELS := .cache/wheels/.complete
DOCKER ?= /usr/bin/docker
COMPOSE = $(DOCKER) compose --env-file compose/.env -f compose/compose.yaml $(if $(CPU),-f compose/compose.cpu.yaml)

.PHONY: venv tiny demo check test test-fast lint wheels docker-engine image image-cpu extract train serve bench clean

venv: $(STAMP)

# SGLang's run-time list without its CUDA-only packages, then SGLang itself with --no-deps, then
# eaglebox (editable) and its activation in this venv: capture hook + the CPU sgl_kernel stand-in.
$(STAMP): requirements/sglang-0.5.23-runtime.txt requirements/dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements/sglang-0.5.23-runtime.txt -r requirements/dev.txt
	$(BIN)/pip install -q --no-deps sglang==0.5.23
	$(BIN)/pip install -q --no-deps -e .
	$(BIN)/python -m eaglebox.engine.install --variant cpu
	touch $@

tiny: $(TINY)
$(TINY): | $(STAMP)
	$(EB) tiny --out .cache/tiny

# The tiny loop on this machine: capture -> train -> export -> acceptance (offline, SGLang's draft code).
demo: venv tiny
	$(EB) check --config $(CONFIG) $(ARGS)
	@echo "demo: shards in runs/tiny/shards, draft in runs/tiny/train/draft, report runs/tiny/bench/check.json"

check: venv tiny
	$(EB) check --config $(CONFIG) $(ARGS)

test: venv tiny wheels docker-engine
	$(BIN)/python -m pytest -v $(ARGS)

test-fast: venv
	$(BIN)/python -m pytest -v -m "not sglang and not docker" $(ARGS)

lint: venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/hadolint Dockerfile

# Wheels for the CPU image (the build has no network): SGLang's run-time list and eaglebox's own.
wheels: $(WHEELS)
$(WHEELS): requirements/sglang-0.5.23-runtime.txt requirements/image.txt | $(STAMP)
	mkdir -p .cache/wheels
	$(BIN)/pip download -q -d .cache/wheels -r requirements/sglang-0.5.23-runtime.txt -r requirements/image.txt
	$(BIN)/pip download -q --no-deps -d .cache/wheels sglang==0.5.23
	touch $@

docker-engine: | $(STAMP)
	bash docker/engine-setup.sh $(VENV)

image-cpu: wheels docker-engine
	DOCKER_BUILDKIT=1 $(DOCKER) build --network host --build-arg VARIANT=cpu \
	  --build-arg CPU_BASE_IMAGE=local/debian:bookworm -t eaglebox:cpu .

# The GPU image builds on the digest recorded in docker/base-image.lock (see docker/README.md).
image:
	@grep -q '@sha256:' docker/base-image.lock || { echo "docker/base-image.lock holds no digest: run docker/pin-base.sh on a machine that reaches the registry"; exit 1; }
	DOCKER_BUILDKIT=1 $(DOCKER) build --build-arg BASE_IMAGE=$$(cat docker/base-image.lock) -t eaglebox:gpu .

extract train:
	$(COMPOSE) --profile $@ run --rm $@ $(ARGS)

serve:
	$(COMPOSE) up target

bench:
	$(COMPOSE) --profile bench run --rm bench $(ARGS)

clean:
	rm -rf runs
