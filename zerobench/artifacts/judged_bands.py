"""A number on every judged row of a paper artifact: how far the model is to be trusted there, and
whether its error lies inside (perfmodel/error_bands.py, docs/perfmodel.md "Error bands").

`band_pct` is the record's regime band where its regime has one (`error_band_pct` a number), else
the pooled band (error_bands.pooled: the 90 % interval over every validation run), `band_basis` says
which; a memory row takes the pooled band as an assumption, said so, as no held-out run measured
memory. `inside_band`: |error| within `band_pct`. REPORT counts them per artifact (`counts`)."""

from __future__ import annotations

import pandas as pd

from zerobench.artifacts.common import JUDGED
from zerobench.perfmodel.error_bands import COVERAGE, POOLED_COVERAGE, band_values, pooled

MEMORY = "pooled, assumed for memory: no held-out run measured memory"


def add(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with band_pct and band_basis on its judged and fitted rows that have an error (a fitted
    row's band serves the claims' reading without its choice), and inside_band on the judged ones."""
    if "error_band_pct" not in df or "role" not in df:
        return df
    rows = df.role.isin((JUDGED, "fitted")) & df.error_pct.notna()
    own = band_values(df.error_band_pct)
    memory = df.band_note.notna() if "band_note" in df else pd.Series(False, index=df.index)
    pct, runs = pooled()
    regime = rows & own.notna() & ~memory
    out = df.assign(band_pct=None, band_basis=None, inside_band=None)
    out.loc[rows, "band_pct"] = own.where(regime, pct)[rows]
    out.loc[regime, "band_basis"] = f"regime ({COVERAGE:.0%})"
    out.loc[rows & ~regime, "band_basis"] = f"pooled ({runs} validation runs, {POOLED_COVERAGE:.0%})"
    out.loc[rows & memory, "band_basis"] = MEMORY
    judged = rows & (df.role == JUDGED)
    out.loc[judged, "inside_band"] = df.error_pct[judged].astype(float).abs() <= out.band_pct[judged].astype(float)
    return out


def _inside(df: pd.DataFrame) -> tuple[pd.DataFrame, int] | None:
    """(the rows with a band, how many of them are inside), None where none has one."""
    if "inside_band" not in df or not df.inside_band.notna().any():
        return None
    rows = df[df.inside_band.notna()]
    return rows, int(rows.inside_band.astype(str).str.lower().eq("true").sum())


def inside_of(df: pd.DataFrame) -> str:
    """'n/m': judged rows inside their band of those with one ('' where none has one)."""
    got = _inside(df)
    return "" if got is None else f"{got[1]}/{len(got[0])}"


def counts(df: pd.DataFrame) -> str:
    """'n of m judged rows inside their band (k on the pooled band)', or '' where none has one."""
    got = _inside(df)
    if got is None:
        return ""
    rows, inside = got
    on_pooled = int(rows.band_basis.astype(str).str.startswith("pooled").sum())
    return (
        f"**Bands.** {inside} of {len(rows)} judged rows inside their band, {len(rows) - inside} outside "
        f"({on_pooled} on the pooled band, {len(rows) - on_pooled} on their regime's)."
    )
