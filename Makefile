# The two commands of the README: `make reproduce` (set up, then the default reproduction) and
# `make test` (set up, then the test suite). Both make .venv on first use.
VENV ?= .venv
BIN := $(VENV)/bin
JOBS ?= 2

.PHONY: setup test test-slurm reproduce lint smoke smoke-baseline

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/setup.sh
	scripts/setup.sh $(VENV)
	touch $@

test: setup
	$(BIN)/pytest -q -n $(JOBS) --durations=10

# The SLURM tests on a real one-node cluster: scripts/slurm_cluster.sh installs slurm-wlm, munge and
# mariadb when missing (apt, root) and starts their daemons for the tests, then stops them. `make test`
# runs them only in CI (CI=true); elsewhere they skip.
test-slurm: setup
	ZEROBENCH_SLURM_TEST=1 $(BIN)/pytest -q tests/workflow/test_slurm.py tests/unit/test_slurm_env.py

# The workflow's default target: every paper artifact -> results/, figures/, results/REPORT.md.
reproduce: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake --workflow-profile workflows/profiles/local --cores $(JOBS)

lint: setup
	$(BIN)/ruff check zerobench tests
	$(BIN)/ruff format --check zerobench tests

# The CI smoke benchmark (< 3 min on 2 cores): small trials in a fresh $(SMOKE_DIR), their
# machine-independent numbers gated against workflows/config/smoke_baseline.json.
SMOKE_DIR ?= $(CURDIR)/.smoke
SMOKE_RUN = rm -rf $(SMOKE_DIR) && PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake smoke --cores $(JOBS) \
	--directory $(SMOKE_DIR) --workflow-profile workflows/profiles/local

smoke: setup
	$(SMOKE_RUN)

# After an intended change: measure, rewrite the baseline, and commit it with the change.
smoke-baseline: setup
	$(SMOKE_RUN) || true
	$(BIN)/python -m zerobench.checks.smoke $(SMOKE_DIR)/results/runs/*.json --update \
		--baseline workflows/config/smoke_baseline.json --out $(SMOKE_DIR)/results/smoke.json
