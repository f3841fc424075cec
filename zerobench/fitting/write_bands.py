"""Write the error bands (zerobench/data/error_bands.csv) that every modelled record carries, and the
coverage check of them (results/external_coverage.csv).

Two kinds of published runs the model was not fitted on, kept apart:
- the runs that **set** the bands (`SETS_BAND`): each A100 source's validation rows judged with the
  per-GPU constants fitted on the other sources (`fit.loso_rows`, written to results/external_loso.csv)
  and the holdout rows some choice was made on (role `validation`, fitting/external.py `role`). Choices
  of the model were made with all of them in view;
- the runs the coverage is **counted** on (`COUNTED`): the holdout rows no choice was made on (role
  `holdout`). They set no band and moved no choice, so only they can check one.
Each run falls in a regime (perfmodel/error_bands.py); a regime's band is the prediction interval of
its band-setting runs' |errors| at the declared coverage (`error_bands.prediction_interval`; empty
where too few runs), with their count, mean |error|, worst and mean signed error beside. The pooled
band (error_bands.POOLED) is the POOLED_COVERAGE interval over every band-setting run. Each counted run
is then judged by the band its regime would give a modelled row (its regime's, else the pooled one):
inside or not. How many are inside depends on the counted runs' errors against the others' (twice
their errors, or errors dealt out to other runs, give another count), which a leave-one-out count
within the band-setting runs does not: there, the count is fixed by the regimes' sizes.
`python -m zerobench.fitting.write_bands` runs one fit per A100 source.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from zerobench.fitting.external import HOLDOUT_OUT, expressible
from zerobench.fitting.fit import loso_rows
from zerobench.perfmodel.error_bands import (
    BANDS,
    COVERAGE,
    POOLED,
    POOLED_COVERAGE,
    REGIME_BASIS,
    prediction_interval,
    regime,
)
from zerobench.trial import git_revision

LOSO_OUT = HOLDOUT_OUT.with_name("external_loso.csv")
COVERAGE_OUT = HOLDOUT_OUT.with_name("external_coverage.csv")
HOW = {
    "loso": "leave-one-source-out",
    "holdout": "holdout, no choice made on it",
    "validation": "holdout, then validation: a choice was made on it",
}
SETS_BAND = ("loso", "validation")  # runs a choice was made with in view: they set the bands
COUNTED = "holdout"  # runs that set no band and moved no choice: the coverage is counted on them
REGIME = ["generation", "kind", "scale"]


def heldout_runs(loso: pd.DataFrame, holdout: pd.DataFrame) -> pd.DataFrame:
    """One row per held-out run the model expresses: source, how it was held out, regime, error."""
    held = holdout[expressible(holdout)]
    how = held.role if "role" in held else pd.Series("holdout", index=held.index)
    both = pd.concat([loso.assign(evidence="loso"), held.assign(evidence=how.values)])
    regs = [regime(r.hardware, int(r.gpus), int(r.mp), int(r.stage)) for r in both.itertuples()]
    return pd.DataFrame({
        "source": both.source.values, "evidence": both.evidence.values, "hardware": both.hardware.values,
        "gpus": both.gpus.astype(int).values, "mp": both.mp.astype(int).values, "stage": both.stage.astype(int).values,
        "generation": [g.generation for g in regs], "kind": [g.kind for g in regs], "scale": [g.scale for g in regs],
        "error_pct": both.error_pct.values,
    })  # fmt: skip


def bands(runs: pd.DataFrame) -> pd.DataFrame:
    """Per regime with band-setting runs (SETS_BAND): band_pct (the COVERAGE prediction interval
    of |error|, empty where too few runs), runs, mean |error|, worst, bias, evidence."""
    out = []
    for (gen, kind, scale), sub in runs[runs.evidence.isin(SETS_BAND)].groupby(REGIME, sort=True):
        err = sub.error_pct.astype(float)
        evidence = "; ".join(f"{src} ({HOW[how]}, {len(s)})" for (src, how), s in sub.groupby(["source", "evidence"]))
        pct = prediction_interval(err.abs())
        out.append(
            dict(
                generation=gen,
                kind=kind,
                scale=scale,
                band_pct=None if pct is None else round(pct, 2),
                coverage=COVERAGE,
                runs=len(sub),
                mean_abs_pct=round(err.abs().mean(), 2),
                worst_pct=round(err.abs().max(), 2),
                bias_pct=round(err.mean(), 2),
                evidence=evidence,
            )
        )
    return pd.DataFrame(out)


def pooled(runs: pd.DataFrame) -> pd.DataFrame:
    """The pooled band: the POOLED_COVERAGE interval of every band-setting run's |error|, one row."""
    err = runs[runs.evidence.isin(SETS_BAND)].error_pct.astype(float).abs()
    pct = prediction_interval(err, POOLED_COVERAGE)
    return pd.DataFrame(
        [dict(band_pct=None if pct is None else round(pct, 2), coverage=POOLED_COVERAGE, runs=len(err))]
    )


def counted(runs: pd.DataFrame, table: pd.DataFrame, pool: pd.DataFrame) -> pd.DataFrame:
    """Each COUNTED run with the band a modelled row of its regime carries (its regime's from `table`
    where numeric, else the pooled one, `band_basis`), and whether its |error| is inside."""
    own = {tuple(r[REGIME]): r.band_pct for _, r in table.iterrows() if pd.notna(r.band_pct)}
    rows = runs[runs.evidence == COUNTED]
    keys = [tuple(r) for r in rows[REGIME].itertuples(index=False)]
    pct = [own.get(k, pool.band_pct.iloc[0]) for k in keys]
    # error_bands.pooled_basis's words, on the pooled band just set
    pooled_basis = f"pooled ({int(pool.runs.iloc[0])} validation runs, {POOLED_COVERAGE:.0%})"
    basis = [REGIME_BASIS if k in own else pooled_basis for k in keys]
    inside = rows.error_pct.astype(float).abs().to_numpy() <= pd.Series(pct, dtype=float).to_numpy()
    return rows.assign(band_pct=pct, band_basis=basis, inside=inside)


def write(loso: pd.DataFrame, holdout: pd.DataFrame, path: Path = BANDS, coverage_path: Path = COVERAGE_OUT):
    """The bands of the band-setting runs, written to `path` with the revision that made them, the
    pooled band beside it (error_bands.POOLED's name), and the counted runs judged by them to
    `coverage_path`: (bands, counted runs)."""
    made_by = f"python -m zerobench.fitting.write_bands @ {git_revision()}"
    runs = heldout_runs(loso, holdout)
    table, pool = bands(runs), pooled(runs)
    check = counted(runs, table, pool)
    table.assign(made_by=made_by).to_csv(path, index=False)
    pool.assign(made_by=made_by).to_csv(path.with_name(POOLED.name), index=False)
    check.assign(made_by=made_by).to_csv(coverage_path, index=False)
    return table, check


if __name__ == "__main__":
    loso = loso_rows().assign(role="validation")  # model choices were made with these rows in view
    loso.to_csv(LOSO_OUT, index=False)
    table, check = write(loso, pd.read_csv(HOLDOUT_OUT))
    with pd.option_context("display.width", 200, "display.max_colwidth", 90):
        print(table.to_string(index=False))
    print(f"coverage: {int(check.inside.sum())} of {len(check)} counted runs inside the band set on the others")
