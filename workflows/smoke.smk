# The CI smoke benchmark: a few small trials whose machine-independent numbers must equal the
# committed baseline (zerobench/checks/smoke.py says which and how). Run it into a directory of its own:
#   make smoke      (snakemake smoke --directory .smoke; under 3 minutes on 2 cores)
# `make smoke-baseline` rewrites the baseline after an intended change.

SMOKE_SPEC = Path(workflow.basedir) / "workflows" / "config" / "smoke_benchmark.yaml"
SMOKE_BASELINE = SMOKE_SPEC.with_name("smoke_baseline.json")
with open(SMOKE_SPEC) as _f:
    _smoke = yaml.safe_load(_f)
try:
    validate(_smoke, schema="schemas/smoke.schema.yaml")
except Exception as exc:
    raise ValueError(f"{SMOKE_SPEC}: {exc}") from exc
SMOKE_TRIALS = []
for _group in _smoke["trials"]:
    for _smoke_trial in sheets.expand_group(_group):
        TRIALS[sheets.trial_id(_smoke_trial)] = _smoke_trial
        SMOKE_TRIALS.append(sheets.trial_id(_smoke_trial))


rule smoke:
    """Gate this run's numbers against the baseline; print the same-run step-time ratios."""
    input:
        expand("results/runs/{trial}.json", trial=SMOKE_TRIALS),
    output:
        "results/smoke.json",
    log:
        "results/logs/smoke.log",
    conda:
        "envs/zerobench.yaml"
    params:
        baseline=SMOKE_BASELINE,
    shell:
        "python -m zerobench.checks.smoke {input} --baseline {params.baseline} --out {output} > {log} 2>&1"
