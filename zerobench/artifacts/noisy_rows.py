"""A measured row whose runs disagree by more than the sheet's tolerance is left out of the verdict as
too noisy, and said so: a verdict must hold from one reproduction to the next, not rest on whichever
median a reproduction happened to get (design.md).

A row with its runs (`measured_runs_s`, the per-run medians) and a spread across them
(`runs_spread_pct`, 100·(max − min)/median) above the tolerance is `too_noisy`: shown, its error
beside it, counted apart (report.stats). Judging such a row on its runs' range instead was tried on
the committed runs of model_vs_measured: resampled two runs of three per row, the range rule's
verdict changed with the resample (the tiny model's 0.014 s step, +32 % above a range of two runs
that agreed by chance), the rule here did not (docs/perfmodel.md "Verdicts across reproductions")."""

from __future__ import annotations

import pandas as pd


def runs_of(text) -> list[float]:
    """The per-run values of a `measured_runs_s` cell ('0.31 0.29 0.26'); [] where none."""
    return [float(v) for v in str(text).split()] if pd.notna(text) else []


def mark_noisy(df: pd.DataFrame, tolerance_pct: float) -> pd.DataFrame:
    """`df` with `too_noisy` on its measured rows whose runs spread past `tolerance_pct` (where it has
    per-run values at all; unchanged otherwise)."""
    if "runs_spread_pct" not in df or "measured_runs_s" not in df:
        return df
    several = df.measured_runs_s.map(lambda t: len(runs_of(t)) > 1)
    return df.assign(too_noisy=several & (df.runs_spread_pct.astype(float) > tolerance_pct))
