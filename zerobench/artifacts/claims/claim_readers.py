"""How the claims ledger (artifacts/claims/claims.py) reads ours from the artifacts' tables
(results/<artifact>.csv): single points (`cell`, judged or fitted, a fitted one flagged), ratios of
them (`ratio`), aggregates over judged and fitted rows (`over_rows`, fitted where one is), a
table's own derived rows of such rows (`over_derived`), or the worst judged row (`worst`). Each
reading's `basis` names its rows with their roles (how many of them fitted), and its band the rows'
(`band_pct`, named by `band_basis`). Rows that failed or were taken wholly in a slow spell of the host
are never read (artifacts/judging/host_speed.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from zerobench.artifacts.judging.common import JUDGED


@dataclass(frozen=True)
class Reading:
    """Ours for one claim: the value, its source(s), whether a fitted point is in it, and the rows
    it was read from; `paper` where the claim takes the paper's number from the row itself; `band_pct`
    its band (artifacts/judging/judged_bands.py): a row's own, the sum of a ratio's two, the widest of an
    aggregate's rows; None where a row read has none; `band_basis` which band that is."""

    value: float
    source: str
    fitted: bool
    basis: str
    paper: float | None = None
    band_pct: float | None = None
    band_basis: str | None = None


def _band(rows: pd.DataFrame) -> tuple[float | None, str | None]:
    """(the widest band of `rows`, its `band_basis`), (None, None) where one of them has none."""
    if "band_pct" not in rows or rows.band_pct.isna().any() or rows.empty:
        return None, None
    widest = rows.band_pct.astype(float).idxmax()
    basis = str(rows.band_basis[widest]) if "band_basis" in rows and pd.notna(rows.band_basis[widest]) else "band"
    return float(rows.band_pct[widest]), basis


Tables = dict[str, pd.DataFrame]
Reader = Callable[[Tables], "Reading | str"]  # a Reading, or why ours cannot be read


def _table(tables: Tables, name: str) -> pd.DataFrame | str:
    return tables[name] if name in tables else f"results/{name}.csv absent"


def _usable(df: pd.DataFrame, column: str = "ours") -> pd.DataFrame:
    """Rows with a number of ours, neither failed nor taken wholly in a slow spell of the host."""
    keep = df[column].notna()
    if "status" in df:
        keep &= df.status.isna() | (df.status.astype(str) == "ok")
    if "slow_spell" in df:
        keep &= df.slow_spell.ne(True)
    return df[keep]


def _source(rows: pd.DataFrame) -> str:
    return ", ".join(sorted({str(s) for s in rows.source.dropna()})) if "source" in rows else "-"


def cell(
    table: str, key: str, column: str = "ours", fn: Callable[[float], float] | None = None, carries_fit: bool = True
) -> Reader:
    """One row's `column` (through `fn`), from a judged or fitted row (fitted: flagged, unless the
    column carries no choice of the model: `carries_fit=False`, e.g. a traced figure beside the model's)."""

    def read(tables: Tables) -> Reading | str:
        df = _table(tables, table)
        if isinstance(df, str):
            return df
        if column not in df:
            return f"{table} has no column {column!r}"
        rows = _usable(df[df.key.astype(str) == key], column)
        if rows.empty:
            return f"{table}: no usable row {key!r}"
        r = rows.iloc[0]
        if r.role not in (JUDGED, "fitted"):
            return f"{table} {key!r} is a {r.role} row, not ours against the paper"
        value = float(r[column]) if fn is None else fn(float(r[column]))
        paper = float(r.paper) if "paper" in r and pd.notna(r.paper) else None
        basis = f"{table}: {key} ({r.role})"
        if not carries_fit:  # the column carries no choice of the model: judged, whatever the row's role
            return Reading(value, column.split("_")[0], False, f"{table}: {key} {column} (judged: no choice in it)")
        return Reading(value, _source(rows), r.role == "fitted", basis, paper, *_band(rows.head(1)))

    return read


def ratio(num: Reader, den: Reader, scale: float = 1.0) -> Reader:
    """scale x num / den; fitted where either is."""

    def read(tables: Tables) -> Reading | str:
        a, b = num(tables), den(tables)
        for part in (a, b):
            if isinstance(part, str):
                return part
        if not b.value:
            return f"{b.basis}: zero denominator"
        source = ", ".join(sorted({*a.source.split(", "), *b.source.split(", ")}))
        band, named = None, None
        if a.band_pct is not None and b.band_pct is not None:  # each side's error may add: their bands summed
            band = a.band_pct + b.band_pct
            named = f"the sum of the two rows' bands ({a.band_basis}; {b.band_basis})"
        return Reading(scale * a.value / b.value, source, a.fitted or b.fitted, f"{a.basis} / {b.basis}", None, band,
                       named)  # fmt: skip

    return read


def _aggregate(table: str, rows: pd.DataFrame, how: str, scale: float, fitted: bool, what: str) -> Reading | str:
    """scale x the mean or max of `rows`' ours, its basis naming the rows (and the max's row);
    `fitted` where a fitted row is among them."""
    if rows.empty:
        return f"{table}: no {what} to read"
    values = rows.ours.astype(float)
    value = scale * (values.max() if how == "max" else values.mean())
    basis = f"{table}: {how} over {what} {', '.join(map(str, rows.key))}"
    if how == "max":
        basis += f" (at {rows.key[values.idxmax()]})"
    return Reading(value, _source(rows), fitted, basis, None, *_band(rows))


def _roles(fitted: int, n: int) -> str:
    """'rows (k fitted, m judged)', or 'judged rows' where none is fitted."""
    return f"rows ({fitted} fitted, {n - fitted} judged)" if fitted else "judged rows"


def over_rows(table: str, pattern: str, how: str = "mean", scale: float = 1.0) -> Reader:
    """scale x the mean or max of `ours` over the judged and fitted rows whose key matches `pattern`
    (fitted where one of them is: the claim then shows its worst reading, artifacts/claims/claims.py)."""

    def read(tables: Tables) -> Reading | str:
        df = _table(tables, table)
        if isinstance(df, str):
            return df
        rows = _usable(df[df.key.astype(str).str.fullmatch(pattern) & df.role.isin((JUDGED, "fitted"))])
        fitted = rows.role.eq("fitted")
        return _aggregate(table, rows, how, scale, bool(fitted.any()), _roles(int(fitted.sum()), len(rows)))

    return read


def over_derived(table: str, series: str, how: str = "max") -> Reader:
    """The mean or max of a table's derived rows of `series` (ratios named in `derived_from` as
    'A / B') whose source rows are judged or fitted (fitted where one of them is)."""

    def read(tables: Tables) -> Reading | str:
        df = _table(tables, table)
        if isinstance(df, str):
            return df
        role = dict(zip(df.key.astype(str), df.role, strict=True))
        rows = _usable(df[(df.series == series) & (df.role == "derived")])
        roles = rows.derived_from.astype(str).map(lambda d: {role.get(k.strip()) for k in d.split("/")})
        rows = rows[roles.map(lambda r: r <= {JUDGED, "fitted"})]
        fitted = int(roles[rows.index].map(lambda r: "fitted" in r).sum())
        what = f"derived rows ({fitted} of a fitted row, {len(rows) - fitted} of judged rows only)"
        return _aggregate(table, rows, how, 1.0, bool(fitted), what if fitted else "derived rows of judged rows")

    return read


def worst(table: str) -> Reader:
    """The judged row whose |error| against the paper is largest: ours and the paper's number."""

    def read(tables: Tables) -> Reading | str:
        df = _table(tables, table)
        if isinstance(df, str):
            return df
        rows = _usable(df[(df.role == JUDGED) & df.error_pct.notna()])
        if rows.empty:
            return f"{table}: no judged rows to read"
        r = rows.loc[rows.error_pct.astype(float).abs().idxmax()]
        basis = f"{table}: worst of {len(rows)} judged rows ({r.key})"
        return Reading(float(r.ours), _source(rows), False, basis, float(r.paper), *_band(rows.loc[[r.name]]))

    return read
