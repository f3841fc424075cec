"""The power of the coverage check (perfmodel/coverage_check.py): the check run on the runs that set
no band (results/external_coverage.csv) for the model and for predictors it must be able to fail,
written to results/external_coverage_power.csv for REPORT (artifacts/report/heldout.py).

The predictors: the model as scored (results/external_holdout.csv); a constant, the runs' own median
published value (an oracle: it has seen the values it predicts); and the model with one term of the
step time left out (`TERMS`: its DP communication, its MP communication, its optimizer step), each
run predicted again. `moved`: how many runs the left-out term moves by more than 1 %: a check cannot
fail a missing term on runs that do not exercise it. Where a predictor passes, the runs cannot fail it,
and REPORT says so. `python -m zerobench.fitting.coverage_power` writes the table (seconds).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from zerobench.fitting.external import HOLDOUT_OUT, expressible, validate
from zerobench.fitting.write_bands import COUNTED, COVERAGE_OUT
from zerobench.perfmodel.coverage_check import check

POWER_OUT = HOLDOUT_OUT.with_name("external_coverage_power.csv")
MODEL = "the model"
# terms of the step time (perfmodel/predict.py Prediction) a predictor leaves out, and how REPORT names it
TERMS = {
    "dp_comm_s": "the model without DP communication",
    "mp_comm_s": "the model without MP communication",
    "optimizer_s": "the model without the optimizer step",
}
MOVED_PCT = 1.0  # a term moves a run where leaving it out changes the prediction by more than this


def counted_runs(holdout: pd.DataFrame, coverage: pd.DataFrame) -> pd.DataFrame:
    """The holdout rows the coverage is counted on, in external_coverage.csv's order, with its bands."""
    rows = holdout[expressible(holdout) & (holdout.role == COUNTED)].reset_index(drop=True)
    if len(rows) != len(coverage) or list(rows.gpus) != list(coverage.gpus) or list(rows.mp) != list(coverage.mp):
        raise ValueError(f"{COVERAGE_OUT.name}: its runs are not the holdout's counted runs, in order")
    return rows.assign(band_pct=coverage.band_pct.values, band_basis=coverage.band_basis.values)


def _row(name: str, predicted, runs: pd.DataFrame, moved: int | None) -> dict:
    c = check(predicted, runs.value, runs.band_pct, runs.band_basis)
    return dict(predictor=name, runs=c.runs, moved=moved, inside=c.inside, coverage_p=c.coverage_p, tau=c.tau,
                skill_p=c.skill_p, below=c.below, above=c.above, sign_p=c.sign_p, mean_abs_pct=c.mean_abs_pct,
                mean_pct=c.mean_pct, failed="; ".join(c.failed), cannot_fail="; ".join(c.cannot_fail),
                passes=c.passes)  # fmt: skip


def power(runs: pd.DataFrame, ablated: dict[str, pd.Series]) -> pd.DataFrame:
    """One row per predictor: the model, the runs' median as a constant, and each `ablated` prediction
    (name -> predicted values, the model with a term left out)."""
    median = float(runs.value.median())
    out = [
        _row(MODEL, runs.predicted, runs, None),
        _row(f"a constant: the runs' median, {median:.4g}", np.full(len(runs), median), runs, None),
    ]
    for name, pred in ablated.items():
        moved = int((100 * (pred.to_numpy() / runs.predicted.to_numpy() - 1) > MOVED_PCT).sum())
        out.append(_row(name, pred, runs, moved))
    return pd.DataFrame(out)


def ablations(runs: pd.DataFrame) -> dict[str, pd.Series]:
    """Each counted run predicted again by the model with each of TERMS left out."""
    cols = [c for c in runs.columns if c not in ("predicted", "error_pct")]
    return {name: validate(rows=runs[cols], without=(term,)).predicted for term, name in TERMS.items()}


def write(holdout: pd.DataFrame, coverage: pd.DataFrame, path=POWER_OUT) -> pd.DataFrame:
    runs = counted_runs(holdout, coverage)
    table = power(runs, ablations(runs))
    table.to_csv(path, index=False)
    return table


if __name__ == "__main__":
    got = write(pd.read_csv(HOLDOUT_OUT), pd.read_csv(COVERAGE_OUT))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(got.round(4).to_string(index=False))
