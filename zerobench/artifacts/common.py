"""Shared pieces of the artifact tables: paper look-ups, error rows, MAPE."""

from __future__ import annotations

import pandas as pd

from zerobench.perfmodel.constants import FIT_SET
from zerobench.results import load_paper_reference

_REF = None


def paper(artifact: str, metric: str, column: str = "value", **where) -> float | None:
    """One number from paper_reference.csv, its `value` or another column's (None when absent or
    not numeric)."""
    global _REF
    if _REF is None:
        _REF = load_paper_reference()
    df = _REF[(_REF.artifact == artifact) & (_REF.metric == metric)]
    for col, val in where.items():
        text = df[col].astype(str)
        df = df[text.str.startswith(val)] if isinstance(val, str) else df[text == f"{val:g}"]
    vals = pd.to_numeric(df[column], errors="coerce").dropna()
    return float(vals.iloc[0]) if len(vals) else None


def row(artifact, key, ours, paper_value, source="modelled", **cols) -> dict:
    err = None if paper_value in (None, 0) or ours is None else 100.0 * (ours - paper_value) / paper_value
    return dict(artifact=artifact, key=key, ours=ours, paper=paper_value, error_pct=err, source=source,
                fit=(artifact, key) in FIT_SET, **cols)  # fmt: skip


def mape(df: pd.DataFrame, judged_only: bool = False) -> tuple[float, float, int]:
    """(mean |error| %, max |error| %, points) over the rows that have an error."""
    rows = df[df["error_pct"].notna()]
    if judged_only and "fit" in rows:
        rows = rows[~rows["fit"].astype(bool)]
    if rows.empty:
        return float("nan"), float("nan"), 0
    err = rows["error_pct"].astype(float).abs()
    return float(err.mean()), float(err.max()), int(len(err))
