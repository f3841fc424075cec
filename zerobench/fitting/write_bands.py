"""Write the error bands (zerobench/data/error_bands.csv) that every modelled record carries.

Held-out runs only: each A100 source's validation rows judged with the per-GPU constants fitted on
the other sources (`fit.loso_rows`, written to results/external_loso.csv with `role` validation),
and the holdout rows as last scored (results/external_holdout.csv), each under its `role`: a holdout
source some choice was made on is validation (fitting/external.py `role`).
Each run falls in a regime (perfmodel/error_bands.py); a regime's band is the prediction interval
of its runs' |errors| at the declared coverage (`error_bands.prediction_interval`; empty where too few
runs), with their count, mean |error|, worst and mean signed error beside, and how many of its runs
fall inside the band of the regime's other runs (`loo_inside` of `loo_judged`; `coverage`): the
declared coverage checked; and the same counted on the never-seen runs alone (`unseen_inside` of
`unseen_judged`: the holdout rows no choice was made on), as only they can check it. The pooled band
(error_bands.POOLED) is the POOLED_COVERAGE interval over every run.
`python -m zerobench.fitting.write_bands` runs one fit per A100 source.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from zerobench.engine.trial import git_revision
from zerobench.fitting.external import HOLDOUT_OUT, expressible
from zerobench.fitting.fit import loso_rows
from zerobench.perfmodel.error_bands import BANDS, COVERAGE, POOLED, POOLED_COVERAGE, prediction_interval, regime

LOSO_OUT = HOLDOUT_OUT.with_name("external_loso.csv")
HOW = {"loso": "leave-one-source-out", "holdout": "holdout, no choice made on it",
       "validation": "holdout, then validation: a choice was made on it"}  # fmt: skip
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
    """Per regime with held-out runs: error_band_pct (the COVERAGE prediction interval of |error|, empty
    where too few runs), runs, mean |error|, worst, bias, evidence."""
    out = []
    for (gen, kind, scale), sub in runs.groupby(REGIME, sort=True):
        err = sub.error_pct.astype(float)
        inside, judged = regime_coverage(err.abs().tolist())
        unseen_in, unseen = regime_coverage(err.abs().tolist(), list(sub.evidence == "holdout"))
        evidence = "; ".join(f"{src} ({HOW[how]}, {len(s)})" for (src, how), s in sub.groupby(["source", "evidence"]))
        pct = prediction_interval(err.abs())
        out.append(dict(generation=gen, kind=kind, scale=scale, error_band_pct=None if pct is None else round(pct, 2),
                        coverage=COVERAGE, runs=len(sub), mean_abs_pct=round(err.abs().mean(), 2),
                        worst_pct=round(err.abs().max(), 2), bias_pct=round(err.mean(), 2),
                        loo_inside=inside, loo_judged=judged, unseen_inside=unseen_in, unseen_judged=unseen,
                        evidence=evidence))  # fmt: skip
    return pd.DataFrame(out)


def regime_coverage(errors: list[float], counted: list[bool] | None = None) -> tuple[int, int]:
    """(runs inside, runs with a band) of one regime's held-out |errors|, each run judged by the band
    of the regime's other runs (leave-one-out): what the declared COVERAGE promises a new run; of the
    `counted` runs alone where given (the never-seen ones)."""
    inside = judged = 0
    for i, e in enumerate(errors):
        if counted is not None and not counted[i]:
            continue
        pct = prediction_interval(errors[:i] + errors[i + 1 :])
        if pct is not None:
            judged += 1
            inside += abs(e) <= pct
    return inside, judged


def coverage(runs: pd.DataFrame) -> tuple[int, int]:
    """`regime_coverage` summed over the regimes of `runs`."""
    per = [regime_coverage(sub.error_pct.astype(float).abs().tolist()) for _, sub in runs.groupby(REGIME)]
    return sum(i for i, _ in per), sum(j for _, j in per)


def pooled(runs: pd.DataFrame) -> pd.DataFrame:
    """The pooled band: the POOLED_COVERAGE interval of every held-out run's |error|, one row."""
    err = runs.error_pct.astype(float).abs()
    pct = prediction_interval(err, POOLED_COVERAGE)
    return pd.DataFrame([dict(error_band_pct=None if pct is None else round(pct, 2),
                              coverage=POOLED_COVERAGE, runs=len(err))])  # fmt: skip


def write(loso: pd.DataFrame, holdout: pd.DataFrame, path: Path = BANDS) -> pd.DataFrame:
    """The bands of these held-out runs, written to `path` with the revision that made them, and the
    pooled band beside it (error_bands.POOLED's name)."""
    pooled_path = path.with_name(POOLED.name)
    made_by = f"python -m zerobench.fitting.write_bands @ {git_revision()}"
    runs = heldout_runs(loso, holdout)
    table = bands(runs).assign(made_by=made_by)
    table.to_csv(path, index=False)
    pooled(runs).assign(made_by=made_by).to_csv(pooled_path, index=False)
    return table


if __name__ == "__main__":
    loso = loso_rows().assign(role="validation")  # model choices were made with these rows in view
    loso.to_csv(LOSO_OUT, index=False)
    table = write(loso, pd.read_csv(HOLDOUT_OUT))
    with pd.option_context("display.width", 200, "display.max_colwidth", 90):
        print(table.drop(columns="made_by").to_string(index=False))
    inside, judged = int(table.loo_inside.sum()), int(table.loo_judged.sum())
    print(f"leave-one-out coverage: {inside} of {judged} held-out runs inside their band (declared {COVERAGE:.0%})")
    inside, judged = int(table.unseen_inside.sum()), int(table.unseen_judged.sum())
    print(f"on never-seen runs alone: {inside} of {judged} inside")
