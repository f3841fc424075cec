# zerobench: regenerate the ZeRO paper's tables and figures (results/, figures/, results/REPORT.md).
# Entry point only: configuration, includes and the default target. See README "Reproducing the paper".
from pathlib import Path

from snakemake.utils import min_version

min_version("9.19")


configfile: Path(workflow.basedir) / "workflows/config/config.yaml"


include: "workflows/common.smk"
include: "workflows/trials.smk"
include: "workflows/peers.smk"
include: "workflows/artifacts.smk"


# Tables, figures and the report are cheap: they stay on the submit host under --executor slurm.
localrules:
    all,
    model_group,
    table,
    plot,
    report,


rule all:
    default_target: True
    input:
        "results/REPORT.md",
