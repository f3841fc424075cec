# The two commands of the README: `make reproduce` (set up, then the default reproduction) and
# `make test` (set up, then the test suite). Both make .venv on first use.
VENV ?= .venv
BIN := $(VENV)/bin
JOBS ?= 2

.PHONY: setup test reproduce lint

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/setup.sh
	scripts/setup.sh $(VENV)
	touch $@

test: setup
	$(BIN)/pytest -q -n $(JOBS) --durations=10

reproduce: setup
	$(BIN)/zerobench run --model cpu-10m --dp 2 --stage 2 --steps 5 --out results/runs/smoke-cpu-10m-dp2-s2.json

lint: setup
	$(BIN)/ruff check zerobench tests
	$(BIN)/ruff format --check zerobench tests
