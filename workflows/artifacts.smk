# Records -> results/<artifact>.csv -> figures/<artifact>.png; results/claims.csv (the paper's claims, read
# from the tables) and results/REPORT.md over them all.
# Figures and tables are flagged for `snakemake --report report.html`: one category per artifact,
# its sheet's claim as the caption (report/artifact.rst).

CAPTION = "report/artifact.rst"


rule table:
    """An artifact's table from its trials' records, joined to the sheet's trials."""
    input:
        runs=sheet_runs,
        profile=table_profile,
    output:
        report(
            "results/{artifact}.csv",
            caption=CAPTION,
            category="{artifact}",
            subcategory="table",
        ),
    log:
        "results/logs/table_{artifact}.log",
    wildcard_constraints:
        artifact="|".join(SHEETS),  # sheets only: results/peers.csv has a rule of its own
    conda:
        "envs/zerobench.yaml"
    params:
        artifact=sheet_table,
        sheet=sheet_path,
        profile=profile_flag,
        title=sheet_title,
        claim=sheet_field("claim"),
        paper=sheet_field("paper"),
    shell:
        "python -m zerobench.cli table {params.artifact} {input.runs} --sheet {params.sheet} {params.profile}"
        " --out {output} > {log} 2>&1"


rule plot:
    """The artifact's figure, with the paper's points overlaid and each source in the legend."""
    input:
        "results/{artifact}.csv",
    output:
        report(
            "figures/{artifact}.png",
            caption=CAPTION,
            category="{artifact}",
            subcategory="figure",
        ),
    log:
        "results/logs/plot_{artifact}.log",
    wildcard_constraints:
        artifact="|".join(SHEETS),  # sheets only: results/peers.csv has a rule of its own
    conda:
        "envs/zerobench.yaml"
    params:
        artifact=sheet_table,
        title=sheet_title,
        claim=sheet_field("claim"),
        paper=sheet_field("paper"),
    shell:
        "python -m zerobench.cli plot {params.artifact} {input} --title {params.title:q} --out {output} > {log} 2>&1"


rule claims:
    """The paper's own claims, each read from the artifacts' tables (zerobench/artifacts/claims/claims.py)."""
    input:
        expand("results/{artifact}.csv", artifact=SHEETS),
    output:
        report("results/claims.csv", category="summary", caption="report/workflow.rst"),
    log:
        "results/logs/claims.log",
    conda:
        "envs/zerobench.yaml"
    shell:
        "python -m zerobench.cli claims {input} --out {output} > {log} 2>&1"


localrules:
    claims,


rule paper_blind:
    """Every paper row under the blind reading (its fit: zerobench/fitting/blind_fit.py)."""
    input:
        tables=expand("results/{artifact}.csv", artifact=BLIND_ARTIFACTS),
        runs=EXTERNAL_RUNS,
    output:
        "results/paper_blind.csv",
    log:
        "results/logs/paper_blind.log",
    conda:
        "envs/zerobench.yaml"
    shell:
        "python -m zerobench.fitting.paper_blind --results results --out {output} > {log} 2>&1"


localrules:
    paper_blind,


# GPU records measured elsewhere and committed (results/gpu/<device>/runs, their README says where):
# the current model's prediction of each is remade from them here, so that it cannot go stale.
GPU_DEVICES = sorted(
    p.parent.name for p in Path("results/gpu").glob("*/runs") if p.is_dir()
)


rule gpu_compare:
    """The model beside one GPU's committed records (zerobench/checks/gpu_check.py --compare)."""
    input:
        runs="results/gpu/{device}/runs",
        profile="results/gpu/{device}/calibrated-cuda.json",
    output:
        "results/gpu/{device}/compare.csv",
    log:
        "results/logs/gpu_compare_{device}.log",
    wildcard_constraints:
        device="|".join(GPU_DEVICES) or "none",
    conda:
        "envs/zerobench.yaml"
    shell:
        "python -m zerobench.checks.gpu_check --compare results/gpu/{wildcards.device} > {log} 2>&1"


localrules:
    gpu_compare,


rule report:
    """REPORT.md: per artifact, the paper's numbers beside ours, the error and a verdict."""
    input:
        unpack(peers_report_input),
        unpack(plan_report_input),
        unpack(blind_report_input),
        gpu=expand("results/gpu/{device}/compare.csv", device=GPU_DEVICES),
        sheets=sheet_files,
        tables=expand("results/{artifact}.csv", artifact=SHEETS),
        claims="results/claims.csv",
        figures=expand("figures/{artifact}.png", artifact=SHEETS),
    output:
        report("results/REPORT.md", category="summary", caption="report/workflow.rst"),
    log:
        "results/logs/report.log",
    conda:
        "envs/zerobench.yaml"
    params:
        peers=peers_report_flag,
        plans=plan_report_flag,
    shell:
        "python -m zerobench.cli report {input.sheets} --tables {input.tables} --claims {input.claims} {params.peers}"
        " {params.plans}"
        " --out {output} > {log} 2>&1"
