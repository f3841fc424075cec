"""Every paper row judged under the paper-blind reading (`results/paper_blind.csv`).

Each of the paper's rows (Table 2, Figs 2, 3, 5-8: every row with a paper number that is a
prediction of ours, not a formula or a ratio of other rows) priced by the performance model under
the blind V100 reading (perfmodel/blind.py: nothing of it fitted or chosen on a ZeRO-paper row,
fitting/blind_fit.py) and as the code that ran it (`code_of`, perfmodel/implementation.py PAPER_CODES):
the Megatron-LM 2019 baselines as Megatron, Fig 8's PyTorch DDP as Megatron with torch DDP, the
ZeRO rows as DeepSpeed's ZeRO of 2020 (ZeRO-OS for Table 2's measured P_os). The sheets' trials are
the experiments as the paper's artifact tables list them (their models, layouts, listed batches,
capped at what the code's memory admits); the blind reading changes the constants and the code, not
the experiment. Every row is `judged`, against the reading's band (fitting/blind_fit.py `band`: its
validation rows' interval; a memory row borrows it, said so in `band_basis`). Beside each, the tuned
reading's number from results/<artifact>.csv (`tuned_*`), where that table has the row.

    python -m zerobench.fitting.paper_blind [--results DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from zerobench.artifacts.judging.common import JUDGED, prediction
from zerobench.artifacts.tables.registry import entry
from zerobench.engine.config import ZERO_CONFIGS
from zerobench.fitting.blind_fit import band
from zerobench.perfmodel.blind import BLIND
from zerobench.perfmodel.constants import Calibration
from zerobench.sweeps.groups import model_trial
from zerobench.sweeps.sheets import load_sheet, sheet_trials

ARTIFACTS = ("fig2", "fig3", "fig5", "fig6", "fig7", "fig8", "table2")
# the rows that read a memory quantity (largest model, cached memory), by artifact: None = every row
MEMORY_ROWS = {"fig5": None, "fig6": None, "table2": None, "fig8": "max model"}
COLUMNS = ["artifact", "key", "implementation", "ours", "paper", "error_pct", "band_pct", "band_basis",
           "inside_band", "role", "quantity", "micro_batch", "tuned_ours", "tuned_error_pct", "tuned_role",
           "tuned_inside_band"]  # fmt: skip


def code_of(artifact: str, trial: dict) -> str:
    """The code that ran the paper's trial: DeepSpeed's ZeRO of 2020 for a ZeRO stage (its ZeRO-OS where
    the sheet says P_os ran as ZeRO-OS), PyTorch DDP for Fig 8's baseline, Megatron-LM 2019 otherwise."""
    stage = trial.get("stage")
    if stage is None:
        stage = ZERO_CONFIGS[trial["zero_config"]]["stage"] if trial.get("zero_config") else 0
    if stage:
        return "deepspeed-zero-os-2020" if trial.get("zero_os") and stage == 1 else "deepspeed-zero-2020"
    return "pytorch-ddp-2019" if artifact == "fig8" else "megatron-lm-2019"


def blind_table(name: str, cal: Calibration = BLIND) -> tuple[pd.DataFrame, dict[str, str]]:
    """(the artifact's table from its sheet's modelled trials, each priced as its own code under `cal`;
    prediction digest -> implementation, to name each row's code)."""
    sheet = load_sheet(name)
    trials = [
        {**t, "implementation": code_of(name, t)}
        for group in sheet_trials(sheet)
        for t in group
        if t["source"] == "modelled"
    ]
    pairs = [(t, model_trial(t, cal)) for t in trials]
    codes = {_digest(r): t["implementation"] for t, r in pairs}
    return entry(sheet["table"]).table(pairs), codes


def _digest(record: dict) -> str:
    return prediction(record, "").rpartition("#")[2]


def _quantity(artifact: str, key: str) -> str:
    rows = MEMORY_ROWS.get(artifact, "")
    return "memory" if rows is None or (rows and key.startswith(rows)) else "throughput"


def paper_blind(cal: Calibration = BLIND, results: Path | None = None) -> pd.DataFrame:
    """Every paper row with a number of the paper's and a prediction of ours (not a formula, not a
    ratio of other rows), priced under `cal` as its own code, judged against the reading's band;
    beside it the tuned reading's row of results/<artifact>.csv where `results` has it."""
    width, n_val = band(cal)
    out = []
    for name in ARTIFACTS:
        df, codes = blind_table(name, cal)
        df = df[df.paper.notna() & ~df.role.isin(("formula", "derived"))]
        for r in df.itertuples():
            q = _quantity(name, r.key)
            basis = f"blind validation ({n_val} Megatron-LM 2019 runs, 80%)"
            out.append(dict(
                artifact=name, key=r.key, implementation=codes.get(str(r.prediction).rpartition("#")[2], ""),
                ours=r.ours, paper=r.paper, error_pct=r.error_pct, band_pct=width,
                band_basis=basis if q == "throughput" else basis + ", borrowed by a memory row (assumption)",
                role=JUDGED, quantity=q, micro_batch=getattr(r, "micro_batch", None),
            ))  # fmt: skip
    table = pd.DataFrame(out)
    ok = table.error_pct.notna() & table.band_pct.notna()
    table["inside_band"] = None
    table.loc[ok, "inside_band"] = table.error_pct[ok].abs() <= table.band_pct[ok]
    return _beside_tuned(table, results)[COLUMNS]


def _beside_tuned(table: pd.DataFrame, results: Path | None) -> pd.DataFrame:
    """`table` with the tuned reading's ours, error, role and inside_band of the same (artifact, key)."""
    tuned = []
    for name in ARTIFACTS:
        path = results / f"{name}.csv" if results else None
        if path is not None and path.exists():
            t = pd.read_csv(path)
            t = t.assign(artifact=name, inside_band=t.get("inside_band"))
            tuned.append(t[["artifact", "key", "ours", "error_pct", "role", "inside_band"]])
    if not tuned:
        return table.assign(tuned_ours=None, tuned_error_pct=None, tuned_role=None, tuned_inside_band=None)
    t = pd.concat(tuned).rename(columns={c: f"tuned_{c}" for c in ("ours", "error_pct", "role", "inside_band")})
    return table.merge(t, on=["artifact", "key"], how="left")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zerobench.fitting.paper_blind", description=__doc__.split("\n")[0])
    p.add_argument("--results", default="results", help="the tuned reading's tables (results/<artifact>.csv)")
    p.add_argument("--out", default="results/paper_blind.csv")
    args = p.parse_args(argv)
    table = paper_blind(results=Path(args.results))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    for name, rows in table.groupby("artifact", sort=False):
        err = rows.error_pct.abs()
        inside = int(rows.inside_band.astype(bool).sum())
        print(
            f"{name:7} n={len(rows):3d} mean {err.mean():6.1f} % worst {err.max():6.1f} % inside {inside}/{len(rows)}"
        )
    print(f"{len(table)} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
