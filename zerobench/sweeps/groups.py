"""Many modelled trials in one process: one Snakemake job per sheet group, one record per trial. A
`zerobench model` process spends most of its time importing, a prediction far less, so a group
of a thousand trials costs about what one process does.

    zerobench sweep SHEET --group N [--smoke] --outdir DIR   # DIR/<trial id>.json per trial

The same command runs an interleaved measured group (sweeps/interleave.py).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from zerobench.perfmodel.constants import DEFAULT, Calibration
from zerobench.record_files import write_record
from zerobench.sources import modelled
from zerobench.sweeps import interleave, sheets
from zerobench.trial import COLUMNS, new_record
from zerobench.trial.errors import REFUSED, InputError


def model_trial(trial: dict, cal: Calibration = DEFAULT) -> dict:
    """One sheet trial through the performance model: its record, `infeasible` where the layout
    cannot exist (the message names the field)."""
    try:
        return modelled.record(trial, cal)
    except REFUSED as exc:
        given = {k: v for k, v in trial.items() if k in COLUMNS and k != "source"}  # the trial's own columns
        return new_record("modelled", status="infeasible", error=str(exc), **given)


def model_group(trials: list[dict], outdir: str | os.PathLike, cal: Calibration = DEFAULT) -> list[Path]:
    """Every trial of a modelled group into `outdir`/<trial id>.json."""
    paths = []
    for trial in trials:
        if trial["source"] != "modelled":
            raise InputError(f"source={trial['source']!r}: `zerobench sweep` runs modelled groups only")
        path = Path(outdir) / f"{sheets.trial_id(trial)}.json"
        write_record(model_trial(trial, cal), path)
        paths.append(path)
    return paths


def cmd_sweep(args: argparse.Namespace) -> int:
    sheet = sheets.load_sheet(args.sheet)
    groups = sheets.sheet_trials(sheet, args.smoke)
    picked = range(len(groups)) if args.group is None else [args.group]
    if any(not 0 <= g < len(groups) for g in picked):
        raise InputError(f"group={args.group}: the sheet has groups 0-{len(groups) - 1}")
    Path(args.outdir).mkdir(parents=True, exist_ok=True)
    if args.group is not None and sheet["trials"][args.group].get("interleave"):
        paths = interleave.run_group(groups[args.group], args.outdir, args.device, args.time_limit, args.launcher)
        print(f"{len(paths)} measured records in {args.outdir}")
        return 0
    trials = [t for g in picked for t in groups[g] if t["source"] == "modelled"]
    paths = model_group(trials, args.outdir)
    print(f"{len(paths)} modelled records in {args.outdir}")
    return 0


def sweep_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("sheet", help="a sheet: its name (workflows/config/sheets/NAME.yaml) or a path")
    p.add_argument("--group", type=int, help="the group's index in the sheet (default: every modelled group)")
    p.add_argument("--smoke", action="store_true", help="apply the groups' smoke overrides")
    p.add_argument("--outdir", required=True, help="one record per trial goes here, as <trial id>.json")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="an interleaved group's device")
    p.add_argument("--time-limit", type=float, default=0, help="an interleaved group: wall seconds per run (0: none)")
    p.add_argument("--launcher", default="", help="an interleaved group: what starts a trial's ranks (srun)")
    p.set_defaults(fn=cmd_sweep)
