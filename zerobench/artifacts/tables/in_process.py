"""The paper's performance artifacts from the performance model, in one process: each sheet's
modelled trials (workflows/config/sheets/<name>.yaml) predicted under a given calibration, then
the sheet's table (its entry in tables/registry.py). The workflow does the same through records on disk;
the calibration fit (fitting/fit.py) calls `ARTIFACTS[name](cal)` many times over.

    python -m zerobench.artifacts.tables.in_process OUTDIR   # every CSV + per-figure MAPE and worst error
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pandas as pd

from zerobench.artifacts.judging.common import mape
from zerobench.artifacts.tables.registry import REGISTRY, entry
from zerobench.perfmodel.constants import DEFAULT, Calibration
from zerobench.sweeps.groups import model_trial
from zerobench.sweeps.sheets import load_sheet, sheet_trials
from zerobench.trial.errors import REFUSED


def modelled_table(name: str, cal: Calibration = DEFAULT) -> pd.DataFrame:
    """The sheet `name`'s table from its modelled trials, predicted under `cal`."""
    sheet = load_sheet(name)
    trials = [t for group in sheet_trials(sheet) for t in group if t["source"] == "modelled"]
    return entry(sheet["table"]).table([(t, model_trial(t, cal)) for t in trials])


def _has_modelled_trials(name: str) -> bool:
    return any(t["source"] == "modelled" for group in sheet_trials(load_sheet(name)) for t in group)


# The paper's performance artifacts: those whose tables join their trials and whose sheets model
# them (superlinear joins its measured trials to their rounds: nothing of it is modelled; an
# emulated sheet's modelled trials are only the line beside its emulated ranks)
ARTIFACTS = {
    name: functools.partial(modelled_table, name)
    for name, a in REGISTRY.items()
    if a.joins_trials and not a.emulated and _has_modelled_trials(name)
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "results")
    out.mkdir(parents=True, exist_ok=True)
    print(f"{'artifact':8} {'MAPE %':>7} {'max %':>7} {'points':>6}   judged: MAPE, max")
    for name, fn in ARTIFACTS.items():
        df = fn()
        df.to_csv(out / f"{name}.csv", index=False)
        m, x, n = mape(df)
        jm, jx, _ = mape(df, judged_only=True)
        print(f"{name:8} {m:7.1f} {x:7.1f} {n:6d}   {jm:6.1f} {jx:6.1f}")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except REFUSED as exc:
        raise SystemExit(str(exc)) from exc
