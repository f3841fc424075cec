"""One band on every modelled row of a table: how far the model is to be trusted there, and, on a
judged row, whether its error lies inside (perfmodel/error_bands.py, docs/perfmodel.md "Error bands").

`band_pct` is the row's regime band where its regime has one, else the pooled band (the 90 % interval
over every validation run), and `band_basis` says which (error_bands.carried); a memory row takes the
pooled band as an assumption, said so, as no held-out run measured memory. The record's own
`error_band_pct` (the regime's band or `unvalidated`) is read and dropped: a table has one band
column. `inside_band`: a judged row's |error| within `band_pct`. REPORT counts them per artifact
(`counts`) and over every artifact, each prediction once (`once`)."""

from __future__ import annotations

import pandas as pd

from zerobench.artifacts.judging.common import JUDGED
from zerobench.perfmodel.error_bands import carried


def add(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with `band_pct` and `band_basis` on its modelled rows that have a number (those whose
    record carried `error_band_pct`), `inside_band` on the judged ones with an error, and the
    records' `error_band_pct` and `band_note` dropped."""
    if "error_band_pct" not in df:
        return df
    memory = df.band_note.notna() if "band_note" in df else pd.Series(False, index=df.index)
    has = df.ours.notna() if "ours" in df else pd.Series(True, index=df.index)
    got = [carried(b, bool(m)) if h else (None, None) for b, m, h in zip(df.error_band_pct, memory, has)]
    out = df.drop(columns=["error_band_pct", "band_note"], errors="ignore").assign(
        band_pct=[g[0] for g in got], band_basis=[g[1] for g in got], inside_band=None
    )
    if "role" in df and "error_pct" in df:
        judged = (df.role == JUDGED) & df.error_pct.notna() & out.band_pct.notna()
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


def once(tables: dict[str, pd.DataFrame]) -> tuple[pd.DataFrame, list[str]]:
    """The judged rows with an error of every table (name -> table, in report order), each prediction
    once: a row whose `prediction` (common.prediction: the same quantity of the same model, layout,
    batch and hardware) an earlier judged row has is left out. (the rows kept, with an `artifact`
    column; 'artifact key = artifact key' for each row left out)."""
    kept, seen, twice = [], {}, []
    for name, df in tables.items():
        if "role" not in df or "error_pct" not in df:
            continue
        rows = df[(df.role == JUDGED) & df.error_pct.notna()].assign(artifact=name)
        for i, r in rows.iterrows():
            p = r.get("prediction")
            if isinstance(p, str) and p in seen:
                twice.append(f"{name} {r.key} = {seen[p]}")
                continue
            if isinstance(p, str):
                seen[p] = f"{name} {r.key}"
            kept.append(rows.loc[[i]])
    return (pd.concat(kept) if kept else pd.DataFrame()), twice


def headline(tables: dict[str, pd.DataFrame]) -> str:
    """REPORT's band count over every artifact: judged rows with a band and how many are inside it,
    each prediction counted once (`once`)."""
    rows, twice = once(tables)
    got = _inside(rows)
    banded, inside = got if got else (rows.iloc[0:0], 0)  # no judged row with a band: 0 of 0
    same = (
        (
            f"{len(twice)} judged row(s) read a prediction an earlier judged row reads and are counted once: "
            f"{'; '.join(twice)}"
        )
        if twice
        else "no two judged rows read the same prediction"
    )
    return (
        f"**Bands over every artifact**: {inside} of {len(banded)} judged rows inside their band, each "
        "prediction counted once: rows reading the same quantity of the same model, layout, batch and "
        f"hardware (`prediction` in the CSVs) are one ({same})."
    )
