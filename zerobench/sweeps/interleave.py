"""A measured group run as one job, round by round (a sheet's `interleave: R`, sheets.py): each
trial once per round, back to back, so that the points a table compares are timed seconds apart
and every slow spell of a shared host falls on all of them. Each run is `zerobench run`, as the
workflow's `run_trial` starts it; its record goes to DIR/<trial id>.json, the id carrying the round
(`repeat`). No slow-spell rerun (runtime/probe.py) here: a rerun would take one point out of its
round; the table compares each round's points with each other instead.

    zerobench sweep SHEET --group N --outdir DIR [--device cpu] [--time-limit S] [--launcher srun]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from zerobench.sweeps import sheets

# one intra-op thread per rank, as the workflow's run_trial: the ranks share the job's cores
THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def trial_command(trial: dict, out: Path, device: str, time_limit: float, launcher: str) -> list[str]:
    """`zerobench run` for one trial, started as the workflow's `mpi` resource starts it
    (`sheets.launch_prefix`)."""
    return [
        *sheets.launch_prefix(trial, launcher),
        sys.executable,
        "-m",
        "zerobench.cli",
        "run",
        *sheets.trial_flags(trial),
        "--device",
        device,
        "--time-limit",
        f"{time_limit:g}",
        "--out",
        str(out),
    ]


def run_group(
    trials: list[dict], outdir: str | os.PathLike, device: str = "cpu", time_limit: float = 0, launcher: str = ""
) -> list[Path]:
    """Every trial in the order given (sheets.expand_group's: round by round), one record each; a run
    that writes no record, or exits with an error, stops the job, as a failed `run_trial` does."""
    if any(t["source"] != "measured" or not t.get("repeat") for t in trials):
        raise ValueError("run_group: takes an interleaved group's measured trials (each with its round, repeat)")
    paths, start = [], time.monotonic()
    for i, trial in enumerate(trials, 1):
        path = Path(outdir) / f"{sheets.trial_id(trial)}.json"
        cmd = trial_command(trial, path, device, time_limit, launcher)
        print(f"[{i}/{len(trials)}, round {trial['repeat']}, {time.monotonic() - start:.0f} s] {path.stem}", flush=True)
        done = subprocess.run(cmd, env={**os.environ, **THREADS})
        if done.returncode != 0 or not path.exists():
            said = f"exited {done.returncode}, record written: {path.exists()}"
            raise RuntimeError(f"{path.stem}: `{' '.join(cmd)}` {said}")
        paths.append(path)
    return paths
