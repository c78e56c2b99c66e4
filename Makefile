# eaglebox: thin targets over the CLI. `make demo` and `make test` work from a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
CONFIG ?= configs/tiny-cpu.yaml
ARGS   ?=
BIN    := $(VENV)/bin
EB     := $(BIN)/eaglebox
STAMP  := $(VENV)/.eaglebox-installed
TINY   := .cache/tiny/target/eaglebox-tiny.json

.PHONY: venv tiny demo test test-fast lint extract train export serve bench check parity clean

venv: $(STAMP)

# SGLang's run-time list without its CUDA-only packages, then SGLang itself with --no-deps, then
# eaglebox (editable) and its activation in this venv: capture hook + the CPU sgl_kernel stand-in.
$(STAMP): requirements/sglang-0.5.23-runtime.txt requirements/dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements/sglang-0.5.23-runtime.txt -r requirements/dev.txt
	$(BIN)/pip install -q --no-deps sglang==0.5.23
	$(BIN)/pip install -q --no-deps -e .
	$(BIN)/python -m eaglebox.engine.install --cpu
	touch $@

tiny: $(TINY)
$(TINY): | $(STAMP)
	$(EB) tiny --out .cache/tiny

test: venv tiny
	$(BIN)/python -m pytest -v $(ARGS)

test-fast: venv
	$(BIN)/python -m pytest -v -m "not sglang and not docker" $(ARGS)

lint: venv
	$(BIN)/ruff check src tests benchmarks

demo: venv tiny
	$(EB) extract --config $(CONFIG) $(ARGS)
	$(EB) parity --config $(CONFIG) $(ARGS)
	$(EB) train --config $(CONFIG) $(ARGS)
	$(EB) check --config $(CONFIG) $(ARGS)

extract train export serve bench check parity: venv
	$(EB) $@ --config $(CONFIG) $(ARGS)

clean:
	rm -rf runs
