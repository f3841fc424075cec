# Shared helpers: config and sheet validation, the trial space, trial ids and command-line flags
# (zerobench/sweeps/sheets.py: pure Python, so dry runs and lint stay light).
from pathlib import Path

import yaml
from snakemake.utils import validate

from zerobench.artifacts.tables.registry import REGISTRY
from zerobench.sweeps import sheets

validate(config, schema="schemas/config.schema.yaml")

# Sheets resolve against the repository, not --directory, so a smoke run can write elsewhere.
SHEET_DIR = Path(workflow.basedir) / "workflows" / "config" / "sheets"


def load_sheet(name):
    """One artifact's sheet, validated: a typo in a key fails here, before any trial starts."""
    path = SHEET_DIR / f"{name}.yaml"
    if not path.exists():
        raise ValueError(f"sheets: no sheet {path} for {name!r}")
    with open(path) as f:
        sheet = yaml.safe_load(f)
    try:
        validate(sheet, schema="schemas/sheet.schema.yaml")
        sheets.check_sheet(sheet, path.name)
    except Exception as exc:
        raise ValueError(f"sheet {path}: {exc}") from exc
    return sheet


# A measured or traced trial is a job of its own: results/runs/<trial id>.json. A modelled group
# is one job that writes one record per trial into results/runs/<artifact>.g<index>/; an
# interleaved measured group (`interleave: R`) one job that runs its trials round by round into
# results/runs/<artifact>.i<index>/.
SHEETS = {name: load_sheet(name) for name in config["sheets"]}
SHEET_INPUTS = {}
TRIALS = {}
GROUPS = {}
INTERLEAVED = {}
for _name, _sheet in SHEETS.items():
    _inputs = []
    for _index, _trials in enumerate(sheets.sheet_trials(_sheet, config["smoke"])):
        if _trials and _trials[0]["source"] == "modelled":
            GROUPS[f"{_name}.g{_index}"] = _trials
            _inputs.append(f"results/runs/{_name}.g{_index}")
            continue
        if _trials and _sheet["trials"][_index].get("interleave"):
            INTERLEAVED[f"{_name}.i{_index}"] = _trials
            _inputs.append(f"results/runs/{_name}.i{_index}")
            continue
        for _trial in _trials:
            TRIALS[sheets.trial_id(_trial)] = _trial
            _inputs.append(f"results/runs/{sheets.trial_id(_trial)}.json")
    SHEET_INPUTS[_name] = list(dict.fromkeys(_inputs))


def _trial(wildcards):
    return TRIALS[f"{wildcards.source}_{wildcards.trial}"]


def trial_flags(wildcards):
    """Command-line flags of one trial (world size from the sheet, never from resources)."""
    return " ".join(sheets.trial_flags(_trial(wildcards)))


def trial_world(wildcards):
    """A trial's world size, dp x mp: the ranks (SLURM tasks) it starts."""
    return sheets.world_size(_trial(wildcards))


def _gpus(world):
    """GPUs a job of `world` ranks holds: one per rank on a GPU cluster, none on CPU."""
    return world if config["device"] == "cuda" else 0


def trial_gpus(wildcards):
    return _gpus(trial_world(wildcards))


def group_trials(wildcards):
    """A modelled group's trials, for the `model_group` job's params (a changed sheet reruns it)."""
    return GROUPS[f"{wildcards.artifact}.g{wildcards.group}"]


def interleaved_trials(wildcards):
    """An interleaved group's trials, in the order they run (a changed sheet reruns the job)."""
    return INTERLEAVED[f"{wildcards.artifact}.i{wildcards.group}"]


def interleaved_world(wildcards):
    """The ranks of the group's largest trial: cores (tasks on SLURM) the job holds throughout."""
    return max(sheets.world_size(t) for t in interleaved_trials(wildcards))


def interleaved_gpus(wildcards):
    return _gpus(interleaved_world(wildcards))


def interleaved_runtime(wildcards, attempt):
    """Minutes: every run of the group at its time limit, at worst (as run_trial's 30 per attempt)."""
    runs = len(interleaved_trials(wildcards))
    return attempt * max(30, runs * config["time_limit_s"] // 60)


def trial_mpi(wildcards):
    """SLURM plugin's `mpi` resource: `<launcher> -n <world>` (config `launcher`, e.g. srun)
    starts one task per rank of a multi-rank trial; "" runs the command once, and zerobench
    starts the ranks itself.
    """
    return " ".join(sheets.launch_prefix(_trial(wildcards), config["launcher"]))


def sheet_runs(wildcards):
    return SHEET_INPUTS[wildcards.artifact]


def sheet_path(wildcards):
    return str(SHEET_DIR / f"{wildcards.artifact}.yaml")


def sheet_table(wildcards):
    return SHEETS[wildcards.artifact]["table"]


def table_profile(wildcards):
    """The calibrated profile of this machine, where the artifact's entry predicts from it."""
    if REGISTRY[sheet_table(wildcards)].needs_profile:
        return f"results/profiles/calibrated-{config['device']}.json"
    return []


def trial_profile(wildcards):
    """The calibrated profile a measured trial's host probe is compared with: a run in a slow spell
    runs once more (runtime/probe.py). None in a smoke run, which checks the plumbing, not speed.
    `ancient`: the trial needs the profile to exist, and a newer calibration does not make its
    records out of date."""
    return (
        []
        if config.get("smoke")
        else ancient(f"results/profiles/calibrated-{config['device']}.json")
    )


def reference_flag(wildcards, input):
    return f"--probe-reference {input.profile}" if input.profile else ""


def profile_flag(wildcards, input):
    return f"--profile {input.profile}" if input.profile else ""


def sheet_title(wildcards):
    return SHEETS[wildcards.artifact]["title"]


def sheet_field(field):
    """The artifact's sheet's `field` (claim, paper) as a params function: report captions."""
    return lambda wildcards: SHEETS[wildcards.artifact][field]


def sheet_files(wildcards):
    return [str(SHEET_DIR / f"{name}.yaml") for name in SHEETS]


wildcard_constraints:
    source="measured|traced|modelled",
    trial=r"[A-Za-z0-9.~-][A-Za-z0-9._~-]*",
    artifact=r"[a-z0-9_]+",
    group=r"[0-9]+",


# -- the peers comparison (workflows/peers.smk) ----------------------------------------------
# Defaults: the peers benchmark of README's comparison. A `peers:` mapping in the config overrides any of them; smoke
# runs take the tiny model for a couple of steps. Clipping is off by default so that the losses
# compare the engines: torch's fp32 CPU norm kernel (clip_grad_norm_, used by DDP, ZeRO-1 and
# FSDP2 here) is off by ~1e-4 relative on 10^7-element gradients (pytorch/pytorch#169237), which
# alone moves their losses by 2-3e-4 within 10 steps. Stage 3 holds a bucket whose next use is
# under 64 MiB of gathers ahead (`reuse_mb`, zero/gather.py): DeepSpeed's stage3_max_reuse_distance at a
# shorter distance (its default, 1e9 parameters, holds all of cpu-100m); the engine's own default is 0, the paper's 3Ψ.
# Every row runs in `rounds` interleaved rounds (order reversed every other round), ratios taken
# within each round: ours and each peer see the host's slow spells alike (zerobench/peers/runner.py).
# `in_report` adds the table to REPORT.md.
PEERS = {
    "model": "tiny" if config.get("smoke") else "cpu-100m",
    "dp": 2,
    "micro_batch": 1,
    "warmup": 1 if config.get("smoke") else 2,
    "steps": 2 if config.get("smoke") else 8,
    "clip_norm": 0.0,
    "reuse_mb": 64,
    "rounds": 1 if config.get("smoke") else 3,
    "in_report": False,
    **config.get("peers", {}),
}


# The paper's rows judged under the paper-blind V100 reading, each priced as the code that ran it
# (zerobench/fitting/paper_blind.py; artifacts.smk), beside the tuned reading's tables: REPORT's
# headline, where the run builds every one of those tables (not a smoke run's few sheets).
BLIND_ARTIFACTS = ["fig2", "fig3", "fig5", "fig6", "fig7", "fig8", "table2"]


def blind_report_input(wildcards):
    return (
        {"blind": "results/paper_blind.csv"}
        if set(BLIND_ARTIFACTS) <= set(SHEETS)
        else {}
    )


def peers_report_input(wildcards):
    return {"peers": "results/peers.csv"} if PEERS["in_report"] else {}


def peers_report_flag(wildcards):
    return "--peers results/peers.csv" if PEERS["in_report"] else ""


# -- plan requests (workflows/plans.smk) ------------------------------------------------------
PLAN_FLAGS = ("model", "layers", "hidden", "heads", "seq", "vocab", "gpus", "hardware", "precision",
              "global_batch", "attention", "top")  # fmt: skip


PLAN_SHEET = Path(workflow.basedir) / "workflows" / "config" / "plans.yaml"
# the package's own data (a copy of the workflow alone still finds it)
EXTERNAL_RUNS = (
    Path(sheets.__file__).resolve().parents[1] / "data" / "external_runs.csv"
)


def _load_plans():
    with open(PLAN_SHEET) as f:
        plans = yaml.safe_load(f)
    validate(plans, schema="schemas/plans.schema.yaml")
    return plans["requests"]


PLANS = _load_plans()


def plan_flags(wildcards):
    """The request's `zerobench plan` flags, from its entry in config/plans.yaml."""
    request = PLANS[wildcards.request]
    return " ".join(
        f"--{k.replace('_', '-')} {request[k]}" for k in PLAN_FLAGS if k in request
    )


def plan_report_input(wildcards):
    """REPORT.md's plan section reads the plans and the validation; a smoke run (CI scale) has none."""
    if config.get("smoke"):
        return {}
    return {
        "plan_sheet": str(PLAN_SHEET),
        "plans": expand("results/plan/{request}.csv", request=PLANS),
        "plan_figures": expand("figures/plan_{request}.png", request=PLANS),
        "plan_validation": "results/plan_validation.csv",
    }


def plan_report_flag(wildcards, input):
    if config.get("smoke"):
        return ""
    return (
        f"--plan-sheet {input.plan_sheet} --plans {' '.join(input.plans)}"
        f" --plan-validation {input.plan_validation}"
    )
