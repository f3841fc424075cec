# Shared helpers: config and sheet validation, the trial space, trial ids and command-line flags.
# No torch at parse time, so dry runs and lint stay light.
from itertools import product
from pathlib import Path

import yaml
from snakemake.utils import validate

validate(config, schema="schemas/config.schema.yaml")

# Sheets resolve against the repository, not --directory, so a smoke run can write elsewhere.
SHEET_DIR = Path(workflow.basedir) / "workflows" / "config" / "sheets"

# Trial field -> (tag in the trial id, flag of `zerobench run|trace|model`), in id order.
FIELDS = {
    "model": ("", "--model"),
    "layers": ("L", "--layers"),
    "hidden": ("h", "--hidden"),
    "heads": ("a", "--heads"),
    "seq": ("s", "--seq"),
    "vocab": ("v", "--vocab"),
    "gpus": ("g", "--gpus"),
    "dp": ("dp", "--dp"),
    "mp": ("mp", "--mp"),
    "stage": ("z", "--stage"),
    "precision": ("", "--precision"),
    "micro_batch": ("b", "--micro-batch"),
    "grad_accum": ("ga", "--grad-accum"),
    "checkpoint_activations": ("ckpt", "--checkpoint-activations"),
    "bucket_mb": ("cb", "--bucket-mb"),
    "steps": ("n", "--steps"),
    "warmup": ("w", "--warmup"),
    "seed": ("seed", "--seed"),
    "data": ("", "--data"),
    "mem_cap_mb": ("cap", "--mem-cap-mb"),
    "hardware": ("", "--hardware"),
}


def load_sheet(name):
    """One artifact's sheet, validated: a typo in a key fails here, before any trial starts."""
    path = SHEET_DIR / f"{name}.yaml"
    if not path.exists():
        raise ValueError(f"sheets: no sheet {path} for {name!r}")
    with open(path) as f:
        sheet = yaml.safe_load(f)
    try:
        validate(sheet, schema="schemas/sheet.schema.yaml")
    except Exception as exc:
        raise ValueError(f"sheet {path}: {exc}") from exc
    return sheet


def expand_group(group, smoke):
    """The trials of one group: base settings times the grid (smoke overrides applied)."""
    base, grid = dict(group.get("base", {})), dict(group.get("grid", {}))
    override = group.get("smoke", {})
    if smoke and override is False:
        return []
    if smoke:
        for key, value in override.get("base", {}).items():
            base[key] = value
            grid.pop(key, None)
        for key, values in override.get("grid", {}).items():
            grid[key] = values
            base.pop(key, None)
    combos = product(*grid.values())
    return [
        dict(source=group["source"], **base, **dict(zip(grid, combo)))
        for combo in combos
    ]


def trial_id(trial):
    """A readable, unique name: the source, then each set field as tag + value."""
    parts = []
    for name, (tag, _) in FIELDS.items():
        value = trial.get(name)
        if value is None or value is False:
            continue
        if value is True:
            parts.append(tag)
        else:
            parts.append(f"{tag}{Path(str(value)).stem if name == 'data' else value}")
    return f"{trial['source']}_" + "-".join(parts)


SHEETS = {name: load_sheet(name) for name in config["sheets"]}
SHEET_TRIALS = {}
TRIALS = {}
for _name, _sheet in SHEETS.items():
    _ids = []
    for _group in _sheet.get("trials", []):
        for _trial in expand_group(_group, config["smoke"]):
            TRIALS[trial_id(_trial)] = _trial
            _ids.append(trial_id(_trial))
    SHEET_TRIALS[_name] = list(dict.fromkeys(_ids))


def trial_flags(wildcards):
    """Command-line flags of one trial (world size from the sheet, never from resources)."""
    trial = TRIALS[f"{wildcards.source}_{wildcards.trial}"]
    flags = []
    for name, (_, flag) in FIELDS.items():
        value = trial.get(name)
        if value is True:
            flags.append(flag)
        elif value is not None and value is not False:
            flags.append(f"{flag} {value}")
    return " ".join(flags)


def world_size(wildcards):
    trial = TRIALS[f"{wildcards.source}_{wildcards.trial}"]
    return trial.get("gpus") or trial.get("dp", 1) * trial.get("mp", 1)


def trial_gpus(wildcards):
    """GPUs a measured trial holds: its world size on a GPU cluster, none on CPU."""
    return world_size(wildcards) if config["device"] == "cuda" else 0


def trial_mpi(wildcards):
    """SLURM plugin's `mpi` resource: `<launcher> -n <world>` (config `launcher`, e.g. srun)
    starts one task per rank of a multi-rank trial; "" runs the command once, and zerobench
    starts the ranks itself.
    """
    world, launch = world_size(wildcards), config["launcher"]
    return f"{launch} -n {world}" if launch and world > 1 else ""


def sheet_runs(wildcards):
    return [f"results/runs/{trial}.json" for trial in SHEET_TRIALS[wildcards.artifact]]


def sheet_table(wildcards):
    return SHEETS[wildcards.artifact]["table"]


def sheet_title(wildcards):
    return SHEETS[wildcards.artifact]["title"]


def sheet_files(wildcards):
    return [str(SHEET_DIR / f"{name}.yaml") for name in SHEETS]


wildcard_constraints:
    source="measured|traced|modelled",
    trial=r"[A-Za-z0-9.~-][A-Za-z0-9._~-]*",
    artifact=r"[a-z0-9_]+",


# -- the peers comparison (workflows/peers.smk) ----------------------------------------------
# Defaults: issue 7's benchmark. A `peers:` mapping in the config overrides any of them; smoke
# runs take the tiny model for a couple of steps. Clipping is off by default so that the losses
# compare the engines: torch's fp32 CPU norm kernel (clip_grad_norm_, used by DDP, ZeRO-1 and
# FSDP2 here) is off by ~1e-4 relative on 10^7-element gradients (pytorch/pytorch#169237), which
# alone moves their losses by 2-3e-4 within 10 steps. `in_report` adds the table to REPORT.md.
PEERS = {
    "model": "tiny" if config.get("smoke") else "cpu-100m",
    "dp": 2,
    "micro_batch": 1,
    "warmup": 1 if config.get("smoke") else 2,
    "steps": 2 if config.get("smoke") else 8,
    "clip_norm": 0.0,
    "in_report": False,
    **config.get("peers", {}),
}


def peers_report_input(wildcards):
    return {"peers": "results/peers.csv"} if PEERS["in_report"] else {}


def peers_report_flag(wildcards):
    return "--peers results/peers.csv" if PEERS["in_report"] else ""
