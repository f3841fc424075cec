# zerobench: regenerate the ZeRO paper's tables and figures (results/, figures/, results/REPORT.md).
# Entry point only: configuration, includes and the default target. See README "Reproducing the paper".
import os
from pathlib import Path

from snakemake.utils import min_version

from zerobench.sweeps import checkout_times

min_version("9.19")

# A clone dates each file by when git wrote it, so Snakemake would redo committed trials and plans:
# date every file whose content is HEAD's as that commit, once per HEAD; an edited file stays newer
# and what depends on it reruns (zerobench/sweeps/checkout_times.py).
checkout_times.restore(Path(workflow.basedir))


configfile: Path(workflow.basedir) / "workflows/config/config.yaml"


report: "workflows/report/workflow.rst"


# One intra-op thread per rank unless the caller says otherwise, as torchrun does: each rank owns a
# core as a GPU rank owns its GPU. With torch's default (one thread per core) two dp ranks on two
# cores oversubscribe them, and every step slows down.
os.environ.setdefault("OMP_NUM_THREADS", "1")


include: "workflows/common.smk"
include: "workflows/trials.smk"
include: "workflows/peers.smk"
include: "workflows/plans.smk"
include: "workflows/artifacts.smk"
include: "workflows/smoke.smk"


# Tables, figures and the report are cheap: they stay on the submit host under --executor slurm.
localrules:
    all,
    model_group,
    table,
    plot,
    report,
    smoke,


rule all:
    default_target: True
    input:
        "results/REPORT.md",
