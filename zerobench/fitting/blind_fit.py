"""The paper-blind V100 reading's fit: its constants from V100 runs that are not the ZeRO paper's.

The rule, written down before any fit (docs/perfmodel.md "The paper-blind reading"):
- Input: the rows of zerobench/data/external_runs.csv whose `hardware` is the V100 profile and whose
  `source` is in BLIND_SOURCES, whatever their `split` there (that column is the tuned reading's). No
  row of paper_reference.csv, and no source of the ZeRO paper's authors' runs, is ever read here.
- Split, by where the source printed the number: Megatron-LM's rows read from the paper's main
  weak-scaling figure (Figure 5, §5.1: 1-8 GPUs of model parallelism, and 64-512 GPUs of model and
  data parallelism) are `fit`; the rows read from its Appendix D (Table 7: heads; Table 8: strong
  scaling) are `validation`. The appendix varies what the fit rows hold fixed (heads at a fixed width,
  GPUs at a fixed model), so the validation rows test the terms the fit rows set, not their copies.
- Fitted: the five throughput knobs of fit.THROUGHPUT_KNOBS (Nelder–Mead on the fit rows' mean
  |error|, inside fit._BOUNDS, from the tuned values), each row priced as the code that ran it
  (`megatron-lm-2019`, perfmodel/implementation.py).
- Not fitted: every switch and memory term, set from the codes' sources and the card
  (perfmodel/blind.py, each with its citation); nothing is chosen on a row's score.
The band of the blind reading is the split-conformal interval of its validation rows' |error|
(`band`); the paper's rows are judged against it (fitting/paper_blind.py).

    python -m zerobench.fitting.blind_fit    # prints the fitted knobs, the fit and validation errors
"""

from __future__ import annotations

import sys

import pandas as pd

from zerobench.fitting.external import DATA, SPLITS, load, validate
from zerobench.fitting.fit import _BOUNDS, THROUGHPUT_KNOBS, _nelder_mead
from zerobench.perfmodel.constants import Calibration
from zerobench.perfmodel.error_bands import prediction_interval

HARDWARE = "v100-32gb-dgx2"
BLIND_SOURCES = ("megatron-lm-2019",)  # published V100 runs of codes other than the ZeRO paper's
IMPLEMENTATION = {"megatron-lm-2019": "megatron-lm-2019"}  # the code each source ran
VALIDATION_MARK = "Appendix D"  # where the source printed a validation row (its `citation`)


def blind_split(df: pd.DataFrame) -> pd.Series:
    """`fit` or `validation` per row, by the rule of the module docstring: a row cited to the
    source's Appendix D validates, every other row fits."""
    return df.citation.str.contains(VALIDATION_MARK, regex=False).map({True: "validation", False: "fit"})


def blind_rows(path=DATA) -> pd.DataFrame:
    """The blind reading's input: the V100 rows of BLIND_SOURCES (every split of the tuned reading),
    with `blind_split` and the code each ran (`implementation`)."""
    df = load(SPLITS, path)
    df = df[(df.hardware == HARDWARE) & df.source.isin(BLIND_SOURCES)].reset_index(drop=True)
    return df.assign(blind_split=blind_split(df), implementation=df.source.map(IMPLEMENTATION))


def scored(cal: Calibration, rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """The blind rows predicted under `cal`, each as its own code, with their error."""
    rows = blind_rows() if rows is None else rows
    return validate(cal, rows=rows)


def objective(cal: Calibration, rows: pd.DataFrame) -> float:
    """Mean |error| in % over the `fit` rows: what `fit_blind` minimises."""
    return float(scored(cal, rows[rows.blind_split == "fit"]).error_pct.abs().mean())


def fit_blind(start: Calibration, iters: int = 200, rows: pd.DataFrame | None = None) -> Calibration:
    """`start` (the blind switches and memory terms) with the throughput knobs fitted on the blind fit rows."""
    rows = blind_rows() if rows is None else rows

    def f(x):
        if any(not lo <= v <= hi for v, (lo, hi) in zip(x, (_BOUNDS[k] for k in THROUGHPUT_KNOBS), strict=True)):
            return 1e6
        return objective(start.replace(**dict(zip(THROUGHPUT_KNOBS, x, strict=True))), rows)

    x0 = [getattr(start, k) for k in THROUGHPUT_KNOBS]
    x, _ = _nelder_mead(f, x0, [0.1 * v for v in x0], iters)
    return start.replace(**dict(zip(THROUGHPUT_KNOBS, x, strict=True)))


def band(cal: Calibration, rows: pd.DataFrame | None = None) -> tuple[float | None, int]:
    """(the blind reading's band in %: the split-conformal interval of its validation rows' |error|
    at error_bands.COVERAGE, or None if too few; how many validation rows)."""
    rows = blind_rows() if rows is None else rows
    val = scored(cal, rows[rows.blind_split == "validation"])
    return prediction_interval(val.error_pct.abs()), len(val)


if __name__ == "__main__":
    from zerobench.perfmodel.blind import BLIND_START

    fitted = fit_blind(BLIND_START)
    for k in THROUGHPUT_KNOBS:
        print(f"{k} = {getattr(fitted, k)!r}")
    table = scored(fitted).assign(blind_split=blind_rows().blind_split)
    cols = ["model", "gpus", "mp", "value", "predicted", "error_pct", "blind_split"]
    with pd.option_context("display.width", 200):
        print(table[cols].round(2).to_string(index=False))
    print("band:", band(fitted))
    sys.exit(0)
