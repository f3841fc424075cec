"""A measured row whose runs disagree by more than the sheet's tolerance is marked `too_noisy`: shown,
counted and judged all the same (report.stats). A rule that set such rows aside was added after
model_vs_measured read "Not reproduced", with the errors in view; a noise rule must be set from the
repeats' own spread before the errors are read, and none was, so every row is judged and the report
says how many spread past the tolerance: which of their runs a reproduction gets can move the verdict.

`too_noisy`: a row with its runs (`measured_runs_s`, the per-run medians) and a spread across them
(`runs_spread_pct`, 100·(max − min)/median) above the tolerance."""

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
