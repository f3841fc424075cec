# Plan requests (config/plans.yaml): each ranked by the performance model and its top layouts traced
# (`zerobench plan --verify trace`, docs/plan.md) -> results/plan/<name>.csv, figures/plan_<name>.png;
# the published runs' layouts found in plans of their own (results/plan_validation.csv). Both feed
# REPORT.md's plan section. Included by the Snakefile.
rule plan:
    """One plan request: every layout ranked (modelled), the top traced."""
    input:
        PLAN_SHEET,
    output:
        table="results/plan/{request}.csv",
        figure="figures/plan_{request}.png",
    log:
        "results/logs/plan_{request}.log",
    wildcard_constraints:
        request="|".join(PLANS),
    conda:
        "envs/zerobench.yaml"
    params:
        flags=plan_flags,
    shell:
        "python -m zerobench.cli plan {params.flags} --verify trace --out {output.table} --figure {output.figure}"
        " > {log} 2>&1"


rule plan_validation:
    """The published runs with complete layouts (zerobench/data/external_runs.csv), each planned:
    where its layout ranks, the top pick against it, the top pick traced."""
    input:
        EXTERNAL_RUNS,
    output:
        "results/plan_validation.csv",
    log:
        "results/logs/plan_validation.log",
    conda:
        "envs/zerobench.yaml"
    shell:
        "python -m zerobench.fitting.plan_validation --out {output} > {log} 2>&1"


localrules:
    plan,
    plan_validation,
