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

# The workflow's default target: every paper artifact -> results/, figures/, results/REPORT.md.
reproduce: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake --workflow-profile workflows/profiles/local --cores $(JOBS)

lint: setup
	$(BIN)/ruff check zerobench tests
	$(BIN)/ruff format --check zerobench tests
