# The two set-up commands (see README): `make dev` starts a local cluster with simulated GPU nodes,
# `make test` runs every test tier. Both install what they need first; both are safe to re-run.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: dev down status simulate test test-unit test-integration test-realnode lint deps k8s-bins helm-bin karpenter-bin

$(STAMP): pyproject.toml
	@echo "[setup] python venv + gpupack[dev] (pip)"
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@$(BIN)/pip install --quiet --upgrade pip
	@$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

deps: $(STAMP)
	@.ci/system-deps

k8s-bins: deps
	@tests/k8s/build.sh >/dev/null

helm-bin: deps
	@tests/helm/build.sh >/dev/null

# Karpenter's kwok provider, for `python -m tests.devcluster up --autoscaler` and tests/integration/test_autoscale.py.
karpenter-bin: deps
	@tests/karpenter/build.sh >/dev/null

dev: k8s-bins
	@$(BIN)/python -m tests.devcluster up

down: $(STAMP)
	@$(BIN)/python -m tests.devcluster down

status: $(STAMP)
	@$(BIN)/python -m tests.devcluster status

simulate: $(STAMP)
	@$(BIN)/gpupack simulate

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

test-unit: $(STAMP)
	$(BIN)/pytest -m "not integration" tests

test-integration: k8s-bins helm-bin karpenter-bin
	$(BIN)/pytest -m integration tests

# The real-node tier alone (root; part of test-integration and test too).
test-realnode: k8s-bins helm-bin
	$(BIN)/pytest -m realnode tests

test: k8s-bins helm-bin karpenter-bin lint
	$(BIN)/pytest tests
